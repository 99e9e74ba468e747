"""A real ``gpuquota serve`` whose quota service dies: the master starts a new one, or the server exits.

While no service runs, no worker admits a pod (none holds quota state of its own), and liveness
fails. To look at that window for as long as the test needs, the gunicorn master is stopped
(SIGSTOP) before the service is killed, so it cannot start the replacement until it is continued.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reviews import pod, review
from webhookproc import WebhookProcess, post_review, quota_service_pid

RATIO = "koordinator.sh/gpu-memory-ratio"
LABEL = "quota.scheduling.koordinator.sh/name"
STATE = """apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team}
spec: {max: {koordinator.sh/gpu-memory-ratio: "100000"}}
"""
HEAL_DEADLINE_SECONDS = 30.0
POLL_SECONDS = 0.05


def ask(server: WebhookProcess, ratio: str = "1") -> dict[str, Any]:
    name = f"p-{uuid.uuid4().hex[:8]}"
    document = review(pod(name, "team", labels={LABEL: "team-a"}, resources={RATIO: ratio}))
    return post_review(server, "/validate-pods", document)  # a fresh connection: any worker may answer


def wait_dead(pid: int) -> None:
    """Until ``pid`` has exited (a zombie: dead, its files and locks released, not yet reaped)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"{pid} still alive")


@contextlib.contextmanager
def master_stopped(server: WebhookProcess) -> Iterator[None]:
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def wait_healed(server: WebhookProcess) -> float:
    """Seconds until /healthz passes and a create is admitted again; fails after HEAL_DEADLINE_SECONDS."""
    started = time.monotonic()
    while time.monotonic() - started < HEAL_DEADLINE_SECONDS:
        if server.get("/healthz")[0] == 200:
            answer = ask(server)
            if answer["allowed"]:
                return time.monotonic() - started
            assert answer["status"]["code"] == 503, answer  # refused only for want of a service
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"not healed after {HEAL_DEADLINE_SECONDS:.0f}s:\n{server.tail()}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WebhookProcess]:
    (tmp_path / "state.yaml").write_text(STATE, encoding="utf-8")
    process = WebhookProcess(tmp_path, serve_args=["--state", str(tmp_path / "state.yaml"), "--accounting", "local"])
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_no_worker_admits_and_liveness_fails_while_the_service_is_dead(server: WebhookProcess) -> None:
    # Fresh connections, so every worker has asked the service while it lives.
    assert all(ask(server)["allowed"] for _ in range(24))
    service = quota_service_pid(server.pid)
    with master_stopped(server):
        os.kill(service, signal.SIGKILL)
        wait_dead(service)
        answers = [ask(server) for _ in range(40)]  # several per worker
        assert [(a["allowed"], a.get("status", {}).get("code"), a.get("status", {}).get("reason"))
                for a in answers] == [(False, 503, "QuotaServiceDown")] * 40
        assert {server.get("/healthz")[0] for _ in range(8)} == {503}
        assert server.get("/readyz")[0] == 503
    wait_healed(server)
    assert quota_service_pid(server.pid) != service
    # The new service decides from a fresh load of --state: what does not fit is refused, with numbers.
    refused = ask(server, "100100")
    assert (refused["allowed"], refused["status"]["code"]) == (False, 403)
    assert "limited: koordinator.sh/gpu-memory-ratio=100k" in refused["status"]["message"]


def test_a_killed_quota_service_is_replaced_and_the_server_heals(server: WebhookProcess) -> None:
    assert ask(server)["allowed"]
    service = quota_service_pid(server.pid)
    os.kill(service, signal.SIGKILL)
    healed_after = wait_healed(server)

    assert quota_service_pid(server.pid) != service
    assert server.get("/readyz")[0] == 200
    assert f"quota service (pid {service}) was killed by SIGKILL" in server.log_text()
    print(f"\nhealed {healed_after:.2f}s after the quota service was killed")


def test_a_service_that_cannot_start_again_stops_the_server_non_zero(server: WebhookProcess, tmp_path: Path) -> None:
    (tmp_path / "state.yaml").write_text("kind: [\n", encoding="utf-8")  # changed under the running server
    os.kill(quota_service_pid(server.pid), signal.SIGKILL)

    assert server._popen is not None
    try:
        code = server._popen.wait(timeout=HEAL_DEADLINE_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running:\n{server.tail()}") from None
    assert code != 0
    log = server.log_text()
    assert f"quota service: cannot start: {tmp_path}/state.yaml:" in log and "not valid YAML" in log
    assert "Traceback" not in log
