"""Mutual TLS against a real kube-apiserver: it presents the client certificate from its admission config.

This module runs its own control plane: the client certificate reaches the apiserver only through
``--admission-control-config-file``, which is read at startup, and the session's control plane
must not call every other test's webhook with it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from admissionchain import (
    delete_webhook_configurations,
    gpu_probe_pod,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from clientpki import ClientPki, make_client_pki
from controlplane import LOOPBACK, Api, Binaries, ControlPlane, make_api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from reviews import body, pod, review
from webhookproc import REPO_ROOT, WebhookProcess

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION
from kubeaccess import pki

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
REFUSAL_DEADLINE = 60.0
CANONICAL_TWO = {"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


@dataclass(frozen=True)
class MtlsCluster:
    api: Api
    webhook: WebhookProcess
    client_pki: ClientPki
    namespace: str


def write_admission_config(directory: Path, webhook_port: int, client_cert: tuple[Path, Path]) -> Path:
    """The apiserver's admission config: both webhook plugins read one kubeconfig of client credentials.

    The apiserver picks the kubeconfig user whose name is the webhook's host:port, so the name has
    to carry the exact port the webhook serves on.
    """
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{
            "name": f"{LOOPBACK}:{webhook_port}",
            "user": {
                "client-certificate-data": pki.ca_bundle(client_cert[0].read_bytes()),
                "client-key-data": pki.ca_bundle(client_cert[1].read_bytes()),
            },
        }],
    }
    kubeconfig_path = pki.write_private_file(directory / "webhook-clients.kubeconfig",
                                             yaml.safe_dump(kubeconfig, sort_keys=False).encode())
    plugin_config = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                     "kubeConfigFile": str(kubeconfig_path)}
    admission = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": plugin_config}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
    }
    return pki.write_public_file(directory / "admission.yaml", yaml.safe_dump(admission, sort_keys=False).encode())


@pytest.fixture(scope="module")
def mtls_cluster(control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsCluster]:
    work = tmp_path_factory.mktemp("mtls")
    client_pki = make_client_pki(work / "client-pki", common_name="kube-apiserver")
    # The webhook comes up first: its port (which the admission kubeconfig names) is then bound,
    # so the control plane's own free ports cannot collide with it.
    webhook = WebhookProcess(work / "webhook", client_cert=client_pki.cert,
                             serve_args=["--state", str(EXAMPLE_STATE), "--client-ca", str(client_pki.ca_file)])
    webhook.start()
    plane = ControlPlane(control_plane_binaries, base_dir=work / "control-plane", extra_apiserver_args=[
        f"--admission-control-config-file={write_admission_config(work, webhook.port, client_pki.cert)}"])
    api: Api | None = None
    documents: list[dict[str, Any]] = []
    try:
        plane.start()
        api = make_api(plane.kubeconfig_path)
        documents = local_webhook_configurations(webhook.url, webhook.ca_bundle)
        register_webhook_configurations(api, documents)
        namespace = f"mtls-{uuid.uuid4().hex[:6]}"
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        wait_until_webhook_is_called(api, namespace)
        yield MtlsCluster(api=api, webhook=webhook, client_pki=client_pki, namespace=namespace)
    finally:
        if api is not None:
            delete_webhook_configurations(api, documents)
            api.close()
        plane.stop()
        webhook.stop()


def session_for(server_ca: Path, cert: tuple[Path, Path] | None) -> requests.Session:
    http = requests.Session()
    # REQUESTS_CA_BUNDLE and proxies from the environment must not stand in for the test's settings.
    http.trust_env = False
    http.verify = str(server_ca)
    if cert is not None:
        http.cert = (str(cert[0]), str(cert[1]))
    return http


def mutate(http: requests.Session, webhook: WebhookProcess) -> requests.Response:
    return http.post(webhook.url + "/mutate-pods", data=body(review(pod(resources={"nvidia.com/gpu": "1"}))),
                     headers={"Content-Type": "application/json"}, timeout=10)


def test_the_apiserver_presents_its_client_certificate_and_the_pod_is_mutated(mtls_cluster: MtlsCluster) -> None:
    api, namespace = mtls_cluster.api, mtls_cluster.namespace
    gpu = {"cpu": "1", "nvidia.com/gpu": "2"}
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
                "spec": {"containers": [{"name": "main", "image": "registry.example/train:1",
                                         "resources": {"requests": gpu, "limits": gpu}}]}}

    # The validating webhook fails closed, so the create succeeding shows the apiserver got past
    # its handshake too, not only the mutating one's.
    api.core.create_namespaced_pod(namespace, manifest)

    stored = api.core.read_namespaced_pod("trainer", namespace)
    expected = {"cpu": "1", **CANONICAL_TWO}
    resources = stored.spec.containers[0].resources
    assert (dict(resources.requests), dict(resources.limits)) == (expected, expected)
    assert json.loads(stored.metadata.annotations[ORIGINAL_RESOURCES_ANNOTATION]) == {
        "containers": {"main": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}}


def test_a_direct_call_without_a_client_certificate_fails_at_the_tls_layer(mtls_cluster: MtlsCluster) -> None:
    webhook = mtls_cluster.webhook

    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_REQUIRED"):
        mutate(session_for(webhook.ca_file, None), webhook)


def test_a_direct_call_with_a_certificate_from_another_ca_fails(mtls_cluster: MtlsCluster) -> None:
    webhook = mtls_cluster.webhook

    with pytest.raises(requests.exceptions.SSLError, match="UNKNOWN_CA"):
        mutate(session_for(webhook.ca_file, mtls_cluster.client_pki.foreign_cert), webhook)


def test_a_direct_call_with_the_right_client_certificate_is_answered(mtls_cluster: MtlsCluster) -> None:
    webhook = mtls_cluster.webhook

    answer = mutate(session_for(webhook.ca_file, mtls_cluster.client_pki.cert), webhook)

    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is True
    assert answer.json()["response"]["patchType"] == "JSONPatch"


def first_refusal(api: Api, namespace: str) -> tuple[int, str]:
    """(status, message) of the first dry-run GPU pod create the apiserver refuses.

    The apiserver loads new webhook configurations asynchronously; until it has, the dry run is
    admitted without any webhook, so this polls until the refusal shows.
    """
    deadline = time.monotonic() + REFUSAL_DEADLINE
    while True:
        try:
            api.core.create_namespaced_pod(namespace, gpu_probe_pod("probe"), dry_run="All")
        except ApiException as error:
            message: str = json.loads(error.body)["message"]
            return error.status, message
        assert time.monotonic() < deadline, f"no create refused within {REFUSAL_DEADLINE:.0f}s"
        time.sleep(0.2)  # polling a condition with a deadline, not synchronising on time


def test_an_apiserver_without_the_client_certificate_is_refused(mtls_cluster: MtlsCluster,
                                                               control_plane_binaries: Binaries,
                                                               tmp_path: Path) -> None:
    """The negative control: the same webhook, called by an apiserver with no admission config."""
    webhook = mtls_cluster.webhook
    plane = ControlPlane(control_plane_binaries, base_dir=tmp_path / "control-plane")
    plane.start()
    documents = local_webhook_configurations(webhook.url, webhook.ca_bundle)
    api: Api | None = None
    try:
        api = make_api(plane.kubeconfig_path)
        register_webhook_configurations(api, documents)
        namespace = f"no-client-cert-{uuid.uuid4().hex[:6]}"
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        status, message = first_refusal(api, namespace)
        assert status == 500
        assert 'failed calling webhook "gpu-quota.gpuquota.koord-gpuquota.io"' in message
        # TLS 1.3: the client finishes its half of the handshake before the server checks for a
        # certificate, so Go sees the server's alert or, when the close wins the race, only a
        # closed connection. Both are the TLS layer refusing the call.
        assert message.endswith(("remote error: tls: certificate required", "use of closed network connection"))
    finally:
        if api is not None:
            delete_webhook_configurations(api, documents)
            api.close()
        plane.stop()
