"""The Helm chart's output is accepted by a real apiserver (server-side dry run), like the kustomize
overlays in test_manifests.py: the release namespace is created for real, everything else is
validated and admitted but not stored. cert-manager and Prometheus Operator objects are left out:
the test apiserver has none of their CRDs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from charttools import helm_template
from controlplane import Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

FOREIGN_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path is not None, "kubectl is required"
    return path


def create_namespace(api: Api, name: str) -> None:
    try:
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    except ApiException as exc:
        if exc.status != 409:
            raise


def dry_run(objects: list[dict[str, Any]], kubeconfig_path: Path) -> str:
    result = subprocess.run([kubectl(), "apply", "--dry-run=server", "--kubeconfig", str(kubeconfig_path), "-f", "-"],
                            input=yaml.safe_dump_all(objects), capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, f"server-side dry run refused the chart:\n{result.stderr}"
    return result.stdout


@pytest.mark.parametrize(("namespace", "sets"), [
    ("gpuquota-system", ()),
    ("gpuquota-system", ("certManager.enabled=true", "monitoring.dashboard.enabled=true",
                         "webhookConfigurations.enabled=true", "networkPolicy.enabled=true",
                         "elasticQuotaCRD.install=true")),
    ("gpu-ops", ("replicas=1", "accounting=local", "auditCronJob.enabled=true")),
])
def test_chart_output_passes_a_server_side_dry_run(
    api: Api, kubeconfig_path: Path, elasticquota_crd: Any, namespace: str, sets: tuple[str, ...],
) -> None:
    objects = helm_template(*sets, namespace=namespace)
    create_namespace(api, namespace)
    checked = [o for o in objects if o["kind"] != "Namespace" and not o["apiVersion"].startswith(FOREIGN_GROUPS)]

    out = dry_run(checked, kubeconfig_path)

    lines = out.splitlines()
    assert len(lines) == len(checked), out
    assert all(line.endswith("(server dry run)") for line in lines), out
    # Nothing was stored: the dry run leaves the cluster as it was.
    with pytest.raises(ApiException) as missing:
        k8s.AppsV1Api(api.client).read_namespaced_deployment("gpuquota-webhook", namespace)
    assert missing.value.status == 404
