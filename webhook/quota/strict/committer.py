"""The group commit: one ledger write in flight per tree at this replica, carrying every admission
queued behind the previous one, under the resourceVersion it was decided on.

Per quota tree, the first admission that finds no commit in flight becomes the committer: it takes
everything queued (its own job included), reads the ledger (``store``), plans the write
(``batch_plan``: verdicts and the edits they make), writes it with the read's resourceVersion as
precondition, and answers. On a conflict the whole batch is planned again from a fresh read:
nothing judged in a failed attempt is admitted without being judged again (kubernetes#141904 in the
native ResourceQuota plugin reused an earlier verdict). When the write cannot be made (the API is
down, conflicts persist past the budget) the batch is refused: the failure mode is a refusal, never
an unrecorded admission. The same write settles this replica's spent escrows and carries the
tree's pending withdrawals (``withdrawals``).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuquota_core.enforcement import LEDGER_UNAVAILABLE
from gpuquota_core.pod_admission import Verdict
from webhook.quota import metrics
from webhook.quota.state import QuotaState
from webhook.quota.strict.batch_plan import BatchPlan, EscrowTerms, Job, LedgerRead, plan_batch, pruned
from webhook.quota.strict.escrow import Escrow, EscrowBook, EscrowJournal, SettleEscrow
from webhook.quota.strict.readiness import LedgerReadiness
from webhook.quota.strict.store import LedgerStore, LedgerUnavailable
from webhook.quota.strict.withdrawals import Withdrawal, late_answers, late_verdict

log = logging.getLogger("gpuquota.quota")
# Conflicts are rare with one writer but the rule under a hand-over or in the degraded mode: retry
# with jittered backoff, within a budget well under the webhook timeout the API server gives us.
RETRY_BUDGET_SECONDS = 3.0
MAX_BACKOFF_SECONDS = 0.05


@dataclass
class TreeQueue:
    # Taken inside the quota state's lock while a commit plans (closing escrows), so nothing may
    # take the state's lock while holding it.
    condition: threading.Condition = field(default_factory=threading.Condition)
    pending: list[Job] = field(default_factory=list)
    committing: bool = False
    escrows: EscrowBook = field(default_factory=EscrowBook)  # guarded by ``condition``
    # What the tree's next write withdraws (any thread adds; the committer takes them all, and puts back
    # what a failed write did not store); guarded by ``condition``.
    withdrawals: list[Withdrawal] = field(default_factory=list)
    # A previous process's escrows of this tree to take back (escrow.EscrowJournal); guarded by ``condition``.
    takebacks: list[SettleEscrow] = field(default_factory=list)


@dataclass
class _Commit:
    """What one commit of a tree carries from one attempt to the next (only its committer touches it)."""

    batch: list[Job]  # the jobs not answered yet
    settling: list[Escrow]  # closed escrows whose pods the write records
    takebacks: list[SettleEscrow]  # a previous process's escrows, replaced by what it journalled
    withdrawals: list[Withdrawal]  # taken from the queue; put back unless written
    give_up_at: float  # the oldest job's arrival plus the budget: queueing counts too
    fresh: bool  # read the object from the API server, not the cache
    degraded: bool  # decided here while the writer cannot be asked: fresh reads, no escrow
    conflicts: int = 0
    # What the write in flight stores for the batch: should it fail without saying whether it
    # landed (a timeout, a reset), the batch is refused, so all of it is withdrawn.
    in_flight: list[Withdrawal] = field(default_factory=list)

    def unfinished(self) -> bool:
        return bool(self.batch or self.settling or self.withdrawals or self.takebacks)


class _BatchRefused(Exception):
    """The jobs of the commit not answered yet are refused (a held tree, a lagging watch, conflicts)."""


class Committer:
    def __init__(self, state: QuotaState, store: LedgerStore, readiness: LedgerReadiness, journal: EscrowJournal, *,
                 replica: str, clock: Callable[[], float], monotonic: Callable[[], float], escrow_most_pods: int,
                 escrow_window: float) -> None:
        self.state, self.store, self.readiness, self.journal = state, store, readiness, journal
        self.replica = replica
        self.clock = clock  # wall clock: the ledger's times
        self.monotonic = monotonic  # the clock of the workers' answer deadlines (CLOCK_MONOTONIC)
        self.escrow_most_pods, self.escrow_window = escrow_most_pods, escrow_window
        self._escrow_ids = itertools.count(1)
        self._queues: dict[str, TreeQueue] = {}
        self._queues_lock = threading.Lock()
        # What a previous quota service of this replica admitted from its escrows: taken back by the
        # first writes of their trees (the settler makes them within its round).
        for tree_root, entries in journal.take_over().items():
            self.queue(tree_root).takebacks.extend(
                SettleEscrow(key, tuple(admitted), taken_back=True) for key, admitted in entries.items())

    def queue(self, tree_root: str) -> TreeQueue:
        with self._queues_lock:
            return self._queues.setdefault(tree_root, TreeQueue())

    def submit(self, tree_root: str, job: Job, queue: TreeQueue) -> Verdict:
        """Queue ``job`` (the caller holds ``queue.condition``) and wait for its verdict, committing
        the queue itself when no commit is in flight."""
        queue.pending.append(job)
        while job.verdict is None and queue.committing:
            queue.condition.wait()
        if job.verdict is not None:
            return job.verdict
        batch, queue.pending = queue.pending, []
        queue.committing = True
        queue.condition.release()
        try:
            self._commit_as_committer(tree_root, queue, batch)
        finally:
            queue.condition.acquire()
        assert job.verdict is not None
        return job.verdict

    def settle_due(self) -> None:
        """The settler's round: write what spent escrows admitted and give back the rest, carry
        pending withdrawals and take-backs; then compact the journal if nothing in it is owed."""
        now, owed = self.clock(), False
        with self._queues_lock:
            queues = list(self._queues.items())
        for tree_root, queue in queues:
            with queue.condition:
                owed = owed or queue.escrows.owed()
                if queue.committing or not (queue.withdrawals or queue.takebacks
                                            or queue.escrows.due(now, self.state.tree_version)):
                    continue  # a commit in flight settles them anyway
                queue.committing = True
            self._commit_as_committer(tree_root, queue, [])
        self.journal.compact_if_idle(owed)

    def _commit_as_committer(self, tree_root: str, queue: TreeQueue, batch: list[Job]) -> None:
        try:
            self._commit(tree_root, queue, batch)
        finally:
            with queue.condition:
                queue.committing = False
                queue.condition.notify_all()

    def _commit(self, tree_root: str, queue: TreeQueue, batch: list[Job]) -> None:
        with queue.condition:
            # Escrows that can admit nothing more are closed and written; open ones of other shapes
            # stay open (pods of two leaves of one tree alternate, and would close each other's).
            queue.escrows.close(self.clock(), self.state.tree_version, only_spent=True)
            settling, takebacks = list(queue.escrows.settling), list(queue.takebacks)
            withdrawals, queue.withdrawals = queue.withdrawals, []
        degraded = any(job.degraded for job in batch)
        commit = _Commit(batch, settling, takebacks, withdrawals,
                         give_up_at=min((job.submitted for job in batch), default=time.monotonic())
                         + RETRY_BUDGET_SECONDS,
                         fresh=degraded or bool(withdrawals), degraded=degraded)
        try:
            self._attempt_until_done(tree_root, queue, commit)
            return
        except _BatchRefused as refusal:
            reason = str(refusal)
        except Exception as error:  # connection errors of every kind too: refuse rather than admit unrecorded
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = str(error) if isinstance(error, LedgerUnavailable) else \
                f"the shared quota ledger is unreachable: {error}"
            self.readiness.failed(reason)
        with queue.condition:
            queue.withdrawals.extend([*commit.withdrawals, *commit.in_flight])
        if commit.batch:
            log.warning("strict accounting: refusing %d admissions: %s", len(commit.batch), reason)
        for job in commit.batch:
            job.verdict = Verdict(False, f"pod not admitted: {reason}; retry shortly", reason=LEDGER_UNAVAILABLE)

    def _attempt_until_done(self, tree_root: str, queue: TreeQueue, commit: _Commit) -> None:
        """Read, plan, write and answer until every job is answered and everything is written."""
        while commit.unfinished():
            if commit.conflicts and time.monotonic() > commit.give_up_at:
                raise _BatchRefused(f"the shared quota ledger of tree {tree_root} kept changing ({commit.conflicts} "
                                    f"conflicts in {RETRY_BUDGET_SECONDS:g}s)")
            commit.batch = self._without_late(commit.batch)
            if not commit.unfinished():
                return
            with queue.condition:
                # Spent while this commit retried: given back in its next write, not after it.
                if queue.escrows.close(self.clock(), self.state.tree_version, only_spent=True):
                    commit.settling = list(queue.escrows.settling)
            read = self._read_and_check_hold(tree_root, commit)
            if read is None:
                continue
            # The watch gate guards decisions. A write that decides nothing (settling, withdrawing,
            # taking back) only gives room back or keeps it: it needs no gate, so a restarted writer
            # takes back its predecessor's escrow before its own list of pods is done.
            gate = self.state.snapshot_once_pods_through(read.pods_counted_through if commit.batch else 0,
                                                         commit.give_up_at - time.monotonic())
            with gate as view:
                if view is None:
                    raise _BatchRefused(
                        f"this replica's watch of pods has not caught up with the shared quota ledger of tree "
                        f"{tree_root} (seen through resourceVersion {self.state.pod_versions.seen_through}, "
                        f"the ledger counts pods through {read.pods_counted_through})")
                with queue.condition:
                    open_escrow = bool(queue.escrows.open)
                    terms = None if commit.degraded or not self.escrow_most_pods else EscrowTerms(
                        self.replica, self.escrow_most_pods, self.escrow_window, self._escrow_ids,
                        frozenset(queue.escrows.open))
                plan = plan_batch(view, read, commit.batch, commit.settling, commit.withdrawals, self.replica,
                                  terms, open_escrow, commit.takebacks)
                if plan is None:
                    # Refused for room this replica itself holds in escrow: all of it is given
                    # back in this write, and the batch judged again without it.
                    with queue.condition:
                        queue.escrows.close(read.now, view.tree_version, only_spent=False)
                        commit.settling = list(queue.escrows.settling)
                    continue
            if not self._write(tree_root, queue, commit, read, plan):
                continue  # a conflict: planned again from a fresh read
            self._answer(queue, commit, plan)

    def _read_and_check_hold(self, tree_root: str, commit: _Commit) -> LedgerRead | None:
        """The tree's ledger as stored; None when a deleted object was let go (read it again).

        _BatchRefused while the tree is held: reservations only a lost object held may still take room."""
        version, stored = self.store.read(tree_root, commit.fresh)
        if self.store.finish_deletion(tree_root, version):
            commit.fresh = True
            return None
        now, record = self.clock(), self.store.record(tree_root)
        if now < record.held_until:
            if record.owes_rewrite() or not version:  # what it carried, and the hold, go into the object
                with self.state.snapshot() as view:
                    kept, counted_through = pruned(view, stored, now)
                self.store.write(tree_root, version, kept, pods_counted_through=counted_through)
            cause = record.hold_cause or "was deleted or could not be read"  # a hold read from the object does not say
            raise _BatchRefused(f"the shared quota ledger of tree {tree_root} {cause}; reservations only it held "
                                f"may still take room for {record.held_until - now:.1f}s, until they expire")
        return LedgerRead(version, stored, now, record.pods_counted_through)

    def _write(self, tree_root: str, queue: TreeQueue, commit: _Commit, read: LedgerRead, plan: BatchPlan) -> bool:
        """Store the plan if the object is still at the version read (nothing to store: done); False
        on a conflict, after a jittered pause."""
        if not plan.changes:  # nothing to write: what they withdraw or take back is gone already
            with queue.condition:
                queue.takebacks = [each for each in queue.takebacks if each not in commit.takebacks]
            commit.settling, commit.withdrawals, commit.takebacks = [], [], []
            return True
        commit.in_flight = [Withdrawal(item.reservation.pod_key, item.reservation.admission_uid)
                            for item in plan.new() if item.reservation.pod_key not in plan.held_before]
        if plan.taken is not None:
            commit.in_flight.append(Withdrawal(plan.taken.entry_key, plan.keep[plan.taken.entry_key]
                                               .reservation.admission_uid))
        written = self.store.write(tree_root, read.version, plan.keep, pods_counted_through=plan.pods_counted_through)
        commit.in_flight = []
        if not written:
            metrics.LEDGER_WRITES.labels("conflict").inc()
            commit.conflicts += 1
            commit.fresh = True
            # Jitter, so the replicas that just collided do not collide again in lockstep.
            time.sleep(random.uniform(0, min(MAX_BACKOFF_SECONDS, 0.002 * 2 ** commit.conflicts)))
            return False
        metrics.LEDGER_WRITES.labels("ok").inc()
        metrics.LEDGER_BATCH.observe(len(plan.new()) + sum(len(escrow.admitted) for escrow in commit.settling))
        with queue.condition:
            if plan.taken is not None:  # journalled before it admits anything, for a successor to take back
                self.journal.took(tree_root, plan.taken.entry_key)
            queue.escrows.written(commit.settling, plan.taken)
            queue.takebacks = [each for each in queue.takebacks if each not in commit.takebacks]
        commit.settling, commit.withdrawals, commit.takebacks = [], [], []
        return True

    def _answer(self, queue: TreeQueue, commit: _Commit, plan: BatchPlan) -> None:
        """Answer the jobs the written attempt decided; an "allowed" decided after its worker's
        deadline is a refusal instead, and what was written only for it is withdrawn in the tree's
        next write (``withdrawals.late_answers``)."""
        late, withdrawals = late_answers([job.answer_by for job in commit.batch], plan.results, plan.held_before,
                                         self.monotonic())
        with queue.condition:
            queue.withdrawals.extend(withdrawals)
        if late:
            log.warning("strict accounting: %d admissions were decided after their workers stopped waiting; "
                        "refused, and their reservations withdrawn in the next write", len(late))
        for index, (job, (verdict, _)) in enumerate(zip(commit.batch, plan.results, strict=True)):
            job.verdict = late_verdict(job.admission, "decided it") if index in late else verdict
        commit.batch = []

    def _without_late(self, batch: list[Job]) -> list[Job]:
        """The jobs whose worker still waits; the others are refused before anything is written for them."""
        now = self.monotonic()
        for job in batch:
            if now >= job.answer_by:
                job.verdict = late_verdict(job.admission, "reached it")
        return [job for job in batch if job.verdict is None]

    def run_settler(self, stop: threading.Event) -> None:
        while not stop.wait(max(self.escrow_window / 4, 0.05)):
            try:
                self.settle_due()
            except Exception as error:  # the next round, or the next admission's write, settles them
                log.warning("strict accounting: settling escrow failed: %s", error)
