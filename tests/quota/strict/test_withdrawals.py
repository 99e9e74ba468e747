"""Withdrawals (webhook/quota/strict/withdrawals.py): the room of admissions whose 'allowed' never left."""

from __future__ import annotations

import dataclasses
from typing import Any

from fakeledger import LEDGER, QUOTA_LABEL, RATIO, FakeCore, Replica, admission_of, slow_writes

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.admission.status import status_of


def test_an_admission_whose_write_ends_after_its_worker_gave_up_is_refused_and_its_room_withdrawn(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    assert replica.admit("answered").allowed  # 100 of the 300
    slow_writes(core, monotonic, 3.0)
    # Decided in time, but the write that records it returns after the worker's deadline: the
    # worker never receives "allowed", so the pod is never stored on its strength.
    verdict = replica.admit("late", "200", answer_by=monotonic[0] + 1.75)
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "AnswerTooLate")
    assert "decided it after the webhook worker stopped waiting" in verdict.message
    assert core.stored() == {"team/answered", "team/late"}  # written before the deadline passed
    replica.settle()  # the settler's next round (no admission needed)
    assert core.stored() == {"team/answered"}
    # The room is back at once, long before the reservation's TTL.
    assert replica.admit("fits", "200").allowed


def test_a_late_retry_never_withdraws_the_room_of_an_admission_already_answered(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, monotonic=monotonic)
    assert replica.admit("p1").allowed  # answered: the pod may be stored
    slow_writes(core, monotonic, 3.0)
    clock[0] += 1.0
    # The same admission delivered again (same uid), decided too late: refused, but the entry it
    # rewrote is also the answered one's, so it stays.
    assert replica.admit("p1", answer_by=monotonic[0] + 1.0).reason == "AnswerTooLate"
    replica.settle()
    assert core.stored() == {"team/p1"}
    assert not replica.admit("p2", "250").allowed


def test_what_any_replica_reserved_for_an_admission_its_worker_got_no_answer_for_is_withdrawn(
        core: FakeCore, clock: list[float]) -> None:
    # The writer reserved "lost" for a forwarder whose quota service then died before it passed the
    # "allowed" on: that worker answered QuotaServiceDown, and reports the admission to the
    # forwarder's next quota service. That one passes the report to the writer when it can; in the
    # degraded mode it writes the withdrawal itself, and the one rule takes the writer's entry out.
    writer, forwarder = Replica(core, "writer/1", clock), Replica(core, "forwarder/2", clock)
    assert writer.admit("answered").allowed and writer.admit("lost", "200").allowed
    assert not forwarder.admit("waiting", "100").allowed  # 300 of 300 held
    forwarder.accounting.withdraw_unanswered([admission_of("lost", "200"), admission_of("never-reserved")])
    forwarder.settle()
    assert core.stored() == {"team/answered"}
    # The room is back at once, not after the reservation's TTL.
    assert forwarder.admit("fits", "200").allowed


def test_the_writer_withdraws_what_a_forwarder_reports_and_its_cached_copy_shows_the_room_at_once(
        core: FakeCore, clock: list[float]) -> None:
    # The forwarder passes its workers' report to the writer (forwarding.SingleWriter), so the
    # withdrawal is the writer's own write: its cached copy is the ledger, and a refusal on it is right.
    writer = Replica(core, "writer/1", clock)
    assert writer.admit("answered").allowed and writer.admit("lost", "200").allowed
    assert not writer.admit("fits", "200").allowed  # 300 of 300 held
    assert writer.accounting.withdraw_unanswered([admission_of("lost", "200")])
    writer.settle()
    assert core.stored() == {"team/answered"}
    reads = core.calls.count("read")
    assert writer.admit("fits", "200").allowed
    assert core.calls.count("read") == reads  # decided on its own copy: nothing to read again


def test_a_withdrawal_of_a_refused_review_never_takes_the_entry_of_the_same_pods_next_review(
        core: FakeCore, clock: list[float]) -> None:
    # The review-uid assumption (webhook/quota/strict/withdrawals.py): review adm-1 of pod p was
    # reserved, but its worker got no answer and refused it 503. The client retried the create: a new
    # request, so a new review, adm-2, admitted and answered. The report of adm-1 arrives after it.
    replica = Replica(core, "writer/1", clock)
    refused = PodAdmission(uid="adm-1", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                           labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    retried = PodAdmission(uid="adm-2", operation="CREATE", namespace="team", name="p", pod_uid="uid-p",
                           labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    assert replica.accounting.admit_pod(refused).allowed  # written; the "allowed" never reached the apiserver
    assert replica.accounting.admit_pod(retried).allowed  # the retry's review: answered, the pod may be stored
    assert replica.accounting.withdraw_unanswered([refused])
    replica.settle()
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    assert set(stored) == {"team/p"} and stored["team/p"].reservation.admission_uid == "adm-2"
    assert not replica.admit("other", "250").allowed  # p's 100 still held: 100 + 250 > 300
    # Reported before the retry's review is judged, the withdrawal takes the refused review's entry,
    # and the retry's is written in the same write.
    q_refused = dataclasses.replace(retried, uid="adm-3", name="q", pod_uid="uid-q")
    q_retried = dataclasses.replace(q_refused, uid="adm-4")
    assert replica.accounting.admit_pod(q_refused).allowed
    assert replica.accounting.withdraw_unanswered([q_refused])
    assert replica.accounting.admit_pod(q_retried).allowed
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    assert stored["team/q"].reservation.admission_uid == "adm-4"


def test_an_unanswered_admission_never_withdraws_an_entry_another_admission_of_its_pod_wrote(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed  # review adm-p1, answered
    # Another review of the same pod name (a new uid) went unanswered: adm-p1's entry stays.
    other = PodAdmission(uid="adm-other", operation="CREATE", namespace="team", name="p1", pod_uid="",
                         labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"})
    replica.accounting.withdraw_unanswered([other])
    replica.settle()
    assert core.stored() == {"team/p1"}
    assert not replica.admit("p2", "250").allowed


def test_a_write_that_lands_but_whose_answer_is_lost_leaves_no_room_held_by_the_refused_pods(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)
    assert replica.admit("answered").allowed  # creates the object; escrow for 2 more
    replace = core.replace_namespaced_config_map

    def lands_then_breaks(*args: Any, **kwargs: Any) -> Any:
        replace(*args, **kwargs)  # stored in etcd, then the connection to this replica broke
        raise ConnectionResetError("connection reset by peer")

    core.replace_namespaced_config_map = lands_then_breaks  # type: ignore[method-assign]
    verdict = replica.admit("big", "300")  # not of the escrow's shape: a write of its own
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "LedgerUnavailable")
    assert "team/big" in core.stored()  # it landed, though the replica cannot know
    core.replace_namespaced_config_map = replace  # type: ignore[method-assign]
    replica.settle()
    assert "team/big" not in core.stored() and "team/answered" in core.stored()
    assert replica.admit("big", "300").allowed


def test_a_withdrawal_reported_while_a_commit_writes_is_not_dropped(core: FakeCore, clock: list[float]) -> None:
    # A worker's report of an unanswered admission reaches the service while a commit of the same
    # tree is writing: the commit took the withdrawals queued before it started, and must leave the
    # one reported meanwhile for the next write instead of clearing it with its own.
    replica = Replica(core, "r1", clock)
    assert replica.admit("lost", "200").allowed
    replace = core.replace_namespaced_config_map

    def reported_during_the_write(*args: Any, **kwargs: Any) -> Any:
        core.replace_namespaced_config_map = replace  # type: ignore[method-assign]
        assert replica.accounting.withdraw_unanswered([admission_of("lost", "200")])
        return replace(*args, **kwargs)

    core.replace_namespaced_config_map = reported_during_the_write  # type: ignore[method-assign]
    assert replica.admit("answered").allowed
    replica.settle()
    assert core.stored() == {"team/answered"}
    assert replica.admit("fits", "200").allowed
