"""Strict accounting: record each admission in a shared ledger object before answering.

Several replicas each hold their own view of pods and quotas, so room is only ever handed out
through a write to the API server that carries the resourceVersion the decision was made on
(``gpuquota_core.shared_ledger`` explains the object and the counting rules). Per quota tree, one
write is in flight at a time from this replica and it carries every admission that queued up
behind the previous one (a group commit): under a burst the write rate stays bounded while the
admission rate grows with the batch size.

A write that admits a pod may also take room in escrow (``webhook.quota.strict.escrow``): this
replica then admits pods of that shape without writing until the escrow is spent, and its next
write to the tree, or the settler, replaces the entry by a reservation per pod admitted from it.
A pod refused for room this replica itself holds in escrow gets
it back in that write; one refused only while other replicas hold escrow in its tree waits for them
to give it back (within the retry budget) and is judged again.

On a conflict the whole batch is decided again from the freshly read object: nothing admitted in
a failed attempt is admitted again without being re-judged, so a request denied in one attempt can
never pass on a retry because an earlier verdict was reused (kubernetes#141904 in the native
ResourceQuota plugin). When the write cannot be made (the API is down, conflicts persist) the
admissions of the batch are refused: the webhook's failure mode, never an unrecorded admission.

When is a reservation's room provably free before its TTL? Only when its pod can never be stored.
The webhook timeout (5 s) does not prove it: it bounds how long the apiserver waits for our answer,
not the create. After the validating webhooks the apiserver still writes the pod to etcd, and that
write is bounded only by the create request's own deadline (kube-apiserver ``--request-timeout``,
60 s by default; a client may ask for less). With etcd paused, a create admitted just before the
pause lands when etcd resumes, however late our answer was. And "our answer left after the webhook
timeout" is no proof either: a paused apiserver that resumes finds both our answer and its expired
timer ready and may take either. So the rule (``StrictAccounting._lost``, run by the reconciler) is:
past the create deadline (``create_deadline_seconds``, the apiserver's default), a consistent GET
of the pod that finds no pod with the reservation's uid proves the create failed, and its room is
released. Under the default TTL (30 s) the TTL releases first; the rule earns its place with a TTL
at or above the create deadline, which is also the only setting under which a reservation never
expires while its create can still land (see docs/reliability.md, "Known limits").
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuquota_core import shared_ledger
from gpuquota_core.enforcement import ANSWER_TOO_LATE, ESCROW_NOT_BACK, LEDGER_UNAVAILABLE, QUOTA_EXCEEDED
from gpuquota_core.ledger import Reservation, ReservationLedger
from gpuquota_core.pod_admission import ALLOW, PodAdmission, Verdict, quota_requests
from webhook.quota import metrics
from webhook.quota.state import QuotaState, QuotaView
from webhook.quota.strict.escrow import (
    DEFAULT_ESCROW_MOST_PODS,
    ESCROW_SHARE,
    ESCROW_WAIT_SECONDS,
    ESCROW_WINDOW_SECONDS,
    Escrow,
    EscrowShape,
    ShapeKey,
    due_back,
    escrow_room,
    escrow_shape,
    lent_out,
    settled,
    take_escrow,
)
from webhook.quota.strict.judgement import Judged, Requests, judge_batch_holding, pruned, tree_of
from webhook.quota.strict.store import LedgerStore, LedgerUnavailable

log = logging.getLogger("gpuquota.quota")
# Conflicts are the normal case under a burst spread over replicas: retry with jittered backoff,
# within a budget well under the webhook timeout the API server gives us (a few seconds).
RETRY_BUDGET_SECONDS = 3.0
MAX_BACKOFF_SECONDS = 0.05
# How long after its admission a pod create can still be written to etcd: kube-apiserver's
# --request-timeout (its default), which bounds the whole create request, the storage write after
# the admission webhooks included. Not the webhook timeout: that bounds only the wait for our answer.
DEFAULT_CREATE_DEADLINE_SECONDS = 60.0
# How often the ledger namespace is checked for writes (a dry-run create) while readiness says it
# cannot be written, and while it can.
LEDGER_CHECK_FAILING_SECONDS = 1.0
LEDGER_CHECK_SECONDS = 10.0
# A refusal for room judged on a cached copy older than this is judged again on a fresh read (_judge).
REFUSAL_COPY_SECONDS = 1.0


@dataclass
class _Job:
    admission: PodAdmission
    # Its quota_requests, read once on arrival: for its escrow shape, every judgement and the escrow's room.
    requests: Requests
    shape: EscrowShape | None = None
    verdict: Verdict | None = None
    submitted: float = field(default_factory=time.monotonic)
    # Monotonic time by which the worker must have the answer (inf: no bound); an "allowed" decided
    # later would reach nobody, so it is turned into a refusal and its reservation withdrawn.
    answer_by: float = math.inf


@dataclass(frozen=True)
class _Withdrawal:
    """A reservation this replica wrote for an admission it then refused for answering too late: it is
    taken out of the object by the next write, if the entry is still exactly the one written.

    ``unanswered``: an admission its worker answered as refused because it got no answer from its
    quota service at all (``withdraw_unanswered``); every entry any replica wrote for it goes."""

    pod_key: str
    admission_uid: str
    admitted_at: float
    unanswered: bool = False

    def matches(self, item: shared_ledger.StoredReservation, replica: str) -> bool:
        if item.reservation.admission_uid != self.admission_uid:
            return False
        return self.unanswered or (item.replica == replica and round(item.admitted_at, 3) == round(self.admitted_at, 3))


@dataclass
class _TreeQueue:
    # Taken inside the quota state's lock while a commit judges (closing and taking escrows), so
    # nothing may take the state's lock while holding it.
    condition: threading.Condition = field(default_factory=threading.Condition)
    pending: list[_Job] = field(default_factory=list)
    committing: bool = False
    # Open escrows by shape key; closed ones whose pods the next successful write records.
    escrows: dict[ShapeKey, Escrow] = field(default_factory=dict)
    settling: list[Escrow] = field(default_factory=list)
    # Reservations of admissions answered as refused after their write; only the committer changes it.
    withdrawals: list[_Withdrawal] = field(default_factory=list)


@dataclass
class _Commit:
    """What one commit of a tree carries from one attempt to the next (only its committer touches it)."""

    batch: list[_Job]  # the jobs not answered yet
    settling: list[Escrow]  # closed escrows whose pods the write records
    withdrawals: list[_Withdrawal]
    # Counted from the oldest job's arrival: time spent queued behind the previous commit is part
    # of the budget, so no admission outlives the API server's webhook timeout.
    give_up_at: float
    fresh: bool  # read the object from the API server, not the cache
    conflicts: int = 0
    # What the write in flight stores for the batch: should it fail without saying whether it landed
    # (a timeout, a reset), the batch is refused, so all of it is withdrawn (see _Withdrawal).
    in_flight: list[_Withdrawal] = field(default_factory=list)

    def unfinished(self) -> bool:
        return bool(self.batch or self.settling or self.withdrawals)


@dataclass(frozen=True)
class _LedgerRead:
    """The tree's ledger object as one attempt read it, and when (wall clock)."""

    version: str
    stored: dict[str, shared_ledger.StoredReservation]
    now: float
    pods_counted_through: int  # how far this replica's pod watch must have got to decide on it
    copy_age: float = 0.0  # seconds since this copy came from the API server (0: read fresh now)


@dataclass(frozen=True)
class _Plan:
    """One attempt's judgement, and what its write stores."""

    results: list[Judged]
    keep: dict[str, shared_ledger.StoredReservation]  # the object's reservations after the write
    held_before: set[str]  # the entries there before this batch's reservations were added
    waiting: set[int]  # the jobs to judge again once other replicas' escrows are back
    new: list[Reservation]
    withdrawn: bool
    pods_counted_through: int
    taken: tuple[Escrow, shared_ledger.StoredReservation] | None  # a new escrow and its entry


class _BatchRefused(Exception):
    """The jobs of the commit not answered yet are refused (a held tree, a lagging watch, conflicts)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StrictAccounting:
    def __init__(self, state: QuotaState, store: LedgerStore, replica: str | None = None,
                 clock: Callable[[], float] = time.time,
                 create_deadline_seconds: float = DEFAULT_CREATE_DEADLINE_SECONDS,
                 escrow_most_pods: int = DEFAULT_ESCROW_MOST_PODS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.monotonic = monotonic  # the clock of the workers' answer deadlines (CLOCK_MONOTONIC)
        self.create_deadline_seconds = create_deadline_seconds
        self.escrow_most_pods = escrow_most_pods
        self.escrow_window = ESCROW_WINDOW_SECONDS if escrow_most_pods else 0.0
        # After a deletion, what only the lost object held expires within a reservation TTL, or
        # for an escrow entry, its window plus that TTL.
        store.clock, store.hold_seconds = clock, state.ledger.ttl_seconds + self.escrow_window
        self.store = store
        self._escrow_ids = itertools.count(1)
        self.replica = replica or f"{socket.gethostname()}/{os.getpid()}"
        self.clock = clock
        self._queues: dict[str, _TreeQueue] = {}
        self._queues_lock = threading.Lock()
        # Why this replica cannot decide now ("" when it can), for readiness: set by the namespace
        # check and by ledger writes that fail for a reason other than a conflict or a held tree.
        self._ledger_problem = f"the ledger namespace {store.namespace} has not been checked yet"
        # With --writer-lease: whether another replica holds it now (webhook.quota.strict.writer_lease).
        self.writer_elsewhere: Callable[[], bool] = lambda: False

    def ledger_problem(self) -> str:
        return self._ledger_problem

    def check_ledger(self) -> bool:
        """Check that the ledger namespace can be written, for readiness; whether it can."""
        try:
            self.store.check_writable()
        except LedgerUnavailable as error:
            if str(error) != self._ledger_problem:
                log.warning("strict accounting: not ready: %s", error)
            self._ledger_problem = str(error)
            return False
        self._ledger_problem = ""
        return True

    def run_ledger_check(self, stop: threading.Event) -> None:
        """Check at once, then every LEDGER_CHECK_SECONDS, or every LEDGER_CHECK_FAILING_SECONDS while failing."""
        while True:
            ok = self.check_ledger()
            if stop.wait(LEDGER_CHECK_SECONDS if ok else LEDGER_CHECK_FAILING_SECONDS):
                return

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict:
        """Decide and record ``admission``; ``answer_by``: the monotonic time after which the worker no
        longer waits for the answer, so nothing is admitted after it (see ``_late``)."""
        if self.monotonic() >= answer_by:  # queued in the socket while this process was stopped or busy
            return self._late(admission, "arrived")
        requests = quota_requests(admission)
        with self.state.snapshot() as view:
            shape = escrow_shape(view, admission, requests) if self.escrow_most_pods else None
            # A shape's chain ends at the tree's root: one resolution of the pod's quota, not two.
            tree_root = shape.quotas[-1] if shape is not None else tree_of(view, admission)
        if tree_root is None:
            return self.state.admit_pod(admission, requests)  # no quota: nothing to share
        queue = self._queue(tree_root)
        job = _Job(admission, requests, shape, answer_by=answer_by)
        with queue.condition:
            if shape is not None:
                escrow = queue.escrows.get(shape.key())
                now = self.clock()
                if escrow is not None and escrow.admits(shape, now):
                    escrow.admitted.append(Reservation(
                        f"{admission.namespace}/{admission.name}", admission.uid, shape.quotas, shape.resources(),
                        now + self.state.ledger.ttl_seconds, admission.pod_uid, {}, admission.caller))
                    metrics.ESCROW_ADMISSIONS.inc()
                    return ALLOW
            queue.pending.append(job)
            while job.verdict is None and queue.committing:
                queue.condition.wait()
            if job.verdict is not None:
                return job.verdict
            # No commit in flight: this thread commits everything queued so far, its own job included.
            batch, queue.pending = queue.pending, []
            queue.committing = True
        self._commit_as_committer(tree_root, queue, batch)
        assert job.verdict is not None
        return job.verdict

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        """Take out, in the next write of their trees, what any replica reserved for ``admissions``.

        Their workers refused them after an attempt that got no answer (``webhook.quota.client``):
        the quota service died or hung with it, though it, or the writer it forwarded to, may have
        written the reservation already. Safe for the same reason as a late answer's withdrawal: that
        refusal was the only answer the apiserver got, so no pod is stored on the strength of these
        reservations. Without it, their room stayed taken for a whole TTL after the service was killed.

        False, taking none, until the quota state is synced (a restarted service is asked first of
        all): only then does it know the trees."""
        with self.state.snapshot() as view:
            if not view.synced:
                return False
            trees = [None if admission.dry_run else tree_of(view, admission) for admission in admissions]
        for admission, tree_root in zip(admissions, trees, strict=True):
            if tree_root is None:
                continue
            queue = self._queue(tree_root)
            with queue.condition:
                queue.withdrawals.append(_Withdrawal(f"{admission.namespace}/{admission.name}", admission.uid, 0.0,
                                                     unanswered=True))
        log.info("strict accounting: withdrawing what was reserved for %d admissions refused after an attempt got no "
                 "answer: %s", len(admissions), ", ".join(f"{a.namespace}/{a.name}" for a in admissions[:10]))
        return True

    def _commit_as_committer(self, tree_root: str, queue: _TreeQueue, batch: list[_Job]) -> None:
        """Commit ``batch`` (the caller has set ``queue.committing``), then hand the role back."""
        try:
            self._commit(tree_root, batch)
        finally:
            with queue.condition:
                queue.committing = False
                queue.condition.notify_all()

    def _queue(self, tree_root: str) -> _TreeQueue:
        with self._queues_lock:
            return self._queues.setdefault(tree_root, _TreeQueue())

    def _commit(self, tree_root: str, batch: list[_Job]) -> None:
        """Decide ``batch`` and write the ledger of ``tree_root`` (this thread is the tree's committer).

        The write also records the pods admitted from this replica's spent escrows of the tree
        (closed first; open ones of other shapes stay open, and all are closed when a pod would
        otherwise be refused for room they hold), and may take a new escrow for the shape of the
        batch's last admitted CREATE when none is open for it.
        """
        queue = self._queue(tree_root)
        # Escrows that can admit nothing more are closed and written; open ones of other shapes
        # stay open, their entries carried through this write as stored (pods of several leaves
        # of one tree alternate, and each would otherwise close the other's escrow).
        self._close_escrows(queue, only_spent=True, tree_version=self.state.tree_version)
        withdrawals = list(queue.withdrawals)
        commit = _Commit(batch, list(queue.settling), withdrawals,  # only the committer changes them from here
                         give_up_at=min((job.submitted for job in batch), default=time.monotonic())
                         + RETRY_BUDGET_SECONDS,
                         # The cached copy may predate the write that stored what they withdraw.
                         fresh=bool(withdrawals))
        try:
            self._attempt_until_done(tree_root, queue, commit)
            return
        except _BatchRefused as refusal:
            reason = refusal.reason
        except LedgerUnavailable as error:
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = self._ledger_problem = str(error)  # not ready until the namespace check passes again
        except Exception as error:  # connection errors of every kind: refuse rather than admit unrecorded
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = self._ledger_problem = f"the shared quota ledger is unreachable: {error}"
        queue.withdrawals.extend(commit.in_flight)
        if commit.batch:
            log.warning("strict accounting: refusing %d admissions: %s", len(commit.batch), reason)
        for job in commit.batch:
            job.verdict = Verdict(False, f"pod not admitted: {reason}; retry shortly",
                                  reason=LEDGER_UNAVAILABLE)

    def _attempt_until_done(self, tree_root: str, queue: _TreeQueue, commit: _Commit) -> None:
        """Read, judge, write and answer until every job is answered and everything is written;
        _BatchRefused when the jobs left must be refused.

        On a conflict the whole batch is judged again from a fresh read: nothing judged in a failed
        attempt is admitted without being judged again."""
        while commit.unfinished():
            if commit.conflicts and time.monotonic() > commit.give_up_at:
                raise _BatchRefused(f"the shared quota ledger of tree {tree_root} kept changing ({commit.conflicts} "
                                    f"conflicts in {RETRY_BUDGET_SECONDS:g}s)")
            commit.batch = self._without_late(commit.batch)
            if not commit.unfinished():
                return
            if self._close_escrows(queue, only_spent=True, tree_version=self.state.tree_version):
                # Spent while this commit retried (conflicts, or jobs waiting for others' escrow):
                # given back in its next write, not after it, where other replicas may be waiting.
                commit.settling = list(queue.settling)
            read = self._read_and_check_hold(tree_root, commit)
            if read is None:
                continue
            with self.state.snapshot_once_pods_through(read.pods_counted_through,
                                                       commit.give_up_at - time.monotonic()) as view:
                if view is None:
                    raise _BatchRefused(
                        f"this replica's watch of pods has not caught up with the shared quota ledger of tree "
                        f"{tree_root} (seen through resourceVersion {self.state.pod_versions.seen_through}, "
                        f"the ledger counts pods through {read.pods_counted_through})")
                plan = self._judge(view, queue, commit, read)
            if plan is None:
                continue  # judged again: without its own escrows, or on a fresh copy (_judge)
            if not self._write(tree_root, queue, commit, read, plan):
                continue  # a conflict: judged again from a fresh read
            self._finish(queue, commit, plan, read.now)

    def _read_and_check_hold(self, tree_root: str, commit: _Commit) -> _LedgerRead | None:
        """The tree's ledger as stored; None when a deleted object was let go (read it again).

        _BatchRefused while the tree is held: reservations only a lost object held may still take room."""
        version, stored = self.store.read(tree_root, commit.fresh)
        if self.store.finish_deletion(tree_root, version):
            commit.fresh = True
            return None
        now = self.clock()
        held_until = self.store.recovering_until(tree_root)
        if now < held_until:
            self._record_hold(tree_root, version, stored, now)
            raise _BatchRefused(f"the shared quota ledger of tree {tree_root} {self.store.hold_cause(tree_root)}; "
                                f"reservations only it held may still take room for {held_until - now:.1f}s, "
                                f"until they expire")
        return _LedgerRead(version, stored, now, self.store.pods_counted_through(tree_root),
                           0.0 if commit.fresh else self.store.copy_age(tree_root))

    def _judge(self, view: QuotaView, queue: _TreeQueue, commit: _Commit, read: _LedgerRead) -> _Plan | None:
        """Judge the batch on the ledger as read, on one view of this replica's state, and plan the
        write: what is kept, settled, withdrawn, reserved and taken in escrow. None when the batch is
        to be judged again: refused for room this replica itself holds in escrow, which it gives back
        instead, or refused on a cached copy older than REFUSAL_COPY_SECONDS (read it afresh)."""
        kept, pods_counted_through = pruned(view, read.stored, read.now)
        keep = settled(kept, commit.settling, self.replica, read.now, view.ttl_seconds)
        withdrawn = self._withdraw(keep, commit.withdrawals)
        held_before = set(keep)
        results, holding = judge_batch_holding(view, [job.admission for job in commit.batch], keep, read.now,
                                               [job.requests for job in commit.batch])
        refused_for_room = any(verdict.reason == QUOTA_EXCEEDED for verdict, _ in results)
        if refused_for_room and read.copy_age >= REFUSAL_COPY_SECONDS:
            # A refusal writes nothing, so nothing would refresh this copy: room another replica
            # gave back since (a withdrawal, a reconcile) would be refused until this replica's
            # next write. Judged again on a fresh read; under load its own writes keep it fresher.
            commit.fresh = True
            return None
        if refused_for_room and self._close_escrows(queue, only_spent=False, tree_version=view.tree_version):
            # Refused for room this replica itself holds in escrow for other shapes: give all of it
            # back in this write and judge the batch again without it.
            commit.settling = list(queue.settling)
            return None
        waiting: set[int] = set()
        if refused_for_room:
            results, waiting = self._wait_for_escrow_due_back(view, commit, results, keep, read.now)
        new = [reservation for _, reservation in results if reservation is not None]
        for reservation in new:
            keep[reservation.pod_key] = shared_ledger.StoredReservation(reservation, self.replica, read.now)
        for gang in shared_ledger.opened_gangs(holding, keep, self.replica, read.now):
            # Written with the member that opened it, and withdrawn with it (the same admission uid).
            keep[gang.reservation.pod_key] = gang
            new.append(gang.reservation)
        taken = None if waiting else self._take_escrow(view, queue, commit.batch, results, holding, read.now)
        if taken is not None:
            keep[taken[0].entry_key] = taken[1]
        return _Plan(results, keep, held_before, waiting, new, withdrawn, pods_counted_through, taken)

    def _wait_for_escrow_due_back(self, view: QuotaView, commit: _Commit, results: list[Judged],
                                  keep: dict[str, shared_ledger.StoredReservation],
                                  now: float) -> tuple[list[Judged], set[int]]:
        """The results, and the jobs to judge again once other replicas' escrows are back.

        The room is there, lent to another replica's escrow: not a refusal for the quota. While that
        escrow is due back and there is time, the job waits for it; otherwise the worker is told so
        (EscrowNotBackInTime) and asks once more, with a deadline of its own."""
        held_back, due = self._held_back_by_escrow(view, commit.batch, results, keep, now)
        if held_back and not (due and self._time_to_wait(commit.give_up_at, commit.batch)):
            return [(self._escrow_not_back(commit.batch[index].admission, held_back[index], due, keep, now), None)
                    if index in held_back else result for index, result in enumerate(results)], set()
        return results, set(held_back)

    def _write(self, tree_root: str, queue: _TreeQueue, commit: _Commit, read: _LedgerRead, plan: _Plan) -> bool:
        """Store the plan if the object is still at the version read (nothing to store: done); False
        on a conflict, after a jittered pause."""
        if not (plan.new or commit.settling or plan.taken is not None or plan.withdrawn):
            return True
        commit.in_flight = [_Withdrawal(r.pod_key, r.admission_uid, read.now) for r in plan.new
                            if r.pod_key not in plan.held_before]
        if plan.taken is not None:
            commit.in_flight.append(_Withdrawal(plan.taken[0].entry_key, plan.taken[1].reservation.admission_uid,
                                                read.now))
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
        metrics.LEDGER_BATCH.observe(len(plan.new) + sum(len(escrow.admitted) for escrow in commit.settling))
        with queue.condition:
            queue.settling.clear()
            commit.settling = []
            if plan.taken is not None:  # opened for admissions once its write succeeded
                queue.escrows[plan.taken[0].shape.key()] = plan.taken[0]
        return True

    def _finish(self, queue: _TreeQueue, commit: _Commit, plan: _Plan, now: float) -> None:
        """Answer the jobs the written attempt decided; keep those waiting for escrow in the batch."""
        queue.withdrawals, commit.withdrawals = [], []  # written, or their entries were gone already
        results = self._refuse_late_answers(queue, commit.batch, plan.results, plan.waiting, plan.held_before, now)
        for index, (job, (verdict, _)) in enumerate(zip(commit.batch, results, strict=True)):
            if index not in plan.waiting:
                job.verdict = verdict
        # Refused only while other replicas hold escrow in the tree: ask again once they may have
        # given it back, from a fresh read, the verdict judged anew.
        commit.batch = [job for index, job in enumerate(commit.batch) if index in plan.waiting]
        if commit.batch:
            commit.fresh = True
            time.sleep(random.uniform(ESCROW_WAIT_SECONDS / 2, ESCROW_WAIT_SECONDS))

    def _late(self, admission: PodAdmission, when: str) -> Verdict:
        return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted: the quota service "
                       f"{when} after the webhook worker stopped waiting for its answer; retry shortly",
                       reason=ANSWER_TOO_LATE)

    def _without_late(self, batch: list[_Job]) -> list[_Job]:
        """The jobs whose worker still waits; the others are refused before anything is written for them."""
        now = self.monotonic()
        for job in batch:
            if now >= job.answer_by:
                job.verdict = self._late(job.admission, "reached it")
        return [job for job in batch if job.verdict is None]

    def _withdraw(self, keep: dict[str, shared_ledger.StoredReservation], withdrawals: list[_Withdrawal]) -> bool:
        """Take the withdrawn reservations out of ``keep``; whether any was still there."""
        withdrawn = False
        for withdrawal in withdrawals:
            item = keep.get(withdrawal.pod_key)
            if item is not None and withdrawal.matches(item, self.replica):
                del keep[withdrawal.pod_key]
                withdrawn = True
        return withdrawn

    def _refuse_late_answers(self, queue: _TreeQueue, batch: list[_Job],
                             results: list[tuple[Verdict, Reservation | None]], waiting: set[int],
                             held_before: set[str], now: float) -> list[tuple[Verdict, Reservation | None]]:
        """Results with every admission decided after its worker's deadline refused, and the
        reservations written only for such admissions queued for withdrawal (committer only).

        Safe because the worker never receives an "allowed" for these: the pod cannot be stored on
        their strength. A reservation is withdrawn only when no answered admission shares its entry:
        one of the same pod earlier in the ledger (an admission already answered) or in this batch.
        """
        finished = self.monotonic()
        late = {index for index, (job, (verdict, _)) in enumerate(zip(batch, results, strict=True))
                if index not in waiting and verdict.allowed and finished >= job.answer_by}
        if not late:
            return results
        answered = {reservation.pod_key for index, (_, reservation) in enumerate(results)
                    if reservation is not None and index not in late}
        for index in sorted(late):
            reservation = results[index][1]
            if reservation is not None and reservation.pod_key not in held_before | answered:
                queue.withdrawals.append(_Withdrawal(reservation.pod_key, reservation.admission_uid, now))
        log.warning("strict accounting: %d admissions were decided after their workers stopped waiting; "
                    "refused, and their reservations withdrawn in the next write", len(late))
        return [(self._late(batch[index].admission, "decided it") if index in late else verdict, reservation)
                for index, (verdict, reservation) in enumerate(results)]

    def _close_escrows(self, queue: _TreeQueue, only_spent: bool, tree_version: int) -> bool:
        """Close this replica's open escrows of the tree (the spent ones under ``tree_version``, or
        all), for the commit in progress to write; whether it closed any. Nothing is admitted from an
        escrow once closed."""
        with queue.condition:
            now = self.clock()
            closing = [key for key, escrow in queue.escrows.items()
                       if not only_spent or escrow.spent(now, tree_version)]
            for key in closing:
                escrow = queue.escrows.pop(key)
                escrow.open = False
                queue.settling.append(escrow)
            return bool(closing)

    def _time_to_wait(self, give_up_at: float, batch: list[_Job]) -> bool:
        """Whether the batch may ask again once more: within the budget, and before any of its workers stops waiting."""
        return (time.monotonic() + ESCROW_WAIT_SECONDS < give_up_at
                and self.monotonic() + ESCROW_WAIT_SECONDS < min((job.answer_by for job in batch), default=math.inf))

    def _held_back_by_escrow(self, view: QuotaView, batch: list[_Job], results: list[Judged],
                             keep: dict[str, shared_ledger.StoredReservation],
                             now: float) -> tuple[dict[int, list[str]], bool]:
        """The jobs refused for room that would be admitted without the escrow other replicas hold,
        with those replicas' names; and whether any of that escrow is due back (``escrow.due_back``),
        so worth waiting for.

        A pod that does not fit even without that escrow is refused for the quota at once."""
        lent = lent_out(keep, self.replica)
        if not lent:
            return {}, False
        without = {key: item for key, item in keep.items() if key not in lent}
        # The whole batch, in order, as the real judgement charged it: an earlier job's reservation
        # takes room from a later one here too.
        alternative, _ = judge_batch_holding(view, [job.admission for job in batch], without, now,
                                             [job.requests for job in batch])
        lenders = sorted(set(lent.values()))
        held_back = {index: lenders
                     for index, ((verdict, _), (instead, _)) in enumerate(zip(results, alternative, strict=True))
                     if verdict.reason == QUOTA_EXCEEDED and instead.allowed}
        return held_back, bool(held_back) and bool(due_back(keep, self.replica, now))

    def _escrow_not_back(self, admission: PodAdmission, lenders: list[str], due: bool,
                         keep: dict[str, shared_ledger.StoredReservation], now: float) -> Verdict:
        held = f"pod {admission.namespace}/{admission.name} not admitted yet: the room it needs is held in escrow by " \
               f"webhook replica {', '.join(lenders)}"
        if due:
            return Verdict(False, f"{held}, which had not given it back when the webhook worker stopped waiting; "
                           f"retry shortly", reason=ESCROW_NOT_BACK)
        # Not given back long after its window: that replica is stopped, dead or cut off, and its
        # escrow holds the room until it expires (pods may have been admitted from it).
        expires = max(keep[key].reservation.expires_at for key in lent_out(keep, self.replica))
        return Verdict(False, f"{held}, which has not given it back since its window ended (that replica may have "
                       f"stopped); the room comes back when the escrow expires, in {max(expires - now, 0):.0f}s at "
                       f"most; retry shortly", reason=ESCROW_NOT_BACK)

    def _take_escrow(self, view: QuotaView, queue: _TreeQueue, batch: list[_Job], results: list[Judged],
                     holding: ReservationLedger, now: float) -> tuple[Escrow, shared_ledger.StoredReservation] | None:
        """Room for more pods of the shape of the batch's last admitted CREATE, if a fair share is free."""
        if not self.escrow_most_pods:
            return None
        with queue.condition:
            open_shapes = set(queue.escrows)
        for job, (_, reservation) in reversed(list(zip(batch, results, strict=True))):
            if reservation is not None and job.shape is not None and job.shape.key() not in open_shapes:
                shape, (new, _) = job.shape, job.requests
                break
        else:
            return None
        room = escrow_room(view, new, shape, holding, self.escrow_most_pods * ESCROW_SHARE)
        return take_escrow(shape, room, self.replica, self._escrow_ids, now, self.escrow_window, view.ttl_seconds)

    def settle_due(self) -> None:
        """Write what spent escrows admitted and give back the rest (the escrow settler's round)."""
        now = self.clock()
        with self._queues_lock:
            queues = list(self._queues.items())
        for tree_root, queue in queues:
            with queue.condition:
                due = bool(queue.settling) or bool(queue.withdrawals) or any(escrow.spent(now, self.state.tree_version)
                                                  for escrow in queue.escrows.values())
                if not due or queue.committing:
                    continue  # a commit in flight settles them anyway
                queue.committing = True
            self._commit_as_committer(tree_root, queue, [])

    def run_escrow_settler(self, stop: threading.Event) -> None:
        while not stop.wait(max(self.escrow_window / 4, 0.05)):
            try:
                self.settle_due()
            except Exception as error:  # the next round, or the next admission's write, settles them
                log.warning("strict accounting: settling escrow failed: %s", error)

    def _record_hold(self, tree_root: str, version: str, stored: dict[str, shared_ledger.StoredReservation],
                     now: float) -> None:
        """Put what this replica carried, and the hold, into the object (recreating it if missing)."""
        if self.store.carrying(tree_root) or self.store.rebuilding(tree_root) or not version:
            with self.state.snapshot() as view:
                kept, counted_through = pruned(view, stored, now)
            self.store.write(tree_root, version, kept, pods_counted_through=counted_through)

    def reconcile_once(self) -> int:
        """Drop expired, long-confirmed and provably lost reservations from every ledger object.

        Without it, room held by pods that never appeared (a later webhook refused them, the
        create failed, the replica that admitted them died) would come back only when the next
        admission of that tree happens to write the object. Trees are those with an object (any
        replica's) and those this replica wrote to, whose object may have been deleted since: it
        is recreated with the reservations this replica carried over. Returns how many it dropped.
        """
        dropped = 0
        for tree_root in sorted(set(self.store.list_trees()) | self.store.known_trees()):
            version, stored = self.store.read(tree_root, fresh=True)
            if self.store.finish_deletion(tree_root, version):
                continue
            now = self.clock()
            with self.state.snapshot() as view:
                keep, counted_through = pruned(view, stored, now)
            lost = self._lost(keep, now)
            for pod_key in lost:
                del keep[pod_key]
            changed = len(keep) < len(stored) or self.store.carrying(tree_root) or self.store.rebuilding(tree_root)
            if not version and not keep:
                self.store.drop_carried(tree_root)  # nothing left worth recreating the object for
            elif changed and self.store.write(tree_root, version, keep, pods_counted_through=counted_through):
                dropped += len(stored) - len(keep)
                if lost:
                    log.info("strict accounting: released %d reservations of creates that can no longer land "
                             "(tree %s): %s", len(lost), tree_root, ", ".join(sorted(lost)))
        return dropped

    def _lost(self, stored: dict[str, shared_ledger.StoredReservation], now: float) -> set[str]:
        """Reservations whose pod provably never landed and never can (see docs/design.md).

        Past its create's deadline, a create can no longer be written to etcd; if a consistent read
        then finds no pod of that uid, none will ever be stored for this admission.
        """
        lost: set[str] = set()
        for pod_key, item in stored.items():
            reservation = item.reservation
            if not reservation.pod_uid or now < item.admitted_at + self.create_deadline_seconds:
                continue
            namespace, _, name = pod_key.partition("/")
            if self.store.pod_uid(namespace, name) != reservation.pod_uid:
                lost.add(pod_key)
        return lost

    def run_reconciler(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            if self.writer_elsewhere():
                continue  # the writer Lease's holder reconciles: its writes would meet these as conflicts
            try:
                dropped = self.reconcile_once()
            except Exception as error:  # the next round tries again; admissions prune as they write
                log.warning("strict accounting: reconcile failed: %s", error)
                continue
            if dropped:
                metrics.RESERVATIONS_EXPIRED.inc(dropped)
                log.info("strict accounting: released %d stale reservations", dropped)
