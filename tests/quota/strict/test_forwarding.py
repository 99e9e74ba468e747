"""Forwarded admissions over real TLS: who the writer's listener answers, and when a forwarder
decides itself instead.

The listener and the forwarder are the product's own (``webhook.quota.strict.forwarding``) with
certificates from the real ``gpuquota certs generate``; only the deciding behind them is a recorder,
so each test can say exactly which side decided. The whole path through three servers and the
apiserver is ``tests/e2e/test_replicas.py``.
"""

from __future__ import annotations

import math
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from controlplane import LOOPBACK
from webhookproc import generate_certs

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota.strict import peer
from webhook.quota.strict.accounting import Mode
from webhook.quota.strict.forwarding import SingleWriter
from webhook.quota.strict.peer import PeerClient, PeerListener, ServingKey, bind_peer_socket
from webhook.quota.wire import FrameReader, send_frame

ADMISSION = PodAdmission(uid="review-1", operation="CREATE", namespace="team-a", name="trainer-0", pod_uid="",
                         labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                         canonical_requests={"koordinator.sh/gpu-memory-ratio": "100"}, caller="10.0.0.9")


class Recorder:
    """Decides every admission as ``verdict`` and remembers what it was asked, with the deadline and
    the mode; takes every report of unanswered admissions."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.asked: list[tuple[PodAdmission, float]] = []
        self.modes: list[Mode] = []
        self.reported: list[PodAdmission] = []

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf, mode: Mode = Mode.WRITER) -> Verdict:
        self.asked.append((admission, answer_by))
        self.modes.append(mode)
        return self.verdict

    def admit_forwarded(self, admission: PodAdmission, answer_by: float) -> Verdict:
        return self.admit_pod(admission, answer_by)

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        self.reported.extend(admissions)
        return True


class FixedLease:
    def __init__(self, address: str | None, holds: bool = False) -> None:
        self.address = address
        self.held = holds

    def writer_elsewhere(self) -> str | None:
        return self.address

    def holds(self) -> bool:
        return self.held


def serving_key(directory: Path) -> ServingKey:
    generate_certs(directory)
    return ServingKey(directory / "tls.crt", directory / "tls.key")


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> ServingKey:
    return serving_key(tmp_path_factory.mktemp("replicas-certs"))


@pytest.fixture
def writer(key: ServingKey) -> Iterator[tuple[PeerListener, Recorder]]:
    decided = Recorder(Verdict(False, "exceeded quota: team-a/team-a", reason="QuotaExceeded"))
    listener = PeerListener(bind_peer_socket(LOOPBACK, 0), key, decided)
    listener.start()
    try:
        yield listener, decided
    finally:
        listener.close()


def test_a_forwarded_admission_is_decided_by_the_writer_within_the_time_given(
        key: ServingKey, writer: tuple[PeerListener, Recorder]) -> None:
    listener, decided = writer
    here = Recorder(Verdict(True))
    forwarding = SingleWriter(here, FixedLease(f"{LOOPBACK}:{listener.port}"), PeerClient(key))  # type: ignore[arg-type]

    verdict = forwarding.admit_pod(ADMISSION, answer_by=math.inf)

    assert verdict == Verdict(False, "exceeded quota: team-a/team-a", reason="QuotaExceeded")
    assert [admission for admission, _ in decided.asked] == [ADMISSION] and here.asked == []
    # Kept: the second admission rides the same connection, and the writer is given a deadline.
    forwarding.admit_pod(ADMISSION, answer_by=math.inf)
    assert len(decided.asked) == 2 and all(deadline < math.inf for _, deadline in decided.asked)


def test_a_request_without_the_replicas_token_is_not_answered(key: ServingKey,
                                                             writer: tuple[PeerListener, Recorder]) -> None:
    listener, decided = writer
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with context.wrap_socket(socket.create_connection((LOOPBACK, listener.port), timeout=5)) as sock:
        send_frame(sock, {"op": "admit_pod", "token": "0" * 64, "admission": ADMISSION, "seconds": 1.0})
        assert FrameReader(sock).read() is None  # closed without a reply
    assert decided.asked == []


def test_a_forwarder_decides_itself_when_the_listener_is_not_its_own_replicas(
        tmp_path: Path, writer: tuple[PeerListener, Recorder]) -> None:
    listener, decided = writer
    here = Recorder(Verdict(True))
    # Another Secret: the listener's certificate is not this replica's, so nothing is sent to it.
    forwarding = SingleWriter(here, FixedLease(f"{LOOPBACK}:{listener.port}"),  # type: ignore[arg-type]
                              PeerClient(serving_key(tmp_path / "other")))

    assert forwarding.admit_pod(ADMISSION) == Verdict(True)
    assert decided.asked == [] and [admission for admission, _ in here.asked] == [ADMISSION]


def test_a_forwarder_decides_itself_when_the_writer_is_gone(key: ServingKey) -> None:
    with socket.socket() as closed:  # a port nobody listens on: the writer's process died
        closed.bind((LOOPBACK, 0))
        address = f"{LOOPBACK}:{closed.getsockname()[1]}"
    here, peers = Recorder(Verdict(True)), CountingClient(key)
    forwarding = SingleWriter(here, FixedLease(address), peers)  # type: ignore[arg-type]

    assert forwarding.admit_pod(ADMISSION) == Verdict(True)
    assert peers.tries == 1 and len(here.asked) == 1
    # The next admission does not try the dead address again first: it is left alone for a while.
    forwarding.admit_pod(ADMISSION)
    assert peers.tries == 1 and len(here.asked) == 2


class CountingClient(PeerClient):
    def __init__(self, key: ServingKey) -> None:
        super().__init__(key)
        self.tries = 0

    def admit_pod(self, address: str, admission: PodAdmission, seconds: float) -> Verdict:
        self.tries += 1
        return super().admit_pod(address, admission, seconds)


def test_without_a_writer_elsewhere_a_replica_decides_itself(key: ServingKey) -> None:
    here = Recorder(Verdict(True))
    assert SingleWriter(here, FixedLease(None), PeerClient(key)).admit_pod(ADMISSION) == Verdict(True)  # type: ignore[arg-type]
    assert len(here.asked) == 1


def test_an_admission_the_writer_reads_after_its_deadline_is_decided_by_the_forwarder(key: ServingKey) -> None:
    # The writer's clock ten seconds on: what a writer paused while the admission waited in its
    # socket sees when it resumes. It must not decide what nobody waits for any more.
    decided = Recorder(Verdict(True))
    listener = PeerListener(bind_peer_socket(LOOPBACK, 0), key, decided, clock=lambda: time.time() + 10)
    listener.start()
    try:
        here = Recorder(Verdict(False, "exceeded quota: team-a/team-a", reason="QuotaExceeded"))
        forwarding = SingleWriter(here, FixedLease(f"{LOOPBACK}:{listener.port}"), PeerClient(key))  # type: ignore[arg-type]

        assert forwarding.admit_pod(ADMISSION).allowed is False
        assert decided.asked == [] and len(here.asked) == 1
    finally:
        listener.close()


def test_a_connection_that_asks_nothing_is_closed_and_does_not_keep_its_thread(
        key: ServingKey, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer, "FIRST_REQUEST_SECONDS", 0.2)
    monkeypatch.setattr(peer, "MAX_PEER_CONNECTIONS", 1)
    decided = Recorder(Verdict(True))
    listener = PeerListener(bind_peer_socket(LOOPBACK, 0), key, decided)
    listener.start()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with context.wrap_socket(socket.create_connection((LOOPBACK, listener.port), timeout=5)) as idle:
            assert FrameReader(idle).read() is None  # closed by the listener, unasked
        # Its one slot is free again: a forwarder is answered.
        forwarding_writer = SingleWriter(Recorder(Verdict(False, "here")), FixedLease(f"{LOOPBACK}:{listener.port}"),
                                         PeerClient(key))  # type: ignore[arg-type]
        assert forwarding_writer.admit_pod(ADMISSION) == Verdict(True)
    finally:
        listener.close()


def test_a_forwarders_report_of_unanswered_admissions_is_written_by_the_writer(
        key: ServingKey, writer: tuple[PeerListener, Recorder]) -> None:
    listener, decided = writer
    here = Recorder(Verdict(True))
    forwarding = SingleWriter(here, FixedLease(f"{LOOPBACK}:{listener.port}"), PeerClient(key))  # type: ignore[arg-type]

    assert forwarding.withdraw_unanswered([ADMISSION]) is True
    assert decided.reported == [ADMISSION] and here.reported == []


def test_a_replica_that_cannot_ask_the_writer_decides_and_withdraws_here_in_the_degraded_mode(
        key: ServingKey, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as closed:  # the writer's port is closed: its quota service died
        closed.bind((LOOPBACK, 0))
        address = f"{LOOPBACK}:{closed.getsockname()[1]}"
    here = Recorder(Verdict(True))
    forwarding = SingleWriter(here, FixedLease(address), PeerClient(key))  # type: ignore[arg-type]

    with caplog.at_level("WARNING", logger="gpuquota.quota"):
        assert forwarding.admit_pod(ADMISSION) == Verdict(True)
    assert here.modes == [Mode.DEGRADED] and forwarding.role() == "degraded"
    assert "entering the degraded mode" in caplog.text
    assert forwarding.withdraw_unanswered([ADMISSION]) and here.reported == [ADMISSION]


def test_the_holder_decides_as_the_writer_and_a_replica_without_a_holder_is_degraded(key: ServingKey) -> None:
    holder = Recorder(Verdict(True))
    assert SingleWriter(holder, FixedLease(None, holds=True), PeerClient(key)).admit_pod(ADMISSION)  # type: ignore[arg-type]
    nobody = Recorder(Verdict(True))
    assert SingleWriter(nobody, FixedLease(None), PeerClient(key)).admit_pod(ADMISSION)  # type: ignore[arg-type]
    assert (holder.modes, nobody.modes) == ([Mode.WRITER], [Mode.DEGRADED])
