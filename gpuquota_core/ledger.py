"""Reservation ledger: pods admitted but not yet seen by the watch still take room.

Between the admission answer and the pod appearing in the watch, concurrent admissions would
otherwise all see the same free room. A reservation is charged to the quotas of the pod's chain
at once and released when the watched pod appears (the pod then counts instead) or when it expires
(a later webhook refused the pod, or the create never landed). The clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quantity import Quantity
from .resources import ResourceList, add_lists, subtract_lists

DEFAULT_TTL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Reservation:
    pod_key: str  # namespace/name: what the watch will show
    admission_uid: str
    quotas: tuple[str, ...]  # leaf first, every ancestor charged too
    requests: ResourceList
    expires_at: float


class ReservationLedger:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._by_pod: dict[str, Reservation] = {}
        self._used: dict[str, ResourceList] = {}

    def __len__(self) -> int:
        return len(self._by_pod)

    def reserve(self, pod_key: str, admission_uid: str, quotas: tuple[str, ...],
                requests: Mapping[str, Quantity], now: float) -> Reservation:
        """Charge a pod; a retried admission of the same pod replaces its earlier reservation."""
        self.release(pod_key)
        reservation = Reservation(pod_key, admission_uid, quotas, dict(requests), now + self.ttl_seconds)
        self._by_pod[pod_key] = reservation
        for quota in quotas:
            self._used[quota] = add_lists(self._used.get(quota, {}), reservation.requests)
        return reservation

    def release(self, pod_key: str) -> Reservation | None:
        reservation = self._by_pod.pop(pod_key, None)
        if reservation is not None:
            for quota in reservation.quotas:
                self._used[quota] = subtract_lists(self._used.get(quota, {}), reservation.requests)
        return reservation

    def expire(self, now: float) -> list[Reservation]:
        expired = [r for r in self._by_pod.values() if r.expires_at <= now]
        for reservation in expired:
            self.release(reservation.pod_key)
        return expired

    def get(self, pod_key: str) -> Reservation | None:
        return self._by_pod.get(pod_key)

    def used(self, quota: str) -> ResourceList:
        return dict(self._used.get(quota, {}))
