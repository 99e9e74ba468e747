"""``gpuquota audit`` against the real apiserver: kubeconfig, namespaces, paging, exit codes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from controlplane import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION, Api, GpuNodeFactory
from kubernetes import client as k8s

from cli.main import cli

IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"
LEGACY_PODS = 3


def legacy_pod(name: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"requests": gpu, "limits": gpu}}]}}


@pytest.fixture
def legacy_namespace(api: Api, elasticquota_crd: Any, gpu_node: GpuNodeFactory) -> str:
    """Objects as a cluster has them before the webhook: opted out, so nothing rewrites them."""
    name = f"legacy-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    for index in range(LEGACY_PODS):
        api.core.create_namespaced_pod(name, legacy_pod(f"train-{index}"))
    api.custom.create_namespaced_custom_object(ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, name, ELASTICQUOTA_PLURAL, {
        "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}", "kind": "ElasticQuota",
        "metadata": {"name": f"quota-{name}", "namespace": name},
        "spec": {"max": {"nvidia.com/gpu": "4"}, "min": {"nvidia.com/gpu": "2"}}})
    gpu_node(f"mixed-{name}", {"nvidia.com/gpu": "4", "koordinator.sh/gpu-core": "400",
                               "koordinator.sh/gpu-memory-ratio": "400"})
    return name


def run_audit(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["audit", *args])
    return result.exit_code, result.stdout, result.stderr


def test_live_audit_finds_legacy_objects_page_by_page(kubeconfig_path: Path, legacy_namespace: str) -> None:
    code, out, err = run_audit("--kubeconfig", str(kubeconfig_path), "-n", legacy_namespace, "-o", "json",
                               "--chunk-size", "1", "--fail-on", "none")

    assert (code, err) == (0, "")
    findings = json.loads(out)["findings"]
    mine = {(f["check"], f["kind"], f["name"]) for f in findings if f["namespace"] == legacy_namespace}
    assert mine >= {("pod-legacy-gpu-request", "Pod", f"train-{i}") for i in range(LEGACY_PODS)}
    assert ("quota-legacy-gpu-key", "ElasticQuota", f"quota-{legacy_namespace}") in mine
    assert {f["namespace"] for f in findings} <= {legacy_namespace, ""}
    assert ("node-mixed-gpu-resources", "Node", f"mixed-{legacy_namespace}") in {
        (f["check"], f["kind"], f["name"]) for f in findings}


def test_live_audit_fails_on_warnings_when_asked(kubeconfig_path: Path, legacy_namespace: str) -> None:
    code, out, _ = run_audit("pods", "--kubeconfig", str(kubeconfig_path), "-n", legacy_namespace,
                             "--fail-on", "warning")

    assert code == 1
    assert out.splitlines()[0].split() == ["SEVERITY", "KIND", "NAMESPACE", "NAME", "CHECK", "MESSAGE"]
    assert sum("pod-legacy-gpu-request" in line for line in out.splitlines()) == LEGACY_PODS
    assert out.splitlines()[-1] == (f"{LEGACY_PODS} findings: 0 errors, {LEGACY_PODS} warnings, 0 info; "
                                    "exit status 1 (--fail-on warning)")


def test_live_audit_takes_kubectl_kinds_selectors_and_names(kubeconfig_path: Path, legacy_namespace: str) -> None:
    code, out, err = run_audit("po,eq", "--kubeconfig", str(kubeconfig_path), "-n", legacy_namespace,
                               "-l", "app in (train-0, train-2)", "-o", "name")

    assert (code, err) == (0, "")  # warnings only
    assert out.splitlines() == ["pod/train-0", "pod/train-2"]


def test_unreachable_cluster_is_one_line_and_exit_2(tmp_path: Path, kubeconfig_path: Path) -> None:
    broken = kubeconfig_path.read_text().replace("https://127.0.0.1:", "https://127.0.0.1:1")
    (tmp_path / "kubeconfig").write_text(broken)

    code, _, err = run_audit("--kubeconfig", str(tmp_path / "kubeconfig"), "-A")

    assert code == 2
    assert err.startswith("Error: cannot reach the API server: ") and err.count("\n") == 1


def test_live_namespace_audit_reads_the_quota_tree_of_every_namespace(kubeconfig_path: Path, api: Api,
                                                                       elasticquota_crd: Any) -> None:
    # The parent lives in another namespace. Before: -n listed only the child, so its key
    # mismatch with the parent went unseen and the audit exited 0.
    suffix = uuid.uuid4().hex[:8]
    org_ns, team_ns = f"org-{suffix}", f"team-{suffix}"
    for name in (org_ns, team_ns):
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    for namespace, name, labels, max_ in (
            (org_ns, f"org-{suffix}", {"quota.scheduling.koordinator.sh/is-parent": "true"},
             {"koordinator.sh/gpu-core": "800", "koordinator.sh/gpu-memory-ratio": "800"}),
            (team_ns, f"team-{suffix}", {"quota.scheduling.koordinator.sh/parent": f"org-{suffix}"},
             {"nvidia.com/gpu": "4"})):
        api.custom.create_namespaced_custom_object(
            ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, namespace, ELASTICQUOTA_PLURAL, {
                "apiVersion": f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}", "kind": "ElasticQuota",
                "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": {"max": max_}})

    code, out, err = run_audit("quotas", "--kubeconfig", str(kubeconfig_path), "-n", team_ns, "-o", "json")

    assert (code, err) == (1, "")
    findings = {(f["check"], f["name"]) for f in json.loads(out)["findings"]}
    assert ("quota-tree-key-mismatch", f"team-{suffix}") in findings
    assert ("quota-parent-missing", f"team-{suffix}") not in findings
    assert {f["namespace"] for f in json.loads(out)["findings"]} <= {team_ns, ""}


def test_live_audit_finds_a_gang_partly_admitted(api: Api, kubeconfig_path: Path, legacy_namespace: str) -> None:
    # Two members of a gang of four stored before the webhook (the namespace opts out of it).
    for index in range(2):
        member = legacy_pod(f"gang-{index}")
        member["metadata"]["annotations"] = {"gang.scheduling.koordinator.sh/name": "trainers",
                                             "gang.scheduling.koordinator.sh/min-available": "4"}
        api.core.create_namespaced_pod(legacy_namespace, member)

    code, out, err = run_audit("pods", "--kubeconfig", str(kubeconfig_path), "-n", legacy_namespace, "-o", "json",
                               "--fail-on", "none")

    assert (code, err) == (0, "")
    [found] = [f for f in json.loads(out)["findings"] if f["check"] == "gang-partly-admitted"]
    assert (found["kind"], found["name"], found["details"]["members"], found["details"]["minMembers"]) == (
        "Pod", "gang-0", 2, 4)
    assert found["details"]["stored"] == [f"Pod {legacy_namespace}/gang-0", f"Pod {legacy_namespace}/gang-1"]
