"""The shared ledger's format and counting rules (strict accounting), pure."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation
from gpuquota_core.pod_records import PodRecord
from gpuquota_core.quota_decision import requests_of
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.usage_index import UsageIndex

RATIO = "koordinator.sh/gpu-memory-ratio"
TTL = 30.0


def tree() -> QuotaTree:
    def quota(name: str, parent: str = "") -> object:
        labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
        return quota_from_object({"metadata": {"name": name, "namespace": "team", "labels": labels},
                                  "spec": {"max": {RATIO: "400"}}})
    return QuotaTree.build([quota("org"), quota("team-a", "org"), quota("team-b", "org")])  # type: ignore[misc]


def stored(pod: str, uid: str, admitted_at: float, ratio: str = "100", leaf: str = "team-a"
           ) -> shared_ledger.StoredReservation:
    reservation = Reservation(f"team/{pod}", "adm-" + pod, (leaf, "org"), requests_of({RATIO: ratio}),
                              admitted_at + TTL, uid, {leaf: requests_of({RATIO: ratio}), "org": {}})
    return shared_ledger.StoredReservation(reservation, "replica-1", admitted_at)


def test_encode_decode_round_trip_keeps_per_quota_charges() -> None:
    original = {"team/p": stored("p", "u1", 100.0)}
    data = shared_ledger.encode(original.values())
    assert list(data) == [shared_ledger.LEDGER_DATA_KEY]
    assert shared_ledger.decode(data) == original
    assert shared_ledger.decode({}) == {} and shared_ledger.decode(None) == {}


@pytest.mark.parametrize("raw", ["not json", "[]", '{"team/p": {"quotas": []}}',
                                 '{"team/p": {"admission": "a", "quotas": ["q"], "requests": {"x": "1e"}, '
                                 '"charges": {}, "expiresAt": 1, "admittedAt": 0}}'])
def test_unreadable_ledger_is_an_error_not_an_empty_one(raw: str) -> None:
    with pytest.raises(shared_ledger.LedgerFormatError):
        shared_ledger.decode({shared_ledger.LEDGER_DATA_KEY: raw})


def test_one_ledger_object_per_tree() -> None:
    quotas = tree()
    assert shared_ledger.tree_of(quotas, "team-a") == shared_ledger.tree_of(quotas, "team-b") == "org"
    assert shared_ledger.ledger_object_name("org") == "gpuquota-ledger-org"


def test_a_stored_reservation_holds_room_until_this_replicas_watch_counts_the_pod() -> None:
    quotas = tree()
    usage = UsageIndex(quotas)
    entries = {"team/p": stored("p", "u1", 100.0), "team/old": stored("old", "u2", 50.0)}
    ledger = shared_ledger.holding_room(entries, usage, now=101.0, ttl_seconds=TTL)
    # "old" expired at 80; "p" still holds 100 in its leaf and nothing more in the parent.
    assert len(ledger) == 1 and ledger.used("team-a") == requests_of({RATIO: "100"}) and ledger.used("org") == {}
    usage.upsert(PodRecord("team", "p", "u1", "team-a", requests_of({RATIO: "100"})))
    assert len(shared_ledger.holding_room(entries, usage, now=101.0, ttl_seconds=TTL)) == 0
    # The same name with another uid (a recreated pod) does not count as confirmation.
    usage.upsert(PodRecord("team", "p", "other", "team-a", requests_of({RATIO: "100"})))
    assert len(shared_ledger.holding_room(entries, usage, now=101.0, ttl_seconds=TTL)) == 1


def test_pruning_keeps_confirmed_reservations_until_other_replicas_had_time_to_see_them() -> None:
    usage = UsageIndex(tree())
    usage.upsert(PodRecord("team", "p", "u1", "team-a", requests_of({RATIO: "100"})))
    entries = {"team/p": stored("p", "u1", 100.0), "team/q": stored("q", "u3", 100.0)}
    assert set(shared_ledger.pruned(entries, usage, now=102.0, settle_seconds=5)) == {"team/p", "team/q"}
    assert set(shared_ledger.pruned(entries, usage, now=105.0, settle_seconds=5)) == {"team/q"}
    assert shared_ledger.pruned(entries, usage, now=130.0, settle_seconds=5) == {}


def test_a_create_is_stored_without_repeating_its_request_per_quota() -> None:
    request = requests_of({RATIO: "100", "koordinator.sh/gpu-core": "100"})
    create = Reservation("team/c", "adm-c", ("team-a", "org"), request, 130.0, "uc",
                         {"team-a": dict(request), "org": dict(request)})
    data = shared_ledger.encode([shared_ledger.StoredReservation(create, "replica-1", 100.0)])
    assert '"charges":{}' in data[shared_ledger.LEDGER_DATA_KEY]
    read = shared_ledger.decode(data)["team/c"].reservation
    # Read back, it charges what it charged before, in every quota of its chain.
    assert [read.charge_of(quota) for quota in read.quotas] == [request, request]
    # A reservation whose charges differ anywhere keeps them all (the relabel case above).
    assert '"charges":{}' not in shared_ledger.encode([stored("p", "u1", 100.0)])[shared_ledger.LEDGER_DATA_KEY]


def alike(pod: str, admitted_at: float, replica: str = "replica-1", caller: str = "apiserver") -> \
        shared_ledger.StoredReservation:
    """A CREATE's reservation as strict accounting makes it: its request charged to every quota of its chain."""
    request = requests_of({RATIO: "100", "koordinator.sh/gpu-core": "100"})
    reservation = Reservation(f"team/{pod}", "adm-" + pod, ("team-a", "org"), request, admitted_at + TTL,
                              "uid-" + pod, {}, caller)
    return shared_ledger.StoredReservation(reservation, replica, admitted_at)


def test_pods_admitted_alike_are_stored_as_one_entry_and_read_back_one_by_one() -> None:
    pods = {f"team/p{i}": alike(f"p{i}", 100.0 + i / 8) for i in range(40)}
    other_replica = {"team/r": alike("r", 100.0, replica="replica-2")}
    escrow = Reservation("~escrow/replica-1/1", "escrow", ("team-a", "org"), requests_of({RATIO: "800"}), 130.5)
    entries = {**pods, **other_replica, "team/p": stored("p", "u1", 100.0),
               escrow.pod_key: shared_ledger.StoredReservation(escrow, "replica-1", 100.0)}
    data = shared_ledger.encode(entries.values())
    stored_keys = set(json.loads(data[shared_ledger.LEDGER_DATA_KEY]))
    # The forty alike pods are one entry; the lone pod of another replica, the pod whose charges
    # differ per quota, and the escrow are each their own.
    assert stored_keys == {"~pods/replica-1/team/p0", "team/r", "team/p", escrow.pod_key}
    read = shared_ledger.decode(data)
    assert read.keys() == entries.keys()
    for key, original in entries.items():
        got = read[key]
        assert (got.replica, got.admitted_at) == (original.replica, original.admitted_at), key
        r, o = got.reservation, original.reservation
        assert (r.pod_key, r.admission_uid, r.pod_uid, r.quotas, r.requests, r.expires_at, r.caller) == \
               (o.pod_key, o.admission_uid, o.pod_uid, o.quotas, o.requests, o.expires_at, o.caller), key
        assert [r.charge_of(q) for q in r.quotas] == [o.charge_of(q) for q in o.quotas], key


def test_a_reader_of_plain_entries_only_counts_a_group_as_all_of_its_room_until_its_last_pod_expires() -> None:
    # A replica of an earlier release, during a rolling update, reads the group as one entry.
    pods = [alike(f"p{i}", 100.0 + i) for i in range(5)]
    raw = json.loads(shared_ledger.encode(pods)[shared_ledger.LEDGER_DATA_KEY])
    (entry,) = raw.values()
    del entry["pods"]
    (plain,) = shared_ledger.decode({shared_ledger.LEDGER_DATA_KEY: json.dumps(raw)}).values()
    assert plain.reservation.requests == requests_of({RATIO: "500", "koordinator.sh/gpu-core": "500"})
    assert plain.reservation.expires_at == 104.0 + TTL and plain.admitted_at == 100.0
    # No pod confirms it, so it holds that room until then, in every quota of the chain.
    ledger = shared_ledger.holding_room({"g": plain}, UsageIndex(tree()), now=104.0 + TTL - 1, ttl_seconds=TTL)
    assert ledger.used("org") == requests_of({RATIO: "500", "koordinator.sh/gpu-core": "500"})


@pytest.mark.parametrize("pods", ['[]', '{"requests": {}, "ttl": 30, "each": [["~escrow/x", "a", "u", 1]]}',
                                  '{"requests": {}, "ttl": 30, "each": [["team/p", "a"]]}',
                                  '{"requests": {"x": "1e"}, "ttl": 30, "each": []}'])
def test_an_unreadable_group_is_an_error_not_fewer_reservations(pods: str) -> None:
    raw = ('{"~pods/r/team/p": {"admission": "", "quotas": ["q"], "requests": {}, "charges": {}, "expiresAt": 1, '
           f'"admittedAt": 0, "pods": {pods}}}}}')
    with pytest.raises(shared_ledger.LedgerFormatError):
        shared_ledger.decode({shared_ledger.LEDGER_DATA_KEY: raw})


@pytest.mark.parametrize("admitted", [100.0004, 100.0006, 1_765_000_000.123456, 1_765_000_000.9999])
def test_no_pod_of_a_group_is_read_back_expiring_earlier_than_it_was_stored(admitted: float) -> None:
    pods = [alike(f"p{i}", admitted + i * 0.0137) for i in range(4)]
    read = shared_ledger.decode(shared_ledger.encode(pods))
    for original in pods:
        back = read[original.reservation.pod_key].reservation.expires_at
        assert original.reservation.expires_at <= back <= original.reservation.expires_at + 0.002


def test_a_group_takes_about_a_third_of_the_room_of_one_full_entry_per_pod() -> None:
    # What each write and each read after a conflict carries: the object's size. Uids as long as
    # the apiserver's, a caller named as the apiserver's client certificate is.
    def pod(i: int) -> shared_ledger.StoredReservation:
        short = alike(f"pod-{i:03d}", 1_765_000_000.0 + i / 100, replica="gpuquota-webhook-7d9f8c6b5-x2x4q/17",
                      caller="system:apiserver")
        uid = f"{i:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        return shared_ledger.StoredReservation(
            dataclasses.replace(short.reservation, admission_uid="a" + uid[1:], pod_uid=uid), short.replica,
            short.admitted_at)
    pods = [pod(i) for i in range(300)]
    grouped = len(shared_ledger.encode(pods)[shared_ledger.LEDGER_DATA_KEY])
    one_each = sum(len(shared_ledger.encode([pod])[shared_ledger.LEDGER_DATA_KEY]) for pod in pods)
    assert grouped < 0.4 * one_each


def test_the_registry_of_ledgers_reads_back_the_trees_it_was_written_with() -> None:
    assert shared_ledger.decode_registry(shared_ledger.encode_registry(["b", "a", "a"])) == {"a", "b"}
    assert not shared_ledger.REGISTRY_OBJECT_NAME.startswith(shared_ledger.LEDGER_NAME_PREFIX)


@pytest.mark.parametrize("data", [{}, {shared_ledger.REGISTRY_DATA_KEY: "{not json"},
                                  {shared_ledger.REGISTRY_DATA_KEY: '{"a": 1}'},
                                  {shared_ledger.REGISTRY_DATA_KEY: '["a", 2]'},
                                  {shared_ledger.REGISTRY_DATA_KEY: '[""]'}])
def test_a_registry_that_is_not_a_list_of_tree_names_is_an_error_not_an_empty_list(data: dict[str, str]) -> None:
    with pytest.raises(shared_ledger.LedgerFormatError):
        shared_ledger.decode_registry(data)
