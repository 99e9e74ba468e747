"""Strict accounting: record each admission in a shared ledger object before answering.

Several replicas each hold their own view of pods and quotas, so room is only ever handed out
through a write to the API server that carries the resourceVersion the decision was made on
(``gpuquota_core.shared_ledger`` explains the object and the counting rules; docs/design.md the
invariant). One replica writes, the holder of the writer Lease, and the others forward it
everything they would have written (``forwarding``). Each admission is decided in one of two modes:

- ``Mode.WRITER``: this replica is the writer (it holds the Lease, or was asked by a forwarder). It
  decides on its cached copy of the ledger, which only its own writes change while it is the one
  writer, and may take room in escrow for pods of one shape (``escrow``).
- ``Mode.DEGRADED``, "decide here": the writer cannot be asked (no holder known, its port closed,
  no answer in time), or no writer Lease is configured. Correct whoever else writes, because the
  compare-and-swap on the ledger is the only fence: it reads the ledger fresh for every commit,
  group-commits under the read's resourceVersion, takes no escrow, and answers a pod whose room is
  lent to another replica's escrow with a retryable 503 at once.

The pieces: ``committer`` (the group commit and its CAS loop), ``batch_plan`` (one attempt's
verdicts and the ledger edits they make, ``ledger_edits``), ``escrow`` (with its journal),
``withdrawals`` (room of admissions whose "allowed" never left), ``reconciler``, ``readiness``,
``store`` with ``tree_ledger``, ``ledger_object`` and ``registry`` (the objects), ``writer_lease``, ``forwarding`` and
``peer``. Why a hand-over of the writer is safe by compare-and-swap and the watch gate alone:
docs/design.md.
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
from webhook.quota.strict.batch_plan import Job
from webhook.quota.strict.committer import Committer
from webhook.quota.strict.escrow import DEFAULT_ESCROW_MOST_PODS, ESCROW_WINDOW_SECONDS, EscrowJournal, escrow_shape
from webhook.quota.strict.judgement import tree_of
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

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf, mode: Mode = Mode.WRITER) -> Verdict:
        """Decide and record ``admission``; ``answer_by``: the monotonic time after which the worker no
        longer waits for the answer, so nothing is admitted after it."""
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
                self.committer.queue(tree_root).withdrawals.add(
                    [Withdrawal(f"{admission.namespace}/{admission.name}", admission.uid)])
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


class DecideHere:
    """Without a writer Lease every replica decides its own admissions, in the degraded mode: fresh
    reads, no escrow (escrow lives at a writer only)."""

    def __init__(self, accounting: StrictAccounting) -> None:
        self.accounting = accounting

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict:
        return self.accounting.admit_pod(admission, answer_by, Mode.DEGRADED)

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        return self.accounting.withdraw_unanswered(admissions)
