"""Gangs under strict accounting: the gang's reservation lives in the shared ledger, so across
replicas exactly one of two racing gangs is admitted, and none in part (fake ConfigMap API)."""

from __future__ import annotations

import math
import random
import threading

import pytest
from fakeledger import LEDGER, QUOTA_LABEL, RATIO, TTL, FakeCore, Replica, slow_writes

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.admission.status import status_of
from webhook.quota.strict.accounting import Mode
from webhook.quota.strict.withdrawals import Withdrawal, withdraw

GANG = "gang.scheduling.koordinator.sh/"


def member(replica: Replica, gang: str, index: int, minimum: int = 8, mode: Mode = Mode.WRITER,
           answer_by: float = math.inf) -> bool:
    return replica.accounting.admit_pod(PodAdmission(
        uid=f"adm-{gang}-{index}", operation="CREATE", namespace="team", name=f"{gang}-{index}",
        pod_uid=f"uid-{gang}-{index}", labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: "100"},
        gang_annotations={GANG + "name": gang, GANG + "min-available": str(minimum)}), answer_by, mode).allowed


@pytest.mark.parametrize("mode", [Mode.WRITER, Mode.DEGRADED], ids=["writer", "degraded"])
@pytest.mark.parametrize("seed", range(3))
def test_two_gangs_racing_across_three_replicas_admit_exactly_one_whole(core: FakeCore, clock: list[float],
                                                                        seed: int, mode: Mode) -> None:
    # Escrow on: gang members never go through it, so it must not change the outcome. Three deciders
    # at once (each a writer, as during a hand-over, or each degraded): only the ledger's
    # preconditions keep them apart.
    replicas = [Replica(core, f"r{n}", clock, room=1000, escrow=32) for n in range(3)]
    order = [(gang, index) for index in range(8) for gang in ("gang-a", "gang-b")]
    rng = random.Random(seed)
    results: dict[str, list[bool]] = {"gang-a": [], "gang-b": []}
    lock = threading.Lock()

    def create(gang: str, index: int) -> None:
        allowed = member(rng.choice(replicas), gang, index, mode=mode)
        with lock:
            results[gang].append(allowed)

    threads = [threading.Thread(target=create, args=pair) for pair in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = sorted((sum(verdicts) for verdicts in results.values()), reverse=True)
    assert admitted == [8, 0]
    winner = "gang-a" if sum(results["gang-a"]) == 8 else "gang-b"
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    gangs = [item.gang for item in stored.values() if item.gang is not None]
    assert [gang.gang for gang in gangs if gang is not None] == [f"team/{winner}"]
    # What is left is two cards' room for anything, on any replica.
    assert replicas[0].admit("plain-0", "200").allowed
    assert not replicas[1].admit("plain-1").allowed


def test_a_gang_reservation_is_stored_with_its_opening_member_and_read_back_by_another_replica(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock, room=1000), Replica(core, "r2", clock, room=1000)
    assert member(first, "gang-a", 0)
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    entry = stored["~gang/team/gang-a"]
    assert entry.gang is not None and entry.gang.min_members == 8 and entry.reservation.requests == {
        RATIO: entry.reservation.requests[RATIO].parse("800")}
    assert stored["team/gang-a-0"].reservation.gang == "team/gang-a"
    # The other replica counts the seven cards still held for gang-a: two plain cards fit, not three.
    assert second.admit("plain-0", "200").allowed
    assert not second.admit("plain-1").allowed
    assert all(member(second, "gang-a", index) for index in range(1, 8))


def test_a_late_opening_members_withdrawal_takes_its_gang_reservation_with_it(core: FakeCore,
                                                                                clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, room=1000, monotonic=monotonic)
    assert replica.admit("plain-0").allowed
    slow_writes(core, monotonic, 3.0)
    # The opening member's write returns after its worker's deadline: refused, so nothing it wrote
    # may hold room, its gang's reservation included.
    assert not member(replica, "gang-a", 0, answer_by=monotonic[0] + 1.75)
    assert {"team/gang-a-0", "~gang/team/gang-a"} <= set(shared_ledger.decode(core.config_maps[LEDGER]["data"]))
    replica.settle()
    assert set(shared_ledger.decode(core.config_maps[LEDGER]["data"])) == {"team/plain-0"}


def test_a_gang_reservation_another_member_draws_from_stays_when_its_opener_is_withdrawn(
        core: FakeCore, clock: list[float]) -> None:
    monotonic = [500.0]
    replica = Replica(core, "r1", clock, room=1000, monotonic=monotonic)
    assert member(replica, "gang-a", 1)  # answered: its "allowed" rests on the gang's reservation
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    keep = dict(stored)
    opener = keep["team/gang-a-1"].reservation
    withdraw(keep, [Withdrawal("team/gang-a-1", opener.admission_uid)])
    assert "~gang/team/gang-a" not in keep  # no other member drew from it
    assert member(replica, "gang-a", 2)
    keep = dict(shared_ledger.decode(core.config_maps[LEDGER]["data"]))
    withdraw(keep, [Withdrawal("team/gang-a-1", opener.admission_uid)])
    assert "~gang/team/gang-a" in keep and "team/gang-a-2" in keep


def test_a_deleted_ledger_holding_a_gang_reservation_holds_its_tree_only_as_long_as_its_pods_reservations(
        core: FakeCore, clock: list[float]) -> None:
    replica, first_look_after = Replica(core, "r1", clock, room=1000), Replica(core, "r2", clock, room=1000)
    assert member(replica, "gang-a", 0)  # the gang's reservation lasts its waiting time: ten minutes
    core.delete(LEDGER)
    assert not first_look_after.admit("p1").allowed  # held: what the object held may still take room
    # Not for the gang's ten minutes: once the pods' reservations have expired, the tree admits again.
    clock[0] += TTL + 1
    assert first_look_after.admit("p2").allowed
    # The gang's reservation is carried into the new object, whichever replica let the old one go:
    # its other seven members still find their room, and no plain pod takes it meanwhile.
    assert "deletionTimestamp" not in core.config_maps[LEDGER]["metadata"]
    assert {"~gang/team/gang-a", "team/p2"} <= core.stored()
    refused = first_look_after.admit("p3", "200")  # 800 held for the gang and p2's 100 leave 100
    assert not refused.allowed and status_of(refused.reason) == 403, refused.message
    assert all(member(first_look_after, "gang-a", index) for index in range(1, 8))
    # gang-a-0's own reservation expired unconfirmed (no watch here): the gang still holds its card.
    assert first_look_after.admit("p4").allowed and not first_look_after.admit("p5").allowed
