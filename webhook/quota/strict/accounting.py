"""Strict accounting's entry: pod admissions and reports of unanswered ones, decided in one of two
modes, and the wiring of its parts (:func:`strict_parts`).

- ``Mode.WRITER``: this replica writes the ledgers (it holds the writer Lease, or a forwarder asked
  it). It decides on its cached copy of each ledger, which only its own writes change, and may take
  room in escrow (``escrow``).
- ``Mode.DEGRADED``, "decide here": the writer cannot be asked, or no writer Lease is configured.
  Fresh reads, group-commit CAS, no escrow, and a retryable 503 at once for room lent to an escrow;
  correct whoever else writes, since the ledger's compare-and-swap is the only fence (docs/design.md).
"""

from __future__ import annotations

import enum
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation
from gpuquota_core.pod_admission import ALLOW, PodAdmission, Verdict, quota_requests
from webhook.quota import metrics
from webhook.quota.state import QuotaState
from webhook.quota.strict.batch_plan import Job, tree_of
from webhook.quota.strict.committer import Committer
from webhook.quota.strict.escrow import DEFAULT_ESCROW_MOST_PODS, ESCROW_WINDOW_SECONDS, EscrowJournal, escrow_shape
from webhook.quota.strict.readiness import LedgerReadiness
from webhook.quota.strict.reconciler import DEFAULT_CREATE_DEADLINE_SECONDS, Reconciler
from webhook.quota.strict.store import LedgerStore
from webhook.quota.strict.withdrawals import Withdrawal, late_verdict

log = logging.getLogger("gpuquota.quota")


class Mode(enum.Enum):
    WRITER = "writer"
    DEGRADED = "degraded"


class StrictAccounting:
    """The quota service's decider under ``--accounting strict``: admissions and withdrawals."""

    def __init__(self, state: QuotaState, committer: Committer, *, clock: Callable[[], float],
                 monotonic: Callable[[], float]) -> None:
        self.state, self.committer = state, committer
        self.clock, self.monotonic = clock, monotonic

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf, mode: Mode = Mode.DEGRADED) -> Verdict:
        """Decide and record ``admission``; ``answer_by``: the monotonic time after which the worker no
        longer waits for the answer, so nothing is admitted after it. ``mode``: the degraded mode unless
        the caller knows this replica is the writer (``forwarding.SingleWriter``); without a writer
        Lease every replica decides its own admissions so."""
        if self.monotonic() >= answer_by:  # queued in the socket while this process was stopped or busy
            return late_verdict(admission, "arrived")
        requests = quota_requests(admission)
        escrow_on = mode is Mode.WRITER and self.committer.escrow_most_pods > 0
        with self.state.snapshot() as view:
            shape = escrow_shape(view, admission, requests) if escrow_on else None
            # A shape's chain ends at the tree's root: one resolution of the pod's quota, not two.
            tree_root = shape.quotas[-1] if shape is not None else tree_of(view, admission)
        if tree_root is None:
            return self.state.admit_pod(admission, requests)  # no quota: nothing to share
        queue = self.committer.queue(tree_root)
        with queue.condition:
            if shape is not None:
                now = self.clock()
                reservation = Reservation(f"{admission.namespace}/{admission.name}", admission.uid, shape.quotas,
                                          shape.resources(), now + self.state.ledger.ttl_seconds,
                                          admission.pod_uid, {}, admission.caller)
                escrow = queue.escrows.admit(shape, reservation, now)
                if escrow is not None:
                    # In the journal before the answer leaves: a successor of this process takes the
                    # escrow back with it (escrow.EscrowJournal).
                    self.committer.journal.admitted(tree_root, escrow.entry_key, shared_ledger.StoredReservation(
                        reservation, self.committer.replica, now))
                    metrics.ESCROW_ADMISSIONS.inc()
                    return ALLOW
            job = Job(admission, requests, shape, degraded=mode is Mode.DEGRADED, answer_by=answer_by)
            return self.committer.submit(tree_root, job, queue)

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        """Take out, in the next write of their trees, what any replica reserved for ``admissions``.

        Their workers refused them after an attempt that got no answer (``webhook.quota.client``):
        the quota service died or hung with it, though it, or the writer it forwarded to, may have
        written the reservation already. Safe because that refusal was the only answer the apiserver
        got for each review, and it never sends a review's uid again after answering it
        (``withdrawals`` states the assumption, and its test holds it).

        False, taking none, until the quota state is synced (a restarted service is asked first of
        all): only then does it know the trees."""
        with self.state.snapshot() as view:
            if not view.synced:
                return False
            trees = [None if admission.dry_run else tree_of(view, admission) for admission in admissions]
        for admission, tree_root in zip(admissions, trees, strict=True):
            if tree_root is not None:
                queue = self.committer.queue(tree_root)
                with queue.condition:
                    queue.withdrawals.append(Withdrawal(f"{admission.namespace}/{admission.name}", admission.uid))
        log.info("strict accounting: withdrawing what was reserved for %d admissions refused after an attempt got no "
                 "answer: %s", len(admissions), ", ".join(f"{a.namespace}/{a.name}" for a in admissions[:10]))
        return True


@dataclass(frozen=True)
class StrictParts:
    """Strict accounting's collaborators as one service wires them (``strict_parts``)."""

    store: LedgerStore
    readiness: LedgerReadiness
    committer: Committer
    accounting: StrictAccounting
    reconciler: Reconciler


def strict_parts(state: QuotaState, core: Any, namespace: str, *, replica: str | None = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 create_deadline_seconds: float = DEFAULT_CREATE_DEADLINE_SECONDS,
                 escrow_most_pods: int = DEFAULT_ESCROW_MOST_PODS,
                 forwarding: Callable[[], bool] = lambda: False, journal: Path | None = None) -> StrictParts:
    """Build strict accounting over the CoreV1Api ``core`` and the ledger namespace.

    ``replica``: this process's name in the ledger (its escrow entries carry it, so a restarted
    service's are another's); ``forwarding``: whether another replica writes now (its reconciler
    then stands by); ``journal``: the escrow journal's file, kept for a successor of this process."""
    escrow_window = ESCROW_WINDOW_SECONDS if escrow_most_pods else 0.0
    # After a deletion, what only the lost object held expires within a reservation TTL, or for an
    # escrow entry, its window plus that TTL.
    store = LedgerStore(core, namespace, hold_seconds=state.ledger.ttl_seconds + escrow_window, clock=clock)
    readiness = LedgerReadiness(store)
    committer = Committer(state, store, readiness, EscrowJournal(journal),
                          replica=replica or f"{socket.gethostname()}/{os.getpid()}", clock=clock,
                          monotonic=monotonic, escrow_most_pods=escrow_most_pods, escrow_window=escrow_window)
    accounting = StrictAccounting(state, committer, clock=clock, monotonic=monotonic)
    return StrictParts(store, readiness, committer, accounting,
                       Reconciler(state, store, clock=clock, create_deadline_seconds=create_deadline_seconds,
                                  forwarding=forwarding))

