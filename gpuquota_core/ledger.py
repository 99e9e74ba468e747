"""Reservation ledger: pods admitted but not yet seen by the watch still take room.

Between the admission answer and the pod appearing in the watch, concurrent admissions would
otherwise all see the same free room. A reservation is charged to the quotas of the pod's chain
at once and released when the watch shows the admitted pod (it then counts instead) or when it
expires (a later webhook refused the pod, or the create never landed). The clock is passed in.

A reservation is confirmed only by the very pod it was made for: same namespace/name, same
``metadata.uid`` (the API server assigns it before validating admission runs), charged to the same
leaf quota, asking at least what was admitted. Anything else the watch shows under that name, the
old pod of a delete-and-recreate or the old version of a relabelled pod, leaves the reservation
in place, so the room is never handed out twice.

A second delivery of the same admission (same AdmissionReview uid: a client retry after a broken
connection, the API server calling again) is judged as if its first delivery had not reserved:
both describe one create, which can be stored once, so counting the first against the second
would refuse a pod that was already admitted.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from .quantity import ZERO, Quantity
from .resources import ResourceList, add_lists, subtract_lists

# How long an admitted pod holds room before the watch must have shown it: pod creates finish well
# within the API server's request timeout (docs/reliability.md, "Known limits", says where not).
DEFAULT_TTL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Reservation:
    pod_key: str  # namespace/name: what the watch will show
    admission_uid: str
    quotas: tuple[str, ...]  # leaf first, every ancestor charged too
    requests: ResourceList  # the admitted pod's full canonical requests
    expires_at: float
    pod_uid: str = ""  # metadata.uid at admission; "" when the caller did not know it
    # Per quota, what the ledger holds for it; defaults to ``requests`` everywhere (a CREATE).
    charges: Mapping[str, ResourceList] = field(default_factory=dict)
    caller: str = ""  # who sent the admission (peer address or client certificate), for the per-caller bound

    def charge_of(self, quota: str) -> ResourceList:
        return self.charges.get(quota, self.requests) if self.charges else self.requests

    def confirmed_by(self, pod_uid: str, charged_to: tuple[str, ...], requests: Mapping[str, Quantity]) -> bool:
        if self.pod_uid and pod_uid != self.pod_uid:
            return False
        if charged_to[:1] != self.quotas[:1]:
            return False
        return all(requests.get(name, ZERO) >= asked for name, asked in self.requests.items())


class ReservationLedger:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._by_pod: dict[str, Reservation] = {}
        self._used: dict[str, ResourceList] = {}
        self._by_caller: dict[str, int] = {}
        # Every reservation's expiry, soonest first, so expire() costs what expired rather than a
        # scan of everything held (it runs on every admission). An entry can outlive its
        # reservation (confirmed, released, or reserved again later); expire() skips those.
        self._expiries: list[tuple[float, int, str]] = []
        self._sequence = itertools.count()  # ties in expiry never compare the pod keys' order

    def __len__(self) -> int:
        return len(self._by_pod)

    def reserve(self, pod_key: str, admission_uid: str, quotas: tuple[str, ...],
                requests: Mapping[str, Quantity], now: float, *, pod_uid: str = "",
                charges: Mapping[str, ResourceList] | None = None, caller: str = "") -> Reservation:
        """Charge a pod; a retried admission of the same pod replaces its earlier reservation."""
        return self.hold(Reservation(pod_key, admission_uid, quotas, dict(requests), now + self.ttl_seconds,
                                     pod_uid, dict(charges or {}), caller))

    def hold(self, reservation: Reservation) -> Reservation:
        """Charge a reservation made elsewhere (a shared ledger's), as it is: its own expiry.

        Its maps are shared, not copied: nothing here changes them."""
        pod_key, caller = reservation.pod_key, reservation.caller
        self.release(pod_key)
        self._by_pod[pod_key] = reservation
        heapq.heappush(self._expiries, (reservation.expires_at, next(self._sequence), pod_key))
        self._by_caller[caller] = self._by_caller.get(caller, 0) + 1
        for quota in reservation.quotas:
            self._used[quota] = add_lists(self._used.get(quota, {}), reservation.charge_of(quota))
        return reservation

    def release(self, pod_key: str) -> Reservation | None:
        reservation = self._by_pod.pop(pod_key, None)
        if reservation is not None:
            remaining = self._by_caller.pop(reservation.caller, 1) - 1
            if remaining:
                self._by_caller[reservation.caller] = remaining
            for quota in reservation.quotas:
                self._used[quota] = subtract_lists(self._used.get(quota, {}), reservation.charge_of(quota))
        return reservation

    def confirm(self, pod_key: str, pod_uid: str, charged_to: tuple[str, ...],
                requests: Mapping[str, Quantity]) -> Reservation | None:
        """Release the reservation of ``pod_key`` if the watched pod is the one it was made for."""
        reservation = self._by_pod.get(pod_key)
        if reservation is None or not reservation.confirmed_by(pod_uid, charged_to, requests):
            return None
        return self.release(pod_key)

    def expire(self, now: float) -> list[Reservation]:
        """Release every reservation that expired by ``now``, soonest first."""
        expired: list[Reservation] = []
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, _, pod_key = heapq.heappop(expiries)
            reservation = self._by_pod.get(pod_key)
            if reservation is not None and reservation.expires_at <= now:
                self.release(pod_key)
                expired.append(reservation)
        return expired

    def held_by(self, caller: str) -> int:
        """How many unconfirmed reservations ``caller``'s admissions hold right now."""
        return self._by_caller.get(caller, 0)

    def made_by(self, pod_key: str, admission_uid: str) -> Reservation | None:
        """The reservation an earlier delivery of this very admission made, if there is one."""
        reservation = self._by_pod.get(pod_key)
        if reservation is None or not admission_uid or reservation.admission_uid != admission_uid:
            return None
        return reservation

    def get(self, pod_key: str) -> Reservation | None:
        return self._by_pod.get(pod_key)

    def used(self, quota: str) -> ResourceList:
        return dict(self._used.get(quota, {}))
