"""``plan_migration`` directly: step order, canonical before/after, blocked plans, revisit items, gate.

The order the code intends (gpuquota_core/migration.py): legacy quotas top-down by depth (name
breaks ties); with the gate, every quota of a multi-level tree first gets ``add-canonical``
(legacy keys kept, canonical ones added to max and min) top-down, and after all of those
``drop-legacy`` runs in exactly the reverse order (children before parents). Quotas outside such
a tree get one ``convert`` step in place.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuquota_core.migration import (
    Blocked,
    Plan,
    RollbackSourceError,
    Step,
    changed_only_by_koordinator_bookkeeping,
    original_from_annotation,
    originals_from_backup,
    plan_migration,
    plan_rollback,
    read_backup,
)

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
MULTI_LEVEL = ("are in a multi-level tree: with ElasticQuotaEnableUpdateResourceKey off Koordinator requires "
               "identical max keys between parent and child on every update, so these quotas must be changed at "
               "once (re-plan with --all-at-once for the maintenance-window procedure, or enable the gate and re-plan)")


def eq(name: str, namespace: str, max_: dict[str, str], min_: dict[str, str] | None = None,
       parent: str | None = None, is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/is-parent": "true" if is_parent else "false"}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"max": max_, "min": min_ or {}}}


def canonical(percent: str, **extra: str) -> dict[str, str]:
    return {CORE: percent, RATIO: percent, **extra}


def order(plan: Plan) -> list[tuple[str, str]]:
    return [(step.phase, step.quota) for step in plan.steps]


# org (8 cards, min 4) > dept (6) > team-a (3, min 0.5, cpu 8), team-b (2); solo (1 AMD card) alone.
TREE: list[dict[str, Any]] = [
    eq("team-b", "b", {"nvidia.com/gpu": "2"}, parent="dept"),
    eq("org", "ops", {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "4"}, is_parent=True),
    eq("team-a", "a", {"nvidia.com/gpu": "3", "cpu": "8"}, {"nvidia.com/gpu": "500m"}, parent="dept"),
    eq("solo", "solo", {"amd.com/gpu": "1"}),
    eq("dept", "ops", {"nvidia.com/gpu": "6"}, parent="org", is_parent=True),
    eq("done", "done", canonical("100")),
]


def test_one_quota_converts_in_one_step_in_canonical_units() -> None:
    plan = plan_migration([eq("team", "team", {"nvidia.com/gpu": "4", "cpu": "16"}, {"nvidia.com/gpu": "2"})])
    assert plan.steps == [Step("team", "team", "convert",
                               {"min": {"nvidia.com/gpu": "2"}, "max": {"cpu": "16", "nvidia.com/gpu": "4"}},
                               {"min": canonical("200"), "max": canonical("400", cpu="16")})]
    assert (plan.blocked, plan.revisit) == ([], [])


def test_canonical_quotas_need_no_step() -> None:
    plan = plan_migration([eq("done", "done", canonical("100")), eq("cpu", "cpu", {"cpu": "4"})])
    assert plan.as_dict() == {"steps": [], "blocked": [], "revisit": []}


def test_gate_on_adds_top_down_then_drops_in_exact_reverse_order() -> None:
    plan = plan_migration(TREE, update_resource_key_gate=True)
    assert order(plan) == [
        ("add-canonical", "org"), ("convert", "solo"), ("add-canonical", "dept"),
        ("add-canonical", "team-a"), ("add-canonical", "team-b"),
        ("drop-legacy", "team-b"), ("drop-legacy", "team-a"), ("drop-legacy", "dept"), ("drop-legacy", "org")]
    assert plan.blocked == []
    adds = [s.quota for s in plan.steps if s.phase == "add-canonical"]
    drops = [s.quota for s in plan.steps if s.phase == "drop-legacy"]
    assert drops == list(reversed(adds))


def test_gate_on_before_and_after_of_every_phase() -> None:
    steps = {(s.phase, s.quota): s for s in plan_migration(TREE, update_resource_key_gate=True).steps}
    add_org, drop_org = steps[("add-canonical", "org")], steps[("drop-legacy", "org")]
    assert add_org.before == {"min": {"nvidia.com/gpu": "4"}, "max": {"nvidia.com/gpu": "8"}}
    # add-canonical: legacy keys kept, canonical keys added to max and to min.
    assert add_org.after == {"min": canonical("400", **{"nvidia.com/gpu": "4"}),
                             "max": canonical("800", **{"nvidia.com/gpu": "8"})}
    # drop-legacy starts where add-canonical ended and ends fully canonical (min too).
    assert drop_org.before == add_org.after
    assert drop_org.after == {"min": canonical("400"), "max": canonical("800")}
    drop_a = steps[("drop-legacy", "team-a")]
    assert drop_a.before == {"min": canonical("50", **{"nvidia.com/gpu": "500m"}),
                             "max": canonical("300", cpu="8", **{"nvidia.com/gpu": "3"})}
    assert drop_a.after == {"min": canonical("50"), "max": canonical("300", cpu="8")}
    assert steps[("convert", "solo")].after == {"min": {}, "max": canonical("100")}
    assert ("convert", "done") not in steps and ("add-canonical", "done") not in steps


def test_gate_on_keeps_child_max_keys_within_the_parent_at_every_step() -> None:
    plan = plan_migration(TREE, update_resource_key_gate=True)
    parent_of = {"dept": "org", "team-a": "dept", "team-b": "dept"}
    keys = {o["metadata"]["name"]: set(o["spec"]["max"]) for o in TREE}
    for step in plan.steps:
        assert set(step.before["max"]) == keys[step.quota]  # each step starts from the previous state
        keys[step.quota] = set(step.after["max"])
        for child, parent in parent_of.items():
            assert keys[child] - {"cpu"} <= keys[parent], (step, child)
    assert {name: keys[name] - {"cpu"} for name in parent_of} == {name: {CORE, RATIO} for name in parent_of}


def test_gate_on_keeps_child_min_keys_within_the_parent_at_every_step() -> None:
    # Koordinator's webhook checks min keys child-within-parent on every update, gate or not: a
    # child's drop-legacy (canonical min only) needs the canonical keys already in its parent's min.
    plan = plan_migration(TREE, update_resource_key_gate=True)
    parent_of = {"dept": "org", "team-a": "dept", "team-b": "dept"}
    keys = {o["metadata"]["name"]: set(o["spec"].get("min", {})) for o in TREE}
    # Where it held before the migration (TREE's dept has no min, which that webhook would refuse).
    held = {child: parent for child, parent in parent_of.items() if keys[child] <= keys[parent]}
    assert held == {"dept": "org", "team-b": "dept"}
    for step in plan.steps:
        assert set(step.before["min"]) == keys[step.quota]
        keys[step.quota] = set(step.after["min"])
        for child, parent in held.items():
            assert keys[child] <= keys[parent], (step, child)


def test_gate_off_blocks_the_tree_and_lists_its_quotas_top_down() -> None:
    plan = plan_migration(TREE)
    message = f"quotas org, dept, team-a, team-b {MULTI_LEVEL}"
    assert [b.as_dict() for b in plan.blocked] == [
        {"quota": name, "namespace": namespace, "reason": "multi-level-tree", "message": message}
        for name, namespace in (("org", "ops"), ("dept", "ops"), ("team-a", "a"), ("team-b", "b"))]
    # The steps still say what would change, each as one convert, top-down.
    assert order(plan) == [("convert", "org"), ("convert", "solo"), ("convert", "dept"),
                           ("convert", "team-a"), ("convert", "team-b")]
    assert plan.steps[0].after == {"min": canonical("400"), "max": canonical("800")}


def test_gate_off_a_legacy_leaf_under_a_canonical_parent_converts_in_one_step() -> None:
    plan = plan_migration([eq("org", "ops", canonical("800"), is_parent=True),
                           eq("team", "team", {"nvidia.com/gpu": "2"}, parent="org")])
    assert plan.blocked == []
    assert plan.steps == [Step("team", "team", "convert", {"min": {}, "max": {"nvidia.com/gpu": "2"}},
                               {"min": {}, "max": canonical("200")})]


def test_gate_off_a_legacy_parent_of_canonical_children_is_blocked() -> None:
    plan = plan_migration([eq("org", "ops", {"nvidia.com/gpu": "8"}, is_parent=True),
                           eq("team", "team", canonical("200"), parent="org")])
    assert plan.blocked == [Blocked("org", "ops", "multi-level-tree", f"quotas org {MULTI_LEVEL}")]
    gated = plan_migration([eq("org", "ops", {"nvidia.com/gpu": "8"}, is_parent=True),
                            eq("team", "team", canonical("200"), parent="org")], update_resource_key_gate=True)
    assert order(gated) == [("add-canonical", "org"), ("drop-legacy", "org")]


def test_usage_over_the_canonical_limit_blocks_the_plan() -> None:
    # team: 2 cards = 200; pods ask 3 cards (legacy) = 300. other: canonical and over too, but
    # not migrated, so it does not block this plan.
    objects = [eq("team", "team", {"nvidia.com/gpu": "2"}), eq("other", "other", canonical("100")),
               {"kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}},
               {"kind": "Pod", "metadata": {"name": "q", "namespace": "x", "labels": {QUOTA_LABEL: "other"}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": canonical("200")}}]}}]
    for gate in (False, True):
        plan = plan_migration(objects, update_resource_key_gate=gate)
        assert plan.blocked == [Blocked("team", "team", "over-limit", f"quota team: canonical usage exceeds the limit: "
                                        f"{CORE} 300 > 200, {RATIO} 300 > 200; raise the limit before migrating")]
        # The pod still stores nvidia.com/gpu, so the quota would keep that key (see below).
        assert order(plan) == [("add-canonical", "team")]


def test_usage_at_the_limit_and_finished_pods_do_not_block() -> None:
    objects = [eq("team", "team", {"nvidia.com/gpu": "2"}),
               {"kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
               {"kind": "Pod", "metadata": {"name": "old", "namespace": "team"}, "status": {"phase": "Succeeded"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}]
    assert plan_migration(objects).blocked == []


def test_revisit_lists_workloads_and_resourcequotas_but_not_pods() -> None:
    objects = [eq("team", "team", {"nvidia.com/gpu": "2"}),
               {"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "team"},
                "spec": {"hard": {"limits.nvidia.com/gpu": "2"}}},
               {"kind": "Deployment", "metadata": {"name": "train", "namespace": "team"},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}},
               {"kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}]
    # The quota's own entry (its pod still stores nvidia.com/gpu) is checked in the tests below.
    assert [item for item in plan_migration(objects).revisit if item["kind"] != "ElasticQuota"] == [
        {"kind": "Deployment", "namespace": "team", "name": "train", "check": "workload-legacy-gpu-request",
         "message": f'the webhook would rewrite: container "main" limits: nvidia.com/gpu: 1 -> {CORE}: 100, '
                    f"{RATIO}: 100"},
        {"kind": "ResourceQuota", "namespace": "team", "name": "rq", "check": "resourcequota-gpu-bypassed",
         "message": "limits limits.nvidia.com/gpu; after the webhook's rewrite GPU pods no longer request it"}]


def test_as_dict_is_plain_data() -> None:
    plan = plan_migration([eq("team", "team", {"nvidia.com/gpu": "1"})])
    assert plan.as_dict() == {"steps": [{"quota": "team", "namespace": "team", "phase": "convert",
                                         "before": {"min": {}, "max": {"nvidia.com/gpu": "1"}},
                                         "after": {"min": {}, "max": canonical("100")}}],
                              "blocked": [], "revisit": []}


UNREADABLE_TAIL = ("; where it sits in the tree and what its step would be are unknown, so no plan over these "
                   "quotas can be trusted: fix it and re-plan")


@pytest.mark.parametrize("all_at_once", [False, True])
def test_an_unreadable_quota_blocks_the_plan_and_the_others_are_still_planned(all_at_once: bool) -> None:
    bad = eq("bad", "team-b", {"nvidia.com/gpu": "lots"})
    nameless = {"kind": "ElasticQuota", "metadata": 3}
    files = {id(bad): "quotas/bad.yaml"}

    plan = plan_migration([bad, eq("team", "team", {"nvidia.com/gpu": "1"}), nameless], all_at_once=all_at_once,
                          origin=lambda obj: files.get(id(obj)))

    assert [(s.quota, s.phase, s.after["max"]) for s in plan.steps] == [("team", "convert", canonical("100"))]
    assert plan.blocked == [
        Blocked("bad", "team-b", "unreadable-quota",
                "quotas/bad.yaml: ElasticQuota team-b/bad cannot be read: spec.max[nvidia.com/gpu]: quantities must "
                "match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'lots'"
                + UNREADABLE_TAIL, "quotas/bad.yaml"),
        Blocked("", "", "unreadable-quota", "ElasticQuota ? cannot be read: metadata: expected an object"
                + UNREADABLE_TAIL)]
    assert plan.as_dict()["blocked"][0]["file"] == "quotas/bad.yaml"
    assert "file" not in plan.as_dict()["blocked"][1]


def test_a_child_of_an_unreadable_quota_is_blocked_as_such_not_as_missing_its_parent() -> None:
    plan = plan_migration([eq("org", "org", {"nvidia.com/gpu": []}, is_parent=True),  # type: ignore[dict-item]
                           eq("team", "team", {"nvidia.com/gpu": "1"}, parent="org")])

    assert [(b.quota, b.reason) for b in plan.blocked] == [("org", "unreadable-quota"), ("team", "unreadable-quota")]
    assert plan.blocked[1].message == ("ElasticQuota team/team is below org, an ElasticQuota that cannot be read: "
                                       "its step cannot be judged until that quota is fixed")


def test_an_admission_review_is_a_note_of_the_plan() -> None:
    review = {"kind": "AdmissionReview", "request": {"object": {"kind": "Pod"}}}

    plan = plan_migration([review, eq("team", "team", {"nvidia.com/gpu": "1"})],
                          origin=lambda obj: "review.json" if obj is review else None)

    assert plan.notes == ["review.json: AdmissionReview not planned: an AdmissionReview is a request to the webhook, "
                          "not an object of the cluster; `gpuquota explain -f FILE` answers it as the webhook would"]
    assert plan.as_dict()["notes"] == plan.notes
    assert [s.quota for s in plan.steps] == ["team"] and plan.blocked == []


# -- rollback ------------------------------------------------------------------------------------

PRE = "gpuquota.koord-gpuquota.io/pre-migration-spec"
IN_PROGRESS = "gpuquota.koord-gpuquota.io/migration"


def at(obj: dict[str, Any], spec: dict[str, dict[str, str]] | None, in_progress: bool = False) -> dict[str, Any]:
    """``obj`` as ``migrate apply`` leaves it: ``spec`` written, the original kept in the annotation."""
    if spec is None:
        return obj
    annotations = {PRE: json.dumps({"min": obj["spec"]["min"], "max": obj["spec"]["max"]}, sort_keys=True)}
    if in_progress:
        annotations[IN_PROGRESS] = "in-progress"
    return {**obj, "metadata": {**obj["metadata"], "annotations": annotations}, "spec": spec}


ORG = eq("org", "ops", {"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "4"}, is_parent=True)
TEAM = eq("team", "team", {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "2"}, parent="org")
ORG_UNION = {"min": canonical("400", **{"nvidia.com/gpu": "4"}), "max": canonical("800", **{"nvidia.com/gpu": "8"})}
TEAM_UNION = {"min": canonical("200", **{"nvidia.com/gpu": "2"}), "max": canonical("400", **{"nvidia.com/gpu": "4"})}
ORG_DONE = {"min": canonical("400"), "max": canonical("800")}
TEAM_DONE = {"min": canonical("200"), "max": canonical("400")}


def originals(*objects: dict[str, Any]) -> dict[tuple[str, str], dict[str, dict[str, str]]]:
    return originals_from_backup(objects)


def test_rollback_of_a_gated_tree_is_apply_in_reverse() -> None:
    live = [at(ORG, ORG_DONE), at(TEAM, TEAM_DONE)]
    result = plan_rollback(live)  # originals from the annotations
    assert [(s.phase, s.quota) for s in result.steps] == [
        ("re-add-legacy", "org"), ("re-add-legacy", "team"), ("restore", "team"), ("restore", "org")]
    steps = result.steps
    assert (steps[0].before, steps[0].after) == (ORG_DONE, ORG_UNION)
    assert (steps[1].before, steps[1].after) == (TEAM_DONE, TEAM_UNION)
    assert (steps[2].before, steps[2].after) == (TEAM_UNION, {"min": {"nvidia.com/gpu": "2"},
                                                              "max": {"nvidia.com/gpu": "4"}})
    assert (steps[3].before, steps[3].after) == (ORG_UNION, {"min": {"nvidia.com/gpu": "4"},
                                                             "max": {"nvidia.com/gpu": "8"}})
    assert (result.refused, result.unchanged) == ([], [])
    # The same steps from the backup (the objects as they were before apply).
    assert plan_rollback(live, originals(ORG, TEAM)).steps == steps


def test_rollback_keeps_child_max_keys_within_the_parent_at_every_step() -> None:
    keys = {"org": set(ORG_DONE["max"]), "team": set(TEAM_DONE["max"])}
    for step in plan_rollback([at(ORG, ORG_DONE), at(TEAM, TEAM_DONE)]).steps:
        assert set(step.before["max"]) == keys[step.quota]
        keys[step.quota] = set(step.after["max"])
        assert keys["team"] <= keys["org"], step
    assert keys == {"org": {"nvidia.com/gpu"}, "team": {"nvidia.com/gpu"}}


def test_rollback_after_a_partial_apply_undoes_only_what_was_done() -> None:
    # apply stopped after step 1 (add-canonical org): team was never written.
    result = plan_rollback([at(ORG, ORG_UNION, in_progress=True), TEAM], originals(ORG, TEAM))
    assert [(s.phase, s.quota, s.before, s.after) for s in result.steps] == [
        ("restore", "org", ORG_UNION, {"min": {"nvidia.com/gpu": "4"}, "max": {"nvidia.com/gpu": "8"}})]
    assert result.unchanged == ["team/team"]


def test_rollback_of_a_single_step_quota_and_quantity_spelling() -> None:
    solo = eq("solo", "solo", {"nvidia.com/gpu": "2"})
    # The apiserver may store 400 as "0.4k"-style spellings; equal quantities are the same state.
    stored = {"min": {}, "max": {CORE: "200", RATIO: "0.2k"}}
    result = plan_rollback([at(solo, stored)])
    assert [(s.phase, s.quota, s.after) for s in result.steps] == [
        ("restore", "solo", {"min": {}, "max": {"nvidia.com/gpu": "2"}})]


def test_rollback_refuses_a_quota_changed_since_the_migration_and_one_that_is_gone() -> None:
    raised = {"min": canonical("200"), "max": canonical("500")}
    result = plan_rollback([at(ORG, ORG_DONE), at(TEAM, raised)],
                           originals(ORG, TEAM, eq("gone", "gone", {"nvidia.com/gpu": "1"})))
    assert sorted((r.as_dict() for r in result.refused), key=lambda r: r["quota"]) == [
        {"quota": "gone", "namespace": "gone", "reason": "not found in the cluster; nothing to restore it onto"},
        # org alone cannot go back to nvidia.com/gpu while its child keeps canonical keys.
        {"quota": "org", "namespace": "ops", "reason": (
            f"its child team is not rolled back and keeps max keys [{CORE}, {RATIO}], which are not within its "
            "original [nvidia.com/gpu]: Koordinator refuses that update; roll back the whole tree together, or "
            "restore this quota by hand")},
        {"quota": "team", "namespace": "team", "reason": (
            f"changed since the migration: its spec is min {{{CORE}: 200, {RATIO}: 200}}; max {{{CORE}: 500, "
            f"{RATIO}: 500}}, which is neither the original (min {{nvidia.com/gpu: 2}}; max {{nvidia.com/gpu: 4}}) "
            "nor a state `gpuquota migrate apply` writes")}]
    assert [r.quota for r in result.refused] == ["gone", "org", "team"]
    assert [s.quota for s in result.steps] == ["org", "org"]  # shown, but the CLI writes nothing


def test_rollback_of_part_of_a_tree_is_refused_both_ways() -> None:
    live = [at(ORG, ORG_DONE), at(TEAM, TEAM_DONE)]
    only_team = plan_rollback(live, originals(TEAM))
    assert [r.as_dict() for r in only_team.refused] == [{"quota": "team", "namespace": "team", "reason": (
        f"its original max keys [nvidia.com/gpu] are not within those of its parent org [{CORE}, {RATIO}], "
        "which is not rolled back: Koordinator refuses that update; roll back the whole tree together, or restore "
        "this quota by hand")}]
    only_org = plan_rollback(live, originals(ORG))
    assert [r.quota for r in only_org.refused] == ["org"]
    assert only_org.refused[0].reason.startswith("its child team is not rolled back")
    # A child that is not rolled back is fine when its max keys fit the parent's restored ones.
    cpu_child = eq("cpu", "cpu", {}, parent="org")
    assert plan_rollback([at(ORG, ORG_DONE), cpu_child], originals(ORG)).refused == []


def test_rollback_with_nothing_to_do_and_annotation_only_cleanup() -> None:
    assert plan_rollback([ORG, TEAM], originals(ORG, TEAM)).as_dict() == {
        "steps": [], "refused": [], "unchanged": ["ops/org", "team/team"]}
    assert plan_rollback([ORG, TEAM]).as_dict() == {"steps": [], "refused": [], "unchanged": []}
    # Spec already back (by hand) but the annotation is still there: one update that drops it.
    marked = at(TEAM, {"min": {"nvidia.com/gpu": "2"}, "max": {"nvidia.com/gpu": "4"}})
    steps = plan_rollback([marked]).steps
    assert [(s.phase, s.quota) for s in steps] == [("restore", "team")]
    assert steps[0].before == steps[0].after == {"min": {"nvidia.com/gpu": "2"}, "max": {"nvidia.com/gpu": "4"}}


def test_rollback_sources_that_cannot_be_read_name_the_quota() -> None:
    broken = {**TEAM, "metadata": {**TEAM["metadata"], "annotations": {PRE: "{not json"}}}
    with pytest.raises(RollbackSourceError, match=rf"^ElasticQuota team/team: annotation {PRE} is not a JSON"):
        original_from_annotation(broken)
    # In a plan it is a refusal by name (nothing is written), never the end of the other quotas.
    assert plan_rollback([broken]).as_dict()["refused"] == [
        {"quota": "team", "namespace": "team", "reason": f"annotation {PRE} is not a JSON object with min and max: "
                                                         "its original spec is unknown, so it cannot be restored; "
                                                         "restore it by hand"}]
    assert original_from_annotation(TEAM) is None
    with pytest.raises(RollbackSourceError, match=r"an ElasticQuota in the backup has no metadata\.name"):
        originals_from_backup([{"kind": "ElasticQuota", "metadata": {}, "spec": {}}])
    assert originals_from_backup([{"kind": "ConfigMap", "metadata": {"name": "x"}}]) == {}


def test_a_backup_item_that_cannot_be_read_is_refused_naming_the_file_and_the_others_read() -> None:
    nameless = {"kind": "ElasticQuota", "metadata": {"namespace": "lab"}, "spec": {}}
    unparsable = {"kind": "ElasticQuota", "metadata": {"name": "odd", "namespace": "lab"}, "spec": {"min": "none"}}
    backup = read_backup([ORG, nameless, unparsable, TEAM], "b.yaml")
    assert sorted(backup.originals) == [("ops", "org"), ("team", "team")]
    assert backup.parents == {("ops", "org"): "koordinator-root-quota", ("team", "team"): "org"}
    tail = ("; its original spec is unknown, so it cannot be restored: fix that item of the backup and run "
            "rollback again")
    assert [r.as_dict() for r in backup.refused] == [
        {"quota": "?", "namespace": "lab", "reason": "in the backup b.yaml: cannot be read: metadata.name: missing"
                                                     + tail},
        {"quota": "odd", "namespace": "lab", "reason": "in the backup b.yaml: cannot be read: spec.min: expected an "
                                                       "object, got str" + tail}]


# -- quotas that do not fit in a tree block their step -------------------------------------------


def test_a_missing_parent_blocks_the_quotas_step() -> None:
    # Before: a one-step convert, planned as if the parent were the root.
    for all_at_once in (False, True):
        plan = plan_migration([eq("team", "t", {"nvidia.com/gpu": "2"}, parent="gone")], all_at_once=all_at_once)
        assert order(plan) == [("convert", "team")]
        assert plan.blocked[0] == Blocked(
            "team", "t", "quota-parent-missing",
            "ElasticQuota t/team names parent gone (label quota.scheduling.koordinator.sh/parent), which does not "
            "exist: no ancestor limits its pods; create the parent first or fix the label")
    # A canonical quota with a missing parent has no step, so it blocks nothing here (the audit reports it).
    assert plan_migration([eq("team", "t", canonical("200"), parent="gone"),
                           eq("solo", "s", {"nvidia.com/gpu": "1"})]).blocked == []


def test_a_repeated_name_and_a_cycle_block_the_plan() -> None:
    copies = plan_migration([eq("team", "a", {"nvidia.com/gpu": "2"}), eq("team", "b", {"nvidia.com/gpu": "4"})])
    assert [(b.quota, b.namespace, b.reason) for b in copies.blocked] == [
        ("team", "a", "quota-duplicate-name"), ("team", "b", "quota-duplicate-name")]
    cycle = plan_migration([eq("a", "t", {"nvidia.com/gpu": "2"}, parent="b", is_parent=True),
                            eq("b", "t", {"nvidia.com/gpu": "2"}, parent="a", is_parent=True)],
                           update_resource_key_gate=True)
    assert {(b.quota, b.reason) for b in cycle.blocked} == {("a", "quota-parent-cycle"), ("b", "quota-parent-cycle")}


def test_a_step_gpuquotas_own_webhook_would_refuse_blocks_the_plan() -> None:
    # min above max stays above max once converted: apply's dry run would stop at this step.
    plan = plan_migration([eq("team", "t", {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "3"})])
    assert plan.blocked == [Blocked(
        "team", "t", "refused-by-webhook",
        "step 1 (convert t/team) would be refused by gpuquota's ElasticQuota webhook: spec.min of t/team is above "
        f"spec.max in canonical units for: {CORE} (300 > 200), {RATIO} (300 > 200)")]


def test_the_webhook_replay_admits_every_state_a_gated_migration_passes_through() -> None:
    # add-canonical names both families: admitted because apply marks the quota as migrating.
    plan = plan_migration(TREE, update_resource_key_gate=True)
    assert [b for b in plan.blocked if b.reason == "refused-by-webhook"] == []
    assert any(step.phase == "add-canonical" for step in plan.steps)


# -- pods that still store vendor names (koord-scheduler counts them only under those names) ------

def vendor_pod(name: str, namespace: str, cards: str = "1", quota: str | None = None) -> dict[str, Any]:
    labels = {QUOTA_LABEL: quota} if quota else {}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": cards}}}]}}


def test_a_quota_with_running_vendor_pods_keeps_its_vendor_keys_beside_the_canonical_ones() -> None:
    plan = plan_migration([eq("team", "team", {"nvidia.com/gpu": "4"}), vendor_pod("p", "team"),
                           vendor_pod("q", "team", cards="0")])

    (step,) = plan.steps
    assert (step.phase, step.after["max"]) == ("add-canonical", {"nvidia.com/gpu": "4", **canonical("400")})
    (note,) = [item for item in plan.revisit if item["check"] == "vendor-pods-running"]
    assert note["name"] == "team" and note["message"].startswith(
        "keeps nvidia.com/gpu beside the canonical keys: 1 pod(s) charged to it still store nvidia.com/gpu (team/p)")
    assert not plan.blocked


def test_once_the_vendor_pods_are_replaced_the_next_plan_drops_the_vendor_keys() -> None:
    kept = eq("team", "team", {"nvidia.com/gpu": "4", **canonical("400")})
    kept["metadata"]["annotations"] = {"gpuquota.koord-gpuquota.io/migration": "in-progress"}
    rewritten = vendor_pod("p", "team")
    rewritten["spec"]["containers"][0]["resources"]["limits"] = canonical("100")

    plan = plan_migration([kept, rewritten])

    assert [(s.phase, s.after["max"]) for s in plan.steps] == [("convert", canonical("400"))]
    assert not [item for item in plan.revisit if item["check"] == "vendor-pods-running"]


def test_with_the_gate_a_tree_keeps_vendor_keys_from_the_root_down_to_the_leaf_with_vendor_pods() -> None:
    objects = [eq("org", "ops", {"nvidia.com/gpu": "8"}, is_parent=True),
               eq("busy", "busy", {"nvidia.com/gpu": "4"}, parent="org"),
               eq("idle", "idle", {"nvidia.com/gpu": "4"}, parent="org"), vendor_pod("p", "busy")]

    plan = plan_migration(objects, update_resource_key_gate=True)

    assert order(plan) == [("add-canonical", "org"), ("add-canonical", "busy"), ("add-canonical", "idle"),
                           ("drop-legacy", "idle")]
    assert {item["name"] for item in plan.revisit if item["check"] == "vendor-pods-running"} == {"org", "busy"}


def test_a_vendor_leaf_under_a_canonical_parent_converts_and_warns_that_koord_scheduler_will_not_count_its_pods(
) -> None:
    objects = [eq("org", "ops", canonical("800"), is_parent=True),
               eq("team", "team", {"nvidia.com/gpu": "4"}, parent="org"), vendor_pod("p", "team")]

    plan = plan_migration(objects)

    assert order(plan) == [("convert", "team")]
    (note,) = [item for item in plan.revisit if item["check"] == "vendor-pods-running"]
    assert note["message"].startswith("koord-scheduler will not count these pods in this quota after the step: ")
    assert "below its parent org" in note["message"]


def _quota_object(**metadata: object) -> dict[str, object]:
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "team", "namespace": "ml", "uid": "u1", "resourceVersion": "10",
                         "labels": {"quota.scheduling.koordinator.sh/parent": "org"},
                         "annotations": {"note": "kept"}, **metadata},
            "spec": {"max": {"nvidia.com/gpu": "4"}}}


def test_only_koordinators_usage_summaries_and_status_count_as_its_bookkeeping() -> None:
    read = _quota_object()
    summaries = _quota_object(resourceVersion="11", annotations={
        "note": "kept", "quota.scheduling.koordinator.sh/runtime": '{"nvidia.com/gpu":"2"}',
        "quota.scheduling.koordinator.sh/request": '{"nvidia.com/gpu":"3"}'})
    summaries["status"] = {"used": {"nvidia.com/gpu": "2"}}
    assert changed_only_by_koordinator_bookkeeping(read, summaries)
    # Anything the step was planned from, or anyone else's edit, is not.
    assert not changed_only_by_koordinator_bookkeeping(read, {**read, "spec": {"max": {"nvidia.com/gpu": "6"}}})
    assert not changed_only_by_koordinator_bookkeeping(read, _quota_object(labels={}))
    assert not changed_only_by_koordinator_bookkeeping(read, _quota_object(annotations={"note": "edited"}))
    assert not changed_only_by_koordinator_bookkeeping(read, _quota_object(uid="u2"))  # deleted and recreated
    assert not changed_only_by_koordinator_bookkeeping(read, _quota_object(deletionTimestamp="2026-12-07T12:00:00Z"))
