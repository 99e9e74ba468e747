"""One tree's record at a replica (webhook/quota/strict/tree_ledger.py): its phases and what moves it."""

from __future__ import annotations

from fakeledger import LEDGER, TTL, FakeCore, Replica

from webhook.quota.strict.tree_ledger import Phase, TreeLedger


def test_a_record_goes_from_missing_to_live_and_to_held_when_its_object_is_lost() -> None:
    record = TreeLedger()
    assert record.phase(now=0.0) is Phase.MISSING
    record.written("uid-1", "7", {}, counted_through=0)
    assert record.phase(now=0.0) is Phase.LIVE and record.copy == ("7", {})
    assert record.lost(now=10.0, hold_until=10.0 + TTL) == 0  # it held nothing to carry
    assert record.phase(now=10.0) is Phase.HELD and record.hold_cause == "was deleted"
    assert record.copy is None and record.phase(now=10.0 + TTL) is Phase.MISSING


def test_a_record_found_missing_while_listed_is_held_once() -> None:
    record = TreeLedger()
    assert record.lost_while_listed(now=5.0, hold_seconds=TTL)
    assert not record.lost_while_listed(now=6.0, hold_seconds=TTL)  # the first hold stands
    assert record.held_until == 5.0 + TTL and record.phase(now=6.0) is Phase.HELD
    assert record.phase(now=5.0 + TTL) is Phase.LISTED


def test_an_unreadable_object_is_rebuilding_until_this_replica_writes_it_over(core: FakeCore,
                                                                              clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    assert replica.store.record("org").phase(clock[0]) is Phase.LIVE
    core.overwrite(LEDGER, {"reservations.json": "{not json"})
    assert not replica.admit("p2").allowed
    # Written over at once (with the hold in it), so the record is held, no longer rebuilding.
    assert replica.store.record("org").phase(clock[0]) is Phase.HELD
    clock[0] += TTL
    assert replica.store.record("org").phase(clock[0]) is Phase.LIVE
