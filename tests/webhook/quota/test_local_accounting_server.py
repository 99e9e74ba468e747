"""A real ``gpuquota serve`` with local accounting (gunicorn, two workers, the quota service).

Every pod CREATE a worker validates is decided by the one quota service over its socket, so
admissions racing in from many connections, whichever worker takes them, take exactly the room,
and a refusal counts what the others reserved.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from racing import race
from reviews import pod, review
from webhookproc import WebhookProcess, post_review, quota_service_directory, served_from_state

RATIO = "koordinator.sh/gpu-memory-ratio"
LABEL = "quota.scheduling.koordinator.sh/name"
STATE = """apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team}
spec: {max: {koordinator.sh/gpu-memory-ratio: "1000"}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-b, namespace: team}
spec: {max: {koordinator.sh/gpu-memory-ratio: "1000"}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    with served_from_state(tmp_path_factory.mktemp("local-accounting"), STATE, "--accounting", "local",
                           "--workers", "2") as process:
        yield process


def ask(server: WebhookProcess, name: str, ratio: str, leaf: str) -> dict[str, Any]:
    document = review(pod(name, "team", labels={LABEL: leaf}, resources={RATIO: ratio}), uid=str(uuid.uuid4()))
    return post_review(server, "/validate-pods", document)  # a fresh connection: any worker may answer


def test_a_refusal_counts_what_every_worker_reserved(server: WebhookProcess) -> None:
    assert [ask(server, f"p{i}", "300", "team-a")["allowed"] for i in range(3)] == [True] * 3
    refused = ask(server, "big", "200", "team-a")
    assert refused["allowed"] is False
    assert refused["status"]["message"] == (f"exceeded quota: team/team-a, requested: {RATIO}=200, "
                                            f"used: {RATIO}=900 (900 of it reserved by admissions not yet seen), "
                                            f"limited: {RATIO}=1k")
    assert ask(server, "last", "100", "team-a")["allowed"] is True


def test_racing_admissions_on_many_connections_take_exactly_the_room(server: WebhookProcess) -> None:
    results = race(16, 5, lambda index, n: ask(server, f"r-{index}-{n}", "25", "team-b")["allowed"])
    assert len(results) == 80 and results.count(True) == 40  # 1000 / 25


def test_the_quota_socket_is_private(server: WebhookProcess) -> None:
    directory = quota_service_directory(server.pid)
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / "quota.sock").stat().st_mode & 0o777 == 0o600
