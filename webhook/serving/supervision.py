"""The gunicorn master keeps the quota service running: a service that dies is replaced at once.

gunicorn restarts a dead worker, but knows nothing of the quota service the master started
beside them (``webhook.quota.service``). Without a replacement a dead service would leave a
server that answers but refuses every decision (validation fails closed) for as long as it ran.
So the master's arbiter (:class:`SupervisingArbiter`) looks at the service whenever a child exits
and at every turn of its loop (at least once a second) and starts a new one, which rebuilds its
state from scratch: a fresh list and watch of the cluster, or a fresh load of ``--state``. What
the dead service held only in memory is gone: reservations of pods admitted but not yet seen by
the watch (with ``--accounting strict`` they are in the ledger ConfigMaps and survive).

The server exits instead (non-zero, so a kubelet restarts the pod) when a new service cannot
start: it exits at once with ``webhook.quota.service.CANNOT_START_EXIT`` (its configuration
no longer loads), or dies within :data:`QUICK_DEATH_SECONDS` of starting :data:`MAX_QUICK_DEATHS`
times in a row. A service that was told to stop (SIGTERM: the pod is being stopped) stops the
server too, with 0.

A stopping master (SIGTERM, SIGINT, or one of the exits above) leaves nothing running behind it:
the workers get SIGTERM and ``graceful_timeout`` seconds to finish; any still alive then (hung, or
stopped) is killed with SIGKILL and waited for. Only then is the quota service, which the draining
workers still ask, sent SIGTERM, and killed too when it has not exited within
:data:`SERVICE_STOP_SECONDS` or the rest of the graceful timeout, whichever is longer. Every child
has been waited for before the master's ``on_exit`` hook removes the metrics directory, so no
process can write into it while or after it is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn.arbiter import Arbiter
from gunicorn.errors import HaltServer

log = logging.getLogger("gpuquota.server")

QUICK_DEATH_SECONDS = 10.0
MAX_QUICK_DEATHS = 3
# The least time a stopping quota service is given after its SIGTERM: it only closes its socket and
# removes its files.
SERVICE_STOP_SECONDS = 5.0
STOP_POLL_SECONDS = 0.05


class ServiceGone(Exception):
    """The server must stop: the quota service cannot be kept running."""

    def __init__(self, reason: str, exit_status: int) -> None:
        super().__init__(reason)
        self.exit_status = exit_status


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"was killed by {signal.Signals(number).name}"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else f"ended ({status})"


class QuotaServiceSupervisor:
    """The master's handle on the quota service process: start it, replace it when it dies."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start_process: Callable[[Path], subprocess.Popen[bytes]] | None = None
        self.socket_path: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._quick_deaths = 0

    def start_with(self, start_process: Callable[[Path], subprocess.Popen[bytes]], socket_path: Path) -> None:
        """Start the service with ``start_process(socket_path)``, and every replacement the same way."""
        self._start_process, self.socket_path = start_process, socket_path
        self._spawn()

    def _spawn(self) -> None:
        assert self._start_process is not None and self.socket_path is not None
        self.process = self._start_process(self.socket_path)
        self._started_at = self._clock()

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM the service; SIGKILL it if it is still alive after ``grace_seconds`` or
        SERVICE_STOP_SECONDS, whichever is longer; return once it is gone. No replacement follows."""
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        grace = max(grace_seconds, SERVICE_STOP_SECONDS)
        kill_at = self._clock() + grace
        while not _reaped(process.pid):
            if self._clock() >= kill_at:
                log.error("quota service (pid %s) still running %.1fs after SIGTERM: killing it", process.pid, grace)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                _reaped(process.pid, block=True)
                break
            time.sleep(STOP_POLL_SECONDS)
        process.returncode = -1 if process.returncode is None else process.returncode

    def check(self) -> None:
        """Reap a service that has exited and start the next one; ServiceGone when that is futile."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        # Here, not at import: the quota modules create their metrics when imported.
        from webhook.quota.service import CANNOT_START_EXIT, remove_private_files

        try:
            pid, status = os.waitpid(process.pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by gunicorn's own waitpid(-1) (a reload reaps every child): dead, status unknown.
            pid, status = process.pid, -1
        if pid == 0:
            return
        process.returncode = os.waitstatus_to_exitcode(status) if status != -1 else -1
        how = _describe(status) if status != -1 else "exited"
        if status != -1 and ((os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
                             or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)):
            raise ServiceGone(f"the quota service (pid {pid}) was stopped", 0)
        if status != -1 and os.WIFEXITED(status) and os.WEXITSTATUS(status) == CANNOT_START_EXIT:
            raise ServiceGone(f"the quota service (pid {pid}) cannot start (its reason is logged above)", 1)
        lived = self._clock() - self._started_at
        self._quick_deaths = self._quick_deaths + 1 if lived < QUICK_DEATH_SECONDS else 1
        if self._quick_deaths >= MAX_QUICK_DEATHS:
            raise ServiceGone(f"the quota service (pid {pid}) {how}; it died within {QUICK_DEATH_SECONDS:g}s "
                              f"of starting {self._quick_deaths} times in a row, giving up", 1)
        assert self.socket_path is not None
        remove_private_files(self.socket_path, keep_directory=True)  # the new one creates them afresh
        _forget_live_gauges(pid)
        self._spawn()
        assert self.process is not None
        log.error("quota service (pid %s) %s after %.1fs; started a new one (pid %s), which rebuilds the "
                  "quota state from a fresh list or load; decisions wait for it (503) meanwhile",
                  pid, how, lived, self.process.pid)


def _forget_live_gauges(pid: int) -> None:
    """Drop the dead service's live-gauge files (its writer role), as for a dead worker: the new
    service reports its own. Max gauges keep the dead one's last value, as before."""
    from webhook.serving.metrics import MULTIPROC_ENV  # here: the metrics directory is set by now

    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def _reaped(pid: int, *, block: bool = False) -> bool:
    """Whether child ``pid`` has exited (and is now reaped); ``block`` waits for it."""
    try:
        reaped, _status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return True  # reaped already (gunicorn's waitpid(-1) takes every child)
    return reaped != 0


class SupervisingArbiter(Arbiter):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's master, also keeping the quota service running (:class:`QuotaServiceSupervisor`)."""

    def __init__(self, app: Any, supervisor: QuotaServiceSupervisor) -> None:
        self.supervisor = supervisor
        super().__init__(app)

    def _supervise(self) -> None:
        try:
            self.supervisor.check()
        except ServiceGone as gone:
            raise HaltServer(str(gone), gone.exit_status) from None

    def handle_chld(self) -> None:
        # Before gunicorn's waitpid(-1), which would reap the service as an unknown child.
        self._supervise()
        super().handle_chld()

    handle_cld = handle_chld

    def manage_workers(self) -> None:
        # Every turn of the master's loop (at least once a second), and once before the first.
        self._supervise()
        super().manage_workers()

    def stop(self, graceful: bool = True) -> None:
        """gunicorn's stop (SIGTERM, the graceful timeout, then SIGKILL), then make sure: every worker
        still listed is killed and waited for, and the quota service is stopped the same way."""
        deadline = time.monotonic() + self.cfg.graceful_timeout
        super().stop(graceful)
        for pid, worker in list(self.WORKERS.items()):
            # gunicorn's last reap does not wait: a worker SIGKILLed just before may still be listed.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reaped(pid, block=True)
            self.WORKERS.pop(pid, None)
            with contextlib.suppress(OSError):
                worker.tmp.close()
            self.cfg.child_exit(self, worker)
        self.supervisor.stop(grace_seconds=max(deadline - time.monotonic(), 0.0))
