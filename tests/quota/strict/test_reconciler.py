"""The reconciler (webhook/quota/strict/reconciler.py): room comes back without an admission writing the tree."""

from __future__ import annotations

from fakeledger import LEDGER, TTL, FakeCore, Replica

from webhook.admission.status import status_of


def test_the_reconciler_recreates_a_deleted_ledger_that_no_admission_writes(core: FakeCore,
                                                                             clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    assert first.admit("p1").allowed and first.admit("p2").allowed
    del core.config_maps[LEDGER]
    # No object lists any more: only what the replica wrote to tells it the tree exists.
    assert first.reconcile() == 0
    assert core.stored() == {"team/p1", "team/p2"}
    assert status_of(second.admit("p3").reason) == 503  # the hold is in the object, for replicas that never saw it
    # Once the reservations expire, the reconciler empties the object and the room is back.
    clock[0] += TTL + 1
    assert first.reconcile() == 2 and core.stored() == set()
    assert second.admit("p5", "300").allowed


def test_a_replica_that_never_wrote_a_tree_does_not_create_an_empty_ledger(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.reconcile() == 0 and core.config_maps == {}


def test_a_create_that_missed_its_deadline_and_left_no_pod_releases_its_room(core: FakeCore,
                                                                           clock: list[float]) -> None:
    replica = Replica(core, "r1", clock, create_deadline=10.0)
    for pod in ("landed", "lost", "replaced"):
        assert replica.admit(pod).allowed
    core.pods["team/landed"] = "uid-landed"  # stored, but this replica's watch has not shown it yet
    core.pods["team/replaced"] = "uid-other"  # another pod of that name: not the admitted one
    # Before the deadline a create may still land: nothing is released, whatever the API shows.
    clock[0] += 9.0
    assert replica.reconcile() == 0
    assert core.stored() == {"team/landed", "team/lost", "team/replaced"}
    clock[0] += 2.0
    assert replica.reconcile() == 2
    assert core.stored() == {"team/landed"}
    assert replica.admit("again", "200").allowed  # 100 landed + 200 = 300, well before the TTL
