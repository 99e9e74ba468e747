"""Escrow (webhook/quota/strict/escrow.py): room the writer takes ahead for pods of one shape, and room lent to it."""

from __future__ import annotations

import random
from typing import Any

import pytest
from fakeledger import FIRST_LEDGER_OF_A_TREE, LEDGER, QUOTA_LABEL, RATIO, TREE, TTL, FakeCore, Replica, escrow_entries
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.admission.status import status_of
from webhook.quota.strict.accounting import Mode
from webhook.quota.strict.escrow import ESCROW_WINDOW_SECONDS as WINDOW


def test_pods_of_one_shape_are_admitted_from_escrow_without_a_write_of_their_own(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)  # room for 100 one-card pods
    assert replica.admit("p1").allowed
    # The write that admitted p1 also took a quarter of what was left for its shape: 99 // 4.
    [(key, entry)] = escrow_entries(core).items()
    assert entry.replica == "r1" and entry.reservation.quotas == ("team-a", TREE)
    assert entry.reservation.requests == {RATIO: shared_ledger.Quantity.of(2400)}
    assert entry.reservation.expires_at == clock[0] + WINDOW + TTL  # the window, then a reservation's TTL
    assert core.calls == FIRST_LEDGER_OF_A_TREE
    for n in range(2, 26):
        assert replica.admit(f"p{n}").allowed
    assert core.calls == FIRST_LEDGER_OF_A_TREE  # 24 pods, no write
    # The 26th is written with the 24 it admitted from escrow; the spent escrow is gone, and a new
    # one takes a quarter of what is left: 100 - 26 = 74 -> 18.
    assert replica.admit("p26").allowed
    assert core.calls[-1] == "replace"
    assert {key for key in core.stored() if not shared_ledger.is_escrow(key)} == {f"team/p{n}" for n in range(1, 27)}
    [(new_key, new_entry)] = escrow_entries(core).items()
    assert new_key != key and new_entry.reservation.requests == {RATIO: shared_ledger.Quantity.of(1800)}


def test_escrow_stops_near_the_limit_and_every_pod_is_then_written(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=300, escrow=32)  # room for 3: never a quarter of one
    for pod in ("p1", "p2", "p3"):
        assert replica.admit(pod).allowed
    assert not escrow_entries(core) and core.stored() == {"team/p1", "team/p2", "team/p3"}
    refused = replica.admit("p4")
    assert not refused.allowed and refused.reason == "QuotaExceeded"


def test_a_lowered_limit_is_not_admitted_past_from_escrow(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and escrow_entries(core)
    replica.state.apply_event("ElasticQuota", "MODIFIED", {
        "kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team"}, "spec": {"max": {RATIO: "150"}}})
    refused = replica.admit("p2")
    assert not refused.allowed and refused.reason == "QuotaExceeded"
    assert not escrow_entries(core)  # the write that judged p2 gave the escrow back


def test_the_settler_writes_what_an_escrow_admitted_and_gives_back_the_rest(core: FakeCore,
                                                                            clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    for pod in ("p1", "p2", "p3"):
        assert replica.admit(pod).allowed
    replica.settle()
    assert escrow_entries(core)  # still inside its window: kept
    clock[0] += WINDOW
    replica.settle()
    assert core.stored() == {"team/p1", "team/p2", "team/p3"}
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    # p2 and p3 hold room for one TTL from their own admission, as a pod written on its own would.
    assert stored["team/p2"].reservation.expires_at == clock[0] - WINDOW + TTL


def test_a_deleted_ledger_keeps_holding_what_an_open_escrow_admitted(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and replica.admit("p2").allowed
    [key] = escrow_entries(core)
    del core.config_maps[LEDGER]
    core.calls.clear()
    # Inside its window the escrow admits without a write, so the deletion is not seen yet: every
    # other replica that saw the object holds the tree for an escrow's window plus the TTL from
    # when it notices, which covers what this escrow admits (docs/design.md, "Known limits").
    assert replica.admit("p3").allowed and core.calls == []
    clock[0] += WINDOW
    assert status_of(replica.admit("p4").reason) == 503
    # The recreated object holds p1 and the escrow p2 and p3 were admitted from, until they expire,
    # and the tree is held for the longest any lost entry could live.
    assert core.stored() == {"team/p1", key}
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + WINDOW + TTL
    # After the hold the next write records p2 and p3 in place of the escrow (p1 has expired too).
    clock[0] += WINDOW + TTL
    assert replica.admit("p5").allowed
    assert "team/p5" in core.stored() and key not in core.stored()


@pytest.mark.parametrize("seed", range(6))
def test_replicas_with_escrow_never_admit_past_the_room_and_lose_none_of_it(
        core: FakeCore, clock: list[float], seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A refused pod waits for other replicas' escrow only within the retry budget; here the other
    # replicas run in this thread between admissions, so a short budget keeps the test quick.
    monkeypatch.setattr("webhook.quota.strict.committer.RETRY_BUDGET_SECONDS", 0.1)
    pods_of_room = 40
    replicas = [Replica(core, f"r{n}", clock, room=100 * pods_of_room, escrow=32, leaf_room=100_000)
                for n in range(3)]
    rng = random.Random(seed)
    admitted = 0
    for n in range(3 * pods_of_room):
        clock[0] += rng.choice([0.0, 0.0, 0.1, 0.4])
        replica = rng.choice(replicas)
        if rng.random() < 0.2:
            replica.settle()
        admitted += replica.admit(f"p{n}").allowed
        assert admitted <= pods_of_room
    # Once every window has passed and each replica has settled, the ledger holds exactly the pods
    # admitted: the room that is left is all there for a replica that never took escrow.
    clock[0] += WINDOW
    for replica in replicas:
        replica.settle()
    assert not escrow_entries(core) and len(core.stored()) == admitted
    latecomer = Replica(core, "late", clock, room=100 * pods_of_room, leaf_room=100_000)
    left = pods_of_room - admitted
    assert all(latecomer.admit(f"late{n}").allowed for n in range(left))
    assert not latecomer.admit("one-too-many").allowed


def test_pods_of_two_leaves_each_keep_their_escrow_when_they_alternate(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    replica.state.apply_event("ElasticQuota", "ADDED", {
        "kind": "ElasticQuota", "metadata": {"name": "team-b", "namespace": "team",
                                             "labels": {"quota.scheduling.koordinator.sh/parent": TREE}},
        "spec": {"max": {RATIO: "10000"}}})

    def admit(pod: str, leaf: str) -> bool:
        return replica.accounting.admit_pod(PodAdmission(
            uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
            labels={QUOTA_LABEL: leaf}, canonical_requests={RATIO: "100"}), mode=Mode.WRITER).allowed

    assert admit("a1", "team-a") and admit("b1", "team-b")
    assert len(escrow_entries(core)) == 2  # one per leaf; b1's write left a1's escrow open
    writes = len(core.calls)
    for n in range(2, 8):
        assert admit(f"a{n}", "team-a") and admit(f"b{n}", "team-b")
    assert len(core.calls) == writes  # twelve pods, alternating leaves, no write


def test_room_this_replica_holds_in_escrow_for_another_shape_is_given_back_before_a_refusal(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards

    def admit(pod: str, cards: int) -> bool:
        return replica.admit(pod, str(100 * cards)).allowed

    assert admit("one-1", 1)  # and escrow for 2 more one-card pods: (10 - 1) // 4
    assert admit("two-1", 2) and admit("two-2", 2) and admit("two-3", 2)  # 9 cards taken or held
    [held] = escrow_entries(core).values()
    assert held.reservation.requests == {RATIO: shared_ledger.Quantity.of(200)}
    # 2 of those 9 cards are this replica's unused one-card escrow: the next two-card pod gets them
    # back rather than a refusal, and the escrow is gone.
    assert admit("two-4", 2)
    assert not escrow_entries(core)
    assert core.stored() == {"team/one-1", "team/two-1", "team/two-2", "team/two-3", "team/two-4"}
    assert not admit("two-5", 2)  # 9 cards admitted: now the room is really gone


def test_room_lent_to_another_writers_escrow_is_a_retryable_503_at_once_and_admitted_once_given_back(
        core: FakeCore, clock: list[float]) -> None:
    # r1 was the writer and holds escrow; r2 decides here (the writer could not be asked). Nobody
    # waits for lent escrow: r2 answers at once with a retryable 503 naming the lender, not "exceeded
    # quota" (the room exists), and the worker's second attempt finds it given back.
    first = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    second = Replica(core, "r2", clock, room=1000, escrow=32, leaf_room=10_000)
    assert first.admit("small").allowed  # and escrow for 2 more one-card pods: (10 - 1) // 4
    reads_before = core.calls.count("read")
    # 8 cards: 7 are free while r1's escrow holds 2, 9 once it gives them back.
    verdict = second.admit("big", "800", mode=Mode.DEGRADED)
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "EscrowNotBackInTime")
    assert "held in escrow by webhook replica r1" in verdict.message and "exceeded quota" not in verdict.message
    assert core.calls.count("read") - reads_before == 1  # one fresh look, no waiting
    assert "team/big" not in core.stored()
    clock[0] += WINDOW
    first.settle()  # r1's window is over: it writes "small" and gives the rest back
    assert second.admit("big", "800", mode=Mode.DEGRADED).allowed
    assert core.stored() == {"team/small", "team/big"}


def test_a_pod_that_does_not_fit_even_without_another_replicas_escrow_is_refused_at_once(
        core: FakeCore, clock: list[float]) -> None:
    first = Replica(core, "r1", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    second = Replica(core, "r2", clock, room=1000, escrow=32, leaf_room=10_000)
    assert first.admit("small").allowed  # and escrow for 2 more one-card pods: (10 - 1) // 4
    reads_before = core.calls.count("read")
    # 10 cards: more than the 9 free with r1's escrow given back, so waiting for it is pointless.
    verdict = second.admit("huge", "1000")
    assert (verdict.allowed, status_of(verdict.reason)) == (False, 403)
    assert f"used: {RATIO}=300 (300 of it reserved by admissions not yet seen)" in verdict.message
    assert core.calls.count("read") - reads_before <= 1


def test_an_escrow_spent_while_a_commit_retries_is_given_back_in_that_commit(core: FakeCore,
                                                                             clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("a1").allowed and replica.admit("a2").allowed  # a2 from a1's escrow, no write
    assert "team/a2" not in core.stored()
    write = core.replace_namespaced_config_map

    def conflict_once(*args: Any, **kwargs: Any) -> Any:
        core.replace_namespaced_config_map = write  # type: ignore[method-assign]
        clock[0] += WINDOW  # the escrow's window ends while this write fails
        raise ApiException(status=409, reason="Conflict")

    core.replace_namespaced_config_map = conflict_once  # type: ignore[method-assign]
    assert replica.admit("b1", "200").allowed  # another shape: its commit conflicts once, then writes
    # The retry closed the escrow spent meanwhile and wrote what it admitted: other replicas waiting
    # for that room do not wait for the settler's next round after this commit.
    assert {"team/a1", "team/a2", "team/b1"} <= core.stored()
    assert "~escrow/r1/1" not in escrow_entries(core)  # a1's, given back


def test_a_quota_event_that_changes_nothing_decisions_read_keeps_the_escrow(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, room=10_000, escrow=32, leaf_room=10_000)
    assert replica.admit("p1").allowed and escrow_entries(core)
    writes = len(core.calls)
    # Koordinator rewrites a quota's status and annotations often: a new resourceVersion, same limits.
    replica.state.apply_event("ElasticQuota", "MODIFIED", {
        "kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team", "resourceVersion": "7"},
        "spec": {"max": {RATIO: "10000"}}, "status": {"used": {RATIO: "100"}}})
    assert replica.admit("p2").allowed and len(core.calls) == writes  # from the escrow, no write


def test_nobody_waits_for_the_escrow_of_a_replica_that_stopped_giving_it_back(core: FakeCore,
                                                                           clock: list[float]) -> None:
    dead = Replica(core, "host/101", clock, room=1000, escrow=32, leaf_room=10_000)  # room for 10 cards
    restarted = Replica(core, "host/202", clock, room=1000, escrow=32, leaf_room=10_000)
    assert dead.admit("small").allowed  # and escrow for 2 more, in the object; then its process is killed
    # Past the escrow's window and the time its replica takes to give it back: whoever needs that
    # room is answered now instead of asking again until its worker gives up, and not with
    # "exceeded quota", since the room exists: a retryable 503 naming the lender and when it comes back.
    clock[0] += WINDOW + 2.0
    reads_before = core.calls.count("read")
    verdict = restarted.admit("big", "800")  # 7 cards are free while the escrow holds 2
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "EscrowNotBackInTime")
    assert "held in escrow by webhook replica host/101" in verdict.message
    # The escrow lives its window plus a TTL from its write; 2.5 s of that are gone.
    assert f"if that replica has stopped, the room comes back when the escrow expires, in " \
        f"{TTL + WINDOW - (WINDOW + 2.0):.0f}s at most" in verdict.message
    assert core.calls.count("read") - reads_before <= 1
    # A pod that would not fit even without that escrow is refused for the quota, as ever.
    refused = restarted.admit("huge", "1000")
    assert (refused.allowed, status_of(refused.reason)) == (False, 403)
    assert f"used: {RATIO}=300 (300 of it reserved by admissions not yet seen)" in refused.message
    # The escrow's room comes back when it expires, as the room of any admission not yet seen does.
    clock[0] += TTL
    assert restarted.admit("big", "800").allowed
