"""The admission endpoints through a real ``gpuquota serve``: gunicorn, TLS, CA verification.

Every request here crosses the same layers the API server's does: TCP, a verified TLS handshake
against the CA that ``gpuquota certs generate`` printed, HTTP/1.1 keep-alive, gunicorn gthread
workers, which answer admission reviews themselves and pass everything else (chunked reviews,
other methods and paths) to the WSGI app (tests/webhook/serving/test_reviews_are_answered_as_gunicorn_would.py
compares the two).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
import requests
from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess, generate_certs

from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION
from gpuquota_core.jsonpatch import apply
from webhook.admission.body import MAX_BODY_BYTES

JSON_HEADERS = {"Content-Type": "application/json"}
MIB = 1024 * 1024


@pytest.fixture
def session(offline_webhook: WebhookProcess) -> requests.Session:
    return verified_session(offline_webhook.ca_file)


def verified_session(ca_file: Path) -> requests.Session:
    http = requests.Session()
    # Otherwise REQUESTS_CA_BUNDLE from the environment silently replaces session.verify, and
    # proxies from the environment would sit between the test and the server.
    http.trust_env = False
    http.verify = str(ca_file)
    return http


def post(session: requests.Session, server: WebhookProcess, path: str, document: Any) -> requests.Response:
    return session.post(server.url + path, data=body(document), headers=JSON_HEADERS, timeout=10)


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def test_mutate_rewrites_whole_cards_to_canonical_units(offline_webhook: WebhookProcess,
                                                        session: requests.Session) -> None:
    request = review(pod(resources={"cpu": "8", "nvidia.com/gpu": "2"}), uid="uid-mutate-1")

    answer = post(session, offline_webhook, "/mutate-pods", request)

    assert answer.status_code == 200
    reply = answer.json()
    assert reply["apiVersion"] == "admission.k8s.io/v1"
    assert reply["kind"] == "AdmissionReview"
    response = reply["response"]
    assert response["uid"] == "uid-mutate-1"
    assert response["allowed"] is True
    assert response["warnings"] == [
        'gpuquota rewrote container "main" nvidia.com/gpu: 2 -> '
        "koordinator.sh/gpu-core: 200, koordinator.sh/gpu-memory-ratio: 200",
        # The example cluster's gpu-mixed-0 reports both families, and nothing keeps the pod off it.
        "gpuquota: this pod can be scheduled on gpu-mixed-0, which advertise(s) both a vendor GPU name and "
        "koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out one card twice "
        "(audit check node-mixed-gpu-resources)"]
    patched = apply(request["request"]["object"], decoded_patch(response))
    resources = patched["spec"]["containers"][0]["resources"]
    canonical = {"cpu": "8", "koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}
    assert resources == {"requests": canonical, "limits": canonical}
    assert json.loads(patched["metadata"]["annotations"][ORIGINAL_RESOURCES_ANNOTATION]) == {
        "containers": {"main": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}}


def test_patch_paths_escape_slashes_in_resource_names(offline_webhook: WebhookProcess,
                                                      session: requests.Session) -> None:
    request = review(pod(resources={"nvidia.com/gpu": "1"}))

    response = post(session, offline_webhook, "/mutate-pods", request).json()["response"]

    paths = {op["path"] for op in decoded_patch(response)}
    assert "/spec/containers/0/resources/requests/nvidia.com~1gpu" in paths
    assert "/spec/containers/0/resources/limits/koordinator.sh~1gpu-core" in paths


def test_second_pass_over_own_output_yields_no_patch(offline_webhook: WebhookProcess,
                                                     session: requests.Session) -> None:
    first = review(pod(resources={"nvidia.com/gpu": "3"}))
    once = apply(first["request"]["object"], decoded_patch(post(session, offline_webhook, "/mutate-pods",
                                                                first).json()["response"]))

    again = post(session, offline_webhook, "/mutate-pods", review(once)).json()["response"]

    assert again["allowed"] is True
    assert "patch" not in again


def test_init_containers_are_rewritten_too(offline_webhook: WebhookProcess, session: requests.Session) -> None:
    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    obj = pod(resources={"nvidia.com/gpu": "1"})
    obj["spec"]["initContainers"] = [{"name": "warmup", "image": "x", "resources": gpu}]

    response = post(session, offline_webhook, "/mutate-pods", review(obj)).json()["response"]

    patched = apply(obj, decoded_patch(response))
    assert patched["spec"]["initContainers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}


@pytest.mark.parametrize(("resources", "expected"), [
    pytest.param({"koordinator.sh/gpu-core": "50"},
                 'invalid resource device requests: [koordinator.sh/gpu-core]: add a memory request: '
                 'koordinator.sh/gpu-memory-ratio (percent of a card) or koordinator.sh/gpu-memory (bytes) '
                 '(asked for by container "main") [rule: combination]', id="core-without-memory"),
    pytest.param({"koordinator.sh/gpu-core": "150", "koordinator.sh/gpu-memory-ratio": "150"},
                 "invalid resource unit koordinator.sh/gpu-core: 150", id="one-and-a-half-cards"),
    pytest.param({"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"},
                 'container "main" resources.requests: koordinator.sh/gpu: 2 (read as koordinator.sh/gpu-core: 2) '
                 "and koordinator.sh/gpu-core: 1 disagree", id="spellings-disagree"),
    pytest.param({"dcu.com/gpu": "112", "nvidia.com/gpu": "101"},
                 "invalid resource device requests: [dcu.com/gpu nvidia.com/gpu]: dcu.com/gpu and nvidia.com/gpu are "
                 "different hardware", id="two-vendors"),
    pytest.param({"amd.com/gpu": "92233720368548"},
                 'container "main" resources.requests[amd.com/gpu]: 92233720368548 is larger than 92233720368547',
                 id="count-past-the-bound"),
])
def test_validate_refuses_unschedulable_gpu_requests(offline_webhook: WebhookProcess, session: requests.Session,
                                                     resources: dict[str, str], expected: str) -> None:
    response = post(session, offline_webhook, "/validate-pods", review(pod(resources=resources))).json()["response"]

    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["reason"] == "Invalid"
    assert response["status"]["message"].startswith(expected)


@pytest.mark.parametrize("resources", [
    pytest.param({"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"}, id="koordinator-gpu-and-core"),
    pytest.param({"nvidia.com/gpu": "1", "koordinator.sh/gpu-memory-ratio": "50"}, id="vendor-and-ratio"),
])
def test_mutate_refuses_spellings_that_disagree_with_validates_answer(
        offline_webhook: WebhookProcess, session: requests.Session, resources: dict[str, str]) -> None:
    """A later mutator (Koordinator's pod webhook) would overwrite one spelling with the other before
    /validate-pods saw the pod: /mutate-pods refuses it first, with /validate-pods' own answer."""
    obj = pod(resources=resources)
    # A second container the rewrite would change: nothing of the pod is rewritten when it is refused.
    obj["spec"]["containers"].append({"name": "sidecar", "image": "x", "resources": {
        "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}})

    mutated = post(session, offline_webhook, "/mutate-pods", review(obj)).json()["response"]
    validated = post(session, offline_webhook, "/validate-pods", review(obj)).json()["response"]

    assert validated["allowed"] is False
    assert "[rule: spellings-disagree]" in validated["status"]["message"]
    assert mutated["allowed"] is False
    assert "patch" not in mutated
    assert mutated["status"] == validated["status"]


def test_an_init_container_larger_than_the_app_container_is_left_as_written_and_admitted(
        offline_webhook: WebhookProcess, session: requests.Session) -> None:
    obj = pod(namespace="scratch-no-quota", resources={"amd.com/gpu": "2"})
    obj["spec"]["initContainers"] = [{"name": "init", "image": "x", "resources": {
        "requests": {"amd.com/gpu": "3"}, "limits": {"amd.com/gpu": "3"}}}]

    mutated = post(session, offline_webhook, "/mutate-pods", review(obj)).json()["response"]
    validated = post(session, offline_webhook, "/validate-pods", review(obj)).json()["response"]

    assert mutated["allowed"] is True and "patch" not in mutated
    # examples/cluster has a mixed node, so the mixed-node warning comes too.
    assert any(w.startswith("gpuquota: spec: left as written: Koordinator schedules the pod as "
                            "written, but could not schedule it rewritten") for w in mutated["warnings"])
    assert validated["allowed"] is True


def test_validate_allows_a_canonical_share(offline_webhook: WebhookProcess, session: requests.Session) -> None:
    share = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
    obj = pod(namespace="scratch-no-quota", resources=share)

    response = post(session, offline_webhook, "/validate-pods", review(obj)).json()["response"]

    assert response["allowed"] is True


@pytest.mark.parametrize(("request_body", "reason"), [
    pytest.param(b"not json", "request body is not valid JSON", id="not-json"),
    pytest.param(b"[]", "expected an AdmissionReview object, got a JSON array", id="array"),
    pytest.param(b"{}", "expected kind AdmissionReview, got None", id="empty-object"),
    pytest.param(b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
                 "AdmissionReview has no request object", id="no-request"),
    pytest.param(b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}',
                 "expected apiVersion admission.k8s.io/v1, got 'admission.k8s.io/v1beta1'", id="old-version"),
])
@pytest.mark.parametrize("path", ["/mutate-pods", "/validate-pods", "/validate-elasticquotas"])
def test_malformed_reviews_get_400_with_the_reason(offline_webhook: WebhookProcess, session: requests.Session,
                                                   path: str, request_body: bytes, reason: str) -> None:
    answer = session.post(offline_webhook.url + path, data=request_body, headers=JSON_HEADERS, timeout=10)

    assert answer.status_code == 400
    status = answer.json()
    assert status["kind"] == "Status"
    assert status["reason"] == "BadRequest"
    assert status["message"].startswith(reason)


def test_oversized_body_is_refused_before_it_is_read(offline_webhook: WebhookProcess,
                                                     session: requests.Session) -> None:
    # Only the headers are sent: a server that waited for the 8 MiB body (or parsed it) would
    # never answer, so an answer proves the cut-off happens on Content-Length alone.
    with socket.create_connection((LOOPBACK, offline_webhook.port), timeout=10) as raw, \
            offline_webhook.ssl_context().wrap_socket(raw, server_hostname=LOOPBACK) as tls:
        tls.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
        reply = http.client.HTTPResponse(tls)
        reply.begin()
        status = json.loads(reply.read())

    assert reply.status == 413
    assert status["reason"] == "RequestEntityTooLarge"
    assert session.get(offline_webhook.url + "/healthz", timeout=10).status_code == 200


def test_a_chunked_review_is_read_to_its_end(offline_webhook: WebhookProcess, session: requests.Session) -> None:
    # A generator body makes requests send Transfer-Encoding: chunked, with no Content-Length.
    payload = body(review(pod(resources={"nvidia.com/gpu": "1"})))
    pieces = (payload[start:start + 1000] for start in range(0, len(payload), 1000))

    answer = session.post(offline_webhook.url + "/mutate-pods", data=pieces, headers=JSON_HEADERS, timeout=10)

    assert answer.status_code == 200
    assert {"op": "add", "path": "/spec/containers/0/resources/requests/koordinator.sh~1gpu-core",
            "value": "100"} in decoded_patch(answer.json()["response"])


def test_an_oversized_chunked_review_is_refused(offline_webhook: WebhookProcess, session: requests.Session) -> None:
    pieces = (b"x" * MIB for _ in range(MAX_BODY_BYTES // MIB + 1))  # over the cap, never announced

    answer = session.post(offline_webhook.url + "/validate-pods", data=pieces, headers=JSON_HEADERS, timeout=10)

    assert answer.status_code == 413
    assert answer.json()["reason"] == "RequestEntityTooLarge"


@pytest.mark.parametrize("path", ["/mutate-pods", "/validate-pods", "/validate-elasticquotas"])
def test_admission_paths_accept_only_post(offline_webhook: WebhookProcess, session: requests.Session,
                                          path: str) -> None:
    answer = session.get(offline_webhook.url + path, timeout=10)

    assert answer.status_code == 405
    assert answer.headers["Allow"] == "POST"
    assert answer.json()["message"] == f"{path} accepts only POST"


def test_objects_other_than_pod_creates_are_allowed_unchanged(offline_webhook: WebhookProcess,
                                                               session: requests.Session) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}
    update = review(pod(resources={"nvidia.com/gpu": "1"}), operation="UPDATE",
                    old=pod(resources={"nvidia.com/gpu": "1"}))

    for request in (review(config_map, kind="ConfigMap", resource="configmaps"), update):
        response = post(session, offline_webhook, "/mutate-pods", request).json()["response"]
        assert response == {"uid": request["request"]["uid"], "allowed": True}


def test_health_readiness_and_metrics(offline_webhook: WebhookProcess, session: requests.Session) -> None:
    post(session, offline_webhook, "/mutate-pods", review(pod(resources={"nvidia.com/gpu": "1"})))

    assert session.get(offline_webhook.url + "/healthz", timeout=10).json() == {"status": "ok"}
    assert session.get(offline_webhook.url + "/readyz", timeout=10).status_code == 200
    metrics = session.get(offline_webhook.url + "/metrics", timeout=10).text
    assert 'gpuquota_admission_requests_total{endpoint="/mutate-pods",operation="CREATE",result="patched"}' \
        in metrics
    assert 'gpuquota_rewrites_total{resource="nvidia.com/gpu"}' in metrics
    # The quota service's own metrics come through the same scrape (it writes to the same directory).
    assert "gpuquota_cluster_state_synced 1.0" in metrics
    assert "gpuquota_cluster_state_stale 0.0" in metrics
    assert 'gpuquota_cluster_state_objects{kind="ElasticQuota"} 3.0' in metrics
    assert 'gpuquota_cluster_state_objects{kind="Pod"} 3.0' in metrics


def test_connection_is_kept_alive_across_requests(offline_webhook: WebhookProcess) -> None:
    connection = http.client.HTTPSConnection(LOOPBACK, offline_webhook.port, timeout=10,
                                             context=offline_webhook.ssl_context())
    try:
        payload = body(review(pod(resources={"nvidia.com/gpu": "1"})))
        connection.request("POST", "/mutate-pods", body=payload, headers=JSON_HEADERS)
        first = connection.getresponse()
        first.read()
        socket_before = connection.sock
        connection.request("POST", "/mutate-pods", body=payload, headers=JSON_HEADERS)
        second = connection.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert first.getheader("Connection", "").lower() != "close"
        assert connection.sock is socket_before
    finally:
        connection.close()


def test_a_client_that_does_not_trust_the_ca_is_refused(offline_webhook: WebhookProcess, tmp_path: Path) -> None:
    generate_certs(tmp_path / "other")
    stranger = verified_session(tmp_path / "other" / "ca.crt")

    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        stranger.get(offline_webhook.url + "/healthz", timeout=10)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_below_1_2_is_refused(offline_webhook: WebhookProcess) -> None:
    context = ssl.create_default_context(cafile=str(offline_webhook.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    connection = http.client.HTTPSConnection(LOOPBACK, offline_webhook.port, timeout=10, context=context)
    try:
        # The server's alert, not a client that could not even offer TLS 1.1 (NO_PROTOCOLS_AVAILABLE).
        with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):
            connection.request("GET", "/healthz")
    finally:
        connection.close()


def test_readme_quota_example_is_refused_with_the_native_message(offline_webhook: WebhookProcess,
                                                                 session: requests.Session) -> None:
    example = (REPO_ROOT / "examples" / "requests" / "validate-pod-over-quota.json").read_bytes()

    answer = session.post(offline_webhook.url + "/validate-pods", data=example, headers=JSON_HEADERS, timeout=10)

    status = answer.json()["response"]["status"]
    assert status["code"] == 403
    assert status["reason"] == "QuotaExceeded"
    assert status["message"] == (
        "exceeded quota: team-nlp/team-nlp, "
        "requested: koordinator.sh/gpu-core=900,koordinator.sh/gpu-memory-ratio=900, "
        "used: koordinator.sh/gpu-core=200,koordinator.sh/gpu-memory-ratio=200, "
        "limited: koordinator.sh/gpu-core=400,koordinator.sh/gpu-memory-ratio=400")


def pod_of_json_size(name: str, size: int, labels: dict[str, str]) -> dict[str, Any]:
    """A GPU pod whose JSON is about ``size`` bytes: the bulk in environment variables, as in large pods."""
    value = "v" * 1000
    count = size // (len(value) + 40)
    containers = [{"name": "main", "image": "registry.example/train:1",
                   "env": [{"name": f"SETTING_{index:06d}", "value": value} for index in range(count)],
                   "resources": {"requests": {"koordinator.sh/gpu-core": "100",
                                              "koordinator.sh/gpu-memory-ratio": "100"},
                                 "limits": {"koordinator.sh/gpu-core": "100",
                                            "koordinator.sh/gpu-memory-ratio": "100"}}}]
    return pod(name, containers=containers, labels=labels)


@pytest.mark.parametrize("path", ["/mutate-pods", "/validate-pods"])
def test_the_largest_review_the_api_server_sends_is_answered(offline_webhook: WebhookProcess,
                                                             session: requests.Session, path: str) -> None:
    # An UPDATE (a label change) of a pod at etcd's limit: object and oldObject are each about
    # 3 MiB of JSON (twice the 1.5 MiB stored protobuf), so the review is over 6 MiB.
    old = pod_of_json_size("huge", 3 * MIB, {"app": "trainer"})
    new = pod_of_json_size("huge", 3 * MIB, {"app": "trainer", "stage": "eval"})
    payload = body(review(new, operation="UPDATE", old=old))
    assert len(payload) > 6 * MIB

    answer = session.post(offline_webhook.url + path, data=payload, headers=JSON_HEADERS, timeout=30)

    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["response"]["allowed"] is True
