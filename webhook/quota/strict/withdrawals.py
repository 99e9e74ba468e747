"""Withdrawals: taking out of a ledger the room reserved for admissions whose "allowed" never left.
Late answers (decided, or written, after the worker's deadline) and unanswered admissions (the worker
got no answer from its quota service and refused the pod 503 ``QuotaServiceDown``, then reports it:
``webhook.quota.client``) take one path, the tree's next write (docs/design.md, "Withdrawals").

The one rule (:meth:`Withdrawal.matches`): a withdrawal names a pod key and the uid of the
AdmissionReview that was refused, and removes the entry under that key only while it was written
for exactly that review, whichever replica wrote it. It rests on one fact of the apiserver: it never
sends a review uid again once it has an answer for it. A client that retries a refused create makes a
new request, hence a new review with a new uid, whose entry the earlier review's withdrawal never
takes (``tests/quota/strict/test_withdrawals.py`` holds it). A review re-sent after a broken
connection keeps its uid, but then the apiserver never got the earlier answer either.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass

from gpuquota_core import shared_ledger
from gpuquota_core.enforcement import ANSWER_TOO_LATE
from gpuquota_core.ledger import Reservation
from gpuquota_core.pod_admission import PodAdmission, Verdict


@dataclass(frozen=True)
class Withdrawal:
    """The entry ``pod_key`` as written for the review ``review_uid`` (an escrow entry: its key and
    the escrow's marker uid), to be taken out of the ledger by the next write of its tree."""

    pod_key: str
    review_uid: str

    def matches(self, item: shared_ledger.StoredReservation) -> bool:
        """The one matching rule (see the module docstring)."""
        return item.reservation.admission_uid == self.review_uid


def withdraw(keep: MutableMapping[str, shared_ledger.StoredReservation], withdrawals: Iterable[Withdrawal]) -> bool:
    """Take the matching entries out of ``keep``; whether any was still there.

    A gang member's withdrawal also takes the gang reservations that same review opened (its own
    gang's, and those of its gang group), each while no other member's entry draws from it: room held
    for gangs whose opening "allowed" never left would otherwise wait for their waiting time. Once
    another member draws from one, that member's "allowed" rests on it, and it stays.
    """
    withdrawn = False
    for withdrawal in withdrawals:
        item = keep.get(withdrawal.pod_key)
        if item is not None and withdrawal.matches(item):
            del keep[withdrawal.pod_key]
            withdrawn = True
            if item.reservation.gang:
                drawn = {other.reservation.gang for other in keep.values() if other.reservation.gang}
                for key in [key for key, opened in keep.items() if opened.gang is not None
                            and withdrawal.matches(opened) and opened.gang.gang not in drawn]:
                    del keep[key]
    return withdrawn


def late_answers(answer_by: Sequence[float], results: Sequence[tuple[Verdict, Reservation | None]],
                 held_before: set[str], finished: float) -> tuple[set[int], list[Withdrawal]]:
    """Of a written batch (each job's deadline, and its verdict and reservation), the jobs admitted
    after their worker's deadline (``finished``: when the write returned), and the withdrawals of
    what was written only for them: never an entry an answered admission shares, one of the same pod
    earlier in the ledger (``held_before``) or in this batch."""
    late = {index for index, (deadline, (verdict, _)) in enumerate(zip(answer_by, results, strict=True))
            if verdict.allowed and finished >= deadline}
    answered = {r.pod_key for index, (_, r) in enumerate(results) if r is not None and index not in late}
    return late, [Withdrawal(r.pod_key, r.admission_uid) for index in sorted(late)
                  if (r := results[index][1]) is not None and r.pod_key not in held_before | answered]


def late_verdict(admission: PodAdmission, when: str) -> Verdict:
    """The refusal of an admission decided, or reached, after its worker stopped waiting."""
    return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted: the quota service "
                   f"{when} after the webhook worker stopped waiting for its answer; retry shortly",
                   reason=ANSWER_TOO_LATE)

