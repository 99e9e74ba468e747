"""Judging admissions against the shared ledger as stored, on one locked view of the quota state.

The same decision as local accounting's (``QuotaView.judge``), with the stored reservations that
still hold room from this replica's point of view in place of its own ledger
(``gpuquota_core.shared_ledger`` has the counting rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation, ReservationLedger
from gpuquota_core.pod_admission import PodAdmission, Verdict
from gpuquota_core.quota_decision import PodQuotaRequest
from gpuquota_core.quota_objects import POD_QUOTA_LABEL
from webhook.quota.state import QuotaState, QuotaView

Judged = tuple[Verdict, Reservation | None]
Requests = tuple[PodQuotaRequest, PodQuotaRequest | None]


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
           now: float) -> tuple[dict[str, shared_ledger.StoredReservation], int]:
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
