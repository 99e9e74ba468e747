"""A worker's QuotaDecider: asks the quota service over its Unix socket, with bounded timeouts.

If the service is down or slow the pod is refused (validation fails closed) instead of hanging.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

from gpuquota_core.enforcement import ANSWER_TOO_LATE, ESCROW_NOT_BACK, QUOTA_SERVICE_DOWN
from gpuquota_core.pod_admission import PodAdmission, QuotaFigure, Verdict
from webhook.quota.wire import FrameReader, kernel_timeouts, send_frame, verdict_from_wire

log = logging.getLogger("gpuquota.server")
DEFAULT_TIMEOUT_SECONDS = 2.0
# An admission tells the quota service to answer it this long before the client gives up on it: an
# answer decided later is a refusal whose reservation is withdrawn (webhook.quota.strict.accounting),
# so no "allowed" is ever decided that this client no longer waits for. The margin covers the reply's
# way back; a reply that misses it only leaves its reservation to the TTL, as before: availability,
# not safety, so it is kept small (a decision taking longer than the timeout less it is refused).
ANSWER_MARGIN_SECONDS = 0.1
# Refusals asked again once, as a timeout is (the second attempt has a deadline of its own): an
# admission the service could not decide by its deadline, and room lent to another replica's escrow
# and not back by then (webhook.quota.strict.accounting); neither is a refusal for the quota.
ASKED_AGAIN_ONCE = frozenset({ANSWER_TOO_LATE, ESCROW_NOT_BACK})


# While the quota service's socket is missing or refuses (the service died and its master is starting
# the next one, about a second), an admission's first attempt tries to connect again this often until
# its deadline, instead of answering 503 at once: a replica whose service is down then answers no
# faster than the others (a least-connections balancer would otherwise send it more of the calls it
# can only refuse), and an admission that arrives during a quick restart is decided.
RECONNECT_SECONDS = 0.05
# Reported at most: an outage longer than this many refused admissions leaves the older ones to their TTL.
UNANSWERED_KEPT = 256
# How often the report is tried while the service does not take it (a restart and sync take seconds).
UNANSWERED_RETRY_SECONDS = 0.1
# After this long the reservations reported expired anyway (the TTL, or a create's deadline): stop.
UNANSWERED_GIVE_UP_SECONDS = 60.0


class QuotaServiceTimeout(TimeoutError):
    """The quota service took longer than the client's timeout to answer."""


def _connect(path: Path, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        kernel_timeouts(sock, timeout)
        sock.connect(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


class QuotaClient:
    def __init__(self, path: Path, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.timeout = timeout
        self._local = threading.local()  # one connection per worker thread
        # Admissions refused after an attempt got no answer, reported to the service once it takes them.
        self._unanswered: list[PodAdmission] = []
        self._unanswered_lock = threading.Lock()
        self._reporting = False  # a thread reports them (_report_until_taken)

    def _call(self, message: dict[str, Any], deadline_key: str = "") -> Any:
        """Send ``message`` and read the reply; ``deadline_key``: the field to carry this attempt's
        answer deadline in (CLOCK_MONOTONIC, one clock for every process of the host on Linux)."""
        for attempt in (1, 2):  # one retry on a stale kept connection, a timeout or an answer too late
            reader: FrameReader | None = getattr(self._local, "reader", None)
            if deadline_key:
                message[deadline_key] = time.monotonic() + max(self.timeout - ANSWER_MARGIN_SECONDS,
                                                               self.timeout / 2)
            try:
                if reader is None:
                    # Only the first attempt of an admission waits for a service that is coming back.
                    until = message[deadline_key] if deadline_key and attempt == 1 else None
                    reader = self._local.reader = FrameReader(self._connect_waiting(until))
                send_frame(reader.sock, message)
                reply = reader.read()
                if reply is None:
                    raise ConnectionError("quota service closed the connection")
                reason = reply.get("reason") if isinstance(reply, dict) else None
                if attempt == 1 and deadline_key and reason in ASKED_AGAIN_ONCE:
                    continue  # what a timeout would have meant, said before it: ask again, as then
                return reply
            except BlockingIOError as error:  # what a kernel timeout raises on a blocking socket
                self._drop(reader)
                self._local.lost_an_answer = True
                if attempt == 2:
                    raise QuotaServiceTimeout(f"no answer within {self.timeout:g}s") from error
            except (OSError, ValueError):
                self._drop(reader)
                self._local.lost_an_answer = True
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _connect_waiting(self, until: float | None) -> socket.socket:
        """A connection to the service; while its socket is missing or refuses, tried again every
        RECONNECT_SECONDS until the monotonic time ``until`` (None: fail at once, as probes must)."""
        while True:
            try:
                return _connect(self.path, self.timeout)
            except (FileNotFoundError, ConnectionRefusedError):
                if until is None or time.monotonic() + RECONNECT_SECONDS >= until:
                    raise
                time.sleep(RECONNECT_SECONDS)  # polling for the next service's socket, within the deadline

    def _drop(self, reader: FrameReader | None) -> None:
        # A timed-out connection may still deliver the late reply; it must never be read as the
        # answer to the next call, so the connection goes.
        if reader is not None:
            reader.sock.close()
        self._local.reader = None

    def alive(self) -> tuple[bool, str]:
        """The service answers, synced or not: what liveness needs to know."""
        try:
            self._call({"op": "alive"})
        except (OSError, ValueError) as error:
            return False, f"quota service unreachable: {error}"
        return True, "quota service answers"

    def ready(self) -> tuple[bool, str]:
        try:
            reply = self._call({"op": "ready"})
        except (OSError, ValueError) as error:
            return False, f"quota service unreachable: {error}"
        return bool(reply["ready"]), str(reply["reason"])

    def quota_figures(self) -> list[QuotaFigure] | None:
        try:
            reply = self._call({"op": "quota_figures"})
            return [QuotaFigure(*row) for row in reply["figures"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            # The scrape goes on without them (gpuquota_ready says when the service is down).
            log.warning("no per-quota metrics in this scrape: asking the quota service failed: %s: %s",
                        type(error).__name__, error)
            return None

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        self._local.lost_an_answer = False
        try:
            # orjson writes the dataclass itself; asdict would deep-copy its label and request maps first.
            verdict = self._verdict(self._call({"op": "admit_pod", "admission": admission}, deadline_key="answer_by"))
        except (OSError, ValueError) as error:
            verdict = Verdict(False, f"quota service unavailable, pod not admitted: {error}", reason=QUOTA_SERVICE_DOWN)
        # A refusal after an attempt whose answer never came (the service died or hung with it, and a
        # new one answered the retry, "not synced yet" say): that attempt may have reserved.
        if not verdict.allowed and self._local.lost_an_answer and not admission.dry_run:
            self._report_unanswered(admission)
        return verdict

    def _report_unanswered(self, admission: PodAdmission) -> None:
        """Refused, though an attempt that got no answer may have reserved for it (in the service or
        the writer it forwards to): tell the service until it takes the report, so that strict
        accounting withdraws that reservation instead of holding its room for a TTL. Safe because
        this refusal is the one answer the apiserver gets for the review."""
        with self._unanswered_lock:
            self._unanswered = [*self._unanswered, admission][-UNANSWERED_KEPT:]
            if self._reporting:
                return
            self._reporting = True
        threading.Thread(target=self._report_until_taken, daemon=True, name="quota-unanswered").start()

    def _report_until_taken(self) -> None:
        started = time.monotonic()
        while True:
            with self._unanswered_lock:
                pending = list(self._unanswered)
                if not pending or time.monotonic() - started > UNANSWERED_GIVE_UP_SECONDS:
                    if pending:
                        log.warning("quota service: %d refused admissions not reported within %gs; what was "
                                    "reserved for them expires with its TTL", len(pending), UNANSWERED_GIVE_UP_SECONDS)
                    self._unanswered, self._reporting = [], False
                    return
            try:
                taken = self._call({"op": "withdraw_unanswered", "admissions": pending}).get("taken") is True
            except (OSError, ValueError, AttributeError):
                taken = False
            if not taken:  # restarting, or not synced yet: ask again shortly
                time.sleep(UNANSWERED_RETRY_SECONDS)
                continue
            with self._unanswered_lock:
                self._unanswered = [each for each in self._unanswered if each not in pending]

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        try:
            reply = self._call({"op": "review_elasticquota", "quota": quota})
        except (OSError, ValueError) as error:
            return Verdict(False, f"quota service unavailable, quota not admitted: {error}",
                           reason=QUOTA_SERVICE_DOWN)
        return self._verdict(reply)

    def record_events(self, events: list[dict[str, Any]]) -> int:
        """Hand events to the service's writer (webhook.quota.events); how many it took. Raises OSError."""
        reply = self._call({"op": "record_events", "events": events})
        return int(reply.get("accepted", 0)) if isinstance(reply, dict) else 0

    @staticmethod
    def _verdict(reply: dict[str, Any]) -> Verdict:
        return verdict_from_wire(reply)
