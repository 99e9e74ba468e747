"""A real ``gpuquota serve`` whose quota service has died: what still passes, what is refused.

The master replaces a dead service within about a second (test_quota_service_heals.py); it is
stopped (SIGSTOP) here so that the outage lasts as long as the test looks at it.

Validation fails closed when the quota view is gone (503 QuotaServiceDown), but an UPDATE that
cannot change what any quota counts needs no decision: the finalizer and label changes a GPU pod
goes through on its way out must not be refused because of an outage.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reviews import pod, review
from webhookproc import REPO_ROOT, WebhookProcess, post_review, quota_service_directory, quota_service_pid

CANONICAL = {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
GROWN = {"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


def validate(server: WebhookProcess, document: dict[str, Any]) -> dict[str, Any]:
    return post_review(server, "/validate-pods", document)


def wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # dead, not yet reaped by the master: its socket is closed already
            return
        time.sleep(0.02)
    raise AssertionError(f"quota service {pid} still alive")


@pytest.fixture
def server_without_quota_service(tmp_path: Path) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path, serve_args=["--state", str(REPO_ROOT / "examples" / "cluster")])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_dead_quota_service_refuses_decisions_but_not_updates_that_change_nothing(
        server_without_quota_service: WebhookProcess) -> None:
    server = server_without_quota_service
    running = pod("p", resources=CANONICAL)
    relabelled = pod("p", resources=CANONICAL, labels={"app": "trainer"})
    assert validate(server, review(relabelled, operation="UPDATE", old=running))["allowed"] is True

    service = quota_service_pid(server.pid)
    directory = quota_service_directory(server.pid)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        os.kill(service, signal.SIGKILL)
        wait_dead(service)
        refused_while_dead(server, running, relabelled)
        # A killed service cannot remove its socket and node view; the master does as it exits.
        assert directory.exists()
    finally:
        os.kill(server.pid, signal.SIGCONT)
    server.stop()
    assert not directory.exists()


def refused_while_dead(server: WebhookProcess, running: dict[str, Any], relabelled: dict[str, Any]) -> None:
    assert validate(server, review(relabelled, operation="UPDATE", old=running))["allowed"] is True
    moved = pod("p", resources=CANONICAL, labels={"quota.scheduling.koordinator.sh/name": "team-nlp"})
    for document in (review(pod("q", resources=CANONICAL)),  # a create needs a decision
                     review(pod("p", resources=GROWN), operation="UPDATE", old=running),  # a request grew
                     review(moved, operation="UPDATE", old=running)):  # a move to another quota
        refused = validate(server, document)
        assert refused["allowed"] is False
        assert (refused["status"]["code"], refused["status"]["reason"]) == (503, "QuotaServiceDown")
        assert refused["status"]["message"].startswith("quota service unavailable, pod not admitted:")

    # The scrape still answers: the replica reports itself unready, and without the service there
    # are no per-quota figures to show rather than stale ones.
    status, metrics = server.get("/metrics")
    assert status == 200
    assert b"\ngpuquota_ready 0.0\n" in metrics
    assert b"gpuquota_quota_used{" not in metrics and b"gpuquota_quota_limit{" not in metrics
