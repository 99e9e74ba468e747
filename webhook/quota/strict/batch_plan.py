"""One commit attempt's decision: a batch judged on the ledger copy it read, and the edits its write
makes to that copy (``ledger_edits``).

Pure but for the view it reads under the quota state's lock and the escrow ids it draws: the
committer (``committer``) reads, calls :func:`plan_batch`, writes the plan's ``keep`` under the
read's resourceVersion, and on a conflict reads again and plans again from scratch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from gpuquota_core import shared_ledger
from gpuquota_core.enforcement import ESCROW_NOT_BACK, QUOTA_EXCEEDED
from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota.state import QuotaView
from webhook.quota.strict.escrow import (
    ESCROW_SHARE,
    Escrow,
    EscrowShape,
    ShapeKey,
    escrow_room,
    lent_out,
    settle_edit,
    take_escrow,
)
from webhook.quota.strict.judgement import Judged, Requests, judge_batch_holding, pruned
from webhook.quota.strict.ledger_edits import LedgerEdit, Reserve, SettleEscrow, Stored, Withdraw, applied
from webhook.quota.strict.withdrawals import Withdrawal


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
    stored: dict[str, shared_ledger.StoredReservation]
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
    keep: Stored  # the object's entries after the write
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
    base = applied(kept, [*(settle_edit(each, replica, view.ttl_seconds) for each in settling), *takebacks,
                          *(Withdraw(withdrawal) for withdrawal in withdrawals)], read.now)
    results, holding = judge_batch_holding(view, [job.admission for job in jobs], base, read.now,
                                           [job.requests for job in jobs])
    refused_for_room = any(verdict.reason == QUOTA_EXCEEDED for verdict, _ in results)
    if refused_for_room and own_escrow_open:
        return None
    if refused_for_room:
        results = _lent_refused(view, jobs, results, base, replica, read.now)
    edits: list[LedgerEdit] = [Reserve(shared_ledger.StoredReservation(reservation, replica, read.now))
                               for _, reservation in results if reservation is not None]
    # The gang reservations the batch's members opened: in the same write as the member that opened
    # each, and withdrawn with it (the same review uid).
    edits.extend(Reserve(gang) for gang in shared_ledger.opened_gangs(holding, base, replica, read.now))
    taken = None
    if escrow is not None:
        offer = _escrow_offer(view, jobs, results, holding, escrow, read.now)
        if offer is not None:
            taken = offer[0]
            edits.append(Reserve(offer[1]))
    keep = applied(base, edits, read.now)
    changes = bool(edits) or base.keys() != kept.keys()
    return BatchPlan(results, keep, set(base), pods_counted_through, taken, changes)


def _lent_refused(view: QuotaView, jobs: Sequence[Job], results: list[Judged], base: Stored, replica: str,
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
