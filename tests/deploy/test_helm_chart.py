"""The Helm chart renders the same objects as the kustomize base and overlays, switch by switch.

Both sides are rendered by the real tools (``kubectl kustomize``, ``helm template`` built from the Go
module proxy) and compared object by object: same kinds, names, namespaces and every field. Three
normalisations: CEL expressions are compared with whitespace runs collapsed (the folded ``>-``
scalars of the webhook configurations keep a line break before a more-indented line; Go's YAML
parser, which kustomize re-serialises with, reads it as two, PyYAML as one; CEL ignores both); the
conversion table in ConfigMap gpuquota-config is compared as parsed YAML (the
base keeps a comment in it, the chart writes ``values.conversion``), and cluster-scoped kinds lose a
metadata.namespace (kustomize 5.5 does not know that ValidatingAdmissionPolicy and its binding are
cluster-scoped and writes one in; kubectl and the apiserver drop it).
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from charttools import CHART, REPO_ROOT, helm, helm_template, kustomize, run

MANIFESTS = REPO_ROOT / "manifests"
BASE = MANIFESTS / "base"
CERT_MANAGER = MANIFESTS / "overlays" / "cert-manager"
SELF_MANAGED = MANIFESTS / "overlays" / "self-managed"
MONITORING = MANIFESTS / "monitoring"
AUDIT_CRONJOB = MANIFESTS / "audit-cronjob"
WEBHOOKS = MANIFESTS / "webhooks"
CERT_MANAGER_WEBHOOKS = CERT_MANAGER / "webhooks"
NETWORK_POLICY = MANIFESTS / "networkpolicy"
ELASTICQUOTA_CRD = MANIFESTS / "elasticquota-crd"

Key = tuple[str, str, str]
CLUSTER_SCOPED = frozenset({"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})


def key(obj: dict[str, Any]) -> Key:
    return (obj["kind"], obj["metadata"].get("namespace") or "", obj["metadata"]["name"])


def collapse_expressions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: " ".join(v.split()) if k in ("expression", "messageExpression") and isinstance(v, str)
                else collapse_expressions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [collapse_expressions(item) for item in value]
    return value


def by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    indexed: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        obj = collapse_expressions(copy.deepcopy(obj))
        if obj["kind"] in CLUSTER_SCOPED:
            obj["metadata"].pop("namespace", None)
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "gpuquota-config":
            obj["data"] = {name: yaml.safe_load(text) for name, text in obj["data"].items()}
        assert key(obj) not in indexed, f"{key(obj)} rendered twice"
        indexed[key(obj)] = obj
    return indexed


def assert_same_objects(chart: list[dict[str, Any]], kustomized: list[dict[str, Any]]) -> None:
    from_chart, from_kustomize = by_key(chart), by_key(kustomized)
    assert sorted(from_chart) == sorted(from_kustomize)
    for name, expected in from_kustomize.items():
        assert from_chart[name] == expected, f"{name} differs"


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(BASE)


def test_default_values_are_the_base_and_the_self_managed_overlay(base: list[dict[str, Any]]) -> None:
    chart = helm_template()

    assert_same_objects(chart, kustomize(SELF_MANAGED))
    assert_same_objects(chart, base)


def test_cert_manager_switch_is_the_cert_manager_overlay() -> None:
    assert_same_objects(helm_template("certManager.enabled=true"), kustomize(CERT_MANAGER))


def test_webhook_configurations_switch_is_step_two(base: list[dict[str, Any]]) -> None:
    """Off by default (installed only once `gpuquota preflight` sees the webhook answer), as the
    kustomize base leaves them to manifests/webhooks."""
    assert not [o for o in helm_template() if o["kind"].endswith("WebhookConfiguration")]
    assert_same_objects(helm_template("webhookConfigurations.enabled=true"), base + kustomize(WEBHOOKS))
    assert_same_objects(helm_template("webhookConfigurations.enabled=true", "certManager.enabled=true"),
                        kustomize(CERT_MANAGER) + kustomize(CERT_MANAGER_WEBHOOKS))


def test_networkpolicy_switch_is_the_networkpolicy_component(base: list[dict[str, Any]], tmp_path: Path) -> None:
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": [os.path.relpath(BASE, tmp_path)],
                     "components": [os.path.relpath(NETWORK_POLICY, tmp_path)]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")

    assert not [o for o in helm_template() if o["kind"] == "NetworkPolicy"]
    assert_same_objects(helm_template("networkPolicy.enabled=true"), kustomize(tmp_path))


def test_elasticquota_crd_only_on_request(base: list[dict[str, Any]]) -> None:
    """Koordinator brings its own ElasticQuota CRD: the chart installs none unless asked."""
    assert not [o for o in helm_template() if o["kind"] == "CustomResourceDefinition"]
    assert_same_objects(helm_template("elasticQuotaCRD.install=true"), base + kustomize(ELASTICQUOTA_CRD))


def test_monitoring_switches_add_the_monitoring_kustomization(base: list[dict[str, Any]]) -> None:
    monitoring = kustomize(MONITORING)
    chart = helm_template("monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                          "monitoring.dashboard.enabled=true")

    assert_same_objects(chart, base + monitoring)
    # One at a time, each adds its own object only.
    for switch, kind in (("serviceMonitor", "ServiceMonitor"), ("prometheusRule", "PrometheusRule"),
                         ("dashboard", "ConfigMap")):
        extra = [o for o in monitoring if o["kind"] == kind]
        assert_same_objects(helm_template(f"monitoring.{switch}.enabled=true"), base + extra)


def test_audit_cronjob_switch_adds_the_audit_cronjob_kustomization(base: list[dict[str, Any]]) -> None:
    assert_same_objects(helm_template("auditCronJob.enabled=true"), base + kustomize(AUDIT_CRONJOB))


def test_audit_cronjob_follows_the_image_and_schedule_values() -> None:
    chart = helm_template("auditCronJob.enabled=true", "auditCronJob.schedule=*/5 * * * *",
                          "image.repository=registry.example/gpuquota", "image.tag=1.2.3")

    [cronjob] = [o for o in chart if o["kind"] == "CronJob"]
    [deployment] = [o for o in chart if o["kind"] == "Deployment"]
    [container] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert cronjob["spec"]["schedule"] == "*/5 * * * *"
    assert container["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "registry.example/gpuquota:1.2.3"


def deployment_args(objects: list[dict[str, Any]]) -> list[str]:
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def without_writer_lease(objects: list[dict[str, Any]]) -> None:
    """The base's Deployment without what --writer-lease needs: its flags, POD_IP and the peer port."""
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    at = args.index("--writer-lease")
    assert args[at:at + 4] == ["--writer-lease", "gpuquota-ledger-writer", "--peer-port", "8444"]
    del args[at:at + 4]
    assert [variable["name"] for variable in container.pop("env")] == ["POD_IP"]
    container["ports"] = [port for port in container["ports"] if port["name"] != "peer"]


def test_replicas_and_local_accounting(base: list[dict[str, Any]]) -> None:
    """replicas=1 and accounting=local: the base with those two values, no ledger RBAC, no writer
    Lease, no PDB (minAvailable 2 of 1 replica would block every drain)."""
    expected = [copy.deepcopy(o) for o in base
                if o["kind"] != "PodDisruptionBudget" and o["metadata"]["name"] != "gpuquota-webhook-ledger"]
    [deployment] = [o for o in expected if o["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = 1
    without_writer_lease(expected)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    args[args.index("--accounting") + 1] = "local"

    assert_same_objects(helm_template("replicas=1", "accounting=local"), expected)


def test_an_empty_writer_lease_lets_every_replica_write(base: list[dict[str, Any]]) -> None:
    expected = copy.deepcopy(base)
    without_writer_lease(expected)
    [role] = [o for o in expected if o["kind"] == "Role" and o["metadata"]["name"] == "gpuquota-webhook-ledger"]
    role["rules"] = [rule for rule in role["rules"] if rule["apiGroups"] != ["coordination.k8s.io"]]

    assert_same_objects(helm_template("writerLease="), expected)


def test_more_replicas_keep_the_pdb_and_strict_ledger(base: list[dict[str, Any]]) -> None:
    expected = copy.deepcopy(base)
    [deployment] = [o for o in expected if o["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = 5

    chart = helm_template("replicas=5")

    assert_same_objects(chart, expected)
    assert deployment_args(chart)[-6:] == ["--accounting", "strict", "--writer-lease", "gpuquota-ledger-writer",
                                           "--peer-port", "8444"]


def test_another_release_namespace_leaves_no_trace_of_the_default() -> None:
    chart = helm_template(namespace="gpu-ops")

    assert "gpuquota-system" not in yaml.safe_dump_all(chart)
    [namespace] = [o for o in chart if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "gpu-ops"
    assert all(o["metadata"].get("namespace") in (None, "gpu-ops") for o in chart)


def test_namespace_create_false_leaves_the_namespace_to_the_user(base: list[dict[str, Any]]) -> None:
    assert_same_objects(helm_template("namespace.create=false"), [o for o in base if o["kind"] != "Namespace"])


@pytest.mark.parametrize(("copy_in_chart", "source"), [
    ("files/prometheus-rules.yaml", MONITORING / "prometheus-rules.yaml"),
    ("files/grafana-dashboard.json", MONITORING / "grafana-dashboard.json"),
    ("files/crd-elasticquota.yaml", ELASTICQUOTA_CRD / "crd-elasticquota.yaml"),
])
def test_the_charts_copies_equal_their_sources(copy_in_chart: str, source: Path) -> None:
    # Helm reads files only from inside the chart; these copies must not drift from manifests/.
    assert (CHART / copy_in_chart).read_bytes() == source.read_bytes(), f"cp {source} {CHART / copy_in_chart}"


def test_helm_lint_passes_strict() -> None:
    out = run([helm(), "lint", "--strict", str(CHART)])

    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("bad", ["accounting=eventual", "replicas=0", "writerLease=Ledger_Writer"])
def test_the_values_schema_refuses_bad_values(bad: str) -> None:
    result = subprocess.run([helm(), "template", "gpuquota", str(CHART), "--set", bad], capture_output=True,
                            text=True, timeout=120, check=False)

    assert result.returncode != 0
    assert bad.split("=")[0] in result.stderr


def install_notes(*sets: str) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (no cluster contacted)."""
    args = [helm(), "install", "gq", str(CHART), "--namespace", "gpu-ops", "--dry-run=client"]
    for value in sets:
        args += ["--set", value]
    out = run(args)
    return out[out.index("NOTES:"):]


def test_install_notes_say_how_the_certificate_arrives() -> None:
    self_managed = install_notes()
    cert_manager = install_notes("certManager.enabled=true")

    assert "hack/install-self-managed-certs.sh --namespace gpu-ops" in self_managed
    assert "install-self-managed-certs" not in cert_manager and "cert-manager issues" in cert_manager
    assert "kubectl -n gpu-ops rollout status deployment/gpuquota-webhook" in self_managed
    # Step 2 is named until the configurations are on, and only then.
    assert "gpuquota preflight -n gpu-ops" in self_managed
    assert "--set webhookConfigurations.enabled=true" in self_managed
    assert "preflight" not in install_notes("webhookConfigurations.enabled=true")
