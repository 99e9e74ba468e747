"""One commit attempt's decision: the batch judged on the ledger copy it read, and what its write
stores.

Pure but for the view it reads under the quota state's lock and the escrow ids it draws: the
committer reads, calls :func:`plan_batch`, writes the plan's ``keep`` under the read's
resourceVersion, and on a conflict reads again and plans again from scratch: nothing decided on the
old copy is reused. Judging is local accounting's decision (``QuotaView.judge``) with the stored
reservations that still hold room from this replica's point of view in place of its own ledger
(``gpuquota_core.shared_ledger`` has the counting rules).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from gpuquota_core import shared_ledger
from gpuquota_core.enforcement import ESCROW_NOT_BACK, QUOTA_EXCEEDED
from gpuquota_core.ledger import Reservation, ReservationLedger
from gpuquota_core.pod_admission import PodAdmission, Verdict
from gpuquota_core.quota_decision import PodQuotaRequest
from gpuquota_core.quota_objects import POD_QUOTA_LABEL
from webhook.quota.state import QuotaState, QuotaView
from webhook.quota.strict.escrow import (
    ESCROW_SHARE,
    Escrow,
    EscrowShape,
    SettleEscrow,
    ShapeKey,
    escrow_room,
    lent_out,
    settle_edit,
    take_escrow,
)
from webhook.quota.strict.withdrawals import Withdrawal, withdraw

Judged = tuple[Verdict, Reservation | None]
Requests = tuple[PodQuotaRequest, PodQuotaRequest | None]


@dataclass
class Job:
    """One admission waiting in its tree's queue for the committer's verdict."""

    admission: PodAdmission
    # Its quota_requests, read once on arrival: for its escrow shape, every judgement and the escrow's room.
    requests: Requests
    shape: EscrowShape | None  # None: never admitted from or into escrow (and always in the degraded mode)
    degraded: bool = False  # decided here because the writer cannot be asked: fresh reads, no escrow
    verdict: Verdict | None = None
    submitted: float = field(default_factory=time.monotonic)
    # Monotonic time by which the worker must have the answer (inf: no bound); an "allowed" decided
    # later would reach nobody, so it is turned into a refusal and its reservation withdrawn.
    answer_by: float = math.inf


@dataclass(frozen=True)
class LedgerRead:
    """The tree's ledger object as one attempt read it, and when (wall clock)."""

    version: str
    stored: shared_ledger.Stored
    now: float
    pods_counted_through: int  # how far this replica's pod watch must have got to decide on it


@dataclass(frozen=True)
class EscrowTerms:
    """What the writer may take in escrow in this attempt (None in the degraded mode)."""

    replica: str
    most_pods: int
    window: float
    ids: Iterator[int]
    open_shapes: frozenset[ShapeKey]  # shapes with an open escrow already


@dataclass(frozen=True)
class BatchPlan:
    results: list[Judged]
    keep: shared_ledger.Stored  # the object's entries after the write
    held_before: set[str]  # the entries there before this batch's reservations were added
    pods_counted_through: int
    taken: Escrow | None  # a new escrow, opened once the write lands
    changes: bool  # whether there is anything to write

    def new(self) -> list[shared_ledger.StoredReservation]:
        """The entries this batch's admissions wrote: their reservations and the gang reservations
        they opened (a gang's entry carries the review uid of the member that opened it)."""
        reservations = [self.keep[r.pod_key] for _, r in self.results if r is not None and r.pod_key in self.keep]
        reviews = {item.reservation.admission_uid for item in reservations}
        return reservations + [item for item in self.keep.values()
                               if item.gang is not None and item.reservation.admission_uid in reviews]


def plan_batch(view: QuotaView, read: LedgerRead, jobs: Sequence[Job], settling: Sequence[Escrow],
               withdrawals: Sequence[Withdrawal], replica: str, escrow: EscrowTerms | None,
               own_escrow_open: bool, takebacks: Sequence[SettleEscrow] = ()) -> BatchPlan | None:
    """Judge ``jobs`` on ``read`` and plan the write; None when a pod was refused for room this
    replica itself holds in escrow (``own_escrow_open``): the committer closes those escrows and
    plans again, giving their room back in the same write. Before judging, the write settles
    ``settling``, takes back a previous process's escrows (``takebacks``) and withdraws."""
    kept, pods_counted_through = pruned(view, read.stored, read.now)
    base = dict(kept)  # ``read.stored`` stays as read
    for settle in [*(settle_edit(each, replica, view.ttl_seconds) for each in settling), *takebacks]:
        settle.apply(base, read.now)
    withdraw(base, withdrawals)
    results, holding = judge_batch_holding(view, [job.admission for job in jobs], base, read.now,
                                           [job.requests for job in jobs])
    refused_for_room = any(verdict.reason == QUOTA_EXCEEDED for verdict, _ in results)
    if refused_for_room and own_escrow_open:
        return None
    if refused_for_room:
        results = _lent_refused(view, jobs, results, base, replica, read.now)
    new = [shared_ledger.StoredReservation(reservation, replica, read.now)
           for _, reservation in results if reservation is not None]
    # The gang reservations the batch's members opened: in the same write as the member that opened
    # each, and withdrawn with it (the same review uid).
    new.extend(shared_ledger.opened_gangs(holding, base, replica, read.now))
    taken = None
    if escrow is not None:
        offer = _escrow_offer(view, jobs, results, holding, escrow, read.now)
        if offer is not None:
            taken = offer[0]
            new.append(offer[1])
    keep = {**base, **{item.reservation.pod_key: item for item in new}}
    changes = bool(new) or base.keys() != kept.keys()
    return BatchPlan(results, keep, set(base), pods_counted_through, taken, changes)


def _lent_refused(view: QuotaView, jobs: Sequence[Job], results: list[Judged], base: shared_ledger.Stored, replica: str,
                  now: float) -> list[Judged]:
    """The results with each pod refused for room that only another writer's escrow holds answered
    503 ``EscrowNotBackInTime`` at once (the room exists, lent out; the worker asks once more), not
    "exceeded quota". A pod that does not fit even without that escrow stays refused for the quota."""
    lent = lent_out(base, replica)
    if not lent:
        return results
    without = {key: item for key, item in base.items() if key not in lent}
    # The whole batch, in order, as the real judgement charged it: an earlier job's reservation
    # takes room from a later one here too.
    instead, _ = judge_batch_holding(view, [job.admission for job in jobs], without, now,
                                     [job.requests for job in jobs])
    lenders = ", ".join(sorted(set(lent.values())))
    expires = max(base[key].reservation.expires_at for key in lent)
    return [(_escrow_not_back(job.admission, lenders, expires - now), None)
            if verdict.reason == QUOTA_EXCEEDED and alternative.allowed else (verdict, reservation)
            for job, (verdict, reservation), (alternative, _) in zip(jobs, results, instead, strict=True)]


def _escrow_not_back(admission: PodAdmission, lenders: str, expires_in: float) -> Verdict:
    return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted yet: the room it needs is held "
                   f"in escrow by webhook replica {lenders}, which gives back what it does not use within its "
                   f"window; if that replica has stopped, the room comes back when the escrow expires, in "
                   f"{max(expires_in, 0):.0f}s at most; retry shortly", reason=ESCROW_NOT_BACK)


def _escrow_offer(view: QuotaView, jobs: Sequence[Job], results: list[Judged], holding: ReservationLedger,
                  terms: EscrowTerms,
                  now: float) -> tuple[Escrow, shared_ledger.StoredReservation] | None:
    """Room for more pods of the shape of the batch's last admitted CREATE, if a fair share is free."""
    for job, (_, reservation) in reversed(list(zip(jobs, results, strict=True))):
        if reservation is not None and job.shape is not None and job.shape.key() not in terms.open_shapes:
            shape, (new, _) = job.shape, job.requests
            break
    else:
        return None
    room = escrow_room(view, new, shape, holding, terms.most_pods * ESCROW_SHARE)
    return take_escrow(shape, room, terms.replica, terms.ids, now, terms.window, view.ttl_seconds)


def judge_batch_holding(view: QuotaView, admissions: Sequence[PodAdmission],
                        stored: Mapping[str, shared_ledger.StoredReservation], now: float,
                        requests: Sequence[Requests] | None = None) -> tuple[list[Judged], ReservationLedger]:
    """Decide a batch against the shared ledger as stored (``now`` is wall time), and what holds room
    once the batch's reservations are added: ``stored`` as this replica counts it plus those.

    Each admission sees the ones before it in the batch, so one write can carry them all. Returns,
    per admission, the verdict and the reservation to store (None: nothing to write).
    ``requests``: each admission's ``quota_requests``, when the caller has read them already.
    """
    ledger = shared_ledger.holding_room(stored, view.usage, now, view.ttl_seconds)
    known: Sequence[Requests | None] = requests if requests is not None else [None] * len(admissions)
    return [view.judge(admission, ledger, now, read)
            for admission, read in zip(admissions, known, strict=True)], ledger


def judge_batch(state: QuotaState, admissions: Sequence[PodAdmission],
                stored: Mapping[str, shared_ledger.StoredReservation], now: float) -> list[Judged]:
    """:func:`judge_batch_holding`'s verdicts on a snapshot of ``state`` of its own (one-off callers:
    ``gpuquota explain``; strict accounting judges inside the snapshot of its whole commit attempt)."""
    with state.snapshot() as view:
        return judge_batch_holding(view, admissions, stored, now)[0]


def pruned(view: QuotaView, stored: Mapping[str, shared_ledger.StoredReservation],
           now: float) -> tuple[shared_ledger.Stored, int]:
    """The reservations worth keeping, and the pod resourceVersion a replica's watch must have
    reached to count every pod whose dropped reservation this replica's watch counts (0: none)."""
    kept = shared_ledger.pruned(stored, view.usage, now)
    counted = (key for key, item in stored.items() if key not in kept and shared_ledger.confirmed(item, view.usage))
    return kept, max(map(view.pod_versions.shown_at_most, counted), default=0)


def tree_of(view: QuotaView, admission: PodAdmission) -> str | None:
    """The quota tree whose shared ledger a pod's admission writes to; None: the pod has no quota."""
    resolution = view.tree.resolve(admission.namespace, admission.labels.get(POD_QUOTA_LABEL, ""))
    if resolution.quota is None or resolution.quota not in view.tree.quotas:
        return None
    return shared_ledger.tree_of(view.tree, resolution.quota)
