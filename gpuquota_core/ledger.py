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
from collections.abc import Callable, Mapping
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
    # The gang (namespace/name) this pod is a member of, when its admission drew from the gang's
    # reservation: its charge then comes out of that reservation rather than on top of it.
    gang: str = ""

    def charge_of(self, quota: str) -> ResourceList:
        return self.charges.get(quota, self.requests) if self.charges else self.requests

    def confirmed_by(self, pod_uid: str, charged_to: tuple[str, ...], requests: Mapping[str, Quantity]) -> bool:
        if self.pod_uid and pod_uid != self.pod_uid:
            return False
        if charged_to[:1] != self.quotas[:1]:
            return False
        return all(requests.get(name, ZERO) >= asked for name, asked in self.requests.items())


@dataclass(frozen=True, slots=True)
class GangReservation:
    """The room a gang's minimum takes, held from its first member's admission until the minimum
    is stored or the gang's waiting time is over (``gpuquota_core.gang``).

    It never changes once made: what it holds at a moment is its need less what the gang's members
    already take (their own reservations, and the members the watch shows), so a member's admission
    writes only its own reservation, and the reservation is used up as members come.
    """

    gang: str  # namespace/name
    admission_uid: str  # the admission of the member that opened it
    quotas: tuple[str, ...]  # leaf first, as a member's charge
    need: ResourceList
    min_members: int
    expires_at: float
    # Given up at once when its PodGroup is deleted (a gang of labels or annotations has no object).
    pod_group: bool = False


# What the watch shows of a gang's members: how many are stored and what they ask, in total.
GangMembersStored = Callable[[str], tuple[int, ResourceList]]


def _nothing_stored(gang: str) -> tuple[int, ResourceList]:
    return 0, {}


class ReservationLedger:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 members_stored: GangMembersStored = _nothing_stored) -> None:
        self.ttl_seconds = ttl_seconds
        self._members_stored = members_stored
        self._gangs: dict[str, GangReservation] = {}
        self._gangs_at: dict[str, set[str]] = {}  # quota -> the gangs holding room there
        # Per gang, the members holding reservations here: how many, and what they ask.
        self._drawn: dict[str, tuple[int, ResourceList]] = {}
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
                charges: Mapping[str, ResourceList] | None = None, caller: str = "",
                gang: str = "") -> Reservation:
        """Charge a pod; a retried admission of the same pod replaces its earlier reservation."""
        return self.hold(Reservation(pod_key, admission_uid, quotas, dict(requests), now + self.ttl_seconds,
                                     pod_uid, dict(charges or {}), caller, gang))

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
        if reservation.gang:
            count, asked = self._drawn.get(reservation.gang, (0, {}))
            self._drawn[reservation.gang] = (count + 1, add_lists(asked, reservation.requests))
        return reservation

    def release(self, pod_key: str) -> Reservation | None:
        reservation = self._by_pod.pop(pod_key, None)
        if reservation is not None:
            remaining = self._by_caller.pop(reservation.caller, 1) - 1
            if remaining:
                self._by_caller[reservation.caller] = remaining
            for quota in reservation.quotas:
                self._used[quota] = subtract_lists(self._used.get(quota, {}), reservation.charge_of(quota))
            if reservation.gang:
                count, asked = self._drawn.pop(reservation.gang, (1, {}))
                if count > 1:
                    self._drawn[reservation.gang] = (count - 1, subtract_lists(asked, reservation.requests))
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
        for gang in [gang for gang, held in self._gangs.items() if held.expires_at <= now]:
            self.close_gang(gang)
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

    def reservations(self) -> list[Reservation]:
        """Every reservation held (a view replaying admissions copies them: gpuquota_core.gang_view)."""
        return list(self._by_pod.values())

    def used(self, quota: str) -> ResourceList:
        gangs = self._gangs_at.get(quota)
        if not gangs:
            return dict(self._used.get(quota, {}))
        return add_lists(self._used.get(quota, {}), *(self.gang_hold(gang) for gang in sorted(gangs)))

    # Gang reservations (gpuquota_core.gang): a gang's first member opens one, every member draws
    # from it, and it holds room until the minimum is stored or it expires.

    def open_gang(self, reservation: GangReservation) -> GangReservation:
        self.close_gang(reservation.gang)
        self._gangs[reservation.gang] = reservation
        for quota in reservation.quotas:
            self._gangs_at.setdefault(quota, set()).add(reservation.gang)
        return reservation

    def close_gang(self, gang: str) -> GangReservation | None:
        reservation = self._gangs.pop(gang, None)
        if reservation is not None:
            for quota in reservation.quotas:
                held = self._gangs_at.get(quota)
                if held is not None:
                    held.discard(gang)
                    if not held:
                        del self._gangs_at[quota]
        return reservation

    def gang(self, gang: str) -> GangReservation | None:
        return self._gangs.get(gang)

    def gangs(self) -> list[GangReservation]:
        return list(self._gangs.values())

    def gang_count(self) -> int:
        return len(self._gangs)

    def gang_members(self, gang: str) -> tuple[int, ResourceList]:
        """How many members of ``gang`` take room (reserved here or stored), and what they ask."""
        reserved, reserved_asks = self._drawn.get(gang, (0, {}))
        stored, stored_asks = self._members_stored(gang)
        return reserved + stored, add_lists(reserved_asks, stored_asks)

    def gang_hold(self, gang: str) -> ResourceList:
        """What ``gang``'s reservation holds now: its need less what its members take (nothing
        once its minimum of members takes room)."""
        reservation = self._gangs.get(gang)
        if reservation is None:
            return {}
        count, asked = self.gang_members(gang)
        return remaining_need(reservation.need, reservation.min_members, count, asked)


def remaining_need(need: Mapping[str, Quantity], min_members: int, members: int,
                   members_ask: Mapping[str, Quantity]) -> ResourceList:
    """What of a gang's ``need`` its ``members`` (asking ``members_ask`` in total) do not take yet."""
    if members >= min_members:
        return {}
    left: ResourceList = {}
    for name, quantity in need.items():
        rest = quantity - members_ask.get(name, ZERO)
        if rest > ZERO:
            left[name] = rest
    return left
