"""``plan_migration(..., all_at_once=True)`` and its rollback: the gate-off procedure for multi-level trees.

With ElasticQuotaEnableUpdateResourceKey off, Koordinator's ElasticQuota webhook requires an
updated quota's max keys to equal its parent's and its children's, unless the quota sits directly
under the root quota and is not a parent (pkg/webhook/elasticquota/quota_topology_check.go). The procedure (see
gpuquota_core/migration.py) walks each tree children first: a legacy quota under a legacy parent is
moved to the root and converted in one update ("detach-convert"); a quota whose parent keeps its
keys converts in place ("convert"); right after a quota is converted its detached children go back
under it ("reattach"). Every test replays the steps through ``simulate_koordinator``, our model of
that webhook's topology check.
"""

from __future__ import annotations

import json
from typing import Any

from gpuquota_core.migration import (
    PRE_MIGRATION_SPEC_ANNOTATION,
    Placement,
    Step,
    koordinator_topology_refusal,
    originals_from_backup,
    placement_of,
    plan_migration,
    plan_rollback,
    simulate_koordinator,
)
from gpuquota_core.quota_objects import ROOT_QUOTA, quota_from_object

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
GPU = "nvidia.com/gpu"
ROOT = ROOT_QUOTA
IN_PROGRESS = "gpuquota.koord-gpuquota.io/migration"


def eq(name: str, max_: dict[str, str], min_: dict[str, str] | None = None, parent: str | None = None,
       is_parent: bool = False, tree_id: str = "") -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/is-parent": "true" if is_parent else "false"}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    if tree_id:
        labels["quota.scheduling.koordinator.sh/tree-id"] = tree_id
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": f"ns-{name}", "labels": labels},
            "spec": {"max": max_, "min": min_ or {}}}


def cards(n: str) -> dict[str, str]:
    return {GPU: n}


def canonical(percent: str) -> dict[str, str]:
    return {CORE: percent, RATIO: percent}


# org (8 cards, min 4) > dept (6, min 2) > team (4, min 1): three levels, one key everywhere.
CHAIN = [eq("team", cards("4"), cards("1"), parent="dept"),
         eq("org", cards("8"), cards("4"), is_parent=True),
         eq("dept", cards("6"), cards("2"), parent="org", is_parent=True)]
# org (8) > dept (6) > team-a (3, min 0.5), team-b (4); solo (1 AMD card) alone at the root.
WIDE = [eq("org", cards("8"), is_parent=True), eq("dept", cards("6"), parent="org", is_parent=True),
        eq("team-b", cards("4"), parent="dept"), eq("team-a", cards("3"), cards("500m"), parent="dept"),
        eq("solo", {"amd.com/gpu": "1"})]


def phases(steps: list[Step]) -> list[tuple[str, str, str | None]]:
    return [(s.phase, s.quota, s.parent_after) for s in steps]


def placements(objects: list[dict[str, Any]]) -> dict[str, Placement]:
    return {q.name: placement_of(q) for q in (quota_from_object(o) for o in objects)}


def replay(objects: list[dict[str, Any]], steps: list[Step]) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (spec, parent label) after ``steps``; each step must start where the last one left."""
    state = {q.name: ({"min": dict(o["spec"]["min"]), "max": dict(o["spec"]["max"])}, q.parent)
             for o, q in ((o, quota_from_object(o)) for o in objects)}
    for step in steps:
        spec, parent = state[step.quota]
        assert {k: dict(v) for k, v in step.before.items()} == spec, step
        if step.parent_before is not None:
            assert step.parent_before == parent, step
        state[step.quota] = ({k: dict(v) for k, v in step.after.items()},
                             step.parent_after if step.parent_after is not None else parent)
    return state


def test_a_three_level_tree_is_detached_converted_and_reattached_children_first() -> None:
    plan = plan_migration(CHAIN, all_at_once=True)
    assert phases(plan.steps) == [
        ("detach-convert", "team", ROOT),  # team leaves dept: dept keeps nvidia.com/gpu for now
        ("detach-convert", "dept", ROOT),  # dept has no child left: free to change keys at the root
        ("reattach", "team", "dept"),      # team's keys equal dept's again
        ("convert", "org", None),          # org is under the root with no child left
        ("reattach", "dept", "org"),
    ]
    assert plan.blocked == []
    steps = {(s.phase, s.quota): s for s in plan.steps}
    assert steps[("detach-convert", "team")].before == {"min": cards("1"), "max": cards("4")}
    assert steps[("detach-convert", "team")].after == {"min": canonical("100"), "max": canonical("400")}
    assert steps[("detach-convert", "team")].parent_before == "dept"
    assert steps[("reattach", "team")].before == steps[("reattach", "team")].after  # only the label moves
    assert steps[("convert", "org")].after == {"min": canonical("400"), "max": canonical("800")}


def test_every_step_passes_koordinators_topology_check_and_the_tree_ends_canonical_and_whole() -> None:
    for objects in (CHAIN, WIDE):
        plan = plan_migration(objects, all_at_once=True)
        assert simulate_koordinator(placements(objects), plan.steps) == []
        final = replay(objects, plan.steps)
        for obj in objects:
            info = quota_from_object(obj)
            spec, parent = final[info.name]
            assert parent == info.parent  # the tree is whole again
            assert set(spec["max"]) == {CORE, RATIO}
            assert all(int(spec["max"][k]) == 100 * int(next(iter(obj["spec"]["max"].values()))) for k in spec["max"])


def test_the_same_changes_without_moving_quotas_are_refused_by_koordinator() -> None:
    # The plain gate-off plan converts in place, top-down: Koordinator refuses its very first step.
    plain = plan_migration(CHAIN)
    assert plain.blocked and all(s.parent_after is None for s in plain.steps)
    refusals = simulate_koordinator(placements(CHAIN), plain.steps)
    assert refusals[0] == ("step 1 (convert ns-org/org) would be refused by Koordinator's ElasticQuota webhook: "
                           "failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey "
                           "failed: dept's max keys are not the same with org's")
    # Bottom-up is refused too.
    assert simulate_koordinator(placements(CHAIN), list(reversed(plain.steps)))[0].startswith(
        "step 1 (convert ns-team/team) would be refused")


def test_wide_tree_order_and_the_window_in_canonical_units() -> None:
    plan = plan_migration(WIDE, all_at_once=True)
    assert phases(plan.steps) == [
        ("detach-convert", "team-a", ROOT), ("detach-convert", "team-b", ROOT), ("detach-convert", "dept", ROOT),
        ("reattach", "team-a", "dept"), ("reattach", "team-b", "dept"), ("convert", "org", None),
        ("reattach", "dept", "org"), ("convert", "solo", None)]
    assert plan.window == [
        "steps 1-7 are one maintenance window: with ElasticQuotaEnableUpdateResourceKey off, Koordinator refuses any "
        "update that leaves an attached parent and child with different max keys, so dept, team-a, team-b leave "
        f"their parent (parent label {ROOT}) while keys change and are reattached right after; run the whole plan "
        "with `gpuquota migrate apply --all-at-once --backup FILE` and let nothing else edit these quotas until it "
        "ends",
        f"steps 1-4: team-a is detached from dept: pods in its subtree are limited by its own max {{{CORE}: 300, "
        f"{RATIO}: 300}} (canonical units) and not by dept's max {{{CORE}: 600, {RATIO}: 600}} nor by org above it",
        f"steps 2-5: team-b is detached from dept: pods in its subtree are limited by its own max {{{CORE}: 400, "
        f"{RATIO}: 400}} (canonical units) and not by dept's max {{{CORE}: 600, {RATIO}: 600}} nor by org above it",
        f"steps 3-7: dept is detached from org: pods in its subtree are limited by its own max {{{CORE}: 600, "
        f"{RATIO}: 600}} (canonical units) and not by org's max {{{CORE}: 800, {RATIO}: 800}}",
        # team-a + team-b may hold 300 + 400 while detached: 100 above dept's 600, still within org's 800.
        f"dept: during the window pods under dept can use up to {{{CORE}: 700, {RATIO}: 700}}, above its max "
        f"{{{CORE}: 600, {RATIO}: 600}} by {{{CORE}: 100, {RATIO}: 100}}: keep the window short, or lower the "
        "children's max first",
        f"org: its max {{{CORE}: 800, {RATIO}: 800}} still holds during the window: with every detached quota held "
        f"to its own max, pods under org can use at most {{{CORE}: 700, {RATIO}: 700}}"]
    assert plan.as_dict()["window"] == plan.window
    assert plan.as_dict()["steps"][0]["parent"] == {"before": "dept", "after": ROOT}
    assert "parent" not in plan.as_dict()["steps"][5]  # org's convert leaves the label alone


def test_quotas_that_need_no_window_convert_in_one_step() -> None:
    plan = plan_migration([eq("org", canonical("800"), is_parent=True), eq("team", cards("2"), parent="org"),
                           eq("solo", cards("1"))], all_at_once=True)
    assert phases(plan.steps) == [("convert", "team", None), ("convert", "solo", None)]
    assert (plan.blocked, plan.window) == ([], [])
    assert "window" not in plan.as_dict()


def test_a_tree_with_a_tree_id_cannot_be_detached() -> None:
    objects = [eq("org", cards("8"), is_parent=True, tree_id="t1"), eq("team", cards("4"), parent="org", tree_id="t1")]
    plan = plan_migration(objects, all_at_once=True)
    assert [(b.quota, b.namespace, b.reason) for b in plan.blocked] == [("team", "ns-team", "tree-id")]
    assert [b.message for b in plan.blocked] == [
        "quota team has tree-id 't1': Koordinator requires a quota's tree id to equal its parent's and never lets it "
        "change, so it cannot be detached to the root quota; the all-at-once procedure cannot migrate this tree "
        "(enable ElasticQuotaEnableUpdateResourceKey and use the step-by-step plan)"]


def test_a_tree_koordinator_already_disagrees_with_is_blocked_with_its_message() -> None:
    # team names cpu, dept does not: Koordinator refuses the reattach (keys must be identical).
    objects = [eq("dept", cards("6"), is_parent=True), eq("team", {**cards("4"), "cpu": "8"}, parent="dept")]
    plan = plan_migration(objects, all_at_once=True)
    assert [(b.quota, b.reason) for b in plan.blocked] == [("team", "koordinator-refuses")]
    assert [b.message for b in plan.blocked] == [
        "step 3 (reattach ns-team/team) would be refused by Koordinator's ElasticQuota webhook: failed to check sub "
        "and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: team's max keys are not the same "
        "with dept's"]


def test_usage_over_the_canonical_limit_still_blocks() -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "x",
                                       "labels": {"quota.scheduling.koordinator.sh/name": "team"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": cards("5")}}]}}
    plan = plan_migration([*CHAIN, pod], all_at_once=True)
    assert [(b.quota, b.reason, b.message) for b in plan.blocked] == [
        ("team", "over-limit", f"quota team: canonical usage exceeds the limit: {CORE} 500 > 400, {RATIO} 500 > 400; "
                               "raise the limit before migrating")]


def marked(obj: dict[str, Any], spec: dict[str, dict[str, str]] | None = None, parent: str | None = None,
           in_progress: bool = False) -> dict[str, Any]:
    """``obj`` as ``apply --all-at-once`` leaves it: original spec and parent recorded, ``spec``/``parent`` set."""
    info = quota_from_object(obj)
    annotations = {PRE_MIGRATION_SPEC_ANNOTATION: json.dumps({**obj["spec"], "parent": info.parent}, sort_keys=True)}
    if in_progress:
        annotations[IN_PROGRESS] = "in-progress"
    labels = dict(obj["metadata"]["labels"])
    if parent is not None:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    return {**obj, "metadata": {**obj["metadata"], "labels": labels, "annotations": annotations},
            "spec": spec or obj["spec"]}


TEAM, ORG, DEPT = CHAIN
TEAM_DONE = {"min": canonical("100"), "max": canonical("400")}
DEPT_DONE = {"min": canonical("200"), "max": canonical("600")}
ORG_DONE = {"min": canonical("400"), "max": canonical("800")}


def test_a_stopped_run_resumes_and_reattaches_under_the_recorded_parent() -> None:
    # apply stopped after step 1: team is canonical, at the root, marked in progress.
    live = [marked(TEAM, TEAM_DONE, ROOT, in_progress=True), ORG, DEPT]
    plan = plan_migration(live, all_at_once=True)
    assert phases(plan.steps) == [("detach-convert", "dept", ROOT), ("reattach", "team", "dept"),
                                  ("convert", "org", None), ("reattach", "dept", "org")]
    assert plan.blocked == []
    assert simulate_koordinator(placements(live), plan.steps) == []


def test_rollback_of_a_finished_run_is_the_same_procedure_back_to_the_originals() -> None:
    live = [marked(TEAM, TEAM_DONE), marked(ORG, ORG_DONE), marked(DEPT, DEPT_DONE)]
    result = plan_rollback(live)  # the recorded parent says: all at once
    assert result.refused == []
    assert phases(result.steps) == [("detach-restore", "team", ROOT), ("detach-restore", "dept", ROOT),
                                    ("reattach", "team", "dept"), ("restore", "org", None),
                                    ("reattach", "dept", "org")]
    assert simulate_koordinator(placements(live), result.steps) == []
    final = replay(live, result.steps)
    assert final == {"team": (TEAM["spec"], "dept"), "org": (ORG["spec"], ROOT), "dept": (DEPT["spec"], "org")}
    # The backup gives the same steps (and the parents, from its labels).
    backup = originals_from_backup(CHAIN)
    assert plan_rollback(live, backup, original_parents={("ns-team", "team"): "dept", ("ns-dept", "dept"): "org",
                                                         ("ns-org", "org"): ROOT}).steps == result.steps


def test_rollback_of_a_stopped_run_undoes_only_what_was_done() -> None:
    # Stopped after step 2 (dept detached and converted); nothing reattached, org untouched.
    live = [marked(TEAM, TEAM_DONE, ROOT, in_progress=True), ORG, marked(DEPT, DEPT_DONE, ROOT, in_progress=True)]
    result = plan_rollback(live, originals_from_backup(CHAIN),
                           original_parents={("ns-team", "team"): "dept", ("ns-dept", "dept"): "org",
                                             ("ns-org", "org"): ROOT})
    assert result.refused == []
    assert result.unchanged == ["ns-org/org"]
    assert phases(result.steps) == [("detach-restore", "team", None), ("restore", "dept", "org"),
                                    ("reattach", "team", "dept")]
    assert simulate_koordinator(placements(live), result.steps) == []
    assert replay(live, result.steps) == {"team": (TEAM["spec"], "dept"), "org": (ORG["spec"], ROOT),
                                          "dept": (DEPT["spec"], "org")}


def test_rollback_refuses_a_quota_changed_since_the_all_at_once_run() -> None:
    raised = {"min": canonical("100"), "max": canonical("500")}
    result = plan_rollback([marked(TEAM, raised), marked(ORG, ORG_DONE), marked(DEPT, DEPT_DONE)])
    assert [r.quota for r in result.refused] == ["dept", "team"]
    assert result.refused[1].reason.endswith("nor a state `gpuquota migrate apply --all-at-once` writes")
    assert result.refused[0].reason.startswith("its child team is not rolled back")


def test_koordinators_topology_check_as_modelled() -> None:
    world = {"org": Placement(ROOT, True, frozenset({GPU})), "dept": Placement("org", True, frozenset({CORE})),
             "team": Placement(ROOT, False, frozenset({"x"})), "lone": Placement("org", False, frozenset({GPU}))}
    assert koordinator_topology_refusal(world, "team") is None  # a leaf under the root: no topology check
    assert koordinator_topology_refusal(world, "lone") is None
    assert "dept's max keys are not the same with org's" in str(koordinator_topology_refusal(world, "org"))
    assert "dept's max keys are not the same with org's" in str(koordinator_topology_refusal(world, "dept"))
    gated = {**world, "dept": Placement("org", True, frozenset({GPU})), "lone": Placement("org", False, frozenset())}
    assert koordinator_topology_refusal(gated, "org", update_resource_key_gate=True) is None
    assert koordinator_topology_refusal(gated, "org") is not None  # lone has fewer keys: refused without the gate
    orphan = {"team": Placement("gone", False, frozenset())}
    assert koordinator_topology_refusal(orphan, "team") == "team has parentName gone but not find parentInfo in " \
                                                            "quotaInfoMap"
