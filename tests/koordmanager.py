"""koord-manager in the test cluster: its pod and ElasticQuota webhooks and its quota controller,
built from Koordinator's Go module by ``hack/build-koordinator.sh`` (not a test module).

koord-manager keeps its own webhook configurations: it reads the two configurations named by
``MUTATING_WEBHOOK_NAME`` / ``VALIDATING_WEBHOOK_NAME`` (which must already exist), keeps their
original webhooks as a ``template`` annotation, drops every webhook whose path has no handler under
its feature gates, and writes back caBundle and clientConfig. With ``WEBHOOK_HOST`` set it turns each
``service`` reference into ``https://WEBHOOK_HOST:WEBHOOK_PORT/<path>`` and, with no
``WEBHOOK_CERT_WRITER``, generates a CA and a serving certificate (an IP SAN for an IP host) into
``WEBHOOK_CERT_DIR`` itself (pkg/webhook/util/controller/webhook_controller.go,
pkg/webhook/util/configuration/configuration.go in koordinator-sh/koordinator). So the harness creates
the configurations from Koordinator's own config/webhook files and lets koord-manager do the rest,
as it does in a cluster.

Koordinator changes nothing of ours, and we change only what the test cluster needs, in code below:
the configurations' names (Koordinator's chart names), the Service they name (so that
koord-manager's rewrite to a URL applies) and, when a test asks, a namespaceSelector that adds its
own labels to Koordinator's.

Which controllers run: ``quotaprofile`` (Koordinator's quota controller, which turns
ElasticQuotaProfiles into quotas) and nothing else by default. The slo-controller's ``noderesource``
with its GPUDeviceResource plugin is how a real node gets its ``koordinator.sh/gpu-*`` allocatable
from the Device koordlet writes; the webhook tests do not use it: no pod webhook of koord-manager
reads Nodes, its other plugins (batch, mid, CPU normalisation) work from NodeMetrics only koordlet
writes, and the tests write the allocatable that plugin would
(``koordinator.koordinator_allocatable``). ``controllers=`` and ``node_resource_plugins=`` turn it on
for a test that wants it.
"""

from __future__ import annotations

import copy
import shutil
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from clusterhelpers import create_quota
from controlplane import LOOPBACK, Api, ControlPlane, free_ports
from koordinator import KOORDINATOR_NAMESPACE, KoordinatorBuild, ensure_namespace, feature_gates_flag, wait_for
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from loadbalancer import HAProxy

KOORD_MANAGER_NAME = "koord-manager"
# The names koord-manager looks for when MUTATING_WEBHOOK_NAME / VALIDATING_WEBHOOK_NAME are unset
# (pkg/webhook/util/util.go), which are also the names Koordinator's chart gives them.
MUTATING_CONFIGURATION = "koordinator-mutating-webhook-configuration"
VALIDATING_CONFIGURATION = "koordinator-validating-webhook-configuration"
WEBHOOK_SERVICE = "koordinator-webhook-service"
# Its quota controller: ElasticQuotaProfile -> ElasticQuota (pkg/quota-controller/profile).
QUOTA_CONTROLLERS = ("quotaprofile",)
# Forbidden on every pod by koord-manager's validating webhook (pkg/webhook/pod/validating/
# verify_annotations.go), whatever the feature gates: a refusal only its webhook gives.
RESERVE_POD_ANNOTATION = "scheduling.koordinator.sh/reserve-pod"
GPU_SHARED = "koordinator.sh/gpu.shared"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
START_TIMEOUT = 120.0
# What its filesystem cert writer reads back; missing any one, it generates a new CA
# (pkg/webhook/util/writer/fs.go, ensureExist).
CERT_FILES = ("ca-cert.pem", "ca-key.pem", "cert.pem", "key.pem", "tls.crt", "tls.key")


@dataclass(frozen=True)
class KoordManager:
    """One running koord-manager: where it serves and which configurations it owns."""

    name: str
    pid: int
    webhook_port: int
    health_port: int
    cert_dir: Path
    log_path: Path
    mutating_configuration: str
    validating_configuration: str
    feature_gates: Mapping[str, bool]

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.webhook_port}"

    @property
    def ca_file(self) -> Path:
        # pkg/webhook/util/writer: ca-cert.pem, ca-key.pem, cert.pem, key.pem (+ tls.crt/tls.key).
        return self.cert_dir / "ca-cert.pem"

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _merge_selector(base: Mapping[str, Any] | None, labels: Mapping[str, str]) -> dict[str, Any]:
    """``base`` AND ``labels``: a LabelSelector matching only namespaces carrying every label too."""
    merged: dict[str, Any] = copy.deepcopy(dict(base or {}))
    merged["matchLabels"] = {**merged.get("matchLabels", {}), **labels}
    return merged


def koordinator_webhook_configurations(build: KoordinatorBuild, *, mutating_name: str, validating_name: str,
                                       namespace_labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Koordinator's config/webhook as its kustomization builds it: manifests.yaml with
    patch_manifests.yaml merged into the webhook of the same name (strategic merge on ``name``), the
    Service in koordinator-system. Then the test-cluster changes, and only these: the two names
    (``mutating_name``/``validating_name``, so several koord-managers can share one apiserver) and,
    with ``namespace_labels``, those labels added to every webhook's namespaceSelector (Koordinator's
    own ``control-plane DoesNotExist`` is kept), so this koord-manager judges only the namespaces of
    the tests that start it."""
    documents = [doc for doc in yaml.safe_load_all((build.webhook_dir / "manifests.yaml").read_text(encoding="utf-8"))
                 if doc]
    patches = {doc["kind"]: doc for doc in
               yaml.safe_load_all((build.webhook_dir / "patch_manifests.yaml").read_text(encoding="utf-8")) if doc}
    names = {"MutatingWebhookConfiguration": mutating_name, "ValidatingWebhookConfiguration": validating_name}
    for document in documents:
        kind = document["kind"]
        document["metadata"] = {"name": names[kind]}
        patch_by_webhook = {webhook["name"]: webhook for webhook in patches.get(kind, {}).get("webhooks", [])}
        for webhook in document["webhooks"]:
            webhook.update({key: value for key, value in patch_by_webhook.get(webhook["name"], {}).items()
                            if key != "name"})
            webhook["clientConfig"]["service"].update({"namespace": KOORDINATOR_NAMESPACE, "name": WEBHOOK_SERVICE})
            if namespace_labels:
                webhook["namespaceSelector"] = _merge_selector(webhook.get("namespaceSelector"), namespace_labels)
    return documents


def _create_or_replace(api: Api, document: Mapping[str, Any]) -> None:
    registration = api.admissionregistration
    name = document["metadata"]["name"]
    mutating = document["kind"] == "MutatingWebhookConfiguration"
    create = (registration.create_mutating_webhook_configuration if mutating
              else registration.create_validating_webhook_configuration)
    try:
        create(document)
    except ApiException as exc:
        if exc.status != 409:
            raise
        # A configuration left by an earlier koord-manager of this name carries its template and
        # URLs; start from Koordinator's files again.
        delete = (registration.delete_mutating_webhook_configuration if mutating
                  else registration.delete_validating_webhook_configuration)
        delete(name)
        create(document)


def start_koord_manager(plane: ControlPlane, api: Api, build: KoordinatorBuild, *,
                        feature_gates: Mapping[str, bool],
                        controllers: Sequence[str] = QUOTA_CONTROLLERS,
                        node_resource_plugins: Sequence[str] = (),
                        namespace_labels: Mapping[str, str] | None = None,
                        name: str = KOORD_MANAGER_NAME) -> KoordManager:
    """koord-manager against ``plane`` with ``feature_gates`` (named in the caller's test), serving its
    webhooks, returned once the apiserver calls them: a dry-run pod in a namespace they judge is
    mutated as theirs (``gpu.shared`` added) and refused as only theirs refuses (the reserve-pod
    annotation).

    Koordinator's CRDs must be installed (install_koordinator_crds): its caches wait for them.
    ``namespace_labels`` restricts its webhooks to namespaces with those labels (the caller labels its
    namespaces); without it they judge every namespace, as in a cluster. Changed from a deployment
    for the test cluster: leader election off (one replica, no Lease), the admin kubeconfig,
    health/metrics/pprof on free loopback ports instead of :8000/:8080/:8090, and its webhook server
    on a free port (it binds 0.0.0.0: Koordinator hard-codes the host, pkg/webhook/server.go) reached
    at 127.0.0.1 through the URL client configs it writes itself (``WEBHOOK_HOST``).
    """
    mutating_name, validating_name = configuration_names(name)
    for document in koordinator_webhook_configurations(build, mutating_name=mutating_name,
                                                       validating_name=validating_name,
                                                       namespace_labels=namespace_labels):
        _create_or_replace(api, document)
    manager = _spawn(plane, api, build, name, feature_gates, controllers, node_resource_plugins,
                     cert_dir=plane.work_dir / f"{name}-certs")
    wait_until_koord_manager_answers(api, manager, namespace_labels or {})
    return manager


def configuration_names(name: str) -> tuple[str, str]:
    """(mutating, validating) configuration names of the koord-manager called ``name``: the chart's
    names for the default name, suffixed for any other, so several can share one apiserver."""
    suffix = "" if name == KOORD_MANAGER_NAME else f"-{name}"
    return MUTATING_CONFIGURATION + suffix, VALIDATING_CONFIGURATION + suffix


def start_koord_manager_replicas(plane: ControlPlane, api: Api, build: KoordinatorBuild, *,
                                 feature_gates: Mapping[str, bool], count: int = 3,
                                 namespace_labels: Mapping[str, str] | None = None,
                                 name: str = KOORD_MANAGER_NAME) -> tuple[list[KoordManager], HAProxy]:
    """``count`` koord-managers behind HAProxy, as Koordinator's chart deploys them (replicas behind
    one Service, sharing one certificate).

    Every replica serves the webhooks whichever is leader (controller-runtime runs its webhook server
    on all of them). The test-cluster changes beyond start_koord_manager's: the configurations name
    HAProxy's URL instead of the Service (koord-manager rewrites only a ``service`` reference, so it
    keeps the URL and writes the caBundle), and the certificate the first replica generates is copied
    into the others' WEBHOOK_CERT_DIR (where the chart shares it through a Secret), so all write the
    same caBundle.
    """
    work = plane.work_dir / f"{name}-replicas"
    work.mkdir(parents=True, exist_ok=True)
    webhook_ports = free_ports(count)
    balancer = HAProxy(work, webhook_ports)
    mutating_name, validating_name = configuration_names(name)
    try:
        for document in koordinator_webhook_configurations(build, mutating_name=mutating_name,
                                                           validating_name=validating_name,
                                                           namespace_labels=namespace_labels):
            for webhook in document["webhooks"]:
                webhook["clientConfig"] = {"url": balancer.url + webhook["clientConfig"]["service"]["path"]}
            _create_or_replace(api, document)
        replicas: list[KoordManager] = []
        for index, port in enumerate(webhook_ports):
            cert_dir = work / f"r{index}-certs"
            if replicas:
                cert_dir.mkdir(exist_ok=True)
                for file in CERT_FILES:
                    shutil.copyfile(replicas[0].cert_dir / file, cert_dir / file)
            replicas.append(_spawn(plane, api, build, f"{name}-r{index}", feature_gates, QUOTA_CONTROLLERS, (),
                                   cert_dir=cert_dir, webhook_port=port, configurations=(mutating_name,
                                                                                         validating_name)))
        wait_until_koord_manager_answers(api, replicas[0], namespace_labels or {})
    except BaseException:
        balancer.stop()
        raise
    return replicas, balancer


def _spawn(plane: ControlPlane, api: Api, build: KoordinatorBuild, name: str, feature_gates: Mapping[str, bool],
           controllers: Sequence[str], node_resource_plugins: Sequence[str], *, cert_dir: Path,
           webhook_port: int | None = None, configurations: tuple[str, str] | None = None) -> KoordManager:
    ensure_namespace(api, KOORDINATOR_NAMESPACE)
    mutating_name, validating_name = configurations or configuration_names(name)
    health_port, metrics_port, pprof_port, spare_port = free_ports(4)
    webhook_port = webhook_port or spare_port
    cert_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "KUBECONFIG": str(plane.kubeconfig_path),
        "WEBHOOK_HOST": LOOPBACK,
        "WEBHOOK_PORT": str(webhook_port),
        "WEBHOOK_CERT_DIR": str(cert_dir),
        "MUTATING_WEBHOOK_NAME": mutating_name,
        "VALIDATING_WEBHOOK_NAME": validating_name,
        "POD_NAMESPACE": KOORDINATOR_NAMESPACE,
    }
    args = [str(build.koord_manager), "--enable-leader-election=false",
            f"--health-probe-addr={LOOPBACK}:{health_port}", f"--metrics-addr={LOOPBACK}:{metrics_port}",
            f"--pprof-addr={LOOPBACK}:{pprof_port}", f"--controllers={','.join(controllers) or '-'}",
            feature_gates_flag(feature_gates), "--v=2"]
    if node_resource_plugins:
        args.append(f"--noderesource-plugins={','.join(node_resource_plugins)}")
    plane.start_component(name, args, _readyz(health_port), env=env, timeout=START_TIMEOUT)
    # start_component keeps the process with the plane's; it is the one started last.
    return KoordManager(name=name, pid=plane.pids[-1], webhook_port=webhook_port, health_port=health_port,
                        cert_dir=cert_dir,
                        log_path=plane.work_dir / f"{name}.log", mutating_configuration=mutating_name,
                        validating_configuration=validating_name, feature_gates=dict(feature_gates))


def _readyz(port: int) -> Any:
    """Its /readyz includes ``webhook-ready``: certificates written and configurations updated."""
    def probe() -> str | None:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/readyz", timeout=5) as response:
                return None if response.status == 200 else f"/readyz {response.status}"
        except urllib.error.HTTPError as exc:
            return f"/readyz {exc.code}: {exc.read().decode(errors='replace')[:300]}"
        except OSError as exc:
            return f"/readyz: {exc}"
    return probe


def probe_pod(name: str, *, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    share = {GPU_MEMORY_RATIO: "50"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": dict(annotations or {})},
            "spec": {"containers": [{"name": "probe", "image": "registry.example/probe:1",
                                     "resources": {"requests": share, "limits": share}}]}}


def wait_until_koord_manager_answers(api: Api, manager: KoordManager, namespace_labels: Mapping[str, str],
                                     timeout: float = 60.0) -> None:
    """Dry-run creates in a fresh namespace its webhooks judge, until the apiserver's answers show both
    of its pod webhooks: the mutating one adds ``gpu.shared`` to a share, the validating one refuses
    the reserve-pod annotation. /readyz says only that its own server answers; the apiserver picks up
    the rewritten configurations asynchronously."""
    namespace = f"koord-probe-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace,
                                                                        labels=dict(namespace_labels))))

    def mutated() -> bool:
        try:
            stored = api.core.create_namespaced_pod(namespace, probe_pod("mutate-probe"), dry_run="All")
        except ApiException:
            return False  # e.g. the Service reference not yet rewritten: "service not found"
        return GPU_SHARED in (stored.spec.containers[0].resources.requests or {})

    def refused() -> bool:
        try:
            api.core.create_namespaced_pod(namespace, probe_pod("validate-probe",
                                                                annotations={RESERVE_POD_ANNOTATION: "true"}),
                                           dry_run="All")
        except ApiException as exc:
            return "cannot set in annotations" in str(exc.body)
        return False

    wait_for(mutated, f"{manager.name}'s mutating webhook called by the apiserver (log {manager.log_path})", timeout)
    wait_for(refused, f"{manager.name}'s validating webhook called by the apiserver (log {manager.log_path})", timeout)
    api.core.delete_namespace(namespace)


def stored_configurations(api: Api, manager: KoordManager) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (mutating, validating) configurations as koord-manager left them, as plain dicts."""
    client = api.client
    mutating = client.sanitize_for_serialization(
        api.admissionregistration.read_mutating_webhook_configuration(manager.mutating_configuration))
    validating = client.sanitize_for_serialization(
        api.admissionregistration.read_validating_webhook_configuration(manager.validating_configuration))
    return dict(mutating), dict(validating)


def create_quota_once_parent_known(api: Api, namespace: str, name: str, max_: Mapping[str, str], *,
                                   min_: Mapping[str, str] | None = None,
                                   labels: Mapping[str, str] | None = None) -> None:
    """Create an ElasticQuota once koord-manager's ElasticQuota webhook knows its parent: a replica
    judges a child against a topology fed by its own watch, and refuses it ("not find parentInfo")
    until the parent another replica admitted has arrived there."""
    def created() -> bool:
        try:
            create_quota(api, namespace, name, max_, min_=min_, labels=labels)
        except ApiException as error:
            if "not find parentInfo" in str(error.body):
                return False
            raise
        return True

    parent = (labels or {}).get("quota.scheduling.koordinator.sh/parent", "the root")
    wait_for(created, f"quota {name} accepted under {parent}")
