"""``gpuquota migrate apply|rollback`` on the real apiserver, with the project's webhook validating each step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from controlplane import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION, Api
from kubernetes import client as k8s
from webhookproc import WebhookProcess

from cli.main import cli

PARENT_LABEL = "quota.scheduling.koordinator.sh/parent"
IS_PARENT_LABEL = "quota.scheduling.koordinator.sh/is-parent"
CANONICAL = ("koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio")


def eq(api: Api, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = api.custom.get_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, name)
    return found


@pytest.fixture
def legacy_tree(webhook_server: WebhookProcess, api: Api, namespace: str) -> tuple[str, str, str]:
    """A legacy two-level tree: parent max 8 cards, child max 4 cards (min 2)."""
    parent, child = f"org-{namespace}", f"team-{namespace}"
    for name, labels, spec in (
            (parent, {IS_PARENT_LABEL: "true"}, {"max": {"nvidia.com/gpu": "8"}, "min": {"nvidia.com/gpu": "4"}}),
            (child, {PARENT_LABEL: parent}, {"max": {"nvidia.com/gpu": "4"}, "min": {"nvidia.com/gpu": "2"}})):
        api.custom.create_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                                   ELASTICQUOTA_PLURAL, {
            "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": spec})
    return namespace, parent, child


def migrate(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["migrate", "apply", "--kubeconfig", str(kubeconfig), *args])
    return result.exit_code, result.stdout, result.stderr


def test_blocked_tree_is_not_touched(kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str],
                                     tmp_path: Path) -> None:
    namespace, parent, child = legacy_tree
    versions = [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)]

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "backup.yaml"))

    assert code == 1
    assert out.startswith("BLOCKED: quotas ")
    assert err == "nothing written: the plan is blocked\n"
    assert [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)] == versions
    assert not (tmp_path / "backup.yaml").exists()


def test_gated_migration_converts_the_tree_and_keeps_the_originals(
        kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str], tmp_path: Path) -> None:
    namespace, parent, child = legacy_tree
    backup = tmp_path / "backup.yaml"

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--update-resource-key-gate")

    assert code == 0, err
    assert out.splitlines() == [
        f"applied step 1: add-canonical ElasticQuota {namespace}/{parent}",
        f"applied step 2: add-canonical ElasticQuota {namespace}/{child}",
        f"applied step 3: drop-legacy ElasticQuota {namespace}/{child}",
        f"applied step 4: drop-legacy ElasticQuota {namespace}/{parent}",
    ]
    for name, cards_max, cards_min in ((parent, 8, 4), (child, 4, 2)):
        stored = eq(api, namespace, name)
        assert stored["spec"]["max"] == {key: str(100 * cards_max) for key in CANONICAL}
        assert stored["spec"]["min"] == {key: str(100 * cards_min) for key in CANONICAL}
        annotations = stored["metadata"]["annotations"]
        assert json.loads(annotations["gpuquota.koord-gpuquota.io/pre-migration-spec"]) == {
            "max": {"nvidia.com/gpu": str(cards_max)}, "min": {"nvidia.com/gpu": str(cards_min)}}
        assert "gpuquota.koord-gpuquota.io/migration" not in annotations
    saved = yaml.safe_load(backup.read_text())
    assert sorted(item["metadata"]["name"] for item in saved["items"]) == sorted([parent, child])

    again = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "second.yaml"))
    assert again[:2] == (0, "nothing to migrate: every ElasticQuota already uses canonical GPU keys\n")


def test_server_dry_run_stores_nothing(kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str],
                                       tmp_path: Path) -> None:
    namespace, _parent, child = legacy_tree

    code, out, _ = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "b.yaml"),
                           "--update-resource-key-gate", "--dry-run", "server")

    assert code == 0
    assert out.splitlines()[0].startswith("would apply step 1: add-canonical")
    assert eq(api, namespace, child)["spec"]["max"] == {"nvidia.com/gpu": "4"}


def test_an_existing_backup_file_is_never_overwritten(kubeconfig_path: Path, tmp_path: Path) -> None:
    (tmp_path / "backup.yaml").write_text("precious")

    code, _, err = migrate(kubeconfig_path, "--backup", str(tmp_path / "backup.yaml"))

    assert code == 2
    assert err == (f"Error: {tmp_path}/backup.yaml exists; choose a new backup file "
                   "(an old backup is never overwritten)\n")
    assert (tmp_path / "backup.yaml").read_text() == "precious"


# -- rollback ------------------------------------------------------------------------------------

PRE_MIGRATION = "gpuquota.koord-gpuquota.io/pre-migration-spec"
IN_PROGRESS = "gpuquota.koord-gpuquota.io/migration"


def rollback(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["migrate", "rollback", "--kubeconfig", str(kubeconfig), *args])
    return result.exit_code, result.stdout, result.stderr


def originals(api: Api, namespace: str, *names: str) -> dict[str, dict[str, Any]]:
    """What rollback must bring back: spec, labels and annotations exactly."""
    found = {}
    for name in names:
        stored = eq(api, namespace, name)
        found[name] = {"spec": stored["spec"], "labels": stored["metadata"].get("labels"),
                       "annotations": stored["metadata"].get("annotations", {})}
    return found


def assert_restored(api: Api, namespace: str, expected: dict[str, dict[str, Any]]) -> None:
    assert originals(api, namespace, *expected) == expected


@pytest.mark.parametrize("source", ["backup", "annotation"])
def test_apply_then_rollback_restores_the_exact_original_spec(
        kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str], tmp_path: Path, source: str) -> None:
    namespace, parent, child = legacy_tree
    before = originals(api, namespace, parent, child)
    assert before[parent]["spec"] == {"max": {"nvidia.com/gpu": "8"}, "min": {"nvidia.com/gpu": "4"}}
    backup = tmp_path / "backup.yaml"
    assert migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--update-resource-key-gate")[0] == 0
    assert eq(api, namespace, parent)["spec"]["max"] == dict.fromkeys(CANONICAL, "800")

    code, out, err = rollback(kubeconfig_path, "-n", namespace, *(["-f", str(backup)] if source == "backup" else []))

    assert (code, err) == (0, "")
    # The reverse of apply's order: legacy keys back top-down, then canonical keys gone bottom-up.
    assert out.splitlines() == [
        f"applied step 1: re-add-legacy ElasticQuota {namespace}/{parent}",
        f"applied step 2: re-add-legacy ElasticQuota {namespace}/{child}",
        f"applied step 3: restore ElasticQuota {namespace}/{child}",
        f"applied step 4: restore ElasticQuota {namespace}/{parent}",
    ]
    assert_restored(api, namespace, before)

    again = rollback(kubeconfig_path, "-n", namespace)
    assert again == (0, f"nothing to roll back: no ElasticQuota differs from the {PRE_MIGRATION} annotation\n", "")


def test_rollback_refuses_a_quota_changed_since_the_migration_and_writes_nothing(
        kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str], tmp_path: Path) -> None:
    namespace, parent, child = legacy_tree
    backup = tmp_path / "backup.yaml"
    assert migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--update-resource-key-gate")[0] == 0
    api.custom.patch_namespaced_custom_object(
        ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, child,
        {"spec": {"max": dict.fromkeys(CANONICAL, "500")}})
    versions = [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)]

    code, out, err = rollback(kubeconfig_path, "-f", str(backup))

    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"REFUSED: ElasticQuota {namespace}/{parent}: its child {child} is not rolled back and keeps max keys "
        "[koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio], which are not within its original "
        "[nvidia.com/gpu]: Koordinator refuses that update; roll back the whole tree together, or restore this "
        "quota by hand",
        f"REFUSED: ElasticQuota {namespace}/{child}: changed since the migration: its spec is "
        "min {koordinator.sh/gpu-core: 200, koordinator.sh/gpu-memory-ratio: 200}; "
        "max {koordinator.sh/gpu-core: 500, koordinator.sh/gpu-memory-ratio: 500}, which is neither the original "
        "(min {nvidia.com/gpu: 2}; max {nvidia.com/gpu: 4}) nor a state `gpuquota migrate apply` writes",
        "nothing written: fix or restore each refused quota by hand (or leave another namespace's out with -n), "
        "then run rollback again",
    ]
    assert [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)] == versions


@pytest.mark.parametrize("mode", ["client", "server"])
def test_rollback_dry_runs_store_nothing(kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str],
                                         tmp_path: Path, mode: str) -> None:
    namespace, parent, child = legacy_tree
    assert migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "b.yaml"),
                   "--update-resource-key-gate")[0] == 0
    versions = [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)]

    code, out, err = rollback(kubeconfig_path, "-n", namespace, "--dry-run", mode)

    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line for line in lines if line.startswith("would apply")] == [
        f"would apply step 1: re-add-legacy ElasticQuota {namespace}/{parent}",
        f"would apply step 2: re-add-legacy ElasticQuota {namespace}/{child}",
        f"would apply step 3: restore ElasticQuota {namespace}/{child}",
        f"would apply step 4: restore ElasticQuota {namespace}/{parent}",
    ]
    if mode == "client":
        # Back to the union state of apply's add-canonical step: both families in min and in max.
        assert lines[:3] == [f"# step 1: re-add-legacy ElasticQuota {namespace}/{parent}",
                             "+  min.nvidia.com/gpu: 4", "+  max.nvidia.com/gpu: 8"]
    assert [eq(api, namespace, n)["metadata"]["resourceVersion"] for n in (parent, child)] == versions


def test_a_conflict_mid_apply_stops_names_the_quota_and_the_backup_rolls_back(
        kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone edits the child between the plan and step 2: the apiserver answers 409 to step 2."""
    namespace, parent, child = legacy_tree
    before = originals(api, namespace, parent, child)
    backup = tmp_path / "backup.yaml"
    real_replace = k8s.CustomObjectsApi.replace_namespaced_custom_object
    sent: list[str] = []
    seen: dict[str, str] = {}
    modes: list[str | None] = []

    def replace_after_a_concurrent_edit(self: k8s.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        modes.append(kwargs.get("dry_run"))
        if kwargs.get("dry_run"):  # the server-side dry run apply sends before each real write
            return real_replace(self, *args, **kwargs)
        name = args[4]
        sent.append(name)
        if len(sent) == 2:
            edited = api.custom.patch_namespaced_custom_object(
                ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, child,
                {"metadata": {"labels": {"edited-by": "someone-else"}}})
            seen["child"] = edited["metadata"]["resourceVersion"]
            seen["parent"] = eq(api, namespace, parent)["metadata"]["resourceVersion"]
        return real_replace(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CustomObjectsApi, "replace_namespaced_custom_object", replace_after_a_concurrent_edit)

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--update-resource-key-gate")

    assert code == 1
    # Each step is judged by a server-side dry run before it is written for real.
    assert modes == ["All", None, "All", None]
    assert out.splitlines() == [f"applied step 1: add-canonical ElasticQuota {namespace}/{parent}"]
    listed_version = yaml.safe_load(backup.read_text())["items"][1]["metadata"]["resourceVersion"]
    assert err.splitlines() == [
        f"backup of 2 ElasticQuota(s) written to {backup}",
        f"step 2 (add-canonical {namespace}/{child}) refused: conflict: ElasticQuota {namespace}/{child} changed "
        f"since it was read (resourceVersion {listed_version}); it was not overwritten",
        f"1 of 4 step(s) applied, nothing further written; originals are in {backup}; undo with "
        f"`gpuquota migrate rollback -f {backup}`, or re-run apply with a new backup file",
    ]
    assert sent == [parent, child]  # nothing was sent after the conflict
    assert eq(api, namespace, child)["metadata"]["resourceVersion"] == seen["child"]
    assert eq(api, namespace, parent)["metadata"]["resourceVersion"] == seen["parent"]
    assert eq(api, namespace, child)["spec"] == before[child]["spec"]
    stored_parent = eq(api, namespace, parent)
    assert stored_parent["spec"]["max"] == {"nvidia.com/gpu": "8", **dict.fromkeys(CANONICAL, "800")}
    assert stored_parent["metadata"]["annotations"][IN_PROGRESS] == "in-progress"
    # The backup holds both quotas as they were before the run: enough to roll back.
    saved = {item["metadata"]["name"]: item for item in yaml.safe_load(backup.read_text())["items"]}
    assert {name: item["spec"] for name, item in saved.items()} == {n: before[n]["spec"] for n in (parent, child)}
    monkeypatch.undo()

    code, out, err = rollback(kubeconfig_path, "-f", str(backup))

    assert (code, out) == (0, f"applied step 1: restore ElasticQuota {namespace}/{parent}\n")
    assert err == f"unchanged: ElasticQuota {namespace}/{child} already has its original spec\n"
    before[child]["labels"]["edited-by"] = "someone-else"  # the other writer's change is kept
    assert_restored(api, namespace, before)


def test_koordinators_usage_summaries_written_mid_apply_do_not_stop_it(
        kubeconfig_path: Path, api: Api, legacy_tree: tuple[str, str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """koord-scheduler's quota controller rewrites its summary annotations (and status) on a quota as
    its pods come and go: a step planned before is still right, so its write is tried again on the
    fresh object, and what Koordinator wrote is kept."""
    namespace, parent, child = legacy_tree
    real_replace = k8s.CustomObjectsApi.replace_namespaced_custom_object
    sent: list[str] = []
    runtime = '{"nvidia.com/gpu":"2"}'

    def replace_after_koordinators_bookkeeping(self: k8s.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("dry_run"):
            sent.append(args[4])
            if len(sent) == 2:
                api.custom.patch_namespaced_custom_object(
                    ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, child,
                    {"metadata": {"annotations": {"quota.scheduling.koordinator.sh/runtime": runtime}}})
        return real_replace(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CustomObjectsApi, "replace_namespaced_custom_object",
                        replace_after_koordinators_bookkeeping)

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "backup.yaml"),
                             "--update-resource-key-gate")

    assert code == 0, err
    assert out.splitlines()[:2] == [f"applied step 1: add-canonical ElasticQuota {namespace}/{parent}",
                                    f"applied step 2: add-canonical ElasticQuota {namespace}/{child}"]
    assert sent[:3] == [parent, child, child]  # the refused write of step 2, then the same step again
    stored = eq(api, namespace, child)
    assert stored["spec"]["max"] == dict.fromkeys(CANONICAL, "400")  # every step applied, the legacy key dropped
    assert stored["metadata"]["annotations"]["quota.scheduling.koordinator.sh/runtime"] == runtime


# -- all at once: a three-level tree, ElasticQuotaEnableUpdateResourceKey off ----------------------

ROOT_QUOTA = "koordinator-root-quota"


@pytest.fixture
def three_level_tree(webhook_server: WebhookProcess, api: Api, namespace: str) -> tuple[str, list[str]]:
    """org (8 cards, min 4) > dept (6, min 2) > team (4, min 1), every quota in nvidia.com/gpu only."""
    org, dept, team = f"org-{namespace}", f"dept-{namespace}", f"team-{namespace}"
    for name, labels, max_cards, min_cards in (
            (org, {IS_PARENT_LABEL: "true"}, "8", "4"),
            (dept, {IS_PARENT_LABEL: "true", PARENT_LABEL: org}, "6", "2"),
            (team, {PARENT_LABEL: dept}, "4", "1")):
        api.custom.create_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                                   ELASTICQUOTA_PLURAL, {
            "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"max": {"nvidia.com/gpu": max_cards}, "min": {"nvidia.com/gpu": min_cards}}})
    return namespace, [org, dept, team]


def koordinator_judges_every_stored_step(api: Api, namespace: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """After each replace, judge the stored state with our model of Koordinator's topology check (gate off).

    Returns the refusals (empty when Koordinator's ElasticQuota webhook would have accepted every step).
    """
    from gpuquota_core.migration import koordinator_topology_refusal, placement_of
    from gpuquota_core.quota_objects import quota_from_object

    real_replace = k8s.CustomObjectsApi.replace_namespaced_custom_object
    refusals: list[str] = []

    def judged_replace(self: k8s.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):  # the server-side dry run apply sends before each real write
            return real_replace(self, *args, **kwargs)
        stored = real_replace(self, *args, **kwargs)
        listed = api.custom.list_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace,
                                                          ELASTICQUOTA_PLURAL)["items"]
        world = {q.name: placement_of(q) for q in (quota_from_object(o) for o in listed)}
        refusal = koordinator_topology_refusal(world, args[4])
        if refusal:
            refusals.append(refusal)
        return stored

    monkeypatch.setattr(k8s.CustomObjectsApi, "replace_namespaced_custom_object", judged_replace)
    return refusals


def test_all_at_once_migrates_a_three_level_tree_and_rollback_restores_it_exactly(
        kubeconfig_path: Path, api: Api, three_level_tree: tuple[str, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    namespace, (org, dept, team) = three_level_tree
    before = originals(api, namespace, org, dept, team)
    backup = tmp_path / "backup.yaml"
    refusals = koordinator_judges_every_stored_step(api, namespace, monkeypatch)

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--all-at-once")

    assert code == 0, err
    assert out.splitlines() == [
        f"applied step 1: detach-convert ElasticQuota {namespace}/{team}",
        f"applied step 2: detach-convert ElasticQuota {namespace}/{dept}",
        f"applied step 3: reattach ElasticQuota {namespace}/{team}",
        f"applied step 4: convert ElasticQuota {namespace}/{org}",
        f"applied step 5: reattach ElasticQuota {namespace}/{dept}",
    ]
    assert refusals == []  # every stored intermediate state passes Koordinator's key-equality rule
    assert err.splitlines()[0] == f"backup of 3 ElasticQuota(s) written to {backup}"
    assert err.splitlines()[1].startswith("WINDOW: steps 1-5 are one maintenance window")
    for name, max_cards, min_cards in ((org, 8, 4), (dept, 6, 2), (team, 4, 1)):
        stored = eq(api, namespace, name)
        assert stored["spec"] == {"max": {key: str(100 * max_cards) for key in CANONICAL},
                                  "min": {key: str(100 * min_cards) for key in CANONICAL}}
        assert stored["metadata"]["labels"] == before[name]["labels"]  # back under the same parent
        annotations = stored["metadata"]["annotations"]
        assert IN_PROGRESS not in annotations
        assert json.loads(annotations[PRE_MIGRATION]) == {
            **before[name]["spec"], "parent": before[name]["labels"].get(PARENT_LABEL, ROOT_QUOTA)}
    again = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "again.yaml"), "--all-at-once")
    assert again[:2] == (0, "nothing to migrate: every ElasticQuota already uses canonical GPU keys\n")

    code, out, err = rollback(kubeconfig_path, "-n", namespace, "-f", str(backup))

    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"applied step 1: detach-restore ElasticQuota {namespace}/{team}",
        f"applied step 2: detach-restore ElasticQuota {namespace}/{dept}",
        f"applied step 3: reattach ElasticQuota {namespace}/{team}",
        f"applied step 4: restore ElasticQuota {namespace}/{org}",
        f"applied step 5: reattach ElasticQuota {namespace}/{dept}",
    ]
    assert refusals == []
    assert_restored(api, namespace, before)  # spec, labels and annotations exactly as before


def test_all_at_once_stopped_by_a_conflict_says_how_to_resume_and_rolls_back(
        kubeconfig_path: Path, api: Api, three_level_tree: tuple[str, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Someone edits team while it is detached: step 3 (its reattach) is a 409 and the run stops there."""
    namespace, (org, dept, team) = three_level_tree
    before = originals(api, namespace, org, dept, team)
    backup = tmp_path / "backup.yaml"
    real_replace = k8s.CustomObjectsApi.replace_namespaced_custom_object
    sent: list[str] = []

    def replace_after_a_concurrent_edit(self: k8s.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):  # the server-side dry run apply sends before each real write
            return real_replace(self, *args, **kwargs)
        sent.append(args[4])
        if len(sent) == 3:
            api.custom.patch_namespaced_custom_object(
                ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, team,
                {"metadata": {"labels": {"edited-by": "someone-else"}}})
        return real_replace(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CustomObjectsApi, "replace_namespaced_custom_object", replace_after_a_concurrent_edit)

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(backup), "--all-at-once")

    assert code == 1
    assert out.splitlines() == [f"applied step 1: detach-convert ElasticQuota {namespace}/{team}",
                                f"applied step 2: detach-convert ElasticQuota {namespace}/{dept}"]
    last = err.splitlines()[-2:]
    assert last[0].startswith(f"step 3 (reattach {namespace}/{team}) refused: conflict: ElasticQuota "
                              f"{namespace}/{team} changed since it was read")
    assert last[1] == (
        "2 of 5 step(s) applied, nothing further written; the maintenance window is still open: quotas marked "
        f"{IN_PROGRESS}=in-progress are detached from their parent. Resume with `gpuquota migrate apply "
        "--all-at-once --backup NEW_FILE` (it re-plans from the current state and reattaches every detached quota "
        f"under the parent recorded in its {PRE_MIGRATION} annotation), or undo with `gpuquota migrate rollback "
        f"-f {backup}`")
    assert sent == [team, dept, team]
    for name in (team, dept):
        stored = eq(api, namespace, name)
        assert stored["metadata"]["labels"][PARENT_LABEL] == ROOT_QUOTA
        assert stored["metadata"]["annotations"][IN_PROGRESS] == "in-progress"
    assert eq(api, namespace, org)["spec"] == before[org]["spec"]
    monkeypatch.undo()

    code, out, err = rollback(kubeconfig_path, "-f", str(backup))

    assert (code, err) == (0, f"unchanged: ElasticQuota {namespace}/{org} already has its original spec\n")
    assert out.splitlines() == [
        f"applied step 1: detach-restore ElasticQuota {namespace}/{team}",
        f"applied step 2: restore ElasticQuota {namespace}/{dept}",
        f"applied step 3: reattach ElasticQuota {namespace}/{team}",
    ]
    before[team]["labels"]["edited-by"] = "someone-else"  # the other writer's change is kept
    assert_restored(api, namespace, before)


def test_all_at_once_resumes_a_stopped_run(kubeconfig_path: Path, api: Api,
                                           three_level_tree: tuple[str, list[str]], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    namespace, (org, dept, team) = three_level_tree
    before = originals(api, namespace, org, dept, team)
    real_replace = k8s.CustomObjectsApi.replace_namespaced_custom_object
    sent: list[str] = []

    def fail_the_third(self: k8s.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("dry_run"):  # the server-side dry run apply sends before each real write
            return real_replace(self, *args, **kwargs)
        sent.append(args[4])
        if len(sent) == 3:
            raise k8s.ApiException(status=500, reason="apiserver went away")
        return real_replace(self, *args, **kwargs)

    monkeypatch.setattr(k8s.CustomObjectsApi, "replace_namespaced_custom_object", fail_the_third)
    assert migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "b1.yaml"), "--all-at-once")[0] == 1
    monkeypatch.undo()

    code, out, err = migrate(kubeconfig_path, "-n", namespace, "--backup", str(tmp_path / "b2.yaml"), "--all-at-once")

    assert code == 0, err
    assert out.splitlines() == [f"applied step 1: reattach ElasticQuota {namespace}/{team}",
                                f"applied step 2: convert ElasticQuota {namespace}/{org}",
                                f"applied step 3: reattach ElasticQuota {namespace}/{dept}"]
    for name in (org, dept, team):
        stored = eq(api, namespace, name)
        assert set(stored["spec"]["max"]) == set(CANONICAL)
        assert stored["metadata"]["labels"] == before[name]["labels"]
        assert IN_PROGRESS not in stored["metadata"]["annotations"]
    # The annotations still hold the true originals: rollback without a backup restores them.
    assert rollback(kubeconfig_path, "-n", namespace)[0] == 0
    assert_restored(api, namespace, before)
