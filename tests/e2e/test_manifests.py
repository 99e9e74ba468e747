"""The install manifests (manifests/base, both overlays, the webhook configurations of step 2 and the
optional NetworkPolicy component and ElasticQuota CRD) render with kustomize and are accepted by a
real apiserver; hack/install-self-managed-certs.sh runs against it end to end.

Only the Namespace is created for real by the manifest checks. Everything else goes through
server-side dry-run: the apiserver validates and admits it but stores nothing. That matters most for
the webhook configurations: stored for real, they would send every GPU pod of the shared test
apiserver to a Service that has no endpoints. The certificate script needs real configurations to
patch, so it gets uniquely named copies that select no namespace at all, deleted again afterwards.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from admissionchain import delete_webhook_configurations
from controlplane import REPO_ROOT, Api
from cryptography import x509
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from webhook.serving.settings import Settings
from webhook.serving.supervision import SERVICE_STOP_SECONDS

BASE = REPO_ROOT / "manifests" / "base"
OVERLAYS = REPO_ROOT / "manifests" / "overlays"
CERT_MANAGER = OVERLAYS / "cert-manager"
SELF_MANAGED = OVERLAYS / "self-managed"
WEBHOOKS = REPO_ROOT / "manifests" / "webhooks"
CERT_MANAGER_WEBHOOKS = CERT_MANAGER / "webhooks"
NETWORK_POLICY = REPO_ROOT / "manifests" / "networkpolicy"
ELASTICQUOTA_CRD_DIR = REPO_ROOT / "manifests" / "elasticquota-crd"
PLACEHOLDER_PEER = {"ipBlock": {"cidr": "192.0.2.1/32"}}
INSTALL_CERTS = REPO_ROOT / "hack" / "install-self-managed-certs.sh"
CONTAINERFILE = REPO_ROOT / "Containerfile"
DEPLOY_DOC = REPO_ROOT / "docs" / "deploy.md"
NAMESPACE = "gpuquota-system"
KUBECTL_TIMEOUT = 120.0
SCRIPT_TIMEOUT = 180.0
CERT_MANAGER_GROUP = "cert-manager.io"
INJECT_CA_FROM = "cert-manager.io/inject-ca-from"
WEBHOOK_CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


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


def render(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    result = run([kubectl, "kustomize", str(directory)])
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, BASE)


@pytest.fixture(scope="module")
def cert_manager_rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, CERT_MANAGER)


@pytest.fixture(scope="module")
def self_managed_rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, SELF_MANAGED)


@pytest.fixture(scope="module")
def webhooks_rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, WEBHOOKS)


@pytest.fixture(scope="module")
def cert_manager_webhooks_rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, CERT_MANAGER_WEBHOOKS)


def render_with_component(kubectl: str, directory: Path, component: Path, workdir: Path,
                          extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``directory`` with ``component`` added, as a user's overlay adds it."""
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize refuses absolute paths, but a relative one may climb out of the overlay's root.
        "resources": [os.path.relpath(directory, workdir)],
        "components": [os.path.relpath(component, workdir)],
        **(extra or {}),
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    return render(kubectl, workdir)


@pytest.fixture(scope="module")
def install_namespace(rendered: list[dict[str, Any]], api: Api) -> str:
    """gpuquota-system, created for real: namespaced objects cannot even be dry-run into a missing one.

    The webhook configurations exclude it by name, and nothing else in the suite uses it.
    """
    try:
        api.core.create_namespace(find(rendered, "Namespace", NAMESPACE))
    except ApiException as exc:
        if exc.status != 409:  # an earlier run in this session created it
            raise
    return NAMESPACE


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


BASE_OBJECTS = [
    ("Namespace", NAMESPACE),
    ("ServiceAccount", "gpuquota-webhook"),
    ("ClusterRole", "gpuquota-webhook"),
    ("ClusterRole", "gpuquota-cli"),
    ("ClusterRoleBinding", "gpuquota-webhook"),
    ("Role", "gpuquota-webhook-ledger"),
    ("RoleBinding", "gpuquota-webhook-ledger"),
    ("Deployment", "gpuquota-webhook"),
    ("Service", "gpuquota-webhook"),
    ("PodDisruptionBudget", "gpuquota-webhook"),
    ("ConfigMap", "gpuquota-config"),
    ("ValidatingAdmissionPolicy", "gpuquota-opt-out-label"),
    ("ValidatingAdmissionPolicyBinding", "gpuquota-opt-out-label"),
]
WEBHOOK_OBJECTS = [(kind, "gpuquota-webhook") for kind in WEBHOOK_CONFIGURATION_KINDS]
NAMESPACED_BASE_KINDS = {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Role",
                         "RoleBinding"}


def test_kustomize_renders_every_listed_resource(
    rendered: list[dict[str, Any]], webhooks_rendered: list[dict[str, Any]],
) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in rendered)
    assert kinds == sorted(BASE_OBJECTS)
    assert identities(webhooks_rendered) == sorted(WEBHOOK_OBJECTS)
    # The kustomization's namespace reached every namespaced object.
    for obj in rendered:
        if obj["kind"] in NAMESPACED_BASE_KINDS:
            assert obj["metadata"]["namespace"] == NAMESPACE, printed_name(obj)


def dry_run_apply(objects: list[dict[str, Any]], kubectl: str, kubeconfig_path: Path, api: Api) -> None:
    """Server-side dry-run apply of ``objects``: every one must be accepted, and nothing stored."""
    before = stored_webhook_configurations(api)
    # The CRD already exists (elasticquota_crd); a dry-run apply over it is still validated in full.
    result = run([kubectl, "apply", "--dry-run=server", "--kubeconfig", str(kubeconfig_path), "-f", "-"],
                 stdin=yaml.safe_dump_all(objects))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    for obj in objects:
        line = re.compile(rf"^{re.escape(printed_name(obj))} \S.*\(server dry run\)$", re.MULTILINE)
        assert line.search(result.stdout), f"{printed_name(obj)} missing from:\n{result.stdout}"
    # Dry-run really stored nothing: no configuration may route the suite's pods to a dead Service.
    # (Compared, not asserted absent: the webhook_server fixture registers loopback copies under
    # the same names when the whole suite runs.)
    assert stored_webhook_configurations(api) == before


def test_apiserver_accepts_every_object(
    rendered: list[dict[str, Any]], webhooks_rendered: list[dict[str, Any]], kubectl: str, kubeconfig_path: Path,
    api: Api, install_namespace: str, elasticquota_crd: k8s.V1CustomResourceDefinition,
) -> None:
    dry_run_apply([o for o in rendered if o["kind"] != "Namespace"] + webhooks_rendered, kubectl, kubeconfig_path,
                  api)


# -- beside Koordinator ---------------------------------------------------------------------------

def test_no_install_of_ours_replaces_koordinators_elasticquota_crd(
    rendered: list[dict[str, Any]], cert_manager_rendered: list[dict[str, Any]],
    self_managed_rendered: list[dict[str, Any]], webhooks_rendered: list[dict[str, Any]],
    cert_manager_webhooks_rendered: list[dict[str, Any]], kubectl: str,
) -> None:
    """Koordinator installs the ElasticQuota CRD; the base, the overlays and step 2 never carry one
    (an apply would replace Koordinator's schema). Only manifests/elasticquota-crd does, on its own."""
    for objects in (rendered, cert_manager_rendered, self_managed_rendered, webhooks_rendered,
                    cert_manager_webhooks_rendered):
        assert [o for o in objects if o["kind"] == "CustomResourceDefinition"] == []
    (crd,) = render(kubectl, ELASTICQUOTA_CRD_DIR)
    assert crd["metadata"]["name"] == "elasticquotas.scheduling.sigs.k8s.io"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_webhook_configurations_are_a_step_of_their_own(
    rendered: list[dict[str, Any]], cert_manager_rendered: list[dict[str, Any]],
    self_managed_rendered: list[dict[str, Any]],
) -> None:
    """Validation fails closed: no step-1 kustomization installs a webhook configuration, so nothing
    refuses GPU pods before `gpuquota preflight --install` has seen the webhook answer."""
    for objects in (rendered, cert_manager_rendered, self_managed_rendered):
        assert [o for o in objects if o["kind"] in WEBHOOK_CONFIGURATION_KINDS] == []


def test_deployment_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    deployment = find(rendered, "Deployment", "gpuquota-webhook")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the server's graceful timeout and the quota service's stop after it (webhook.serving.supervision)
    assert pod["terminationGracePeriodSeconds"] > Settings().graceful_timeout + SERVICE_STOP_SECONDS
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


def test_webhook_role_reads_and_writes_only_its_ledger_and_events(rendered: list[dict[str, Any]]) -> None:
    role = find(rendered, "ClusterRole", "gpuquota-webhook")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    # PodGroups: a gang's minimum when its members name one (gpuquota_core/gang.py).
    reads = {(group, resource, verb) for group, resource in (("", "pods"), ("", "nodes"),
                                                                   ("scheduling.sigs.k8s.io", "elasticquotas"),
                                                                   ("scheduling.sigs.k8s.io", "podgroups"))
             for verb in ("get", "list", "watch")}
    # Events about refused pods (webhook/quota/events.py): created, then read and patched to raise their count.
    events = {("", "events", verb) for verb in ("create", "get", "patch")}
    assert granted == reads | events
    # The CLI role exists but is bound to nobody by the base: operators bind it themselves.
    find(rendered, "ClusterRole", "gpuquota-cli")
    bindings = [o for o in rendered if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    assert sorted(b["roleRef"]["name"] for b in bindings) == ["gpuquota-webhook", "gpuquota-webhook-ledger"]
    # Its one write permission: strict accounting's ledger ConfigMaps, in its own namespace only.
    ledger = find(rendered, "Role", "gpuquota-webhook-ledger")
    assert ledger["metadata"]["namespace"] == NAMESPACE
    # And the writer Lease, read and renewed by its name only (RBAC cannot restrict a create by name).
    assert ledger["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                "verbs": ["get", "list", "create", "update"]},
                               {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                "resourceNames": ["gpuquota-ledger-writer"], "verbs": ["get", "update"]},
                               {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    (container,) = find(rendered, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--accounting") + 1] == "strict"
    assert args[args.index("--writer-lease") + 1] == "gpuquota-ledger-writer"
    # The holder writes its own address into the Lease: the pod's IP, from the downward API.
    assert container["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert {"containerPort": int(args[args.index("--peer-port") + 1]), "name": "peer",
            "protocol": "TCP"} in container["ports"]


# -- NetworkPolicy --------------------------------------------------------------------------------

def container_ports(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (container,) = find(rendered, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]["containers"]
    ports: list[dict[str, Any]] = container["ports"]
    return ports


@pytest.fixture(scope="module")
def network_policy(kubectl: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    objects = render_with_component(kubectl, BASE, NETWORK_POLICY, tmp_path_factory.mktemp("netpol"))
    return find(objects, "NetworkPolicy", "gpuquota-webhook")


def test_the_networkpolicy_is_an_optional_component(rendered: list[dict[str, Any]], kubectl: str) -> None:
    assert [o for o in rendered if o["kind"] == "NetworkPolicy"] == []
    component = yaml.safe_load((NETWORK_POLICY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert component["kind"] == "Component"


def test_networkpolicy_admits_control_plane_and_monitoring_to_the_deployments_port(
    rendered: list[dict[str, Any]], network_policy: dict[str, Any],
) -> None:
    policy = network_policy["spec"]
    assert network_policy["metadata"]["namespace"] == NAMESPACE
    pod_labels = find(rendered, "Deployment", "gpuquota-webhook")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    control_plane, monitoring, replicas = policy["ingress"]
    # Index 0 is the control plane: docs/deploy.md and the policy's comment tell overlays to replace
    # /spec/ingress/0/from. Shipped: a placeholder that matches nothing, never a selector of
    # kube-system pods (which matches neither a host-network nor a managed apiserver).
    assert control_plane["from"] == [PLACEHOLDER_PEER]
    assert monitoring["from"] == [
        {"namespaceSelector": {"matchLabels": {"gpuquota.koord-gpuquota.io/monitoring": "true"}}},
    ]
    # The other replicas, and only they, reach the peer port (forwarded admissions).
    assert replicas["from"] == [{"podSelector": {"matchLabels": policy["podSelector"]["matchLabels"]}}]
    # Each rule opens one port the webhook container listens on (by name or number): https, which
    # carries admission and /metrics alike, to the control plane and scrapers; peer to the replicas.
    by_name = {port["name"]: {port["name"], port["containerPort"]} for port in container_ports(rendered)}
    assert sorted(by_name) == ["https", "peer"]
    for rule, opened in ((control_plane, "https"), (monitoring, "https"), (replicas, "peer")):
        assert [(p["port"] in by_name[opened], p["protocol"]) for p in rule["ports"]] == [(True, "TCP")]


def test_documented_overlay_renders_and_is_accepted(
    kubectl: str, kubeconfig_path: Path, api: Api, install_namespace: str, tmp_path: Path,
) -> None:
    """The example overlay of docs/deploy.md, step 0, pointed at the real directories."""
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    match = re.search(r"```yaml\n# my-cluster/kustomization.yaml\n(.*?)```", text, re.DOTALL)
    assert match, "docs/deploy.md lost its example overlay"
    kustomization = yaml.safe_load(match.group(1))
    assert kustomization["resources"] == ["../manifests/overlays/cert-manager"]
    assert kustomization["components"] == ["../manifests/networkpolicy"]
    # kustomize refuses absolute paths, but a relative one may climb out of the overlay's root.
    kustomization["resources"] = [os.path.relpath(CERT_MANAGER, tmp_path)]
    kustomization["components"] = [os.path.relpath(NETWORK_POLICY, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
    objects = render(kubectl, tmp_path)
    policy = find(objects, "NetworkPolicy", "gpuquota-webhook")["spec"]
    assert policy["ingress"][0]["from"] == [{"ipBlock": {"cidr": f"10.20.0.{n}/32"}} for n in (11, 12, 13)]
    assert policy["ingress"][1]["from"][0]["namespaceSelector"]  # the monitoring rule is untouched
    (container,) = find(objects, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/platform/koord-gpuquota:0.1.0"
    dry_run_apply([o for o in objects if o["kind"] != "Namespace" and not is_cert_manager(o)],
                  kubectl, kubeconfig_path, api)


# -- the overlays ---------------------------------------------------------------------------------

def is_cert_manager(obj: dict[str, Any]) -> bool:
    return bool(obj["apiVersion"].partition("/")[0] == CERT_MANAGER_GROUP)


def identities(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects)


def test_overlays_render_the_base_plus_their_certificates(
    cert_manager_rendered: list[dict[str, Any]], self_managed_rendered: list[dict[str, Any]],
    webhooks_rendered: list[dict[str, Any]], cert_manager_webhooks_rendered: list[dict[str, Any]],
) -> None:
    assert identities(self_managed_rendered) == sorted(BASE_OBJECTS)
    assert identities(cert_manager_rendered) == sorted([
        *BASE_OBJECTS,
        ("Issuer", "gpuquota-selfsigned"),
        ("Certificate", "gpuquota-webhook-ca"),
        ("Issuer", "gpuquota-webhook-ca"),
        ("Certificate", "gpuquota-webhook"),
    ])
    for obj in cert_manager_rendered:
        if is_cert_manager(obj):
            assert obj["apiVersion"] == "cert-manager.io/v1", printed_name(obj)
            assert obj["metadata"]["namespace"] == NAMESPACE, printed_name(obj)
    # Step 2 with cert-manager is step 2 plus cainjector's annotation, nothing else.
    assert identities(cert_manager_webhooks_rendered) == identities(webhooks_rendered)
    for plain in webhooks_rendered:
        annotated = copy.deepcopy(find(cert_manager_webhooks_rendered, plain["kind"], plain["metadata"]["name"]))
        assert annotated["metadata"].pop("annotations") == {INJECT_CA_FROM: f"{NAMESPACE}/gpuquota-webhook"}
        assert annotated == plain
    # The rendered configurations carry no caBundle: re-applying them never overwrites the one
    # preflight or the script wrote.
    for kind in WEBHOOK_CONFIGURATION_KINDS:
        for webhook in find(webhooks_rendered, kind, "gpuquota-webhook")["webhooks"]:
            assert "caBundle" not in webhook["clientConfig"], webhook["name"]


def test_cert_manager_overlay_wires_certificate_secret_service_and_webhooks(
    cert_manager_rendered: list[dict[str, Any]], cert_manager_webhooks_rendered: list[dict[str, Any]],
) -> None:
    objects = cert_manager_rendered + cert_manager_webhooks_rendered
    service = find(objects, "Service", "gpuquota-webhook")
    svc, ns = service["metadata"]["name"], service["metadata"]["namespace"]
    certificates = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects
                    if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Issuer"}
    injected = set()
    for kind in WEBHOOK_CONFIGURATION_KINDS:
        configuration = find(objects, kind, "gpuquota-webhook")
        annotation = configuration["metadata"]["annotations"][INJECT_CA_FROM]
        injected.add(annotation)
        namespace, _, name = annotation.partition("/")
        assert (namespace, name) in certificates, f"{kind}: {annotation} names no Certificate in the output"
        for webhook in configuration["webhooks"]:
            reference = webhook["clientConfig"]["service"]
            assert (reference["namespace"], reference["name"]) == (ns, svc), webhook["name"]
            assert reference["port"] == service["spec"]["ports"][0]["port"], webhook["name"]
            assert "caBundle" not in webhook["clientConfig"], "cainjector's field; the overlay must not set it"
    (annotation,) = injected
    serving = certificates[tuple(annotation.split("/", 1))]["spec"]
    assert serving["dnsNames"] == [f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
    assert serving.get("isCA", False) is False
    # It writes the Secret the Deployment mounts.
    volumes = find(objects, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]["volumes"]
    (tls_volume,) = [v for v in volumes if v["name"] == "tls"]
    assert serving["secretName"] == tls_volume["secret"]["secretName"] == "gpuquota-webhook-tls"
    # The chain: serving Certificate <- CA Issuer <- CA Certificate <- selfSigned Issuer.
    ca_issuer = issuers[serving["issuerRef"]["name"]]
    assert serving["issuerRef"]["kind"] == "Issuer"
    ca_secret = ca_issuer["spec"]["ca"]["secretName"]
    (ca_certificate,) = [c for c in certificates.values() if c["spec"]["secretName"] == ca_secret]
    assert ca_certificate["spec"]["isCA"] is True
    # Kept across CA renewals, so serving certificates issued before one still verify after it.
    assert ca_certificate["spec"]["privateKey"]["rotationPolicy"] == "Never"
    assert issuers[ca_certificate["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    assert ca_certificate["spec"]["issuerRef"]["kind"] == "Issuer"


@pytest.mark.parametrize("overlay", ["cert-manager", "self-managed"])
def test_apiserver_accepts_every_overlay_object(
    overlay: str, kubectl: str, kubeconfig_path: Path, api: Api, install_namespace: str,
    elasticquota_crd: k8s.V1CustomResourceDefinition,
) -> None:
    # cert-manager's CRDs are not installed in the test apiserver, so its four objects cannot be
    # dry-run; the wiring test above checks what they must agree on.
    objects = [o for o in render(kubectl, OVERLAYS / overlay) if o["kind"] != "Namespace" and not is_cert_manager(o)]
    assert len(objects) == len(BASE_OBJECTS) - 1
    step_two = render(kubectl, CERT_MANAGER_WEBHOOKS if overlay == "cert-manager" else WEBHOOKS)
    dry_run_apply(objects + step_two, kubectl, kubeconfig_path, api)


def test_apiserver_accepts_the_optional_crd_and_networkpolicy(
    kubectl: str, kubeconfig_path: Path, api: Api, install_namespace: str, network_policy: dict[str, Any],
    elasticquota_crd: k8s.V1CustomResourceDefinition,
) -> None:
    dry_run_apply([*render(kubectl, ELASTICQUOTA_CRD_DIR), network_policy], kubectl, kubeconfig_path, api)


# -- monitoring (optional kustomization) ----------------------------------------------------------

MONITORING = REPO_ROOT / "manifests" / "monitoring"


@pytest.fixture(scope="module")
def monitoring_rendered(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, MONITORING)


def test_monitoring_renders_servicemonitor_rules_and_dashboard(
    monitoring_rendered: list[dict[str, Any]], rendered: list[dict[str, Any]],
) -> None:
    assert identities(monitoring_rendered) == [("ConfigMap", "gpuquota-grafana-dashboard"),
                                               ("PrometheusRule", "gpuquota-webhook"),
                                               ("ServiceMonitor", "gpuquota-webhook")]
    assert all(o["metadata"]["namespace"] == NAMESPACE for o in monitoring_rendered)
    dashboard = find(monitoring_rendered, "ConfigMap", "gpuquota-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["grafana-dashboard.json"] == (MONITORING / "grafana-dashboard.json").read_text()
    rule = find(monitoring_rendered, "PrometheusRule", "gpuquota-webhook")
    assert rule["spec"]["groups"] == yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())["groups"]
    # The ServiceMonitor selects the base's Service, by the name of its port, and verifies the
    # serving certificate for the Service's DNS name with the CA in the TLS Secret the pods mount.
    service = find(rendered, "Service", "gpuquota-webhook")
    monitor = find(monitoring_rendered, "ServiceMonitor", "gpuquota-webhook")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    secret = endpoint["tlsConfig"]["ca"]["secret"]
    volumes = find(rendered, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]["volumes"]
    assert secret["name"] in {v.get("secret", {}).get("secretName") for v in volumes}
    assert secret["key"] == "ca.crt"


def test_apiserver_accepts_the_dashboard_configmap(
    monitoring_rendered: list[dict[str, Any]], kubectl: str, kubeconfig_path: Path, api: Api,
    install_namespace: str,
) -> None:
    # The Prometheus Operator's CRDs are not installed in the test apiserver; the ConfigMap (the
    # dashboard JSON under the size limit) is what it can check.
    dry_run_apply([find(monitoring_rendered, "ConfigMap", "gpuquota-grafana-dashboard")], kubectl,
                  kubeconfig_path, api)


# -- Containerfile --------------------------------------------------------------------------------

def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def test_containerfile_matches_the_deployment(rendered: list[dict[str, Any]]) -> None:
    text = CONTAINERFILE.read_text(encoding="utf-8")
    assert "NOT BUILT" in text.splitlines()[0]  # honest about never having been built
    instructions = containerfile_instructions()
    stages = [args for keyword, args in instructions if keyword == "FROM"]
    assert stages == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE}"]
    (base_image,) = [args for keyword, args in instructions if keyword == "ARG" and args.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=\S*python:3\.11-slim\S*", base_image)
    final_from = [index for index, (keyword, _) in enumerate(instructions) if keyword == "FROM"][-1]
    builder, final = instructions[:final_from], instructions[final_from:]
    assert any(k == "RUN" and "pip wheel" in a for k, a in builder)
    # The final stage installs the builder's wheels offline and compiles nothing.
    final_runs = " ".join(a for k, a in final if k == "RUN")
    assert "from=builder" in final_runs and "--no-index" in final_runs
    assert not re.search(r"\b(apt-get|gcc|build-essential)\b", final_runs)
    # Every package setuptools packs into the wheel is copied into the builder.
    copied = {args.split()[0].rstrip("/") for keyword, args in builder if keyword == "COPY"}
    assert {"gpuquota_core", "kubeaccess", "webhook", "cli"} <= copied
    # Non-root with the Deployment's numeric UID/GID; the entrypoint the Deployment spells out.
    pod = find(rendered, "Deployment", "gpuquota-webhook")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (user,) = [args for keyword, args in final if keyword == "USER"]
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert user.split(":")[0] == str(container["securityContext"]["runAsUser"])
    (entrypoint,) = [args for keyword, args in final if keyword == "ENTRYPOINT"]
    assert yaml.safe_load(entrypoint) == container["command"] == ["gpuquota", "serve"]
    assert "serve" not in container["args"]
    (exposed,) = [args for keyword, args in final if keyword == "EXPOSE"]
    assert [int(port) for port in exposed.split()] == [port["containerPort"] for port in container_ports(rendered)]


# -- hack/install-self-managed-certs.sh -----------------------------------------------------------

def gpuquota_command() -> str:
    beside_python = Path(sys.executable).parent / "gpuquota"
    found = str(beside_python) if beside_python.exists() else shutil.which("gpuquota")
    assert found, "the gpuquota command is not installed (make .venv/.installed)"
    return found


def run_install_certs(args: list[str], kubectl: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(kubectl).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("GPUQUOTA", None)
    return subprocess.run([str(INSTALL_CERTS), *args], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
                          check=False, cwd=REPO_ROOT, env=env)


@pytest.fixture
def inert_configurations(
    webhooks_rendered: list[dict[str, Any]], namespace: str, kubectl: str, kubeconfig_path: Path, api: Api,
) -> Iterator[list[dict[str, Any]]]:
    """The configurations of step 2, stored for real under a unique name, calling the
    webhook Service in ``namespace``, and selecting no namespace at all.

    Stored configurations are shared by every test of the session, and validation fails closed: a
    copy that matched anything would refuse the suite's GPU pods. So every webhook requires a
    namespace label nobody sets, and the copies are deleted again whatever the test does.
    """
    name = f"gpuquota-certs-{uuid.uuid4().hex[:8]}"
    documents = []
    for kind in WEBHOOK_CONFIGURATION_KINDS:
        document = find(webhooks_rendered, kind, "gpuquota-webhook")
        document = yaml.safe_load(yaml.safe_dump(document))  # a deep copy
        document["metadata"]["name"] = name
        for webhook in document["webhooks"]:
            webhook["clientConfig"]["service"]["namespace"] = namespace
            webhook["namespaceSelector"]["matchExpressions"].append(
                {"key": "gpuquota-e2e.invalid/never-set", "operator": "Exists"})
        documents.append(document)
    try:
        # Stored like a user's `kubectl apply -k` would, so the re-apply below is a real upgrade.
        result = run([kubectl, "apply", "--kubeconfig", str(kubeconfig_path), "-f", "-"],
                     stdin=yaml.safe_dump_all(documents))
        assert result.returncode == 0, result.stderr
        yield documents
    finally:
        delete_webhook_configurations(api, documents)


def stored_ca_bundles(api: Api, name: str) -> dict[str, str | None]:
    bundles: dict[str, str | None] = {}
    mutating = api.admissionregistration.read_mutating_webhook_configuration(name)
    validating = api.admissionregistration.read_validating_webhook_configuration(name)
    for configuration in (mutating, validating):
        for webhook in configuration.webhooks:
            bundles[webhook.name] = webhook.client_config.ca_bundle
    return bundles


def test_install_self_managed_certs_end_to_end_and_idempotent(
    inert_configurations: list[dict[str, Any]], namespace: str, kubectl: str, kubeconfig_path: Path, api: Api,
) -> None:
    name = inert_configurations[0]["metadata"]["name"]
    webhook_names = {w["name"] for d in inert_configurations for w in d["webhooks"]}
    assert len(webhook_names) == 3
    args = ["--namespace", namespace, "--kubeconfig", str(kubeconfig_path), "--configuration", name,
            "--gpuquota", gpuquota_command()]

    def install() -> tuple[dict[str, bytes], subprocess.CompletedProcess[str]]:
        result = run_install_certs(args, kubectl)
        assert result.returncode == 0, f"{shlex.join(args)}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        secret = api.core.read_namespaced_secret("gpuquota-webhook-tls", namespace)
        assert secret.type == "kubernetes.io/tls"
        assert set(secret.data) == {"tls.crt", "tls.key", "ca.crt"}
        data = {key: base64.b64decode(value) for key, value in secret.data.items()}
        # The key never reaches the terminal, and no copy of it sits in a last-applied annotation.
        key_body = b"".join(data["tls.key"].splitlines()[1:-1]).decode()
        assert key_body and key_body[:40] not in result.stdout + result.stderr
        assert "kubectl.kubernetes.io/last-applied-configuration" not in (secret.metadata.annotations or {})
        # The serving certificate is for the Service, and signed by the CA in the Secret.
        leaf = x509.load_pem_x509_certificate(data["tls.crt"])
        ca = x509.load_pem_x509_certificate(data["ca.crt"])
        leaf.verify_directly_issued_by(ca)
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {f"gpuquota-webhook.{namespace}.svc", f"gpuquota-webhook.{namespace}.svc.cluster.local"} <= set(
            sans.get_values_for_type(x509.DNSName))
        return data, result

    first, _ = install()
    assert stored_ca_bundles(api, name) == dict.fromkeys(webhook_names, base64.b64encode(first["ca.crt"]).decode())

    # Again: a new CA, and caBundle trusts it and the previous one while the pods reload.
    second, result = install()
    assert second["ca.crt"] != first["ca.crt"]
    both = base64.b64encode(second["ca.crt"] + first["ca.crt"]).decode()
    assert stored_ca_bundles(api, name) == dict.fromkeys(webhook_names, both)
    assert "until the next run" in result.stderr

    # An upgrade (`kubectl apply` of the overlay again) keeps the patched caBundle.
    reapplied = run([kubectl, "apply", "--kubeconfig", str(kubeconfig_path), "-f", "-"],
                    stdin=yaml.safe_dump_all(inert_configurations))
    assert reapplied.returncode == 0, reapplied.stderr
    assert stored_ca_bundles(api, name) == dict.fromkeys(webhook_names, both)

    # The bundle never grows past two CAs: the oldest drops out on the next run.
    third, _ = install()
    assert stored_ca_bundles(api, name) == dict.fromkeys(
        webhook_names, base64.b64encode(third["ca.crt"] + second["ca.crt"]).decode())


def test_install_self_managed_certs_refuses_a_mismatched_service(
    inert_configurations: list[dict[str, Any]], namespace: str, kubectl: str, kubeconfig_path: Path, api: Api,
) -> None:
    name = inert_configurations[0]["metadata"]["name"]
    # The configurations call gpuquota-webhook in `namespace`; a certificate for another Service
    # would never verify, so the script stops before generating or writing anything.
    result = run_install_certs(["--namespace", namespace, "--kubeconfig", str(kubeconfig_path),
                                "--configuration", name, "--service", "other", "--gpuquota", gpuquota_command()],
                               kubectl)
    assert result.returncode == 1, result.stderr
    assert f"calls service '{namespace}/gpuquota-webhook', but the certificate would be for {namespace}/other" \
        in result.stderr
    with pytest.raises(ApiException) as missing:
        api.core.read_namespaced_secret("gpuquota-webhook-tls", namespace)
    assert missing.value.status == 404
    assert set(stored_ca_bundles(api, name).values()) == {None}


def test_install_self_managed_certs_usage(kubectl: str) -> None:
    help_result = run_install_certs(["--help"], kubectl)
    assert help_result.returncode == 0
    for option in ("--namespace", "--kubeconfig", "--context"):
        assert option in help_result.stdout
    bad = run_install_certs(["--frobnicate"], kubectl)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert "unknown argument: --frobnicate" in bad.stderr
    assert "--help" in bad.stderr


def test_install_self_managed_certs_before_step_two_writes_the_secret_only(
    namespace: str, kubectl: str, kubeconfig_path: Path, api: Api,
) -> None:
    """On a first install the configurations do not exist yet (preflight writes them later, with the
    CA of the Secret): the script writes the Secret and says so, and creates no configuration."""
    name = f"gpuquota-certs-{uuid.uuid4().hex[:8]}"
    result = run_install_certs(["--namespace", namespace, "--kubeconfig", str(kubeconfig_path), "--configuration",
                                name, "--gpuquota", gpuquota_command()], kubectl)

    assert result.returncode == 0, result.stderr
    assert f"validatingwebhookconfiguration/{name} is not installed yet" in result.stderr
    secret = api.core.read_namespaced_secret("gpuquota-webhook-tls", namespace)
    assert set(secret.data) == {"tls.crt", "tls.key", "ca.crt"}
    with pytest.raises(ApiException) as missing:
        api.admissionregistration.read_validating_webhook_configuration(name)
    assert missing.value.status == 404
