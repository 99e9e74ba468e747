"""The registry of ledgers (webhook/quota/strict/registry.py): a tree is listed before its ledger
holds a reservation."""

from __future__ import annotations

import json

from fakeledger import FIRST_LEDGER_OF_A_TREE, LEDGER, TREE, FakeCore, Replica

from gpuquota_core import shared_ledger


def test_a_new_tree_is_listed_before_its_ledger_holds_a_reservation(core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    # Missing and unlisted: a new tree. Created with nothing in it, listed, then written: a ledger
    # never holds a reservation that a replica finding it missing could take for a new tree's.
    assert core.calls == FIRST_LEDGER_OF_A_TREE
    assert core.stored() == {"team/p1"}
    # An existing ledger read by a replica that has not listed it (one made before the registry
    # existed, or whose maker stopped in between) is listed by that replica's first read.
    core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"] = shared_ledger.encode_registry([])
    assert Replica(core, "r2", clock).admit("p2").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}


def test_a_new_tree_made_by_another_replica_between_a_missing_read_and_the_registry_read_is_not_held(
        core: FakeCore, clock: list[float]) -> None:
    first, second = Replica(core, "r1", clock), Replica(core, "r2", clock)
    # The second replica finds no ledger; before it asks the registry, the first makes the ledger and
    # lists the tree (the first admissions of a new tree, on several replicas at once). Listed does
    # not mean lost here: the ledger is there when read again, and nothing is held.
    core.before_registry_read = lambda: first.admit("p1")
    assert second.admit("p2").allowed
    assert core.stored() == {"team/p1", "team/p2"}
    assert second.store.record(TREE).held_until == 0.0


def test_a_registry_that_cannot_be_read_is_rebuilt_from_the_ledgers_that_exist(core: FakeCore,
                                                                               clock: list[float]) -> None:
    assert Replica(core, "r1", clock).admit("p1").allowed
    core.overwrite(shared_ledger.REGISTRY_OBJECT_NAME, {shared_ledger.REGISTRY_DATA_KEY: "{not json"})
    assert Replica(core, "r2", clock).admit("p2").allowed
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {TREE}


def test_unlisting_a_tree_from_a_registry_that_cannot_be_read_keeps_the_other_ledgers_listed(
        core: FakeCore, clock: list[float]) -> None:
    replica = Replica(core, "r1", clock)
    assert replica.admit("p1").allowed
    other = json.loads(json.dumps(core.config_maps[LEDGER]))
    other["metadata"].update(name=shared_ledger.ledger_object_name("other"),
                             labels={**other["metadata"]["labels"], shared_ledger.TREE_LABEL: "other"})
    core.config_maps[other["metadata"]["name"]] = other
    core.overwrite(shared_ledger.REGISTRY_OBJECT_NAME, {shared_ledger.REGISTRY_DATA_KEY: "{not json"})
    # Rebuilt from the ledgers that exist, as a listing rebuilds it, then the tree let go is unlisted.
    replica.store.registry.remove(TREE)
    assert shared_ledger.decode_registry(core.config_maps[shared_ledger.REGISTRY_OBJECT_NAME]["data"]) == {"other"}
