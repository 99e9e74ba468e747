"""``gpuquota migrate plan`` on manifest files, and ``migrate rollback`` without a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import cli


def quota(name: str, parent: str | None, cards: str, is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/is-parent": "true" if is_parent else "false"}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": name, "labels": labels},
            "spec": {"min": {"nvidia.com/gpu": cards}, "max": {"nvidia.com/gpu": cards}}}


TREE = [quota("org", None, "4", is_parent=True), quota("team", "org", "2"),
        {"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "team"},
         "spec": {"hard": {"limits.nvidia.com/gpu": "2"}}}]


def plan(tmp_path: Path, *args: str, exit_code: int = 0) -> Any:
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump_all(TREE))
    result = CliRunner().invoke(cli, ["migrate", "plan", "-f", str(path), *args])
    assert result.exit_code == exit_code, result.output
    return result.stdout


def test_gate_on_adds_top_down_then_drops_bottom_up(tmp_path: Path) -> None:
    steps = json.loads(plan(tmp_path, "--update-resource-key-gate", "-o", "json"))["steps"]
    assert [(s["phase"], s["quota"]) for s in steps] == [
        ("add-canonical", "org"), ("add-canonical", "team"), ("drop-legacy", "team"), ("drop-legacy", "org")]
    assert steps[-1]["after"]["max"] == {"koordinator.sh/gpu-core": "400", "koordinator.sh/gpu-memory-ratio": "400"}
    # Every intermediate state keeps child max keys within the parent's.
    state = {"org": set(steps[0]["before"]["max"]), "team": set(steps[1]["before"]["max"])}
    for step in steps:
        state[step["quota"]] = set(step["after"]["max"])
        assert state["team"] <= state["org"]


def test_gate_off_reports_blocked_tree(tmp_path: Path) -> None:
    out = plan(tmp_path, exit_code=1)
    assert "-  max.nvidia.com/gpu: 4" in out and "+  max.koordinator.sh/gpu-core: 400" in out
    lines = out.splitlines()
    # What blocks the plan comes first, once per reason, and its steps are marked.
    assert lines[0].startswith("BLOCKED: quotas org, team are in a multi-level tree")
    assert lines[0].endswith(" [multi-level-tree]") and sum(line.startswith("BLOCKED") for line in lines) == 1
    assert lines[1] == "# step 1: convert ElasticQuota org/org (BLOCKED)"
    assert "REVISIT: ResourceQuota team/rq: limits limits.nvidia.com/gpu" in out


def test_usage_over_new_limit_is_blocked(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "team",
                                       "labels": {"quota.scheduling.koordinator.sh/name": "team"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}
    path.write_text(yaml.safe_dump_all([*TREE, pod]))
    result = CliRunner().invoke(cli, ["migrate", "plan", "-o", "json", "-f", str(path)])
    assert result.exit_code == 1
    blocked = json.loads(result.stdout)["blocked"]
    over = [b for b in blocked if b["reason"] == "over-limit"]
    assert [(b["quota"], b["namespace"]) for b in over] == [("team", "team")]
    assert over[0]["message"].startswith("quota team: canonical usage exceeds the limit: koordinator.sh/gpu-core "
                                         "300 > 200")


# -- rollback, without a cluster -----------------------------------------------------------------

PRE = "gpuquota.koord-gpuquota.io/pre-migration-spec"
IN_PROGRESS = "gpuquota.koord-gpuquota.io/migration"
CANONICAL_400 = {"koordinator.sh/gpu-core": "400", "koordinator.sh/gpu-memory-ratio": "400"}


def migrated(obj: dict[str, Any], spec: dict[str, dict[str, str]]) -> dict[str, Any]:
    annotations = {PRE: json.dumps(obj["spec"], sort_keys=True), "team.example/owner": "ml"}
    return {**obj, "metadata": {**obj["metadata"], "annotations": annotations, "resourceVersion": "42"},
            "spec": spec}


def rollback(monkeypatch: pytest.MonkeyPatch, live: list[dict[str, Any]], *args: str) -> tuple[int, str, str]:
    """``migrate rollback`` against ``live`` as the cluster listing (client dry run: nothing is sent)."""
    monkeypatch.setattr("cli.migrate._live_objects", lambda kubeconfig, context: live)
    result = CliRunner().invoke(cli, ["migrate", "rollback", *args])
    return result.exit_code, result.stdout, result.stderr


def test_rollback_client_dry_run_prints_the_reverse_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    org, team = TREE[0], TREE[1]
    live = [migrated(org, {"min": CANONICAL_400, "max": CANONICAL_400}),
            migrated(team, {"min": dict.fromkeys(CANONICAL_400, "200"), "max": dict.fromkeys(CANONICAL_400, "200")})]

    code, out, err = rollback(monkeypatch, live, "--dry-run", "client")

    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "# step 1: re-add-legacy ElasticQuota org/org",
        "+  min.nvidia.com/gpu: 4", "+  max.nvidia.com/gpu: 4",
        "# step 2: re-add-legacy ElasticQuota team/team",
        "+  min.nvidia.com/gpu: 2", "+  max.nvidia.com/gpu: 2",
        "# step 3: restore ElasticQuota team/team",
        "-  min.koordinator.sh/gpu-core: 200", "-  min.koordinator.sh/gpu-memory-ratio: 200",
        "-  max.koordinator.sh/gpu-core: 200", "-  max.koordinator.sh/gpu-memory-ratio: 200",
        "# step 4: restore ElasticQuota org/org",
        "-  min.koordinator.sh/gpu-core: 400", "-  min.koordinator.sh/gpu-memory-ratio: 400",
        "-  max.koordinator.sh/gpu-core: 400", "-  max.koordinator.sh/gpu-memory-ratio: 400",
        "would apply step 1: re-add-legacy ElasticQuota org/org",
        "would apply step 2: re-add-legacy ElasticQuota team/team",
        "would apply step 3: restore ElasticQuota team/team",
        "would apply step 4: restore ElasticQuota org/org",
    ]
    # -n keeps only that namespace's quotas; the rest of the tree is still read, and a child cannot
    # go back to nvidia.com/gpu under a parent that keeps canonical keys only.
    code, out, err = rollback(monkeypatch, live, "--dry-run", "client", "-n", "team")
    assert (code, out) == (1, "")
    assert err.splitlines()[0].startswith(
        "REFUSED: ElasticQuota team/team: its original max keys [nvidia.com/gpu] are not within those of its "
        "parent org [koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio], which is not rolled back")


def test_rollback_refuses_everything_when_one_quota_changed(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    org, team = TREE[0], TREE[1]
    backup = tmp_path / "backup.yaml"
    backup.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [org, team]}))
    live = [migrated(org, {"min": CANONICAL_400, "max": CANONICAL_400}),
            {**team, "spec": {"min": {"nvidia.com/gpu": "2"}, "max": {"nvidia.com/gpu": "3"}}}]

    code, out, err = rollback(monkeypatch, live, "-f", str(backup))

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "REFUSED: ElasticQuota team/team: changed since the migration: its spec is min {nvidia.com/gpu: 2}; "
        "max {nvidia.com/gpu: 3}, which is neither the original (min {nvidia.com/gpu: 2}; max {nvidia.com/gpu: 2}) "
        "nor a state `gpuquota migrate apply` writes",
        "nothing written: fix or restore each refused quota by hand (or leave another namespace's out with -n), "
        "then run rollback again"]


def test_rollback_with_nothing_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert rollback(monkeypatch, TREE) == (
        0, f"nothing to roll back: no ElasticQuota differs from the {PRE} annotation\n", "")
    backup = tmp_path / "backup.yaml"
    backup.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": TREE[:2]}))
    assert rollback(monkeypatch, TREE, "-f", str(backup)) == (
        0, f"nothing to roll back: no ElasticQuota differs from {backup}\n",
        "unchanged: ElasticQuota org/org already has its original spec\n"
        "unchanged: ElasticQuota team/team already has its original spec\n")


def test_rollback_bad_backup_files_are_one_line_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    result = CliRunner().invoke(cli, ["migrate", "rollback", "-f", str(missing)])
    assert (result.exit_code, result.stderr) == (2, f"Error: {missing}: no such file or directory\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"kind": "List", "items": [TREE[2]]}))
    result = CliRunner().invoke(cli, ["migrate", "rollback", "-f", str(empty)])
    assert (result.exit_code, result.stderr) == (
        2, f"Error: {empty}: no ElasticQuota in this file; is it a `migrate apply --backup` file?\n")
    result = CliRunner().invoke(cli, ["migrate", "rollback", "--dry-run", "yes"])
    assert result.exit_code == 2


BROKEN_DETAIL = ("spec.max[nvidia.com/gpu]: quantities must match the regular expression "
                 "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'lots'")
TEAM_CHANGED = ("REFUSED: ElasticQuota team/team: changed since the migration: its spec is min {nvidia.com/gpu: 2}; "
                "max {nvidia.com/gpu: 3}, which is neither the original (min {nvidia.com/gpu: 2}; max "
                "{nvidia.com/gpu: 2}) nor a state `gpuquota migrate apply` writes")


def test_rollback_refuses_an_unreadable_live_quota_by_name_and_still_judges_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: one `Error:` line for the unreadable quota, and nothing about the others.
    org, team = TREE[0], TREE[1]
    live = [migrated(org, {"min": CANONICAL_400, "max": CANONICAL_400}),
            migrated(team, {"min": {"nvidia.com/gpu": "2"}, "max": {"nvidia.com/gpu": "3"}}), UNREADABLE]

    code, out, err = rollback(monkeypatch, live, "--dry-run", "client")

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"REFUSED: ElasticQuota lab/broken: in the cluster: cannot be read: {BROKEN_DETAIL}; where it sits in the "
        "tree is unknown, so no rollback over these quotas can be trusted: fix it and run rollback again",
        TEAM_CHANGED,
        "nothing written: fix or restore each refused quota by hand (or leave another namespace's out with -n), "
        "then run rollback again"]


def test_rollback_refuses_an_unreadable_annotation_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    org, team = TREE[0], TREE[1]
    bad = migrated(team, {"min": CANONICAL_400, "max": CANONICAL_400})
    bad["metadata"]["annotations"][PRE] = "[1, 2]"
    live = [migrated(org, {"min": CANONICAL_400, "max": CANONICAL_400}), bad]

    code, out, err = rollback(monkeypatch, live, "--dry-run", "client")

    assert (code, out) == (1, "")
    # Its parent org is still judged: it cannot go back to nvidia.com/gpu above a canonical child.
    assert err.splitlines()[0].startswith("REFUSED: ElasticQuota org/org: its child team is not rolled back")
    assert err.splitlines()[1] == (
        f"REFUSED: ElasticQuota team/team: annotation {PRE} is not a JSON object with min and max: its original "
        "spec is unknown, so it cannot be restored; restore it by hand")


def test_rollback_refuses_an_unreadable_backup_item_naming_the_file(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    org, team = TREE[0], TREE[1]
    backup = tmp_path / "backup.yaml"
    backup.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [org, team, UNREADABLE]}))
    live = [migrated(org, {"min": CANONICAL_400, "max": CANONICAL_400}),
            {**team, "spec": {"min": {"nvidia.com/gpu": "2"}, "max": {"nvidia.com/gpu": "3"}}}]

    code, out, err = rollback(monkeypatch, live, "-f", str(backup))

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"REFUSED: ElasticQuota lab/broken: in the backup {backup}: cannot be read: {BROKEN_DETAIL}; its original "
        "spec is unknown, so it cannot be restored: fix that item of the backup and run rollback again",
        TEAM_CHANGED,
        "nothing written: fix or restore each refused quota by hand (or leave another namespace's out with -n), "
        "then run rollback again"]
    # -n leaves out what the backup holds for other namespaces, the unreadable item included.
    code, out, err = rollback(monkeypatch, live, "-f", str(backup), "-n", "org", "--dry-run", "client")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "# step 1: re-add-legacy ElasticQuota org/org"


def test_rollback_request_bodies_mark_the_union_state_and_drop_the_annotations() -> None:
    from cli.migrate import _restored
    from gpuquota_core.migration import Step

    live = migrated(TREE[0], {"min": CANONICAL_400, "max": CANONICAL_400})
    union = {"min": {"nvidia.com/gpu": "4"}, "max": {"nvidia.com/gpu": "4", **CANONICAL_400}}
    body = _restored(live, Step("org", "org", "re-add-legacy", live["spec"], union))
    assert body["spec"] == union
    assert body["metadata"]["resourceVersion"] == "42"  # the precondition: exactly the version read
    assert body["metadata"]["annotations"] == {**live["metadata"]["annotations"], IN_PROGRESS: "in-progress"}
    body = _restored(body, Step("org", "org", "restore", union, TREE[0]["spec"]))
    assert body["spec"] == TREE[0]["spec"]
    assert body["metadata"]["annotations"] == {"team.example/owner": "ml"}
    assert live["metadata"]["annotations"][PRE]  # the listed object itself is not modified


def test_a_missing_parent_blocks_the_plan_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(quota("team", "gone", "2")))
    result = CliRunner().invoke(cli, ["migrate", "plan", "-f", str(path)])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("BLOCKED: ElasticQuota team/team names parent gone") and lines[0].endswith(
        " [quota-parent-missing]")
    assert lines[1] == "# step 1: convert ElasticQuota team/team (BLOCKED)"
    result = CliRunner().invoke(cli, ["migrate", "plan", "-f", str(path), "-o", "json"])
    assert result.exit_code == 1
    [blocked] = json.loads(result.stdout)["blocked"]
    assert {key: blocked[key] for key in ("quota", "namespace", "reason")} == {
        "quota": "team", "namespace": "team", "reason": "quota-parent-missing"}


# -- an unreadable ElasticQuota: blocked, named with its file; the others still planned ------------

UNREADABLE = {"kind": "ElasticQuota", "metadata": {"name": "broken", "namespace": "lab"},
              "spec": {"max": {"nvidia.com/gpu": "lots"}}}
UNREADABLE_LINE = ("ElasticQuota lab/broken cannot be read: spec.max[nvidia.com/gpu]: quantities must match the "
                   "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'lots'; where it sits in the "
                   "tree and what its step would be are unknown, so no plan over these quotas can be trusted: fix it "
                   "and re-plan [unreadable-quota]")


def test_an_unreadable_quota_blocks_the_plan_and_the_others_are_still_shown(tmp_path: Path) -> None:
    (tmp_path / "tree.yaml").write_text(yaml.safe_dump_all(TREE))
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(UNREADABLE))

    result = CliRunner().invoke(cli, ["migrate", "plan", "--update-resource-key-gate", "-f", str(tmp_path)])

    assert (result.exit_code, result.stderr) == (1, "")
    lines = result.stdout.splitlines()
    assert lines[0] == f"BLOCKED: {broken}: {UNREADABLE_LINE}"
    assert [line for line in lines if line.startswith("# step")] == [
        "# step 1: add-canonical ElasticQuota org/org", "# step 2: add-canonical ElasticQuota team/team",
        "# step 3: drop-legacy ElasticQuota team/team", "# step 4: drop-legacy ElasticQuota org/org"]
    result = CliRunner().invoke(cli, ["migrate", "plan", "--update-resource-key-gate", "-f", str(tmp_path),
                                      "-o", "json"])
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert [{key: b[key] for key in ("quota", "namespace", "reason", "file")} for b in document["blocked"]] == [
        {"quota": "broken", "namespace": "lab", "reason": "unreadable-quota", "file": str(broken)}]
    assert len(document["steps"]) == 4


def test_apply_writes_nothing_when_a_quota_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cli.migrate._live_objects", lambda kubeconfig, context: [*TREE, UNREADABLE])

    result = CliRunner().invoke(cli, ["migrate", "apply", "--dry-run", "client", "--update-resource-key-gate"])

    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == f"BLOCKED: {UNREADABLE_LINE}"
    assert "would apply" not in result.stdout
    assert result.stderr == "nothing written: the plan is blocked\n"
