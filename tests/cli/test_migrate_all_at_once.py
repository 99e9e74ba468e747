"""``gpuquota migrate plan|apply|rollback --all-at-once`` without a cluster (files, client dry runs, bodies)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import cli

PARENT = "quota.scheduling.koordinator.sh/parent"
PRE = "gpuquota.koord-gpuquota.io/pre-migration-spec"
IN_PROGRESS = "gpuquota.koord-gpuquota.io/migration"
ROOT = "koordinator-root-quota"
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def quota(name: str, parent: str | None, cards: str, is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/is-parent": "true" if is_parent else "false"}
    if parent:
        labels[PARENT] = parent
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": "ml", "labels": labels,
                                                 "resourceVersion": "7"},
            "spec": {"min": {}, "max": {"nvidia.com/gpu": cards}}}


TREE = [quota("org", None, "8", is_parent=True), quota("dept", "org", "6", is_parent=True),
        quota("team", "dept", "4")]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def write_tree(tmp_path: Path) -> Path:
    path = tmp_path / "tree.yaml"
    path.write_text(yaml.safe_dump_all(TREE))
    return path


def test_plan_shows_the_moves_and_the_window(tmp_path: Path) -> None:
    code, out, err = invoke("migrate", "plan", "--all-at-once", "-f", str(write_tree(tmp_path)))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:7] == [
        "# step 1: detach-convert ElasticQuota ml/team",
        "+  max.koordinator.sh/gpu-core: 400", "+  max.koordinator.sh/gpu-memory-ratio: 400",
        "-  max.nvidia.com/gpu: 4",
        f"-  metadata.labels.{PARENT}: dept", f"+  metadata.labels.{PARENT}: {ROOT}",
        "# step 2: detach-convert ElasticQuota ml/dept",
    ]
    assert "# step 3: reattach ElasticQuota ml/team" in lines
    assert [line.split(":")[0] for line in lines if line.startswith("# step")] == [
        "# step 1", "# step 2", "# step 3", "# step 4", "# step 5"]
    window = [line for line in lines if line.startswith("WINDOW: ")]
    assert window[0].startswith("WINDOW: steps 1-5 are one maintenance window")
    assert f"WINDOW: steps 1-3: team is detached from dept: pods in its subtree are limited by its own max " \
           f"{{{CORE}: 400, {RATIO}: 400}} (canonical units) and not by dept's max {{{CORE}: 600, {RATIO}: 600}} " \
           "nor by org above it" in window
    assert not any(line.startswith("BLOCKED") for line in lines)
    # Without the flag the same tree is blocked, as before.
    assert "BLOCKED: quotas org, dept, team are in a multi-level tree" in invoke(
        "migrate", "plan", "-f", str(tmp_path / "tree.yaml"))[1]


def test_plan_json_carries_parents_and_window(tmp_path: Path) -> None:
    code, out, _ = invoke("migrate", "plan", "--all-at-once", "-o", "json", "-f", str(write_tree(tmp_path)))
    plan = json.loads(out)
    assert code == 0
    assert [(s["phase"], s["quota"], s.get("parent")) for s in plan["steps"]] == [
        ("detach-convert", "team", {"before": "dept", "after": ROOT}),
        ("detach-convert", "dept", {"before": "org", "after": ROOT}),
        ("reattach", "team", {"before": ROOT, "after": "dept"}),
        ("convert", "org", None),
        ("reattach", "dept", {"before": ROOT, "after": "org"})]
    assert plan["blocked"] == [] and len(plan["window"]) == 5  # overview, 2 detached, 2 parents


def test_all_at_once_and_the_gate_exclude_each_other(tmp_path: Path) -> None:
    for command in (["plan", "-f", str(write_tree(tmp_path))], ["apply", "--backup", str(tmp_path / "b.yaml")]):
        code, _, err = invoke("migrate", *command, "--all-at-once", "--update-resource-key-gate")
        assert code == 2
        assert err.startswith("Error: --all-at-once is for ElasticQuotaEnableUpdateResourceKey off")


def test_apply_client_dry_run_prints_the_window_and_the_steps(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setattr("cli.migrate._live_objects", lambda kubeconfig, context: TREE)
    code, out, err = invoke("migrate", "apply", "--all-at-once", "--dry-run", "client",
                            "--backup", str(tmp_path / "b.yaml"))
    assert code == 0
    assert out.splitlines() == [
        "would apply step 1: detach-convert ElasticQuota ml/team",
        "would apply step 2: detach-convert ElasticQuota ml/dept",
        "would apply step 3: reattach ElasticQuota ml/team",
        "would apply step 4: convert ElasticQuota ml/org",
        "would apply step 5: reattach ElasticQuota ml/dept"]
    assert err.startswith("WINDOW: steps 1-5 are one maintenance window")
    assert not (tmp_path / "b.yaml").exists()


def test_apply_bodies_move_the_label_record_the_parent_and_mark_the_window() -> None:
    from cli.migrate import _updated_all_at_once
    from gpuquota_core.migration import Step

    team = TREE[2]
    legacy = {"min": {}, "max": {"nvidia.com/gpu": "4"}}
    done = {"min": {}, "max": {CORE: "400", RATIO: "400"}}
    body = _updated_all_at_once(team, Step("team", "ml", "detach-convert", legacy, done, "dept", ROOT))
    assert body["spec"] == done
    assert body["metadata"]["labels"][PARENT] == ROOT
    assert body["metadata"]["resourceVersion"] == "7"  # the precondition
    assert json.loads(body["metadata"]["annotations"][PRE]) == {**legacy, "parent": "dept"}
    assert body["metadata"]["annotations"][IN_PROGRESS] == "in-progress"
    body = _updated_all_at_once(body, Step("team", "ml", "reattach", done, done, ROOT, "dept"))
    assert body["metadata"]["labels"][PARENT] == "dept"
    assert json.loads(body["metadata"]["annotations"][PRE]) == {**legacy, "parent": "dept"}  # the original kept
    assert IN_PROGRESS not in body["metadata"]["annotations"]
    assert team["metadata"]["labels"][PARENT] == "dept" and "annotations" not in team["metadata"]


def test_rollback_detects_an_all_at_once_run_and_prints_its_reverse(monkeypatch: pytest.MonkeyPatch) -> None:
    def migrated(obj: dict[str, Any], percent: str) -> dict[str, Any]:
        parent = obj["metadata"]["labels"].get(PARENT, ROOT)
        annotations = {PRE: json.dumps({**obj["spec"], "parent": parent}, sort_keys=True)}
        return {**obj, "metadata": {**obj["metadata"], "annotations": annotations},
                "spec": {"min": {}, "max": {CORE: percent, RATIO: percent}}}

    live = [migrated(TREE[0], "800"), migrated(TREE[1], "600"), migrated(TREE[2], "400")]
    monkeypatch.setattr("cli.migrate._live_objects", lambda kubeconfig, context: live)
    code, out, err = invoke("migrate", "rollback", "--dry-run", "client")
    assert (code, err) == (0, "")
    assert [line for line in out.splitlines() if line.startswith("would apply")] == [
        "would apply step 1: detach-restore ElasticQuota ml/team",
        "would apply step 2: detach-restore ElasticQuota ml/dept",
        "would apply step 3: reattach ElasticQuota ml/team",
        "would apply step 4: restore ElasticQuota ml/org",
        "would apply step 5: reattach ElasticQuota ml/dept"]


def test_rollback_bodies_restore_the_label_and_drop_the_annotations() -> None:
    from cli.migrate import _restored
    from gpuquota_core.migration import Step

    legacy = {"min": {}, "max": {"nvidia.com/gpu": "4"}}
    done = {"min": {}, "max": {CORE: "400", RATIO: "400"}}
    live = {**TREE[2], "spec": done,
            "metadata": {**TREE[2]["metadata"], "annotations": {PRE: json.dumps({**legacy, "parent": "dept"})}}}
    body = _restored(live, Step("team", "ml", "detach-restore", done, legacy, "dept", ROOT))
    assert (body["spec"], body["metadata"]["labels"][PARENT]) == (legacy, ROOT)
    assert body["metadata"]["annotations"][IN_PROGRESS] == "in-progress"
    body = _restored(body, Step("team", "ml", "reattach", legacy, legacy, ROOT, "dept"))
    assert body["metadata"]["labels"] == TREE[2]["metadata"]["labels"]
    assert body["metadata"]["annotations"] == {}


def test_all_at_once_plan_blocks_on_an_unreadable_quota_and_still_shows_the_procedure(tmp_path: Path) -> None:
    write_tree(tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"kind": "ElasticQuota", "metadata": {"name": "lab", "namespace": "ml"},
                                      "spec": {"min": "none"}}))

    code, out, err = invoke("migrate", "plan", "--all-at-once", "-f", str(tmp_path))

    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == (f"BLOCKED: {broken}: ElasticQuota ml/lab cannot be read: spec.min: expected an object, "
                        "got str; where it sits in the tree and what its step would be are unknown, so no plan over "
                        "these quotas can be trusted: fix it and re-plan [unreadable-quota]")
    assert [line.split(":")[0] for line in lines if line.startswith("# step")] == [
        "# step 1", "# step 2", "# step 3", "# step 4", "# step 5"]
    assert any(line.startswith("WINDOW: steps 1-5 are one maintenance window") for line in lines)
