"""A real ``gpuquota serve`` (gunicorn, two workers, the quota service) admitting from the shared totals.

The workers answer a pod that fits without the quota service: with the service stopped (SIGSTOP:
alive, holding its locks' owner, but answering nothing) such pods still pass. What they reserve
reaches the service's ledger, and racing admissions from many connections take exactly the room.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from racing import race
from reviews import pod, review
from webhookproc import WebhookProcess, post_review, quota_service_directory, quota_service_pid, served_from_state

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
    with served_from_state(tmp_path_factory.mktemp("shared-totals"), STATE) as process:
        yield process


def ask(server: WebhookProcess, name: str, ratio: str, leaf: str) -> dict[str, Any]:
    document = review(pod(name, "team", labels={LABEL: leaf}, resources={RATIO: ratio}), uid=str(uuid.uuid4()))
    return post_review(server, "/validate-pods", document)


def test_workers_admit_what_fits_while_the_quota_service_is_stopped(server: WebhookProcess) -> None:
    service = quota_service_pid(server.pid)
    os.kill(service, signal.SIGSTOP)
    try:
        assert [ask(server, f"p{i}", "300", "team-a")["allowed"] for i in range(3)] == [True] * 3
    finally:
        os.kill(service, signal.SIGCONT)
    # Back, the service has the three reservations in its ledger: 900 used, 100 left.
    refused = ask(server, "big", "200", "team-a")
    assert refused["allowed"] is False
    assert refused["status"]["message"] == (f"exceeded quota: team/team-a, requested: {RATIO}=200, "
                                            f"used: {RATIO}=900 (900 of it reserved by admissions not yet seen), "
                                            f"limited: {RATIO}=1k")
    assert ask(server, "last", "100", "team-a")["allowed"] is True


def test_racing_admissions_on_many_connections_take_exactly_the_room(server: WebhookProcess) -> None:
    results = race(16, 5, lambda index, n: ask(server, f"r-{index}-{n}", "25", "team-b")["allowed"])
    assert len(results) == 80 and results.count(True) == 40  # 1000 / 25


def test_the_shared_region_lives_beside_the_private_socket(server: WebhookProcess) -> None:
    directory = quota_service_directory(server.pid)
    assert (directory / "quota.region").stat().st_mode & 0o777 == 0o600
    assert (directory / "quota.region.tree.json").stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700


def test_a_stopped_server_leaves_no_private_files(tmp_path: Path) -> None:
    with served_from_state(tmp_path, STATE) as process:
        assert ask(process, "p", "1", "team-a")["allowed"] is True  # the region is in use
        service = quota_service_pid(process.pid)
        directory = quota_service_directory(process.pid)
        assert {p.name for p in directory.iterdir()} == {"quota.sock", "quota.region", "quota.region.tree.json",
                                                       "nodes.json"}
    # The service exits on the SIGTERM its process group got; wait for that exit, not a fixed time.
    deadline = time.monotonic() + 10
    while _running(service) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not directory.exists()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
