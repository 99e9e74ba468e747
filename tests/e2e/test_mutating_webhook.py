"""The webhook as the API server calls it: real configurations, real admission chain, stored pods."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from admissionchain import (
    delete_webhook_configurations,
    local_webhook_configurations,
    register_webhook_configurations,
    wait_until_webhook_is_called,
)
from controlplane import LOOPBACK, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from webhookproc import REPO_ROOT, WebhookProcess, generate_certs

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION

IGNORE_LABEL = "gpuquota.koord-gpuquota.io/ignore"
CANONICAL_ONE = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
CANONICAL_TWO = {"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


def gpu_pod(name: str, resources: dict[str, str], containers: int = 1) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": f"main-{i}" if i else "main", "image": "registry.example/train:1",
                                     "resources": {"requests": dict(resources), "limits": dict(resources)}}
                                    for i in range(containers)]}}


def resources_of(container: k8s.V1Container) -> tuple[dict[str, str], dict[str, str]]:
    return dict(container.resources.requests or {}), dict(container.resources.limits or {})


def api_error(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as caught:
        call()
    message = json.loads(caught.value.body)["message"]
    return caught.value.status, message


def test_gpu_pod_is_stored_in_canonical_form(webhook_server: WebhookProcess, api: Api, namespace: str) -> None:
    api.core.create_namespaced_pod(namespace, gpu_pod("trainer", {"cpu": "2", "nvidia.com/gpu": "2"}))

    stored = api.core.read_namespaced_pod("trainer", namespace)

    expected = {"cpu": "2", **CANONICAL_TWO}
    assert resources_of(stored.spec.containers[0]) == (expected, expected)
    assert json.loads(stored.metadata.annotations[ORIGINAL_RESOURCES_ANNOTATION]) == {
        "containers": {"main": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}}


def test_server_side_dry_run_shows_the_rewrite_and_stores_nothing(webhook_server: WebhookProcess, api: Api,
                                                                  namespace: str) -> None:
    answer = api.core.create_namespaced_pod(namespace, gpu_pod("preview", {"nvidia.com/gpu": "1"}), dry_run="All")

    assert resources_of(answer.spec.containers[0]) == (CANONICAL_ONE, CANONICAL_ONE)
    assert ORIGINAL_RESOURCES_ANNOTATION in answer.metadata.annotations
    status, _ = api_error(lambda: api.core.read_namespaced_pod("preview", namespace))
    assert status == 404


def test_unschedulable_gpu_request_is_refused_with_the_webhooks_message(webhook_server: WebhookProcess, api: Api,
                                                                       namespace: str) -> None:
    status, message = api_error(lambda: api.core.create_namespaced_pod(
        namespace, gpu_pod("half", {"koordinator.sh/gpu-core": "50"})))

    assert status == 422
    assert message == (
        'admission webhook "gpu-quota.gpuquota.koord-gpuquota.io" denied the request: '
        "invalid resource device requests: [koordinator.sh/gpu-core]: add a memory request: "
        "koordinator.sh/gpu-memory-ratio (percent of a card) or koordinator.sh/gpu-memory (bytes) "
        '(asked for by container "main") [rule: combination]')
    status, _ = api_error(lambda: api.core.read_namespaced_pod("half", namespace))
    assert status == 404


def test_a_zero_request_is_stored_as_written(webhook_server: WebhookProcess, api: Api, namespace: str) -> None:
    # Charts write nvidia.com/gpu: 0 for CPU-only variants: it asks for nothing.
    api.core.create_namespaced_pod(namespace, gpu_pod("cpu-only", {"cpu": "1", "nvidia.com/gpu": "0"}))

    stored = api.core.read_namespaced_pod("cpu-only", namespace)

    assert resources_of(stored.spec.containers[0]) == ({"cpu": "1", "nvidia.com/gpu": "0"},) * 2
    assert ORIGINAL_RESOURCES_ANNOTATION not in (stored.metadata.annotations or {})


def test_a_huge_vendor_count_is_refused_in_the_users_spelling(webhook_server: WebhookProcess, api: Api,
                                                              namespace: str) -> None:
    # Multiplied by 100 it was refused by the API server ("must be an integer") on gpu-core, a name
    # the user never wrote; now the rewrite leaves it and the validating webhook says why.
    status, message = api_error(lambda: api.core.create_namespaced_pod(
        namespace, gpu_pod("huge", {"amd.com/gpu": "92233720368548"})))

    assert status == 422
    assert message.startswith(
        'admission webhook "gpu-quota.gpuquota.koord-gpuquota.io" denied the request: container "main" '
        "resources.requests[amd.com/gpu]: 92233720368548 is larger than 92233720368547, beyond what the scheduler "
        "can count [rule: out-of-range]")


def test_a_container_naming_a_card_twice_is_stored_once_or_refused(webhook_server: WebhookProcess, api: Api,
                                                                   namespace: str) -> None:
    api.core.create_namespaced_pod(namespace, gpu_pod("agree", {"nvidia.com/gpu": "1", **CANONICAL_ONE}))
    stored = api.core.read_namespaced_pod("agree", namespace)
    assert resources_of(stored.spec.containers[0]) == (CANONICAL_ONE, CANONICAL_ONE)

    status, message = api_error(lambda: api.core.create_namespaced_pod(
        namespace, gpu_pod("disagree", {"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"})))
    assert status == 422
    assert ('container "main" resources.requests: koordinator.sh/gpu: 2 (read as koordinator.sh/gpu-core: 2) and '
            "koordinator.sh/gpu-core: 1 disagree") in message


@pytest.fixture
def isolated_namespace(api: Api) -> str:
    """A namespace the session's webhook configurations skip (opt-out label), for private ones."""
    name = f"isolated-{uuid.uuid4().hex[:8]}"
    api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={IGNORE_LABEL: "true"})))
    return name


def only(namespace: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


def test_with_the_webhook_down_only_gpu_pods_are_blocked(api: Api, isolated_namespace: str,
                                                         tmp_path: Path) -> None:
    server = WebhookProcess(tmp_path / "webhook", serve_args=["--state", str(REPO_ROOT / "examples" / "cluster")])
    server.start()
    documents = local_webhook_configurations(server.url, server.ca_bundle, name_suffix="-down",
                                             namespace_selector=only(isolated_namespace))
    register_webhook_configurations(api, documents)
    try:
        wait_until_webhook_is_called(api, isolated_namespace)
        api.core.create_namespaced_pod(isolated_namespace, gpu_pod("admitted", {"nvidia.com/gpu": "1"}))
        server.stop()

        # Updates that cannot change the quota (the scheduler's and controllers' patches) skip it ...
        api.core.patch_namespaced_pod("admitted", isolated_namespace,
                                      {"metadata": {"annotations": {"example.com/scheduled-by": "test"}}})
        # ... a move to another quota does not.
        status, message = api_error(lambda: api.core.patch_namespaced_pod(
            "admitted", isolated_namespace,
            {"metadata": {"labels": {"quota.scheduling.koordinator.sh/name": "elsewhere"}}}))
        assert status == 500
        assert 'failed calling webhook "gpu-quota.gpuquota.koord-gpuquota.io"' in message

        cpu_only = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-only"},
                    "spec": {"containers": [{"name": "main", "image": "x",
                                             "resources": {"requests": {"cpu": "1"}}}]}}
        api.core.create_namespaced_pod(isolated_namespace, cpu_only)
        assert api.core.read_namespaced_pod("cpu-only", isolated_namespace).metadata.name == "cpu-only"

        status, message = api_error(lambda: api.core.create_namespaced_pod(
            isolated_namespace, gpu_pod("gpu", {"nvidia.com/gpu": "1"})))
        assert status == 500
        assert message.startswith('Internal error occurred: failed calling webhook '
                                  '"gpu-quota.gpuquota.koord-gpuquota.io"')
        assert "connection refused" in message
    finally:
        delete_webhook_configurations(api, documents)
        server.stop()


class SidecarInjector(BaseHTTPRequestHandler):
    """A second mutator that adds a GPU sidecar after ours ran, as HAMi-like injectors do."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if not any(c["name"] == "sidecar" for c in request["object"]["spec"]["containers"]):
            gpu = {"nvidia.com/gpu": "1"}
            sidecar = {"name": "sidecar", "image": "registry.example/sidecar:1",
                       "resources": {"requests": gpu, "limits": gpu}}
            patch = [{"op": "add", "path": "/spec/containers/-", "value": sidecar}]
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        payload = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                              "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def sidecar_injector(tmp_path: Path) -> Iterator[tuple[str, str]]:
    ca_bundle = generate_certs(tmp_path / "sidecar-certs")
    httpd = ThreadingHTTPServer((LOOPBACK, 0), SidecarInjector)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "sidecar-certs" / "tls.crt", tmp_path / "sidecar-certs" / "tls.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://{LOOPBACK}:{httpd.server_address[1]}/inject", ca_bundle
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_reinvocation_after_another_mutator_keeps_the_pod_canonical(
        api: Api, isolated_namespace: str, tmp_path: Path, sidecar_injector: tuple[str, str]) -> None:
    server = WebhookProcess(tmp_path / "webhook", serve_args=["--state", str(REPO_ROOT / "examples" / "cluster")])
    server.start()
    ours = local_webhook_configurations(server.url, server.ca_bundle, name_suffix="-reinvoke",
                                        namespace_selector=only(isolated_namespace))
    url, ca_bundle = sidecar_injector
    # Named to sort after ours: the apiserver calls mutating configurations in name order.
    theirs = [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": f"zz-sidecar-injector-{isolated_namespace}"},
               "webhooks": [{"name": "sidecar.e2e.example", "admissionReviewVersions": ["v1"],
                             "clientConfig": {"url": url, "caBundle": ca_bundle},
                             "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                        "resources": ["pods"]}],
                             "sideEffects": "None", "failurePolicy": "Fail",
                             "namespaceSelector": only(isolated_namespace)}]}]
    register_webhook_configurations(api, ours + theirs)
    try:
        wait_until_webhook_is_called(api, isolated_namespace)
        api.core.create_namespaced_pod(isolated_namespace, gpu_pod("trainer", {"nvidia.com/gpu": "2"}))

        stored = api.core.read_namespaced_pod("trainer", isolated_namespace)
        by_name = {c.name: resources_of(c) for c in stored.spec.containers}
        assert by_name == {"main": (CANONICAL_TWO, CANONICAL_TWO), "sidecar": (CANONICAL_ONE, CANONICAL_ONE)}
        assert json.loads(stored.metadata.annotations[ORIGINAL_RESOURCES_ANNOTATION]) == {"containers": {
            "main": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}},
            "sidecar": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}}
        with contextlib.suppress(ApiException):
            api.core.delete_namespaced_pod("trainer", isolated_namespace)
    finally:
        delete_webhook_configurations(api, ours + theirs)
        server.stop()
