"""The ledger store (webhook/quota/strict/store.py, tree_ledger.py): deleted, lost and unreadable
ledgers, and the holds they start."""

from __future__ import annotations

import pytest
from fakeledger import LEDGER, TREE, TTL, FakeCore, Replica, watch_shows

from gpuquota_core import shared_ledger
from webhook.admission.status import status_of
from webhook.quota.strict.escrow import ESCROW_WINDOW_SECONDS as WINDOW


def test_a_deleted_ledger_is_created_again_and_the_tree_held_until_what_it_held_expired(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed and replica.admit("p2").allowed
    del core.config_maps[LEDGER]
    core.calls.clear()
    # The cached version is stale now: the replace finds nothing, the fresh read finds nothing,
    # and a create (not a replace, which would 404 for ever) puts back p1 and p2. Other replicas
    # may have written reservations this one never read: until they have expired the tree is
    # held, and the admission is refused for the ledger, not admitted into room that may be taken.
    refused = replica.admit("p3")
    assert not refused.allowed and status_of(refused.reason) == 503 and refused.reason == "LedgerUnavailable"
    assert "the shared quota ledger of tree org was deleted" in refused.message
    # It knew the object, so it needs no registry to know a ledger was lost; the new one is listed.
    assert core.calls == ["replace", "read", "create", "registry read"]
    assert core.stored() == {"team/p1", "team/p2"}
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + TTL
    clock[0] += TTL
    assert replica.admit("p3").allowed and replica.admit("p4", "200").allowed
    assert core.stored() == {"team/p3", "team/p4"}
    assert shared_ledger.RECOVERING_UNTIL_KEY not in core.config_maps[LEDGER]["data"]


def test_a_ledger_removed_without_its_finalizer_holds_its_tree_for_a_replica_that_never_read_it(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}
    del core.config_maps[LEDGER]  # its finalizer taken off by hand: gone at once
    # The second replica never saw the old object, and p1 still holds room there. The registry
    # lists the tree, so the missing object is a lost ledger, not a new tree: held, not admitted from
    # an empty ledger; the new object records the hold for every replica.
    refused = second.admit("p2")
    assert not refused.allowed and refused.reason == "LedgerUnavailable" and status_of(refused.reason) == 503
    assert "the shared quota ledger of tree org was deleted" in refused.message
    assert shared_ledger.recovering_until(core.config_maps[LEDGER]["data"]) == clock[0] + TTL
    # The first replica's replace conflicts; its fresh read shows another object (another uid):
    # it carries p1 into it and holds the tree too.
    clock[0] += 1.0
    assert status_of(first.admit("p3").reason) == 503
    assert core.stored() == {"team/p1"}
    clock[0] += TTL
    assert second.admit("p4").allowed and first.admit("p5").allowed
    assert core.stored() == {"team/p4", "team/p5"}


def test_a_ledger_let_go_through_its_finalizer_is_unlisted_first_and_its_tree_is_new_again(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed
    core.delete(LEDGER)  # kept, terminating, by the finalizer
    assert status_of(first.admit("p2").reason) == 503
    clock[0] += TTL + 1
    assert first.reconcile() == 0 and LEDGER not in core.config_maps
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == set()
    # Nothing it held can take room any more: a replica that never saw it is not held.
    assert second.admit("p3").allowed


def test_the_hold_after_a_deletion_is_not_extended_while_the_object_stays_missing(core: FakeCore,
                                                                                   clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    clock[0] += TTL + 1  # p1 expired: nothing is worth recreating the object for
    del core.config_maps[LEDGER]
    start = clock[0]
    for _ in range(4):
        assert replica.reconcile() == 0 and LEDGER not in core.config_maps
        clock[0] += TTL / 4
    assert replica.store.record(TREE).held_until == start + TTL
    assert clock[0] >= start + TTL and replica.admit("p2", "300").allowed


def test_a_deleted_ledger_stays_readable_and_holds_its_tree_for_every_replica_until_what_it_held_expired(
        core: FakeCore, clock: list[float]) -> None:
    knew = Replica(core, "r1", clock, room=100 * 100, escrow=32, leaf_room=100 * 100)
    first_look_after = Replica(core, "r2", clock, room=100 * 100, escrow=32, leaf_room=100 * 100)
    assert knew.admit("p1").allowed  # takes escrow for more: room the object holds, not yet any pod
    assert core.config_maps[LEDGER]["metadata"]["finalizers"] == ["gpuquota.koord-gpuquota.io/ledger"]
    core.delete(LEDGER)
    assert LEDGER in core.config_maps  # kept by the finalizer, with everything it held
    # A replica whose first look at the tree comes after the deletion finds it, and holds.
    verdict = first_look_after.admit("p2")
    assert not verdict.allowed and status_of(verdict.reason) == 503 and "was deleted" in verdict.message
    # The one that knew it may still admit from its open escrow: that room is in the object.
    assert knew.admit("p3").allowed
    clock[0] += WINDOW + TTL + 1  # everything the deleted object held has expired
    assert first_look_after.admit("p4").allowed
    # The finalizer went, the apiserver removed the object, and a new one was created (no deletion).
    assert "deletionTimestamp" not in core.config_maps[LEDGER]["metadata"]
    assert "team/p4" in core.stored()
    # The one that knew the old object and never saw it terminating cannot tell the new one from a
    # recreation after a loss: it holds the tree as after a loss, then admits again.
    assert status_of(knew.admit("p5").reason) == 503
    clock[0] += WINDOW + TTL + 1
    assert knew.admit("p6").allowed


UNREADABLE = {
    "not JSON": {shared_ledger.LEDGER_DATA_KEY: "{not json"},
    "a list": {shared_ledger.LEDGER_DATA_KEY: "[]"},
    "entries of another version": {shared_ledger.LEDGER_DATA_KEY: '{"team/x": {"pod": "x", "version": 2}}'},
    "no reservations": {"something": "else"},
    "a bad podsCountedThrough": {shared_ledger.LEDGER_DATA_KEY: "{}", shared_ledger.PODS_COUNTED_THROUGH_KEY: "x"},
}


@pytest.mark.parametrize("garbage", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_unreadable_ledger_is_rebuilt_and_its_tree_held_until_what_it_may_have_held_expired(
        core: FakeCore, clock: list[float], garbage: dict[str, str]) -> None:
    knew = Replica(core, "r1", clock)
    never_saw = Replica(core, "r2", clock)
    assert knew.admit("p1").allowed
    core.pods.update({"team/landed": "uid-landed", "team/other": "uid-other"})
    core.pod_versions.update({"team/landed": "41", "team/other": "57"})
    core.overwrite(LEDGER, garbage)
    # Whoever reads it first rebuilds it: the reservations it may have held are unknown, so the tree
    # is held one TTL, and the rebuilt object says so to every replica.
    verdict = never_saw.admit("p2")
    assert (verdict.allowed, status_of(verdict.reason), verdict.reason) == (False, 503, "LedgerUnavailable")
    assert "the shared quota ledger of tree org could not be read and is being rebuilt" in verdict.message
    data = core.config_maps[LEDGER]["data"]
    assert shared_ledger.decode(data) == {}
    assert shared_ledger.recovering_until(data) == clock[0] + TTL
    # Readers decide on it only once their watch shows every pod that exists now.
    assert shared_ledger.pods_counted_through(data) == 57
    # The replica that knew the object holds the tree too, from the rebuilt object.
    clock[0] += 1.0
    verdict = knew.admit("p3")
    assert status_of(verdict.reason) == 503
    assert "was deleted or could not be read; reservations only it held" in verdict.message
    clock[0] += TTL
    for replica in (knew, never_saw):
        watch_shows(replica, "other", "57")
    # The room is back: 300, of which "other" takes 100 (p1 expired with the hold).
    assert never_saw.admit("p4", "200").allowed and not never_saw.admit("p5").allowed
    assert status_of(knew.admit("p6").reason) == 403


def test_an_unreadable_ledger_deleted_under_its_finalizer_goes_once_the_hold_is_over(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    core.overwrite(LEDGER, {shared_ledger.LEDGER_DATA_KEY: "{not json"})
    core.delete(LEDGER)  # kept, terminating, by the finalizer
    assert status_of(replica.admit("p2").reason) == 503
    assert "deletionTimestamp" in core.config_maps[LEDGER]["metadata"]
    clock[0] += TTL
    # The finalizer went, the apiserver removed the object, and a new ledger holds the new admission.
    assert replica.admit("p3", "300").allowed
    assert "deletionTimestamp" not in core.config_maps[LEDGER]["metadata"]
    assert core.stored() == {"team/p3"}
