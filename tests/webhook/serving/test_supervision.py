"""The master's supervisor of the quota service (webhook.serving.supervision), with real child processes.

Each "service" here is a short Python process that exits the way a quota service can; the
supervisor reaps it and starts the next one, or says the server must stop.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from webhook.quota.service import CANNOT_START_EXIT
from webhook.serving.supervision import MAX_QUICK_DEATHS, QUICK_DEATH_SECONDS, QuotaServiceSupervisor, ServiceGone


def exiting_with(code: int, started: list[int]) -> Callable[[Path], subprocess.Popen[bytes]]:
    def start(_path: Path) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
        started.append(process.pid)
        return process
    return start


def check_until_gone(supervisor: QuotaServiceSupervisor, deadline_seconds: float = 30.0) -> ServiceGone:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            supervisor.check()
        except ServiceGone as gone:
            return gone
        time.sleep(0.01)
    raise AssertionError("the supervisor never gave up")


def test_a_service_that_keeps_dying_at_start_is_given_up_after_three_tries(tmp_path: Path) -> None:
    started: list[int] = []
    supervisor = QuotaServiceSupervisor()
    (tmp_path / "quota.sock").touch()
    supervisor.start_with(exiting_with(1, started), tmp_path / "quota.sock")

    gone = check_until_gone(supervisor)

    assert gone.exit_status == 1
    assert len(started) == MAX_QUICK_DEATHS
    assert "exited with 1; it died within 10s of starting 3 times in a row" in str(gone)
    assert not (tmp_path / "quota.sock").exists() and tmp_path.is_dir()  # cleared for the next one, dir kept


@pytest.mark.parametrize(("code", "status", "says"), [
    (CANNOT_START_EXIT, 1, "cannot start"),
    (0, 0, "was stopped"),
])
def test_a_service_that_cannot_start_or_was_stopped_ends_the_server_at_once(
        tmp_path: Path, code: int, status: int, says: str) -> None:
    started: list[int] = []
    supervisor = QuotaServiceSupervisor()
    supervisor.start_with(exiting_with(code, started), tmp_path / "quota.sock")

    gone = check_until_gone(supervisor)

    assert (gone.exit_status, len(started)) == (status, 1)
    assert says in str(gone)


def test_a_service_that_lived_a_while_is_restarted_every_time(tmp_path: Path) -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += QUICK_DEATH_SECONDS  # every death comes at least that long after its start
        return now[0]

    started: list[int] = []
    supervisor = QuotaServiceSupervisor(clock=clock)
    supervisor.start_with(exiting_with(1, started), tmp_path / "quota.sock")
    deadline = time.monotonic() + 30
    while len(started) < 2 * MAX_QUICK_DEATHS + 1:
        assert time.monotonic() < deadline
        supervisor.check()
        time.sleep(0.01)
    assert len(started) == 2 * MAX_QUICK_DEATHS + 1
