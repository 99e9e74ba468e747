"""Policy reports against the real apiserver: the CRDs in manifests/policyreport install, the reports
``gpuquota audit -o policyreport`` writes are accepted by them and read back as written, and the
commands of the in-cluster CronJob (manifests/audit-cronjob) apply and prune them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clusterhelpers import eventually
from controlplane import REPO_ROOT, Api, create_gpu_node, wait_for_crd_established
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

CRDS = REPO_ROOT / "manifests" / "policyreport" / "crds.yaml"
CRONJOB = REPO_ROOT / "manifests" / "audit-cronjob" / "cronjob.yaml"
RBAC = REPO_ROOT / "manifests" / "audit-cronjob" / "rbac.yaml"
GROUP, VERSION = "wgpolicyk8s.io", "v1alpha2"
IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"
INSTALL_NAMESPACE = "gpuquota-system"
TIMEOUT = 120.0
GPUQUOTA = str(Path(sys.executable).parent / "gpuquota")


def kubectl() -> str:
    for candidate in (os.environ.get("KUBECTL"), "/usr/bin/kubectl", "kubectl"):
        if candidate and (Path(candidate).exists() or candidate == "kubectl"):
            return candidate
    raise AssertionError("kubectl is required")


def run(args: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False,
                            cwd=REPO_ROOT, env=env)
    assert result.returncode == 0, f"{shlex.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def report_crds(api: Api, kubeconfig_path: Path) -> list[str]:
    run([kubectl(), "apply", "--server-side", "--kubeconfig", str(kubeconfig_path), "-f", str(CRDS)])
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(CRDS.read_text()) if doc]
    for name in names:
        wait_for_crd_established(api.apiextensions, name)
    return names


def legacy_pod(name: str, pool: str) -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"pool": pool},
                     "containers": [{"name": "main", "image": "x", "resources": {"requests": gpu, "limits": gpu}}]}}


@pytest.fixture
def legacy_namespace(api: Api) -> Iterator[str]:
    """A namespace the webhook leaves alone (if a test registered it), with one pod to rewrite.

    The pod is pinned to a Node of its own that advertises nvidia.com/gpu, so that it is a pod its
    node can take as written (the shared control plane's other Nodes, the session's canonical one
    among them, would otherwise make it one no reachable node can take, an error finding this test
    is not about), and the canonical names, so that the webhook would rewrite it there (pinned to a
    vendor-only node the webhook leaves it as written, and the audit reports nothing)."""
    name = f"polr-{uuid.uuid4().hex[:8]}"
    create_gpu_node(api.core, name, {"nvidia.com/gpu": "4", "koordinator.sh/gpu-core": "400",
                                     "koordinator.sh/gpu-memory-ratio": "400"}, labels={"pool": name})
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    api.core.create_namespaced_pod(name, legacy_pod("train", name))
    yield name
    api.core.delete_node(name)


def audit_reports(kubeconfig_path: Path, namespace: str) -> list[dict[str, Any]]:
    out = run([GPUQUOTA, "audit", "--kubeconfig", str(kubeconfig_path), "-n", namespace,
               "-o", "policyreport", "--fail-on", "none"])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_reports_are_accepted_by_the_crds_and_read_back(
    api: Api, kubeconfig_path: Path, report_crds: list[str], legacy_namespace: str,
) -> None:
    reports = audit_reports(kubeconfig_path, legacy_namespace)
    namespaced = [r for r in reports if r["kind"] == "PolicyReport"]
    assert [r["metadata"]["namespace"] for r in namespaced] == [legacy_namespace]
    # Created (not applied) so the apiserver's schema validation sees exactly what the CLI wrote.
    stored = api.custom.create_namespaced_custom_object(GROUP, VERSION, legacy_namespace, "policyreports",
                                                        namespaced[0])

    read = api.custom.get_namespaced_custom_object(GROUP, VERSION, legacy_namespace, "policyreports",
                                                   stored["metadata"]["name"])
    assert read["results"] == namespaced[0]["results"]
    assert read["summary"] == {"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 0}
    [result] = read["results"]
    assert (result["policy"], result["result"], result["severity"]) == ("pod-legacy-gpu-request", "warn", "medium")
    assert result["resources"] == [{"apiVersion": "v1", "kind": "Pod", "name": "train",
                                    "namespace": legacy_namespace}]


def test_the_schema_refuses_a_result_outside_the_enum(
    api: Api, report_crds: list[str], legacy_namespace: str,
) -> None:
    bad = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PolicyReport", "metadata": {"name": "bad"},
           "results": [{"policy": "p", "result": "failed"}]}

    with pytest.raises(ApiException) as refused:
        api.custom.create_namespaced_custom_object(GROUP, VERSION, legacy_namespace, "policyreports", bad)

    assert refused.value.status == 422
    assert "results[0].result" in str(refused.value.body)


def cronjob_script() -> str:
    spec = yaml.safe_load(CRONJOB.read_text())["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert container["command"][:2] == ["sh", "-c"]
    assert spec["serviceAccountName"] == "gpuquota-audit"
    return str(container["command"][2])


@pytest.fixture
def audit_account_kubeconfig(api: Api, kubeconfig_path: Path, elasticquota_crd: Any, tmp_path: Path) -> Path:
    """A kubeconfig that authenticates as the CronJob's ServiceAccount, with the RBAC of
    manifests/audit-cronjob applied for real, so the test proves those permissions suffice."""
    try:
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=INSTALL_NAMESPACE)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    run([kubectl(), "apply", "--server-side", "--kubeconfig", str(kubeconfig_path), "-n", INSTALL_NAMESPACE,
         "-f", str(RBAC)])
    token = api.core.create_namespaced_service_account_token(
        "gpuquota-audit", INSTALL_NAMESPACE,
        k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600)),
    ).status.token
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_path.read_text())
    run([kubectl(), "config", "set-credentials", "gpuquota-audit", f"--token={token}", "--kubeconfig", str(path)])
    run([kubectl(), "config", "set-context", "--current", "--user=gpuquota-audit", "--kubeconfig", str(path)])
    return path


def test_cronjob_command_applies_the_reports_and_prunes_them_when_the_findings_are_gone(
    api: Api, audit_account_kubeconfig: Path, report_crds: list[str], legacy_namespace: str,
) -> None:
    # The container's command with the venv's gpuquota and one namespace instead of -A: the shared
    # test apiserver holds every other test's namespaces too.
    # The script's /tmp/ goes to this test's directory first: the checkout itself may live under /tmp.
    script = cronjob_script().replace("/tmp/", f"{audit_account_kubeconfig.parent}/")
    script = script.replace("gpuquota ", f"{shlex.quote(GPUQUOTA)} ")
    assert " -A " in script
    script = script.replace(" -A ", f" -n {legacy_namespace} ")
    env = {**os.environ, "KUBECONFIG": str(audit_account_kubeconfig), "TMPDIR": str(audit_account_kubeconfig.parent)}

    first_out = run(["sh", "-c", script], env=env)
    assert f"policyreport.wgpolicyk8s.io/gpuquota-audit -n {legacy_namespace} serverside-applied" in first_out
    first = api.custom.get_namespaced_custom_object(GROUP, VERSION, legacy_namespace, "policyreports", "gpuquota-audit")
    assert first["summary"]["warn"] == 1
    cluster_uid = api.custom.get_cluster_custom_object(GROUP, VERSION, "clusterpolicyreports",
                                                       "gpuquota-audit")["metadata"]["uid"]

    api.core.delete_namespaced_pod("train", legacy_namespace, grace_period_seconds=0)
    eventually(lambda: not api.core.list_namespaced_pod(legacy_namespace).items, "the pod is gone")
    second_out = run(["sh", "-c", script], env=env)

    assert f"policyreport.wgpolicyk8s.io/gpuquota-audit -n {legacy_namespace} pruned" in second_out
    with pytest.raises(ApiException) as gone:
        api.custom.get_namespaced_custom_object(GROUP, VERSION, legacy_namespace, "policyreports", "gpuquota-audit")
    assert gone.value.status == 404
    # The cluster report is written on every run: updated in place, never deleted and recreated.
    assert api.custom.get_cluster_custom_object(GROUP, VERSION, "clusterpolicyreports",
                                                "gpuquota-audit")["metadata"]["uid"] == cluster_uid
