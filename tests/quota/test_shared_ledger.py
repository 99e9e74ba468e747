"""The shared ledger's format and counting rules (strict accounting), pure."""

from __future__ import annotations

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
