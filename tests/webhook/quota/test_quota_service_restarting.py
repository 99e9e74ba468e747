"""A worker whose quota service is down waits for the next one within the admission's deadline,
instead of answering 503 at once (webhook/quota/client.py, RECONNECT_SECONDS).

While a quota service is dead its master starts another within about a second. A worker that
refused at once would answer the apiserver's calls faster than the other replicas, and a
least-connections balancer would send it more of them; readiness (probed every 5 s, three failures)
cannot take it out that fast. Probes, though, must still fail at once: they are how the replica says
it is unready when the outage lasts.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota import client as client_module
from webhook.quota.client import QuotaClient
from webhook.quota.wire import FrameReader, send_frame

ADMISSION = PodAdmission(uid="review-9", operation="CREATE", namespace="team-a", name="trainer-9", pod_uid="",
                         labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                         canonical_requests={"koordinator.sh/gpu-memory-ratio": "100"})


def serve_allowing(path: Path) -> socket.socket:
    """The next quota service: answers every admission "allowed"."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            reader = FrameReader(conn)
            while reader.read() is not None:
                send_frame(conn, Verdict(True))

    threading.Thread(target=answer, daemon=True).start()
    return listener


def counted_connects(monkeypatch: pytest.MonkeyPatch, on_attempt: Any = None) -> list[float]:
    attempts: list[float] = []
    connect = client_module._connect

    def counting(path: Path, timeout: float) -> socket.socket:
        attempts.append(time.monotonic())
        if on_attempt is not None:
            on_attempt(len(attempts))
        return connect(path, timeout)

    monkeypatch.setattr(client_module, "_connect", counting)
    return attempts


def test_an_admission_arriving_while_the_service_restarts_is_decided_by_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "quota.sock"
    listeners: list[socket.socket] = []
    # The socket appears at the third try: the master has started the next service meanwhile.
    attempts = counted_connects(monkeypatch, lambda n: listeners.append(serve_allowing(path)) if n == 3 else None)
    try:
        assert QuotaClient(path, timeout=2.0).admit_pod(ADMISSION).allowed
    finally:
        for listener in listeners:
            listener.close()
    assert len(attempts) == 3


def test_an_admission_is_refused_at_its_deadline_not_at_once_and_probes_fail_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = counted_connects(monkeypatch)
    quota = QuotaClient(tmp_path / "quota.sock", timeout=0.5)
    started = time.monotonic()
    verdict = quota.admit_pod(ADMISSION)
    assert (verdict.allowed, verdict.reason) == (False, "QuotaServiceDown")
    # Tried again until the first attempt's deadline (the timeout less the answer margin), then once more.
    assert time.monotonic() - started >= 0.5 - client_module.ANSWER_MARGIN_SECONDS - client_module.RECONNECT_SECONDS
    assert len(attempts) > 2
    attempts.clear()
    assert quota.ready()[0] is False and len(attempts) == 2
