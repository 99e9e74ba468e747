"""The install manifests (manifests/base) render with kustomize and are accepted by a real apiserver.

Only the Namespace is created for real. Everything else goes through server-side dry-run: the
apiserver validates and admits it but stores nothing. That matters most for the webhook
configurations: stored for real, they would send every GPU pod of the shared test apiserver to a
Service that has no endpoints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import REPO_ROOT, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

BASE = REPO_ROOT / "manifests" / "base"
NAMESPACE = "gpuquota-system"
KUBECTL_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def kubectl() -> str:
    path = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if path is None:
        if os.environ.get("CI"):
            raise AssertionError("kubectl is required for the manifest tests")
        pytest.skip("no kubectl on PATH")
    return path


def run(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT,
                          check=False, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def rendered(kubectl: str) -> list[dict[str, Any]]:
    result = run([kubectl, "kustomize", str(BASE)])
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def stored_webhook_configurations(api: Api) -> dict[str, str | None]:
    """resourceVersion of each stored gpuquota-webhook configuration, None where there is none."""
    versions: dict[str, str | None] = {}
    for kind, reader in (("mutating", api.admissionregistration.read_mutating_webhook_configuration),
                         ("validating", api.admissionregistration.read_validating_webhook_configuration)):
        try:
            versions[kind] = reader("gpuquota-webhook").metadata.resource_version
        except ApiException as exc:
            if exc.status != 404:
                raise
            versions[kind] = None
    return versions


def printed_name(obj: dict[str, Any]) -> str:
    """How kubectl names an object in its output: ``kind[.group]/name``, lowercased kind and group."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower()
    return f"{kind}.{group}/{obj['metadata']['name']}" if group else f"{kind}/{obj['metadata']['name']}"


def test_kustomize_renders_every_listed_resource(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in rendered)
    assert kinds == sorted([
        ("Namespace", NAMESPACE),
        ("ServiceAccount", "gpuquota-webhook"),
        ("ClusterRole", "gpuquota-webhook"),
        ("ClusterRole", "gpuquota-cli"),
        ("ClusterRoleBinding", "gpuquota-webhook"),
        ("Deployment", "gpuquota-webhook"),
        ("Service", "gpuquota-webhook"),
        ("PodDisruptionBudget", "gpuquota-webhook"),
        ("ConfigMap", "gpuquota-config"),
        ("CustomResourceDefinition", "elasticquotas.scheduling.sigs.k8s.io"),
        ("MutatingWebhookConfiguration", "gpuquota-webhook"),
        ("ValidatingWebhookConfiguration", "gpuquota-webhook"),
    ])
    # The kustomization's namespace reached every namespaced object.
    for obj in rendered:
        if obj["kind"] in {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"}:
            assert obj["metadata"]["namespace"] == NAMESPACE, printed_name(obj)


def test_apiserver_accepts_every_object(
    rendered: list[dict[str, Any]], kubectl: str, kubeconfig_path: Path, api: Api,
    elasticquota_crd: k8s.V1CustomResourceDefinition,
) -> None:
    # Namespaced objects cannot even be dry-run into a namespace that does not exist, so this one is
    # real. The webhook configurations exclude it by name, and nothing else in the suite uses it.
    namespace = find(rendered, "Namespace", NAMESPACE)
    try:
        api.core.create_namespace(namespace)
    except ApiException as exc:
        if exc.status != 409:  # an earlier run in this session created it
            raise
    rest = [o for o in rendered if o["kind"] != "Namespace"]
    before = stored_webhook_configurations(api)
    # The CRD already exists (elasticquota_crd); a dry-run apply over it is still validated in full.
    result = run([kubectl, "apply", "--dry-run=server", "--kubeconfig", str(kubeconfig_path), "-f", "-"],
                 stdin=yaml.safe_dump_all(rest))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    for obj in rest:
        line = re.compile(rf"^{re.escape(printed_name(obj))} \S.*\(server dry run\)$", re.MULTILINE)
        assert line.search(result.stdout), f"{printed_name(obj)} missing from:\n{result.stdout}"
    # Dry-run really stored nothing: no configuration may route the suite's pods to a dead Service.
    # (Compared, not asserted absent: the webhook_server fixture registers loopback copies under
    # the same names when the whole suite runs.)
    assert stored_webhook_configurations(api) == before


def test_deployment_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    deployment = find(rendered, "Deployment", "gpuquota-webhook")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["terminationGracePeriodSeconds"] > 30  # gunicorn's graceful_timeout
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        http = container[probe]["httpGet"]
        assert (http["path"], http["scheme"]) == (path, "HTTPS"), probe
        assert http["port"] in (8443, "https"), probe
    assert {"containerPort": 8443, "name": "https", "protocol": "TCP"} in container["ports"]
    assert "--kubeconfig" not in container["args"]  # in-cluster config
    # The pod selects what the Service and PDB select.
    labels = spec["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        obj = find(rendered, kind, "gpuquota-webhook")
        selector = obj["spec"]["selector"].get("matchLabels", obj["spec"]["selector"])
        assert selector.items() <= labels.items(), kind


def test_pdb_keeps_two_replicas(rendered: list[dict[str, Any]]) -> None:
    assert find(rendered, "PodDisruptionBudget", "gpuquota-webhook")["spec"]["minAvailable"] == 2


def test_webhook_role_is_read_only(rendered: list[dict[str, Any]]) -> None:
    role = find(rendered, "ClusterRole", "gpuquota-webhook")
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
    resources = {(group, resource) for rule in role["rules"]
                 for group in rule["apiGroups"] for resource in rule["resources"]}
    assert resources == {("", "pods"), ("scheduling.sigs.k8s.io", "elasticquotas")}
    # The CLI role exists but is bound to nobody by the base: operators bind it themselves.
    find(rendered, "ClusterRole", "gpuquota-cli")
    bindings = [o for o in rendered if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert [b["roleRef"]["name"] for b in bindings] == ["gpuquota-webhook"]
