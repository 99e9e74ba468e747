"""Strict accounting: record each admission in a shared ledger object before answering.

Several replicas each hold their own view of pods and quotas, so room is only ever handed out
through a write to the API server that carries the resourceVersion the decision was made on
(``gpuquota_core.shared_ledger`` explains the object and the counting rules). Per quota tree, one
write is in flight at a time from this replica and it carries every admission that queued up
behind the previous one (a group commit): under a burst the write rate stays bounded while the
admission rate grows with the batch size.

On a conflict the whole batch is decided again from the freshly read object: nothing admitted in
a failed attempt is admitted again without being re-judged, so a request denied in one attempt can
never pass on a retry because an earlier verdict was reused (kubernetes#141904 in the native
ResourceQuota plugin). When the write cannot be made (the API is down, conflicts persist) the
admissions of the batch are refused: the webhook's failure mode, never an unrecorded admission.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import Reservation

from . import quota_metrics as metrics
from .quota_port import PodAdmission, Verdict
from .quota_state import QuotaState

log = logging.getLogger("gpuquota.quota")
# Conflicts are the normal case under a burst spread over replicas: retry with jittered backoff,
# within a budget well under the webhook timeout the API server gives us (a few seconds).
MAX_ATTEMPTS = 40
RETRY_BUDGET_SECONDS = 3.0
MAX_BACKOFF_SECONDS = 0.05
FIELD_MANAGER = "gpuquota-webhook"
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "koord-gpuquota"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# Quota names are DNS subdomains (up to 253 characters); label values stop at 63, so a tree root
# longer than that cannot be named in a label and is reconciled only when admissions write to it.
TREE_LABEL = "gpuquota.koord-gpuquota.io/quota-tree"


class LedgerUnavailable(Exception):
    """The shared ledger could not be read or written; the message says why."""


@dataclass
class _Job:
    admission: PodAdmission
    verdict: Verdict | None = None
    submitted: float = field(default_factory=time.monotonic)


@dataclass
class _TreeQueue:
    condition: threading.Condition = field(default_factory=threading.Condition)
    pending: list[_Job] = field(default_factory=list)
    committing: bool = False


class LedgerStore:
    """Reads and writes the ledger ConfigMaps of one namespace; caches the last version seen."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        # Any: with _preload_content=False the client returns the raw response, not the model
        # its annotations promise; the JSON is decoded here directly.
        self.core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self._cache: dict[str, tuple[str, dict[str, shared_ledger.StoredReservation]]] = {}

    def read(self, tree_root: str, fresh: bool) -> tuple[str, dict[str, shared_ledger.StoredReservation]]:
        """(resourceVersion or "" when absent, reservations); from the cache unless ``fresh``."""
        if not fresh and tree_root in self._cache:
            return self._cache[tree_root]
        name = shared_ledger.ledger_object_name(tree_root)
        try:
            response = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return "", {}
            raise LedgerUnavailable(f"cannot read ConfigMap {self.namespace}/{name}: {error.status} {error.reason}") \
                from None
        body = orjson.loads(response.data)
        try:
            stored = shared_ledger.decode(body.get("data"))
        except shared_ledger.LedgerFormatError as error:
            raise LedgerUnavailable(f"ConfigMap {self.namespace}/{name}: {error}") from None
        result = (str(body["metadata"]["resourceVersion"]), stored)
        self._cache[tree_root] = result
        return result

    def list_trees(self) -> list[str]:
        """The quota trees that have a ledger object, from their label (any replica may have made them)."""
        listed = orjson.loads(self.core.list_namespaced_config_map(
            self.namespace, label_selector=MANAGED_SELECTOR, _preload_content=False).data)
        return sorted(str(item["metadata"]["labels"][TREE_LABEL]) for item in listed.get("items", [])
                      if TREE_LABEL in (item["metadata"].get("labels") or {}))

    def write(self, tree_root: str, version: str, stored: dict[str, shared_ledger.StoredReservation]) -> bool:
        """Store ``stored`` if the object is still at ``version``; False on a conflict."""
        name = shared_ledger.ledger_object_name(tree_root)
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        if len(tree_root) <= 63:
            labels[TREE_LABEL] = tree_root
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "data": shared_ledger.encode(stored.values()),
        }
        try:
            if version:
                body["metadata"]["resourceVersion"] = version
                response = self.core.replace_namespaced_config_map(name, self.namespace, body,
                                                                   field_manager=FIELD_MANAGER,
                                                                   _preload_content=False)
            else:
                response = self.core.create_namespaced_config_map(self.namespace, body, field_manager=FIELD_MANAGER,
                                                                  _preload_content=False)
        except ApiException as error:
            if error.status == 409:
                self._cache.pop(tree_root, None)
                return False
            raise LedgerUnavailable(f"cannot write ConfigMap {self.namespace}/{name}: {error.status} "
                                    f"{error.reason}") from None
        written = orjson.loads(response.data)
        self._cache[tree_root] = (str(written["metadata"]["resourceVersion"]), stored)
        return True


class StrictAccounting:
    def __init__(self, state: QuotaState, store: LedgerStore, replica: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.store = store
        self.replica = replica or f"{socket.gethostname()}/{os.getpid()}"
        self.clock = clock
        self._queues: dict[str, _TreeQueue] = {}
        self._queues_lock = threading.Lock()

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        tree_root = self.state.tree_of(admission)
        if tree_root is None:
            return self.state.admit_pod(admission)  # no quota: nothing to share
        queue = self._queue(tree_root)
        job = _Job(admission)
        with queue.condition:
            queue.pending.append(job)
            while job.verdict is None and queue.committing:
                queue.condition.wait()
            if job.verdict is not None:
                return job.verdict
            # No commit in flight: this thread commits everything queued so far, its own job included.
            batch, queue.pending = queue.pending, []
            queue.committing = True
        try:
            self._commit(tree_root, batch)
        finally:
            with queue.condition:
                queue.committing = False
                queue.condition.notify_all()
        assert job.verdict is not None
        return job.verdict

    def _queue(self, tree_root: str) -> _TreeQueue:
        with self._queues_lock:
            return self._queues.setdefault(tree_root, _TreeQueue())

    def _commit(self, tree_root: str, batch: list[_Job]) -> None:
        admissions = [job.admission for job in batch]
        fresh = False
        # Counted from the oldest job's arrival: time spent queued behind the previous commit is
        # part of the budget, so no admission outlives the API server's webhook timeout.
        give_up_at = min(job.submitted for job in batch) + RETRY_BUDGET_SECONDS
        try:
            for attempt in range(MAX_ATTEMPTS):
                if attempt and time.monotonic() > give_up_at:
                    break
                version, stored = self.store.read(tree_root, fresh)
                now = self.clock()
                results = self.state.judge_batch(admissions, stored, now)
                new = [r for _, r in results if r is not None]
                if not new:
                    self._finish(batch, results)
                    return
                keep = self.state.pruned(stored, now)
                for reservation in new:
                    keep[reservation.pod_key] = shared_ledger.StoredReservation(reservation, self.replica, now)
                if self.store.write(tree_root, version, keep):
                    metrics.LEDGER_WRITES.labels("ok").inc()
                    metrics.LEDGER_BATCH.observe(len(new))
                    self._finish(batch, results)
                    return
                metrics.LEDGER_WRITES.labels("conflict").inc()
                fresh = True
                # Jitter, so the replicas that just collided do not collide again in lockstep.
                time.sleep(random.uniform(0, min(MAX_BACKOFF_SECONDS, 0.002 * 2 ** attempt)))
            reason = (f"the shared quota ledger of tree {tree_root} kept changing ({attempt + 1} conflicts "
                      f"in {RETRY_BUDGET_SECONDS:g}s)")
        except LedgerUnavailable as error:
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = str(error)
        except Exception as error:  # connection errors of every kind: refuse rather than admit unrecorded
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = f"the shared quota ledger is unreachable: {error}"
        log.warning("strict accounting: refusing %d admissions: %s", len(batch), reason)
        for job in batch:
            job.verdict = Verdict(False, f"pod not admitted: {reason}; retry shortly", 503, "LedgerUnavailable")

    def reconcile_once(self) -> int:
        """Drop expired and long-confirmed reservations from every ledger object; returns how many.

        Without it, room held by pods that never appeared (a later webhook refused them, the
        create failed, the replica that admitted them died) would come back only when the next
        admission of that tree happens to write the object.
        """
        dropped = 0
        for tree_root in self.store.list_trees():
            version, stored = self.store.read(tree_root, fresh=True)
            keep = self.state.pruned(stored, self.clock())
            if len(keep) < len(stored) and self.store.write(tree_root, version, keep):
                dropped += len(stored) - len(keep)
        return dropped

    def run_reconciler(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                dropped = self.reconcile_once()
            except Exception as error:  # the next round tries again; admissions prune as they write
                log.warning("strict accounting: reconcile failed: %s", error)
                continue
            if dropped:
                metrics.RESERVATIONS_EXPIRED.inc(dropped)
                log.info("strict accounting: released %d stale reservations", dropped)

    @staticmethod
    def _finish(batch: list[_Job], results: list[tuple[Verdict, Reservation | None]]) -> None:
        for job, (verdict, _) in zip(batch, results, strict=True):
            job.verdict = verdict
