"""A flood of forged AdmissionReviews next to real pod creates through the apiserver.

The forger posts straight to the webhook from 127.0.0.2 with fresh UIDs; the apiserver calls it from
127.0.0.1. The per-caller bound caps the forger, and real pods still get the rest of the quota.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admissionchain import delete_webhook_configurations, local_webhook_configurations, register_webhook_configurations
from clusterhelpers import QUOTA_LABEL, RATIO, admits_quota, create_quota, eventually, whole_card_pod
from controlplane import LOOPBACK, Api
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from reviews import body, pod, review
from webhookproc import WebhookProcess

TEST_LABEL = "gpuquota.koord-gpuquota.io/flood-test"
BOUND = 5
DEADLINE = 60.0


@pytest.fixture
def guarded(api: Api, kubeconfig_path: Path, elasticquota_crd: object, canonical_gpu_node: str,
            tmp_path: Path) -> Iterator[tuple[WebhookProcess, str, str]]:
    server = WebhookProcess(tmp_path / "server", serve_args=["--kubeconfig", str(kubeconfig_path), "--workers", "1",
                                                             "--max-reservations-per-caller", str(BOUND)])
    server.start()
    value = uuid.uuid4().hex[:8]
    documents = local_webhook_configurations(server.url, server.ca_bundle, name_suffix=f"-flood-{value}",
                                             namespace_selector={"matchLabels": {TEST_LABEL: value}})
    try:
        register_webhook_configurations(api, documents)
        namespace = f"flood-{value}"
        api.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(
            name=namespace, labels={TEST_LABEL: value, "gpuquota.koord-gpuquota.io/ignore": "true"})))
        quota = f"room-{namespace}"
        create_quota(api, namespace, quota, {RATIO: "1000"})
        eventually(lambda: admits_quota(server, namespace, quota), "the webhook sees the quota", DEADLINE)

        def called() -> bool:
            stored = api.core.create_namespaced_pod(namespace, whole_card_pod("probe", quota), dry_run="All")
            return "koordinator.sh/gpu-core" in (stored.spec.containers[0].resources.requests or {})

        eventually(called, "the apiserver calls the webhook for the namespace", DEADLINE)
        yield server, namespace, quota
    finally:
        delete_webhook_configurations(api, documents)
        server.stop()


def forge(server: WebhookProcess, namespace: str, quota: str, name: str) -> dict[str, Any]:
    connection = http.client.HTTPSConnection(LOOPBACK, server.port, context=server.ssl_context(), timeout=10,
                                             source_address=("127.0.0.2", 0))
    try:
        document = review(pod(name, namespace, labels={QUOTA_LABEL: quota}, resources={RATIO: "100"}),
                          uid=str(uuid.uuid4()))
        connection.request("POST", "/validate-pods", body=body(document), headers={"Content-Type": "application/json"})
        answer: dict[str, Any] = json.loads(connection.getresponse().read())["response"]
        return answer
    finally:
        connection.close()


def test_forged_flood_leaves_the_quota_usable_by_real_pods(api: Api, guarded: tuple[WebhookProcess, str, str]) -> None:
    server, namespace, quota = guarded
    answers = [forge(server, namespace, quota, f"forged-{i}") for i in range(40)]
    assert [a["allowed"] for a in answers].count(True) == BOUND
    assert {a["status"]["reason"] for a in answers if not a["allowed"]} == {"TooManyReservations"}
    # 1000 of room, 500 held by the forger until its reservations expire: real pods get the rest.
    for index in range(10 - BOUND):
        api.core.create_namespaced_pod(namespace, whole_card_pod(f"real-{index}", quota))
    with pytest.raises(ApiException) as refused:
        api.core.create_namespaced_pod(namespace, whole_card_pod("one-too-many", quota))
    assert f"exceeded quota: {namespace}/{quota}, " in json.loads(refused.value.body)["message"]
    assert len(api.core.list_namespaced_pod(namespace).items) == 10 - BOUND
