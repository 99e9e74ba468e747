"""Offline (``--state``) mode has no API server to write Events to: the quota service logs them.

Through a real ``gpuquota serve`` over TLS: a refusal travels from the worker that decided it,
over the quota service's socket, through aggregation, into one log line per write.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import requests
from reviews import body, pod, review
from webhookproc import WebhookProcess

OVER_QUOTA = {"koordinator.sh/gpu-core": "900", "koordinator.sh/gpu-memory-ratio": "900"}
DEADLINE = 15.0


def validate(server: WebhookProcess, obj: dict[str, Any]) -> dict[str, Any]:
    with requests.Session() as http:
        http.trust_env = False
        http.verify = str(server.ca_file)
        answer = http.post(server.url + "/validate-pods", data=body(review(obj)),
                           headers={"Content-Type": "application/json"}, timeout=10)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def logged_events(server: WebhookProcess, name: str) -> list[dict[str, Any]]:
    records = (json.loads(line) for line in server.log_text().splitlines() if line.startswith("{"))
    return [r for r in records if r.get("event") == "kubernetes_event" and r["involvedObject"]["name"] == name]


def wait_for_logged(server: WebhookProcess, name: str, count: int) -> list[dict[str, Any]]:
    end = time.monotonic() + DEADLINE
    while True:
        found = logged_events(server, name)
        if sum(r["count"] for r in found) >= count:
            return found
        assert time.monotonic() < end, f"{count} occurrence(s) on {name} not logged: {found}"
        time.sleep(0.05)  # polling a condition with a deadline


def test_offline_refusals_are_logged_as_events_not_written(offline_webhook: WebhookProcess) -> None:
    owner = f"rs-{uuid.uuid4().hex[:6]}"
    for n in range(3):
        obj = pod(f"{owner}-{n}", "team-nlp", resources=OVER_QUOTA)
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                               "uid": "u-1", "controller": True}]
        assert validate(offline_webhook, obj)["allowed"] is False

    found = wait_for_logged(offline_webhook, owner, 3)

    assert sum(r["count"] for r in found) == 3
    for record in found:
        assert record["written"] is False
        assert record["reason"] == "GPUQuotaExceeded"
        assert record["involvedObject"] == {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                            "namespace": "team-nlp", "uid": "u-1"}
        assert record["message"].startswith("pod refused: exceeded quota: team-nlp/team-nlp, ")


def test_an_ownerless_refusal_is_logged_on_its_elasticquota(offline_webhook: WebhookProcess) -> None:
    before = sum(r["count"] for r in logged_events(offline_webhook, "team-nlp"))
    assert validate(offline_webhook, pod("lonely", "team-nlp", resources=OVER_QUOTA))["allowed"] is False

    found = wait_for_logged(offline_webhook, "team-nlp", before + 1)

    assert found[-1]["involvedObject"]["kind"] == "ElasticQuota"
    assert found[-1]["involvedObject"]["namespace"] == "team-nlp"


def test_a_dry_run_refusal_writes_no_event(offline_webhook: WebhookProcess) -> None:
    """sideEffects NoneOnDryRun. One kept-alive connection reaches one worker, whose events reach
    the service in order: once the real refusal's event is logged, the dry run's would be too."""
    dry, real = (f"rs-{uuid.uuid4().hex[:6]}" for _ in range(2))
    with requests.Session() as http:
        http.trust_env = False
        http.verify = str(offline_webhook.ca_file)
        for owner, dry_run in ((dry, True), (real, False)):
            obj = pod(f"{owner}-0", "team-nlp", resources=OVER_QUOTA)
            obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                                   "uid": owner, "controller": True}]
            answer = http.post(offline_webhook.url + "/validate-pods", data=body(review(obj, dry_run=dry_run)),
                               headers={"Content-Type": "application/json"}, timeout=10)
            assert answer.json()["response"]["allowed"] is False

    wait_for_logged(offline_webhook, real, 1)

    assert logged_events(offline_webhook, dry) == []


def test_an_invalid_request_outside_any_quota_is_reported_on_the_namespace(offline_webhook: WebhookProcess) -> None:
    namespace = f"scratch-{uuid.uuid4().hex[:6]}"  # no ElasticQuota applies to it (nor a default one)
    invalid = {"koordinator.sh/gpu-core": "150", "koordinator.sh/gpu-memory-ratio": "150"}
    response = validate(offline_webhook, pod("half-more", namespace, resources=invalid))
    assert response["status"]["reason"] == "Invalid"

    (record,) = wait_for_logged(offline_webhook, namespace, 1)

    assert record["reason"] == "GPURequestInvalid"
    assert record["involvedObject"] == {"apiVersion": "v1", "kind": "Namespace", "name": namespace,
                                        "namespace": namespace}
    assert record["message"] == "pod refused: " + response["status"]["message"]
