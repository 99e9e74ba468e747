from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY
from racing import race

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_objects import quota_from_object
from webhook.admission.status import status_of
from webhook.quota.client import QuotaClient
from webhook.quota.loop import ServiceLoop
from webhook.quota.service import serve
from webhook.quota.state import QuotaState
from webhook.quota.strict.batch_plan import judge_batch
from webhook.quota.wire import FrameReader, send_frame

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA = {"kind": "ElasticQuota", "metadata": {"name": "team-a", "namespace": "team"},
         "spec": {"max": {RATIO: "1000"}}}
RUNNING = {"kind": "Pod", "metadata": {"name": "running", "namespace": "team", "uid": "u0",
                                       "labels": {"quota.scheduling.koordinator.sh/name": "team-a"}},
           "spec": {"containers": [{"name": "c", "resources": {"requests": {RATIO: "300"}}}]},
           "status": {"phase": "Running"}}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[QuotaClient]:
    state = QuotaState()
    state.load([QUOTA, RUNNING])
    path = tmp_path / "quota.sock"
    listener = serve(state, path)
    yield QuotaClient(path, timeout=5.0)
    listener.close()


def admission(name: str, ratio: str, dry_run: bool = False) -> PodAdmission:
    return PodAdmission(uid="uid-" + name, operation="CREATE", namespace="team", name=name, pod_uid="",
                        labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                        canonical_requests={RATIO: ratio}, dry_run=dry_run)


def test_denial_through_socket_has_native_message(client: QuotaClient) -> None:
    assert client.ready() == (True, "quota state synced")
    verdict = client.admit_pod(admission("big", "800"))
    assert not verdict.allowed and status_of(verdict.reason) == 403
    # Quantities print as Kubernetes prints them: 1000 is "1k".
    assert verdict.message == (f"exceeded quota: team/team-a, requested: {RATIO}=800, used: {RATIO}=300, "
                               f"limited: {RATIO}=1k")


def test_dry_run_never_reserves(client: QuotaClient) -> None:
    assert client.admit_pod(admission("p", "700", dry_run=True)).allowed
    assert client.admit_pod(admission("q", "700")).allowed
    assert not client.admit_pod(admission("r", "1")).allowed


def test_concurrent_admissions_take_exactly_the_room(client: QuotaClient) -> None:
    # 700 of room left, 10 each: exactly 70 of 300 racing pods may pass.
    results = race(30, 10, lambda index, n: client.admit_pod(admission(f"p-{index}-{n}", "10")).allowed)
    assert len(results) == 300 and results.count(True) == 70


def test_service_down_is_a_prompt_denial(tmp_path: Path) -> None:
    client = QuotaClient(tmp_path / "absent.sock", timeout=0.5)
    verdict = client.admit_pod(admission("p", "1"))
    assert not verdict.allowed and status_of(verdict.reason) == 503 and "quota service unavailable" in verdict.message
    assert client.ready()[0] is False


def test_elasticquota_review_through_socket(client: QuotaClient) -> None:
    shrunk = {"metadata": {"name": "team-a", "namespace": "team"}, "spec": {"max": {RATIO: "200"}}}
    verdict = client.review_elasticquota(shrunk)
    assert verdict.allowed
    assert verdict.warnings == (f"new spec.max of team/team-a is below current usage for: {RATIO} "
                                f"(max 200, used 300)",)
    mixed = {"metadata": {"name": "m", "namespace": "team"}, "spec": {"max": {RATIO: "200", "nvidia.com/gpu": "2"}}}
    refused = client.review_elasticquota(mixed)
    assert not refused.allowed and status_of(refused.reason) == 422 and "gpuquota migrate" in refused.message


def pod_object(name: str, uid: str, ratio: str, quota: str = "team-a") -> dict[str, object]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "team", "uid": uid,
                                        "labels": {"quota.scheduling.koordinator.sh/name": quota}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {RATIO: ratio}}}]},
            "status": {"phase": "Pending"}}


def test_recreated_pod_keeps_its_reservation_until_the_new_pod_is_watched() -> None:
    state = QuotaState()
    state.load([QUOTA, pod_object("p", "old-uid", "600")])
    # "p" is deleted and created again at once; the new one is admitted before the watch catches up.
    new = PodAdmission(uid="adm", operation="CREATE", namespace="team", name="p", pod_uid="new-uid",
                       labels={"quota.scheduling.koordinator.sh/name": "team-a"}, canonical_requests={RATIO: "400"})
    assert state.admit_pod(new).allowed
    # Late events of the old pod must neither release the new reservation nor drop a newer record.
    state.apply_event("Pod", "MODIFIED", pod_object("p", "old-uid", "600"))
    assert len(state.ledger) == 1
    state.apply_event("Pod", "DELETED", pod_object("p", "old-uid", "600"))
    assert len(state.ledger) == 1
    assert not state.admit_pod(admission("other", "700")).allowed  # 400 reserved of 1000
    state.apply_event("Pod", "ADDED", pod_object("p", "new-uid", "400"))
    assert len(state.ledger) == 0 and state.usage.used("team-a")[RATIO] == Quantity.parse("400")
    # A DELETED of the old pod arriving after the new one's ADDED leaves the new one counted.
    state.apply_event("Pod", "DELETED", pod_object("p", "old-uid", "600"))
    assert state.usage.used("team-a")[RATIO] == Quantity.parse("400")


def test_relabel_update_reserves_the_new_quota_until_watched() -> None:
    team_b = {"kind": "ElasticQuota", "metadata": {"name": "team-b", "namespace": "team"},
              "spec": {"max": {RATIO: "500"}}}
    state = QuotaState()
    state.load([QUOTA, team_b, pod_object("p", "u1", "300")])
    move = PodAdmission(uid="adm", operation="UPDATE", namespace="team", name="p", pod_uid="u1",
                        labels={"quota.scheduling.koordinator.sh/name": "team-b"}, canonical_requests={RATIO: "300"},
                        old_labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                        old_canonical_requests={RATIO: "300"})
    assert state.admit_pod(move).allowed
    assert state.ledger.used("team-b") == {RATIO: Quantity.parse("300")}
    into_b = PodAdmission(uid="adm2", operation="CREATE", namespace="team", name="q", pod_uid="u2",
                          labels={"quota.scheduling.koordinator.sh/name": "team-b"}, canonical_requests={RATIO: "300"})
    denied = state.admit_pod(into_b)
    assert not denied.allowed and denied.message.startswith("exceeded quota: team/team-b,")
    state.apply_event("Pod", "MODIFIED", pod_object("p", "u1", "300", quota="team-b"))
    assert len(state.ledger) == 0 and state.usage.used("team-b") == {RATIO: Quantity.parse("300")}


def test_limit_only_quota_update_does_not_reindex() -> None:
    state = QuotaState()
    state.load([QUOTA, RUNNING])
    raised = {**QUOTA, "spec": {"max": {RATIO: "2000"}}}
    assert state.tree.upsert(quota_from_object(raised)) is False
    moved = {**QUOTA, "metadata": {**QUOTA["metadata"], "labels": {"quota.scheduling.koordinator.sh/parent": "x"}}}
    assert state.tree.upsert(quota_from_object(moved)) is True


def recharged() -> float:
    return REGISTRY.get_sample_value("gpuquota_usage_recharged_pods_total") or 0.0


def test_a_new_quota_no_pod_resolves_to_charges_no_pod_again() -> None:
    # Many pods of team-a, and two that name a quota not created yet (counted nowhere until it is).
    state = QuotaState()
    state.load([QUOTA, *(pod_object(f"p{i}", f"u{i}", "10") for i in range(500)),
                pod_object("early-0", "e0", "100", quota="team-b"), pod_object("early-1", "e1", "100", quota="team-b")])
    assert state.usage.used("team-b") == {}
    before = recharged()
    # A quota elsewhere in the cluster, as every burst namespace or team brings: no pod resolves to it.
    state.apply_event("ElasticQuota", "ADDED", {"kind": "ElasticQuota", "metadata": {"name": "elsewhere",
                      "namespace": "other"}, "spec": {"max": {RATIO: "100"}}})
    assert recharged() == before
    assert state.usage.used("team-a") == {RATIO: Quantity.parse("5000")}
    # The quota the two early pods name: they count in it now; every pod is charged again (a fresh count).
    state.apply_event("ElasticQuota", "ADDED", {"kind": "ElasticQuota", "metadata": {"name": "team-b",
                      "namespace": "team"}, "spec": {"max": {RATIO: "1000"}}})
    assert recharged() == before + 502
    assert state.usage.used("team-b") == {RATIO: Quantity.parse("200")}
    # team-a moves under a new parent: its 500 pods now count there too.
    state.apply_event("ElasticQuota", "ADDED", {"kind": "ElasticQuota", "metadata": {"name": "org",
                      "namespace": "team", "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
                      "spec": {"max": {RATIO: "10000"}}})
    state.apply_event("ElasticQuota", "MODIFIED", {**QUOTA, "metadata": {
        **QUOTA["metadata"], "labels": {"quota.scheduling.koordinator.sh/parent": "org"}}})
    assert recharged() == before + 2 * 502
    assert state.usage.used("org") == {RATIO: Quantity.parse("5000")}
    # And team-b goes: its pods count nowhere again, team-a's stay where they are.
    state.apply_event("ElasticQuota", "DELETED", {"kind": "ElasticQuota", "metadata": {"name": "team-b",
                      "namespace": "team"}, "spec": {"max": {RATIO: "1000"}}})
    assert recharged() == before + 3 * 502
    assert state.usage.used("team-b") == {}
    assert state.usage.used("team-a") == {RATIO: Quantity.parse("5000")}


def test_one_caller_cannot_hold_more_than_its_bound_of_unconfirmed_reservations() -> None:
    state = QuotaState(max_reservations_per_caller=2)
    state.load([QUOTA])

    def ask(name: str, caller: str) -> PodAdmission:
        return PodAdmission(uid="adm-" + name, operation="CREATE", namespace="team", name=name, pod_uid="uid-" + name,
                            labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                            canonical_requests={RATIO: "10"}, caller=caller)

    assert state.admit_pod(ask("f1", "10.0.0.9")).allowed
    assert state.admit_pod(ask("f2", "10.0.0.9")).allowed
    refused = state.admit_pod(ask("f3", "10.0.0.9"))
    assert not refused.allowed and status_of(refused.reason) == 429 and refused.reason == "TooManyReservations"
    assert refused.message == ("pod team/f3 not admitted: caller 10.0.0.9 already holds 2 quota reservations no "
                               "created pod has confirmed (limit 2); retry once they are confirmed or expire")
    # Another caller (the API server) is not affected, and the flood's room is not taken further.
    assert state.admit_pod(ask("real", "10.0.0.1")).allowed
    assert state.ledger.used("team-a") == {RATIO: Quantity.parse("30")}
    # Once a pod of the caller shows up in the watch, its reservation no longer counts against it.
    state.apply_event("Pod", "ADDED", {**pod_object("f1", "uid-f1", "10")})
    assert state.admit_pod(ask("f4", "10.0.0.9")).allowed


def test_a_retried_admission_is_allowed_and_holds_its_room_once(client: QuotaClient) -> None:
    # The client retries once when the connection breaks, which can be after the service reserved.
    assert client.admit_pod(admission("big", "600")).allowed
    assert client.admit_pod(admission("big", "600")).allowed  # 300 + 600 + 600 would exceed 1000
    denied = client.admit_pod(admission("next", "200"))
    assert denied.message == (f"exceeded quota: team/team-a, requested: {RATIO}=200, used: {RATIO}=900 "
                              f"(600 of it reserved by admissions not yet seen), limited: {RATIO}=1k")
    assert client.admit_pod(admission("next", "100")).allowed


def test_a_retry_at_the_callers_bound_replaces_its_reservation() -> None:
    state = QuotaState(max_reservations_per_caller=1)
    state.load([QUOTA])
    first = PodAdmission(uid="adm-p", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                         labels={"quota.scheduling.koordinator.sh/name": "team-a"},
                         canonical_requests={RATIO: "10"}, caller="10.0.0.1")
    assert state.admit_pod(first).allowed
    assert state.admit_pod(first).allowed
    assert len(state.ledger) == 1 and state.ledger.used("team-a") == {RATIO: Quantity.parse("10")}


def test_strict_accounting_judges_a_retry_against_the_stored_ledger_without_its_own_entry() -> None:
    state = QuotaState()
    state.load([QUOTA, RUNNING])
    retried = PodAdmission(uid="adm-p", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                           labels={"quota.scheduling.koordinator.sh/name": "team-a"}, canonical_requests={RATIO: "600"})
    [(verdict, reservation)] = judge_batch(state, [retried], {}, now=1000.0)
    assert verdict.allowed and reservation is not None
    # The first delivery's write landed; the second delivery sees it in the shared ledger.
    stored = {reservation.pod_key: shared_ledger.StoredReservation(reservation, "replica-1", 1000.0)}
    [(verdict, again)] = judge_batch(state, [retried], stored, now=1001.0)
    assert verdict.allowed and again is not None and again.requests == {RATIO: Quantity.parse("600")}
    other = PodAdmission(uid="adm-q", operation="CREATE", namespace="team", name="q", pod_uid="uid-q",
                         labels={"quota.scheduling.koordinator.sh/name": "team-a"}, canonical_requests={RATIO: "200"})
    [(denied, _)] = judge_batch(state, [other], stored, now=1001.0)
    assert not denied.allowed and "used: koordinator.sh/gpu-memory-ratio=900" in denied.message


def frame(message: object) -> bytes:
    body = orjson.dumps(message)
    return struct.pack(">I", len(body)) + body


def test_a_frame_split_across_sends_is_read_whole() -> None:
    left, right = socket.socketpair()
    with left, right:
        reader = FrameReader(right)
        data = frame({"op": "ready"}) + frame(None)
        left.sendall(data[:3])
        assert reader.read_available() == []  # not even the header yet
        left.sendall(data[3:10])
        assert reader.read_available() == []
        left.sendall(data[10:])
        # Both frames came in one recv; JSON null is a message like any other.
        assert reader.read_available() == [{"op": "ready"}, None]
        left.sendall(data[:7])
        threading.Timer(0.05, left.sendall, args=(data[7:],)).start()
        assert reader.read() == {"op": "ready"}  # waits for the rest of its frame
        assert reader.read() is None  # the second frame, already received
        left.sendall(data[:5])
        left.close()
        with pytest.raises(ConnectionError, match="inside a frame"):
            reader.read()


def test_frames_sent_together_are_answered_in_order(tmp_path: Path, client: QuotaClient) -> None:
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(client.path))
        raw.sendall(frame({"op": "ready"}) + frame({"op": "admit_pod", "admission": admission("big", "800")}))
        reader = FrameReader(raw)
        assert reader.read() == {"ready": True, "reason": "quota state synced"}
        reply = reader.read()
        assert reply["allowed"] is False and reply["reason"] == "QuotaExceeded"


def test_a_connection_that_breaks_the_protocol_is_dropped_and_the_others_served(client: QuotaClient) -> None:
    assert client.ready()[0]  # this worker thread's connection, opened before the bad ones
    bad_messages = [
        b"\x00\x00\x00\x02{x",  # not JSON
        frame({"op": "admit_pod", "admission": {"uid": "u"}}),  # missing fields
        # Wrong types inside: the decision itself fails (AttributeError, not a wire error).
        frame({"op": "admit_pod", "admission": {**orjson.loads(orjson.dumps(admission("p", "1"))), "labels": None}}),
        struct.pack(">I", 5 * 1024 * 1024),  # a frame larger than any message
    ]
    for message in bad_messages:
        with socket.socket(socket.AF_UNIX) as raw:
            raw.settimeout(5)
            raw.connect(str(client.path))
            raw.sendall(message)
            assert raw.recv(100) == b""  # dropped, not answered and not left hanging
    assert client.ready() == (True, "quota state synced")
    assert client.admit_pod(admission("after", "100")).allowed


def test_a_service_that_does_not_answer_is_refused_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)  # accepted by the kernel, never read
        client = QuotaClient(path, timeout=0.2)
        verdict = client.admit_pod(admission("p", "1"))
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "QuotaServiceDown")
    assert verdict.message == "quota service unavailable, pod not admitted: no answer within 0.2s"


def test_a_slow_reply_for_a_client_that_left_never_reaches_another(tmp_path: Path) -> None:
    # Strict accounting answers admissions from a pool; a client that timed out and reconnected
    # must get its own answers only, never the late one for its old connection.
    release = threading.Event()

    def slow(message: dict[str, str]) -> dict[str, str]:
        release.wait(10)
        return {"slow": message["n"]}

    path = tmp_path / "loop.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    loop = ServiceLoop(listener, lambda message: {"fast": message["n"]}, slow,
                       slow=lambda message: message["op"] == "slow")
    runner = threading.Thread(target=loop.run, daemon=True)
    runner.start()

    def connect() -> tuple[socket.socket, FrameReader]:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(5)
        sock.connect(str(path))
        return sock, FrameReader(sock)

    try:
        gone, _ = connect()
        gone.sendall(frame({"op": "slow", "n": "1"}))
        waiting, waiting_reader = connect()
        waiting.sendall(frame({"op": "slow", "n": "2"}))
        gone.close()
        again, reader = connect()
        again.sendall(frame({"op": "fast", "n": "3"}))
        assert reader.read() == {"fast": "3"}
        release.set()
        assert waiting_reader.read() == {"slow": "2"}  # a client that stayed gets its late answer
        again.sendall(frame({"op": "fast", "n": "4"}))
        assert reader.read() == {"fast": "4"}
        again.setblocking(False)
        with pytest.raises(BlockingIOError):  # and nothing else is waiting on that connection
            again.recv(100)
        again.close()
        waiting.close()
    finally:
        release.set()
        listener.close()
        runner.join(5)
    assert not runner.is_alive()  # closing the listener stops the loop


# AnswerTooLate: the service could not decide it in time; EscrowNotBackInTime: its room was lent to
# another replica's escrow that was due back but not back in time. Neither refuses for the quota.
@pytest.mark.parametrize("reason", ["AnswerTooLate", "EscrowNotBackInTime"])
def test_an_admission_the_service_could_not_decide_in_time_is_asked_once_more_with_a_new_deadline(
        tmp_path: Path, reason: str) -> None:
    path = tmp_path / "late.sock"
    received: list[dict[str, object]] = []
    too_late = {"allowed": False, "message": "pod team/p not admitted: too late", "reason": reason}

    def service(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            reader = FrameReader(conn)
            for reply in (too_late, {"allowed": True}, too_late, too_late):
                message = reader.read()
                if message is None:
                    return
                received.append(message)
                send_frame(conn, reply)

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(8)
        thread = threading.Thread(target=service, args=(listener,), daemon=True)
        thread.start()
        client = QuotaClient(path)
        assert client.admit_pod(admission("p", "1")).allowed  # the second attempt's answer
        verdict = client.admit_pod(admission("q", "1"))  # too late twice: the second refusal stands
        thread.join(timeout=10)
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, reason)
    first, second = (float(message["answer_by"]) for message in received[:2])  # type: ignore[arg-type]
    assert first < second  # each attempt has a deadline of its own
    assert len(received) == 4  # two attempts each, never a third
