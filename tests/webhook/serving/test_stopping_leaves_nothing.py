"""A stopped ``gpuquota serve`` leaves no process and nothing in its temporary directory behind.

Real servers over TLS: a worker that cannot exit (SIGSTOP) is killed once the graceful timeout has
passed, and the metrics directory is removed only after every child is gone; workers whose master
was killed stop by themselves even while a thread waits on a kept-alive connection.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from pathlib import Path

from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess, quota_service_pid

from webhook.serving.supervision import SERVICE_STOP_SECONDS

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
GRACEFUL_TIMEOUT = 3
# What the master may take beyond the graceful timeout: the quota service's own stop and a loaded machine.
MARGIN_SECONDS = SERVICE_STOP_SECONDS + 5.0


def children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
        except OSError:
            continue  # gone meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0]


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)  # polling a condition with a deadline


def server_in(tmp_path: Path, *args: str) -> tuple[WebhookProcess, Path]:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    server = WebhookProcess(tmp_path / "server", env={"TMPDIR": str(temporary)},
                            serve_args=["--state", str(EXAMPLE_STATE), "--graceful-timeout", str(GRACEFUL_TIMEOUT),
                                        *args]).start()
    return server, temporary


def test_a_worker_that_cannot_exit_is_killed_and_nothing_is_left(tmp_path: Path) -> None:
    server, temporary = server_in(tmp_path, "--workers", "2")
    try:
        assert [path.name.startswith("gpuquota-metrics-") for path in temporary.iterdir()].count(True) == 1
        service = quota_service_pid(server.pid)
        tree = children(server.pid)
        workers = sorted(tree - {service})
        assert len(workers) == 2, tree
        os.kill(workers[0], signal.SIGSTOP)
        wait_for(lambda: state_of(workers[0]) == "T", 10, "the worker did not stop")

        started = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        code = server.wait(timeout=GRACEFUL_TIMEOUT + MARGIN_SECONDS)
        took = time.monotonic() - started

        assert code == 0, server.tail()
        assert took >= GRACEFUL_TIMEOUT  # the stopped worker was given its graceful timeout first
        assert [pid for pid in tree if running(pid)] == []
        assert sorted(path.name for path in temporary.iterdir()) == []
    finally:
        for pid in children(server.pid):
            os.kill(pid, signal.SIGCONT)
        server.stop()


def test_workers_whose_master_was_killed_exit_though_a_connection_is_kept_alive(tmp_path: Path) -> None:
    server, _temporary = server_in(tmp_path, "--workers", "1")
    connection = http.client.HTTPSConnection(LOOPBACK, server.port, timeout=10, context=server.ssl_context())
    try:
        service = quota_service_pid(server.pid)
        tree = children(server.pid)
        assert len(tree - {service}) == 1, tree
        # A thread of the worker now waits on this connection for its next request (keepalive: 120 s).
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.getheader("Connection") == "keep-alive"
        answer.read()

        os.kill(server.pid, signal.SIGKILL)
        assert server.wait(timeout=10) == -signal.SIGKILL
        # gthread looks at its parent every second; then it drains for at most the graceful timeout.
        wait_for(lambda: not any(running(pid) for pid in tree), GRACEFUL_TIMEOUT + MARGIN_SECONDS,
                 f"still running after their master was killed: {[pid for pid in tree if running(pid)]}")
    finally:
        connection.close()
        server.stop()
