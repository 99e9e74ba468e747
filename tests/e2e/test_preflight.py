"""``gpuquota preflight`` against the real apiserver and a real ``gpuquota serve``.

The install of step 1 is created for real in a namespace of the test's own: the Deployment and
Service rendered from manifests/base, the TLS Secret with the serving CA of the running webhook. No
kubelet runs, so the test writes what a kubelet would (pod status: ready, or waiting on the image)
and what the EndpointSlice controller would. The configurations preflight installs are those of
manifests/webhooks, with clientConfig pointing at the real server (the test apiserver has no cluster
DNS to resolve a Service), uniquely named and selecting only the test's namespace.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from admissionchain import delete_webhook_configurations
from controlplane import REPO_ROOT, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from webhookproc import WebhookProcess

BASE = REPO_ROOT / "manifests" / "base"
WEBHOOKS = REPO_ROOT / "manifests" / "webhooks"
GPUQUOTA = Path(sys.executable).parent / "gpuquota"
IMAGE = "registry.example.com/team/koord-gpuquota:0.1.0"
LABELS = {"app.kubernetes.io/name": "koord-gpuquota", "app.kubernetes.io/component": "webhook"}
POD_WAIT_TIMEOUT = 60.0
RUN_TIMEOUT = 180.0


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is required to render the manifests"
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return copy.deepcopy(found)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    """A real ``gpuquota serve`` (offline state: the probe needs an answer, not a cluster view)."""
    work = tmp_path_factory.mktemp("preflight-webhook")
    (work / "state.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n", encoding="utf-8")
    process = WebhookProcess(work, serve_args=["--state", str(work / "state.yaml")])
    process.start()
    try:
        yield process
    finally:
        process.stop()


@dataclass
class Install:
    namespace: str
    api: Api
    kubeconfig: Path

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api.client)

    def deploy(self, image: str = IMAGE, ca_bundle: str | None = None) -> None:
        """Step 1 as a user applies it: Deployment and Service of the base, and the TLS Secret."""
        base = render(BASE)
        deployment = find(base, "Deployment")
        deployment["metadata"]["namespace"] = self.namespace
        deployment["spec"]["replicas"] = 1
        deployment["spec"]["template"]["spec"]["containers"][0]["image"] = image
        self.apps.create_namespaced_deployment(self.namespace, deployment)
        service = find(base, "Service")
        service["metadata"]["namespace"] = self.namespace
        self.api.core.create_namespaced_service(self.namespace, service)
        if ca_bundle is not None:
            self.api.core.create_namespaced_secret(self.namespace, {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpuquota-webhook-tls"},
                "type": "Opaque", "data": {"ca.crt": ca_bundle}})

    def pod(self) -> k8s.V1Pod:
        """The one pod the controllers make of the Deployment (waited for, with a deadline)."""
        deadline = time.monotonic() + POD_WAIT_TIMEOUT
        selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
        while True:
            pods = self.api.core.list_namespaced_pod(self.namespace, label_selector=selector).items
            if pods:
                return pods[0]
            assert time.monotonic() < deadline, "the Deployment's pod never appeared"
            time.sleep(0.2)  # polling a condition with a deadline, not synchronising on time

    def kubelet_reports(self, *, ready: bool, waiting: str | None = None) -> str:
        """Write the pod's status as the kubelet would; returns the pod's name."""
        pod = self.pod()
        state: dict[str, Any] = ({"waiting": {"reason": waiting, "message": f'Back-off pulling image "{IMAGE}"'}}
                                 if waiting else {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
        status = {"phase": "Running" if ready else "Pending",
                  "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                  "containerStatuses": [{"name": "webhook", "image": IMAGE, "imageID": "", "ready": ready,
                                         "restartCount": 0, "state": state}]}
        self.api.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": status})
        return str(pod.metadata.name)

    def endpoints(self, *addresses: str) -> None:
        """What the EndpointSlice controller would write for the Service's ready pods."""
        k8s.DiscoveryV1Api(self.api.client).create_namespaced_endpoint_slice(self.namespace, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "gpuquota-webhook-abcde",
                         "labels": {"kubernetes.io/service-name": "gpuquota-webhook"}},
            "addressType": "IPv4", "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in addresses]})

    def network_policy(self, *peers: dict[str, Any]) -> None:
        k8s.NetworkingV1Api(self.api.client).create_namespaced_network_policy(self.namespace, {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "gpuquota-webhook"},
            "spec": {"podSelector": {"matchLabels": LABELS}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": list(peers), "ports": [{"port": "https", "protocol": "TCP"}]}]}})

    def preflight(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(GPUQUOTA), "preflight", "-n", self.namespace, "--kubeconfig", str(self.kubeconfig),
                               "--probe-namespace", self.namespace, *args],
                              input=stdin, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)


@pytest.fixture
def install(api: Api, kubeconfig_path: Path, namespace: str) -> Install:
    return Install(namespace, api, kubeconfig_path)


def configurations_calling(url: str, namespace: str) -> list[dict[str, Any]]:
    """manifests/webhooks as installed, but calling ``url``, uniquely named, for ``namespace`` only."""
    suffix = uuid.uuid4().hex[:8]
    documents = render(WEBHOOKS)
    for document in documents:
        document["metadata"]["name"] += f"-{suffix}"
        for webhook in document["webhooks"]:
            webhook["clientConfig"] = {"url": url + webhook["clientConfig"]["service"]["path"]}
            webhook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return documents


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The printed checks: name -> "STATUS message"."""
    checks = {}
    for line in result.stdout.splitlines():
        if line.startswith(("ok ", "FAIL ", "skipped ")):
            status, name, message = line.split(None, 2)
            checks[name] = f"{status} {message}"
    return checks


def applied(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.endswith(" serverside-applied")]


def stored(api: Api, documents: list[dict[str, Any]]) -> list[Any]:
    found = []
    for document in documents:
        reader = (api.admissionregistration.read_mutating_webhook_configuration
                  if document["kind"] == "MutatingWebhookConfiguration"
                  else api.admissionregistration.read_validating_webhook_configuration)
        try:
            found.append(reader(document["metadata"]["name"]))
        except ApiException as error:
            assert error.status == 404
    return found


def test_a_ready_install_passes_and_the_configurations_are_written_with_the_serving_ca(
    install: Install, server: WebhookProcess, api: Api,
) -> None:
    install.deploy(ca_bundle=server.ca_bundle)
    install.kubelet_reports(ready=True)
    documents = configurations_calling(server.url, install.namespace)
    try:
        result = install.preflight("--install", "-f", "-", stdin=yaml.safe_dump_all(documents))

        assert result.returncode == 0, result.stdout + result.stderr
        checks = lines(result)
        assert sorted(checks) == sorted(["image", "pods", "service", "certificate", "networkpolicy", "webhook"])
        assert all(value.startswith("ok ") for value in checks.values()), result.stdout
        assert applied(result) == [
            f"{document['kind'].lower()}.admissionregistration.k8s.io/{document['metadata']['name']} serverside-applied"
            for document in documents]
        assert checks["webhook"] == f"ok the apiserver called {server.url}/validate-pods and got an answer"
        assert checks["networkpolicy"] == f"ok no NetworkPolicy in {install.namespace} selects the webhook pods"
        # Written as given, every webhook with the CA of the Secret as its caBundle.
        written = stored(api, documents)
        assert len(written) == 2
        for configuration, document in zip(written, documents, strict=True):
            assert [w.name for w in configuration.webhooks] == [w["name"] for w in document["webhooks"]]
            for webhook in configuration.webhooks:
                assert webhook.client_config.ca_bundle == server.ca_bundle
        # Nothing of the probe is left behind.
        probes = [c.metadata.name for c in api.admissionregistration.list_validating_webhook_configuration().items
                  if c.metadata.name.startswith("gpuquota-preflight-")]
        assert probes == []
        # The installed configurations work: the apiserver now sends the namespace's GPU pods to the webhook.
        gpu_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"},
                   "spec": {"containers": [{"name": "c", "image": "registry.example/none:1",
                                            "resources": {"limits": {"koordinator.sh/gpu-core": "50"}}}]}}
        with pytest.raises(ApiException) as refused:
            api.core.create_namespaced_pod(install.namespace, gpu_pod, dry_run="All")
        message = json.loads(refused.value.body)["message"]
        assert message.startswith('admission webhook "gpu-quota.gpuquota.koord-gpuquota.io" denied the request: ')
        assert "[koordinator.sh/gpu-core]: add a memory request" in message
    finally:
        delete_webhook_configurations(api, documents)


def test_a_webhook_that_does_not_answer_keeps_the_configurations_out(
    install: Install, server: WebhookProcess, api: Api,
) -> None:
    install.deploy(ca_bundle=server.ca_bundle)
    install.kubelet_reports(ready=True)
    # A port nothing listens on: what the apiserver meets when the pods are not reachable.
    dead = WebhookProcess(server.work_dir / "dead").url
    documents = configurations_calling(dead, install.namespace)
    try:
        result = install.preflight("--install", "-f", "-", stdin=yaml.safe_dump_all(documents))

        assert result.returncode == 1, result.stdout + result.stderr
        webhook = lines(result)["webhook"]
        assert webhook.startswith(f"FAIL the apiserver cannot call {dead}/validate-pods: ")
        assert 'failed calling webhook "probe.preflight.gpuquota.koord-gpuquota.io"' in webhook
        assert "connection refused" in webhook
        assert result.stderr.strip().endswith("preflight failed: webhook; nothing installed")
        assert stored(api, documents) == []
        assert applied(result) == []
    finally:
        delete_webhook_configurations(api, documents)


def test_the_placeholder_image_and_a_pull_failure_are_named(install: Install, server: WebhookProcess) -> None:
    install.deploy(image="registry.invalid/koord-gpuquota:0.1.0", ca_bundle=server.ca_bundle)

    placeholder = install.preflight()

    assert placeholder.returncode == 1
    assert lines(placeholder)["image"].startswith(
        f"FAIL Deployment {install.namespace}/gpuquota-webhook runs the placeholder image "
        "registry.invalid/koord-gpuquota:0.1.0, which no registry serves")

    k8s.AppsV1Api(install.api.client).patch_namespaced_deployment(
        "gpuquota-webhook", install.namespace,
        {"spec": {"template": {"spec": {"containers": [{"name": "webhook", "image": IMAGE}]}}}})
    name = install.kubelet_reports(ready=False, waiting="ImagePullBackOff")

    pulling = install.preflight()

    assert pulling.returncode == 1
    checks = lines(pulling)
    assert checks["image"] == (f'FAIL pod {install.namespace}/{name} cannot pull {IMAGE} '
                               f'(ImagePullBackOff: Back-off pulling image "{IMAGE}")')
    assert checks["pods"].startswith(f"FAIL 0 of 1 replicas of {install.namespace}/gpuquota-webhook ready")


def test_the_service_endpoints_and_the_networkpolicy_peer_are_checked(install: Install) -> None:
    """Without -f the probe calls the Service the shipped configurations call; the apiserver of the
    tests has no cluster DNS, so that call fails here, and the other checks are what is asserted."""
    install.deploy(ca_bundle=base64.b64encode(b"not a CA").decode())
    install.kubelet_reports(ready=True)
    install.network_policy({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                            "podSelector": {"matchLabels": {"component": "kube-apiserver"}}})

    before = lines(install.preflight("--apiserver-address", "10.20.0.11"))

    assert before["service"] == (f"FAIL Service {install.namespace}/gpuquota-webhook has no ready endpoint: the "
                                 "apiserver would have no pod to call")
    assert before["networkpolicy"].startswith(
        f"FAIL NetworkPolicy {install.namespace}/gpuquota-webhook admits no peer that covers the apiserver's "
        "address 10.20.0.11 (--apiserver-address)")
    assert before["webhook"].startswith(
        f"FAIL the apiserver cannot call service {install.namespace}/gpuquota-webhook:443/validate-pods: ")

    install.endpoints("10.1.0.7")
    k8s.NetworkingV1Api(install.api.client).patch_namespaced_network_policy(
        "gpuquota-webhook", install.namespace,
        {"spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "10.20.0.0/24"}}],
                               "ports": [{"port": "https", "protocol": "TCP"}]}]}})

    after = lines(install.preflight("--apiserver-address", "10.20.0.11", "--skip", "webhook"))

    assert after["service"] == f"ok Service {install.namespace}/gpuquota-webhook has 1 ready endpoint(s): 10.1.0.7"
    assert after["networkpolicy"].startswith(f"ok NetworkPolicy {install.namespace}/gpuquota-webhook admits")
    assert after["webhook"].startswith("skipped ")


def test_install_needs_the_configurations(install: Install) -> None:
    result = install.preflight("--install")

    assert result.returncode == 2
    assert result.stderr.startswith("Error: --install writes the configurations of -f")


def test_the_apiserver_addresses_are_the_endpoints_of_the_kubernetes_service(install: Install, api: Api) -> None:
    """Without --apiserver-address the NetworkPolicy is checked against the addresses the apiserver
    publishes for Service default/kubernetes. The test apiserver publishes none (its endpoint
    reconciler is off), so the test writes one EndpointSlice as a kubeadm apiserver would have it."""
    install.deploy(ca_bundle=base64.b64encode(b"not a CA").decode())
    install.network_policy({"ipBlock": {"cidr": "10.30.0.0/24"}})
    discovery = k8s.DiscoveryV1Api(api.client)
    name = f"kubernetes-preflight-{uuid.uuid4().hex[:6]}"

    unknown = lines(install.preflight("--skip", "webhook"))
    assert unknown["networkpolicy"] == (
        f"FAIL NetworkPolicy {install.namespace}/gpuquota-webhook selects the webhook pods, and the apiserver's "
        "addresses are unknown (the endpoints of Service default/kubernetes): give --apiserver-address")

    discovery.create_namespaced_endpoint_slice("default", {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4", "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.30.0.5"]}, {"addresses": ["10.40.0.5"]}]})
    try:
        outside = lines(install.preflight("--skip", "webhook"))
        assert outside["networkpolicy"] == (
            f"FAIL NetworkPolicy {install.namespace}/gpuquota-webhook admits no peer that covers the apiserver's "
            "address 10.40.0.5 (the endpoints of Service default/kubernetes) to the webhook's port: add an "
            "ipBlock for it (docs/deploy.md, NetworkPolicy)")

        discovery.patch_namespaced_endpoint_slice(name, "default", {"endpoints": [{"addresses": ["10.30.0.5"]}]})
        inside = lines(install.preflight("--skip", "webhook"))
        assert inside["networkpolicy"] == (
            f"ok NetworkPolicy {install.namespace}/gpuquota-webhook admits the apiserver's address(es) 10.30.0.5 "
            "(the endpoints of Service default/kubernetes)")
    finally:
        discovery.delete_namespaced_endpoint_slice(name, "default")
