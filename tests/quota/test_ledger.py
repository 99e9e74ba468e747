"""The reservation ledger: what holds room, and which watched pod may release it."""

from __future__ import annotations

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.quota_decision import requests_of

RATIO = "koordinator.sh/gpu-memory-ratio"
CHAIN = ("team-a", "org")


def ledger_with_one() -> ReservationLedger:
    ledger = ReservationLedger(ttl_seconds=30)
    ledger.reserve("team/p", "adm-1", CHAIN, requests_of({RATIO: "100"}), now=0.0, pod_uid="pod-uid-1")
    return ledger


def test_reservation_charges_every_quota_of_the_chain() -> None:
    ledger = ledger_with_one()
    assert ledger.used("team-a") == ledger.used("org") == requests_of({RATIO: "100"})
    assert len(ledger) == 1


def test_only_the_admitted_pod_confirms_its_reservation() -> None:
    ledger = ledger_with_one()
    asked = requests_of({RATIO: "100"})
    # The old pod of a delete-and-recreate, still shown by the watch under the same name.
    assert ledger.confirm("team/p", "pod-uid-0", CHAIN, asked) is None
    # The admitted pod, but the watch still shows a version charged elsewhere or asking less.
    assert ledger.confirm("team/p", "pod-uid-1", ("team-b", "org"), asked) is None
    assert ledger.confirm("team/p", "pod-uid-1", CHAIN, requests_of({RATIO: "50"})) is None
    assert len(ledger) == 1 and ledger.used("org") == asked
    released = ledger.confirm("team/p", "pod-uid-1", CHAIN, asked)
    assert released is not None and released.admission_uid == "adm-1"
    assert len(ledger) == 0 and ledger.used("org")[RATIO].is_zero()


def test_reservation_without_pod_uid_is_confirmed_by_name_and_quota() -> None:
    ledger = ReservationLedger()
    ledger.reserve("team/p", "adm", CHAIN, requests_of({RATIO: "100"}), now=0.0)
    assert ledger.confirm("team/p", "any-uid", CHAIN, requests_of({RATIO: "100"})) is not None


def test_per_quota_charges_of_an_update() -> None:
    ledger = ReservationLedger()
    new_leaf_only = {"team-b": requests_of({RATIO: "100"}), "org": {}}
    ledger.reserve("team/p", "adm", ("team-b", "org"), requests_of({RATIO: "100"}), now=0.0, charges=new_leaf_only)
    assert ledger.used("team-b") == requests_of({RATIO: "100"}) and ledger.used("org") == {}
    ledger.release("team/p")
    assert ledger.used("team-b")[RATIO].is_zero()


def test_retried_admission_replaces_and_expiry_releases() -> None:
    ledger = ledger_with_one()
    ledger.reserve("team/p", "adm-2", CHAIN, requests_of({RATIO: "100"}), now=10.0, pod_uid="pod-uid-1")
    assert ledger.used("org") == requests_of({RATIO: "100"})
    assert ledger.expire(now=39.0) == []
    assert [r.admission_uid for r in ledger.expire(now=40.0)] == ["adm-2"]
    assert ledger.used("org")[RATIO].is_zero()
