"""The reservation ledger: what holds room, and which watched pod may release it."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.quantity import Quantity
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


# expire() keeps its own index of expiries; this model is the plain definition it must match:
# every reservation held whose expiry has come, however it got there.
STEPS = st.lists(st.tuples(st.sampled_from(["reserve", "confirm", "release", "expire"]),
                           st.integers(0, 5),  # which pod
                           st.integers(0, 20)),  # how far the clock moves first
                 max_size=60)


@settings(max_examples=int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300")), deadline=None,
          derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")
@given(STEPS, st.sampled_from([0.0, 5.0, 30.0]))
def test_expire_releases_exactly_what_a_scan_would(steps: list[tuple[str, int, int]], ttl: float) -> None:
    ledger = ReservationLedger(ttl_seconds=ttl)
    request = requests_of({RATIO: "10"})
    now = 0.0
    for number, (action, pod, advance) in enumerate(steps):
        now += advance
        key = f"team/p{pod}"
        if action == "reserve":
            ledger.reserve(key, f"adm-{number}", CHAIN, request, now, pod_uid=f"uid-{pod}")
        elif action == "confirm":
            ledger.confirm(key, f"uid-{pod}", CHAIN, request)
        elif action == "release":
            ledger.release(key)
        else:
            held = {k: ledger.get(k) for k in (f"team/p{p}" for p in range(6)) if ledger.get(k) is not None}
            due = {k for k, r in held.items() if r is not None and r.expires_at <= now}
            assert {r.pod_key for r in ledger.expire(now)} == due
            assert len(ledger) == len(held) - len(due)
            assert ledger.used("org").get(RATIO, Quantity.of(0)) == Quantity.of(10 * len(ledger))
