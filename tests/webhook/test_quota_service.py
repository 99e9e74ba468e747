from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from webhook.quota_client import QuotaClient
from webhook.quota_port import PodAdmission
from webhook.quota_service import serve
from webhook.quota_state import QuotaState

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA = {"kind": "ElasticQuota", "metadata": {"name": "team-a", "namespace": "team"},
         "spec": {"max": {RATIO: "1000"}}}
RUNNING = {"kind": "Pod", "metadata": {"name": "running", "namespace": "team", "uid": "u0",
                                       "labels": {"quota.scheduling.koordinator.sh/name": "team-a"}},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {RATIO: "300"}}}]},
           "status": {"phase": "Running"}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[QuotaClient]:
    state = QuotaState()
    state.load([QUOTA, RUNNING])
    path = tmp_path / "quota.sock"
    listener = serve(state, path)
    yield QuotaClient(path, timeout=5.0)
    listener.close()


def admission(name: str, ratio: str, dry_run: bool = False) -> PodAdmission:
    return PodAdmission(uid="uid-" + name, operation="CREATE", namespace="team", name=name, pod_uid="",
                        labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                        canonical_requests={RATIO: ratio}, dry_run=dry_run)


def test_denial_through_socket_has_native_message(client: QuotaClient) -> None:
    assert client.ready() == (True, "quota state synced")
    verdict = client.admit_pod(admission("big", "800"))
    assert not verdict.allowed and verdict.code == 403
    # Quantities print as Kubernetes prints them: 1000 is "1k".
    assert verdict.message == (f"exceeded quota: team/team-a, requested: {RATIO}=800, used: {RATIO}=300, "
                               f"limited: {RATIO}=1k")


def test_dry_run_never_reserves(client: QuotaClient) -> None:
    assert client.admit_pod(admission("p", "700", dry_run=True)).allowed
    assert client.admit_pod(admission("q", "700")).allowed
    assert not client.admit_pod(admission("r", "1")).allowed


def test_concurrent_admissions_take_exactly_the_room(client: QuotaClient) -> None:
    # 700 of room left, 10 each: exactly 70 of 300 racing pods may pass.
    results: list[bool] = []
    guard = threading.Lock()
    start = threading.Barrier(30)

    def worker(index: int) -> None:
        start.wait()
        for n in range(10):
            allowed = client.admit_pod(admission(f"p-{index}-{n}", "10")).allowed
            with guard:
                results.append(allowed)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 300 and results.count(True) == 70


def test_service_down_is_a_prompt_denial(tmp_path: Path) -> None:
    client = QuotaClient(tmp_path / "absent.sock", timeout=0.5)
    verdict = client.admit_pod(admission("p", "1"))
    assert not verdict.allowed and verdict.code == 503 and "quota service unavailable" in verdict.message
    assert client.ready()[0] is False


def test_elasticquota_review_through_socket(client: QuotaClient) -> None:
    shrunk = {"metadata": {"name": "team-a", "namespace": "team"}, "spec": {"max": {RATIO: "200"}}}
    verdict = client.review_elasticquota("UPDATE", shrunk, QUOTA, False)
    assert verdict.allowed
    assert verdict.warnings == (f"new spec.max of team/team-a is below current usage for: {RATIO} "
                                f"(max 200, used 300)",)
    mixed = {"metadata": {"name": "m", "namespace": "team"}, "spec": {"max": {RATIO: "200", "nvidia.com/gpu": "2"}}}
    refused = client.review_elasticquota("CREATE", mixed, None, False)
    assert not refused.allowed and refused.code == 422 and "gpuquota migrate" in refused.message
