"""A worker that got no answer from its quota service tells the next one which admissions it refused.

The service may have reserved for an admission, itself or through the ledger writer it forwards to,
and then died before answering: the worker refuses the pod (QuotaServiceDown), and strict accounting
withdraws that reservation once told (tests/quota/strict/test_withdrawals.py has the withdrawal; the
fault tests, tests/e2e/test_faults.py, kill quota services mid-burst). Here the worker's side, over
the real wire on a Unix socket: a service that hangs up without an answer, then one that answers
"not yet" (restarting, not synced) before it takes the report.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

from gpuquota_core.pod_admission import PodAdmission
from webhook.quota.client import QuotaClient
from webhook.quota.wire import FrameReader, send_frame

ADMISSION = PodAdmission(uid="review-7", operation="CREATE", namespace="team-a", name="trainer-7", pod_uid="",
                         labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                         canonical_requests={"koordinator.sh/gpu-memory-ratio": "100"})
DEADLINE_SECONDS = 30.0


class DyingThenRestartingService:
    """Hangs up on every admission; answers reports "not yet" ``refusals`` times, then takes them."""

    def __init__(self, path: Path, refusals: int, retry_answer: dict[str, Any] | None = None) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.refusals = refusals
        # Answered to the second attempt of an admission (the restarted service), if given.
        self.retry_answer = retry_answer
        self.admissions_seen = 0
        self.reports: list[dict[str, Any]] = []
        self.taken = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.taken.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            # A thread per connection: the worker's thread keeps its connection while the reporter opens its own.
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            reader = FrameReader(conn)
            while (message := reader.read()) is not None:
                if message["op"] == "admit_pod":
                    self.admissions_seen += 1
                    if self.retry_answer is not None and self.admissions_seen % 2 == 0:
                        send_frame(conn, self.retry_answer)
                        continue
                    break  # dies before it answers: the client sees the connection close
                assert message["op"] == "withdraw_unanswered", message
                self.reports.append(message)
                taken = len(self.reports) > self.refusals
                send_frame(conn, {"taken": taken})
                if taken:
                    self.taken.set()
                    return

    def close(self) -> None:
        self.listener.close()


def test_a_refused_unanswered_admission_is_reported_until_the_service_takes_it(tmp_path: Path) -> None:
    service = DyingThenRestartingService(tmp_path / "quota.sock", refusals=2)
    try:
        verdict = QuotaClient(tmp_path / "quota.sock", timeout=2.0).admit_pod(ADMISSION)

        assert (verdict.allowed, verdict.reason) == (False, "QuotaServiceDown")
        assert service.taken.wait(DEADLINE_SECONDS)
        # Asked again while the service answered "not yet", the same admission each time.
        assert len(service.reports) == 3
        assert all(report["admissions"] == [_as_wire(ADMISSION)] for report in service.reports)
    finally:
        service.close()


def test_a_refusal_from_the_next_service_after_a_lost_answer_is_reported_too(tmp_path: Path) -> None:
    # The first attempt dies with the service; the retry reaches its successor, not synced yet,
    # which refuses: the first attempt may still have reserved, so the admission is reported.
    not_synced = {"allowed": False, "message": "quota state is not synced yet; retry shortly", "reason": "NotReady"}
    service = DyingThenRestartingService(tmp_path / "quota.sock", refusals=0, retry_answer=not_synced)
    try:
        verdict = QuotaClient(tmp_path / "quota.sock", timeout=2.0).admit_pod(ADMISSION)

        assert (verdict.allowed, verdict.reason) == (False, "NotReady")
        assert service.taken.wait(DEADLINE_SECONDS)
        assert service.reports[0]["admissions"] == [_as_wire(ADMISSION)]
    finally:
        service.close()


def test_a_dry_run_is_not_reported(tmp_path: Path) -> None:
    service = DyingThenRestartingService(tmp_path / "quota.sock", refusals=0)
    try:
        client = QuotaClient(tmp_path / "quota.sock", timeout=2.0)
        dry = PodAdmission(**{**_as_wire(ADMISSION), "uid": "review-8", "dry_run": True})
        assert client.admit_pod(dry).reason == "QuotaServiceDown"
        assert client.admit_pod(ADMISSION).reason == "QuotaServiceDown"
        assert service.taken.wait(DEADLINE_SECONDS)
        # Only the real one: a dry run reserves nothing anywhere.
        assert [each["uid"] for each in service.reports[0]["admissions"]] == ["review-7"]
    finally:
        service.close()


def _as_wire(admission: PodAdmission) -> dict[str, Any]:
    return {name: getattr(admission, name) for name in admission.__dataclass_fields__}
