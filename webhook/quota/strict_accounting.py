"""Strict accounting: record each admission in a shared ledger object before answering.

Several replicas each hold their own view of pods and quotas, so room is only ever handed out
through a write to the API server that carries the resourceVersion the decision was made on
(``gpuquota_core.shared_ledger`` explains the object and the counting rules). Per quota tree, one
write is in flight at a time from this replica and it carries every admission that queued up
behind the previous one (a group commit): under a burst the write rate stays bounded while the
admission rate grows with the batch size.

A write that admits a pod may also take room in escrow: an entry holding room for up to
``escrow_most_pods`` more pods of the same shape (quota chain and request). For
``ESCROW_WINDOW_SECONDS`` after that write, this replica admits pods of that shape from the escrow
without writing; every replica counts the whole entry until it expires. Once the escrow is spent
(used up, its window over, the tree changed), this replica's next write to the tree, or the
settler, closes it and replaces the entry by a reservation for each pod admitted from it
(docs/design.md has the invariant). A pod refused for room this replica itself holds in escrow gets
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
from datetime import UTC, datetime
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.enforcement import QUOTA_EXCEEDED
from gpuquota_core.ledger import DEFAULT_TTL_SECONDS, Reservation, ReservationLedger
from gpuquota_core.pod_admission import ALLOW, PodAdmission, Verdict
from webhook.quota import metrics
from webhook.quota.client import ANSWER_TOO_LATE, ESCROW_NOT_BACK
from webhook.quota.pod_versions import resource_version
from webhook.quota.state import EscrowShape, QuotaState

log = logging.getLogger("gpuquota.quota")
# Conflicts are the normal case under a burst spread over replicas: retry with jittered backoff,
# within a budget well under the webhook timeout the API server gives us (a few seconds).
RETRY_BUDGET_SECONDS = 3.0
MAX_BACKOFF_SECONDS = 0.05
FIELD_MANAGER = "gpuquota-webhook"
MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "koord-gpuquota"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# Quota names are DNS subdomains (up to 253 characters); label values stop at 63, so a tree root
# longer than that cannot be named in a label and is reconciled only when admissions write to it.
TREE_LABEL = "gpuquota.koord-gpuquota.io/quota-tree"
# Keeps a deleted ledger object readable, with everything it held, until that has expired: a replica
# that never saw the object then still finds it (terminating) and holds the tree, instead of finding
# nothing and starting an empty ledger while other replicas admit from what the old one held.
LEDGER_FINALIZER = "gpuquota.koord-gpuquota.io/ledger"
# How long after its admission a pod create can still be written to etcd: kube-apiserver's
# --request-timeout (its default), which bounds the whole create request, the storage write after
# the admission webhooks included. Not the webhook timeout: that bounds only the wait for our answer.
DEFAULT_CREATE_DEADLINE_SECONDS = 60.0
# Escrow: how long a replica admits from room it took, the most pods one escrow holds room for, and
# the share of what is free for a shape one escrow may take. The share keeps most of the free room
# for the other replicas and makes escrow stop as a quota nears its limit, where every pod is then
# written on its own; the short window gives back what a replica did not use.
ESCROW_WINDOW_SECONDS = 0.5
DEFAULT_ESCROW_MOST_PODS = 32
ESCROW_SHARE = 4
# How often the ledger namespace is checked for writes (a dry-run create) while readiness says it
# cannot be written, and while it can; and how long one check may take.
LEDGER_CHECK_FAILING_SECONDS = 1.0
LEDGER_CHECK_SECONDS = 10.0
LEDGER_CHECK_TIMEOUT_SECONDS = 3.0
# A pod refused while other replicas hold escrow in its tree asks again this often.
ESCROW_WAIT_SECONDS = 0.05
# How long after an escrow's window ends its replica is expected to have given back what it did not
# use (its settler's round plus one write). An entry still there later belongs to a replica that is
# dead, stopped or cut off: it holds its room until it expires, and nobody waits for it.
ESCROW_GIVE_BACK_SECONDS = 1.0


class LedgerUnavailable(Exception):
    """The shared ledger could not be read or written; the message says why."""


@dataclass
class _Job:
    admission: PodAdmission
    shape: EscrowShape | None = None
    verdict: Verdict | None = None
    submitted: float = field(default_factory=time.monotonic)
    # Monotonic time by which the worker must have the answer (inf: no bound); an "allowed" decided
    # later would reach nobody, so it is turned into a refusal and its reservation withdrawn.
    answer_by: float = math.inf


@dataclass(frozen=True)
class _Withdrawal:
    """A reservation this replica wrote for an admission it then refused for answering too late: it is
    taken out of the object by the next write, if the entry is still exactly the one written."""

    pod_key: str
    admission_uid: str
    admitted_at: float

    def matches(self, item: shared_ledger.StoredReservation, replica: str) -> bool:
        return (item.replica == replica and item.reservation.admission_uid == self.admission_uid
                and round(item.admitted_at, 3) == round(self.admitted_at, 3))


@dataclass
class _Escrow:
    """Room this replica holds in the ledger for pods of one shape, and the pods admitted from it."""

    entry_key: str
    shape: EscrowShape  # the pods it admits, under the tree version it was taken in
    count: int
    admits_until: float  # wall clock; the entry itself expires one reservation TTL later
    admitted: list[Reservation] = field(default_factory=list)
    open: bool = True

    def admits(self, shape: EscrowShape, now: float) -> bool:
        return self.open and shape == self.shape and len(self.admitted) < self.count and now < self.admits_until

    def spent(self, now: float, tree_version: int) -> bool:
        """Nothing more can be admitted from it: time to write what it admitted and give back the rest."""
        return len(self.admitted) >= self.count or now >= self.admits_until or tree_version != self.shape.tree_version


@dataclass
class _TreeQueue:
    condition: threading.Condition = field(default_factory=threading.Condition)
    pending: list[_Job] = field(default_factory=list)
    committing: bool = False
    # Open escrows by shape key; closed ones whose pods the next successful write records.
    escrows: dict[Any, _Escrow] = field(default_factory=dict)
    settling: list[_Escrow] = field(default_factory=list)
    # Reservations of admissions answered as refused after their write; only the committer changes it.
    withdrawals: list[_Withdrawal] = field(default_factory=list)


class LedgerStore:
    """Reads and writes the ledger ConfigMaps of one namespace; caches the last version seen.

    A deleted object stays, terminating, while ``LEDGER_FINALIZER`` is on it: it is read as usual and
    holds its tree until everything in it has expired, then ``finish_deletion`` lets it go. It can
    still disappear at once (its finalizer removed by hand, a restore from an older backup). The
    reservations this replica last saw in it are then carried over: returned by every
    read as if still stored, until a write of this replica has put them back (a create when the
    object is missing, a replace when another replica recreated it first, recognised by its new
    ``metadata.uid``). Expired or confirmed ones are pruned on that write as usual, so nothing
    this replica knew to hold room is forgotten and nothing stale is kept.

    What only other replicas knew (reservations they wrote after this replica's last read) is
    gone with the object. Each of those was admitted before the deletion, so it expires at the
    latest one TTL after the deletion was noticed: until then the tree is held (``recovering_until``,
    recorded in the recreated object so that every replica, one that never saw the old object
    included, holds it too) and its admissions are refused as LedgerUnavailable, never admitted
    into room that may be taken.
    """

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        # Any: with _preload_content=False the client returns the raw response, not the model
        # its annotations promise; the JSON is decoded here directly.
        self.core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self._cache: dict[str, tuple[str, dict[str, shared_ledger.StoredReservation]]] = {}
        # Per tree: the uid of the object last read or written, and what it held then.
        self._known: dict[str, tuple[str, dict[str, shared_ledger.StoredReservation]]] = {}
        # Per tree: reservations of a deleted object not yet written back (see the class docstring).
        self._carried: dict[str, dict[str, shared_ledger.StoredReservation]] = {}
        # Per tree: wall-clock end of the hold after a deletion (see the class docstring).
        self._recovering: dict[str, float] = {}
        # Per tree whose object was found deleted but kept by its finalizer: when everything it holds
        # has expired (the finalizer may go then), and its deletionTimestamp (kept in every write).
        self._terminating: dict[str, tuple[float, str]] = {}
        # Per tree whose object was found unreadable and not yet written over: the end of its hold.
        self._rebuilding: dict[str, float] = {}
        self._hold_causes: dict[str, str] = {}  # per tree held after its object was found unreadable
        # Per tree: the pod resourceVersion the copy last read or written asks its readers' watches
        # to have reached (shared_ledger.PODS_COUNTED_THROUGH_KEY); only ever raised.
        self._pods_counted_through: dict[str, int] = {}
        self._lock = threading.Lock()  # admissions of several trees and the reconciler share the maps
        self.clock: Callable[[], float] = time.time
        self.hold_seconds = DEFAULT_TTL_SECONDS  # the reservation TTL; StrictAccounting sets both

    def read(self, tree_root: str, fresh: bool) -> tuple[str, dict[str, shared_ledger.StoredReservation]]:
        """(resourceVersion or "" when absent, reservations); from the cache unless ``fresh``."""
        with self._lock:
            if not fresh and tree_root in self._cache:
                return self._cache[tree_root]
        name = shared_ledger.ledger_object_name(tree_root)
        try:
            response = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                with self._lock:
                    self._lost(tree_root)
                    return "", dict(self._carried.get(tree_root, {}))
            raise LedgerUnavailable(f"cannot read ConfigMap {self.namespace}/{name}: {error.status} {error.reason}") \
                from None
        body = orjson.loads(response.data)
        metadata = body["metadata"]
        try:
            data = body.get("data") or {}
            if shared_ledger.LEDGER_DATA_KEY not in data:  # every write stores it, an empty ledger too
                raise shared_ledger.LedgerFormatError(f"{shared_ledger.LEDGER_DATA_KEY} is missing")
            stored = shared_ledger.decode(data)
            held = shared_ledger.recovering_until(data)
            counted_through = shared_ledger.pods_counted_through(data)
        except shared_ledger.LedgerFormatError as error:
            return self._unreadable(tree_root, metadata, str(error))
        uid = str(metadata.get("uid", ""))
        deleted_at = metadata.get("deletionTimestamp")
        with self._lock:
            known = self._known.get(tree_root)
            if known is not None and known[0] != uid:
                # Deleted and recreated by someone else since this replica's last look. The
                # deletion came before the new object's creation, and before the hold a replica
                # that noticed it recorded: either bounds when what was lost expires.
                self._lost(tree_root, min(held or float("inf"), _created(metadata) + self.hold_seconds))
            self._known[tree_root] = (uid, stored)
            self._rebuilding.pop(tree_root, None)  # another replica wrote it over first
            if deleted_at:
                # Deleted, and kept by the finalizer with all it holds: held until that has expired,
                # by every replica that reads it, the ones that never saw it before included.
                until = max([held, *(item.reservation.expires_at for item in stored.values())])
                if tree_root not in self._terminating:
                    log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s is being deleted; holding the "
                                "tree until what it holds has expired (%.1fs)", self.namespace, name, tree_root,
                                until - self.clock())
                self._terminating[tree_root] = (until, str(deleted_at))
                held = max(held, until)
            self._recovering[tree_root] = max(self._recovering.get(tree_root, 0.0), held)
            self._pods_counted_through[tree_root] = max(self._pods_counted_through.get(tree_root, 0), counted_through)
            result = (str(metadata["resourceVersion"]), {**self._carried.get(tree_root, {}), **stored})
            self._cache[tree_root] = result
            return result

    def _unreadable(self, tree_root: str, metadata: dict[str, Any], problem: str) -> tuple[
            str, dict[str, shared_ledger.StoredReservation]]:
        """The object exists but cannot be read (hand-edited, written by an incompatible version):
        handled as a loss of what it held, and rebuilt over it by the next write (``rebuilding``).

        Every reservation it may have held was written before this read, so all of them have expired
        one hold (the TTL, and an escrow's window) later: the tree is held until then, from the first
        read that found it unreadable, and the hold goes into the rebuilt object for every replica.
        The podsCountedThrough it may have held is replaced by the newest resourceVersion of the
        pods that exist (``write``). A deleted object stays kept by its finalizer until the hold
        ends, then goes as any deleted ledger does (``finish_deletion``)."""
        name = shared_ledger.ledger_object_name(tree_root)
        with self._lock:
            now = self.clock()
            if tree_root not in self._rebuilding:
                log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s cannot be read (%s); rebuilding it "
                            "and holding the tree for %.1fs, until what it may have held has expired",
                            self.namespace, name, tree_root, problem, self.hold_seconds)
                self._rebuilding[tree_root] = now + self.hold_seconds
                self._hold_causes[tree_root] = "could not be read and is being rebuilt"
                self._recovering[tree_root] = max(self._recovering.get(tree_root, 0.0), now + self.hold_seconds)
            until = self._rebuilding[tree_root]
            known = self._known.pop(tree_root, None)
            if known is not None and known[1]:  # what this replica last read there goes back in
                carried = self._carried.setdefault(tree_root, {})
                carried.update({key: item for key, item in known[1].items() if key not in carried})
            deleted_at = metadata.get("deletionTimestamp")
            if deleted_at and tree_root not in self._terminating:
                self._terminating[tree_root] = (until, str(deleted_at))
            self._cache.pop(tree_root, None)
            return str(metadata["resourceVersion"]), dict(self._carried.get(tree_root, {}))

    def hold_cause(self, tree_root: str) -> str:
        """What the tree's hold follows from, for refusals (a hold read from the object does not say)."""
        with self._lock:
            return self._hold_causes.get(tree_root, "was deleted or could not be read")

    def rebuilding(self, tree_root: str) -> bool:
        """Whether the object was found unreadable and this replica has not written it over yet."""
        with self._lock:
            return tree_root in self._rebuilding

    def newest_pod_version(self) -> int:
        """The highest resourceVersion of the pods that exist (a consistent, paged list): every watch
        that has got that far has shown each of them, so it counts every pod whose reservation an
        unreadable ledger may have dropped."""
        newest, token = 0, None
        while True:
            page = orjson.loads(self.core.list_pod_for_all_namespaces(limit=500, _continue=token,
                                                                      _preload_content=False).data)
            for item in page.get("items", []):
                newest = max(newest, resource_version((item.get("metadata") or {}).get("resourceVersion")))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return newest

    def _lost(self, tree_root: str, hold_until: float | None = None) -> None:
        """The object this replica knew is gone: carry what it held, hold the tree (lock held)."""
        terminating = self._terminating.pop(tree_root, None)
        if terminating is not None and self.clock() >= terminating[0]:
            # Gone through its finalizer once everything it held had expired: nothing was lost.
            self._cache.pop(tree_root, None)
            self._known.pop(tree_root, None)
            self._carried.pop(tree_root, None)
            return
        self._cache.pop(tree_root, None)
        known = self._known.pop(tree_root, None)
        if known is not None:  # noticed now; a tree already found missing keeps its first hold
            until = hold_until if hold_until is not None else self.clock() + self.hold_seconds
            self._recovering[tree_root] = max(self._recovering.get(tree_root, 0.0), until)
            self._hold_causes[tree_root] = "was deleted"
        if known is not None and known[1]:
            carried = self._carried.setdefault(tree_root, {})
            carried.update({key: item for key, item in known[1].items() if key not in carried})
            log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s was deleted; carrying the %d "
                        "reservations this replica knew into its next write", self.namespace,
                        shared_ledger.ledger_object_name(tree_root), tree_root, len(carried))

    def recovering_until(self, tree_root: str) -> float:
        """Until when (wall clock) the tree is held after its object was found deleted; 0: not held."""
        with self._lock:
            return self._recovering.get(tree_root, 0.0)

    def drop_carried(self, tree_root: str) -> None:
        with self._lock:
            self._carried.pop(tree_root, None)

    def carrying(self, tree_root: str) -> bool:
        """Whether reservations of a deleted object still wait to be written back."""
        with self._lock:
            return bool(self._carried.get(tree_root))

    def known_trees(self) -> set[str]:
        """The trees this replica has read or written, whether or not their object still exists."""
        with self._lock:
            return set(self._known) | set(self._carried) | set(self._cache)

    def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod stored under that name, None when there is none (a consistent read)."""
        try:
            response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise LedgerUnavailable(f"cannot read pod {namespace}/{name}: {error.status} {error.reason}") from None
        return str(orjson.loads(response.data)["metadata"].get("uid", ""))

    def finish_deletion(self, tree_root: str, version: str) -> bool:
        """Once everything a deleted object held has expired, drop its finalizer so the apiserver
        removes it; True when that was tried (the caller reads again, and may create a new one)."""
        with self._lock:
            terminating = self._terminating.get(tree_root)
        if terminating is None or not version or self.clock() < terminating[0]:
            return False
        self.write(tree_root, version, {}, release=True)
        return True

    def check_writable(self) -> None:
        """Raise LedgerUnavailable unless a ledger could be created in the namespace now (a dry run:
        the namespace exists, this replica may create ConfigMaps in it, the apiserver answers)."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{shared_ledger.LEDGER_NAME_PREFIX}write-check", "namespace": self.namespace}}
        try:
            self.core.create_namespaced_config_map(self.namespace, body, dry_run="All", field_manager=FIELD_MANAGER,
                                                   _request_timeout=LEDGER_CHECK_TIMEOUT_SECONDS,
                                                   _preload_content=False)
        except ApiException as error:
            if error.status == 409:  # a ledger of that name exists: creating is allowed there
                return
            raise LedgerUnavailable(f"cannot write ledger ConfigMaps in namespace {self.namespace}: "
                                    f"{error.status} {error.reason}") from None
        except Exception as error:  # connection errors of every kind
            raise LedgerUnavailable(f"cannot reach the apiserver to write ledger ConfigMaps in namespace "
                                    f"{self.namespace}: {error}") from None

    def pods_counted_through(self, tree_root: str) -> int:
        """How far a replica's pod watch must have got to decide on the copy of ``tree_root`` last read."""
        with self._lock:
            return self._pods_counted_through.get(tree_root, 0)

    def _hold_to_record(self, tree_root: str) -> float:
        with self._lock:
            until = self._recovering.get(tree_root, 0.0)
            return until if until > self.clock() else 0.0

    def list_trees(self) -> list[str]:
        """The quota trees that have a ledger object, from their label (any replica may have made them)."""
        listed = orjson.loads(self.core.list_namespaced_config_map(
            self.namespace, label_selector=MANAGED_SELECTOR, _preload_content=False).data)
        return sorted(str(item["metadata"]["labels"][TREE_LABEL]) for item in listed.get("items", [])
                      if TREE_LABEL in (item["metadata"].get("labels") or {}))

    def write(self, tree_root: str, version: str, stored: dict[str, shared_ledger.StoredReservation],
              release: bool = False, pods_counted_through: int = 0) -> bool:
        """Store ``stored`` if the object is still at ``version`` (absent: ""); False on a conflict.

        ``pods_counted_through``: the pod resourceVersion of what ``stored`` dropped because this
        replica's watch counts it (``QuotaState.pruned``); the object keeps the highest ever recorded.

        A replace that finds the object deleted is a conflict too: the caller reads again, finds
        it missing, and creates it with what this replica carried over. ``release``: the write
        drops the finalizer of a deleted object, which the apiserver then removes.
        """
        name = shared_ledger.ledger_object_name(tree_root)
        labels = {MANAGED_BY_LABEL: MANAGED_BY}
        if len(tree_root) <= 63:
            labels[TREE_LABEL] = tree_root
        metadata: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels,
                                    "finalizers": [] if release else [LEDGER_FINALIZER]}
        if self.rebuilding(tree_root) and not release:
            pods_counted_through = max(pods_counted_through, self.newest_pod_version())
        with self._lock:
            terminating = self._terminating.get(tree_root)
            counted_through = max(pods_counted_through, self._pods_counted_through.get(tree_root, 0))
        if terminating is not None:  # a deleted object's deletionTimestamp cannot be taken back
            metadata["deletionTimestamp"] = terminating[1]
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": shared_ledger.encode(stored.values(), self._hold_to_record(tree_root), counted_through),
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
            if error.status == 409 or (error.status == 404 and version):
                with self._lock:
                    if error.status == 404:
                        self._lost(tree_root)
                    self._cache.pop(tree_root, None)
                return False
            with self._lock:  # a 5xx (etcd timing out, say) does not prove the write did not land
                self._cache.pop(tree_root, None)
            raise LedgerUnavailable(f"cannot write ConfigMap {self.namespace}/{name}: {error.status} "
                                    f"{error.reason}") from None
        except BaseException:  # no answer: the write may have landed, so the cached copy may be stale
            with self._lock:
                self._cache.pop(tree_root, None)
            raise
        written = orjson.loads(response.data)["metadata"]
        with self._lock:
            if release:  # gone now; a read finds it missing, and _lost knows nothing was lost
                self._cache.pop(tree_root, None)
                self._known.pop(tree_root, None)
                self._rebuilding.pop(tree_root, None)
                return True
            # What was carried is in the object now (or was pruned from it on purpose), and it reads.
            self._carried.pop(tree_root, None)
            self._rebuilding.pop(tree_root, None)
            self._pods_counted_through[tree_root] = counted_through
            self._known[tree_root] = (str(written.get("uid", "")), stored)
            self._cache[tree_root] = (str(written["resourceVersion"]), stored)
        return True


def _created(metadata: dict[str, Any]) -> float:
    """An object's creationTimestamp in wall-clock seconds, rounded up (it is kept to the second)."""
    try:
        stamp = datetime.strptime(str(metadata["creationTimestamp"]), "%Y-%m-%dT%H:%M:%SZ")
    except (KeyError, ValueError):
        return time.time()  # unknown: no later than now
    return stamp.replace(tzinfo=UTC).timestamp() + 1.0


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
        shape = self.state.escrow_shape(admission) if self.escrow_most_pods else None
        # A shape's chain ends at the tree's root: one resolution of the pod's quota, not two.
        tree_root = shape.quotas[-1] if shape is not None else self.state.tree_of(admission)
        if tree_root is None:
            return self.state.admit_pod(admission)  # no quota: nothing to share
        queue = self._queue(tree_root)
        job = _Job(admission, shape, answer_by=answer_by)
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
        self._close_escrows(queue, only_spent=True)
        settling = list(queue.settling)  # only the committer changes it from here
        withdrawals = list(queue.withdrawals)
        conflicts = 0
        fresh = bool(withdrawals)  # the cached copy may predate the write that stored what they withdraw
        # Counted from the oldest job's arrival: time spent queued behind the previous commit is
        # part of the budget, so no admission outlives the API server's webhook timeout.
        give_up_at = min((job.submitted for job in batch), default=time.monotonic()) + RETRY_BUDGET_SECONDS
        held = ""
        in_flight: list[_Withdrawal] = []
        try:
            while batch or settling or withdrawals:
                if conflicts and time.monotonic() > give_up_at:
                    break
                batch = self._without_late(batch)
                if not (batch or settling or withdrawals):
                    continue
                version, stored = self.store.read(tree_root, fresh)
                if self.store.finish_deletion(tree_root, version):
                    fresh = True
                    continue
                now = self.clock()
                held_until = self.store.recovering_until(tree_root)
                if now < held_until:
                    self._record_hold(tree_root, version, stored, now)
                    held = (f"the shared quota ledger of tree {tree_root} {self.store.hold_cause(tree_root)}; "
                            f"reservations only it held may still take room for {held_until - now:.1f}s, "
                            f"until they expire")
                    break
                counted_through = self.store.pods_counted_through(tree_root)
                if not self.state.wait_for_pods_through(counted_through, give_up_at - time.monotonic()):
                    held = (f"this replica's watch of pods has not caught up with the shared quota ledger of tree "
                            f"{tree_root} (seen through resourceVersion {self.state.pod_versions.seen_through}, "
                            f"the ledger counts pods through {counted_through})")
                    break
                kept, counted_now = self.state.pruned(stored, now)
                keep = self._settled(kept, settling, now)
                withdrawn = self._withdraw(keep, withdrawals)
                held_before = set(keep)
                results, holding = self.state.judge_batch_holding([job.admission for job in batch], keep, now)
                refused_for_room = any(verdict.reason == QUOTA_EXCEEDED for verdict, _ in results)
                if refused_for_room and self._close_escrows(queue, only_spent=False):
                    # Refused for room this replica itself holds in escrow for other shapes: give
                    # all of it back in this write and judge the batch again without it.
                    settling = list(queue.settling)
                    continue
                held_back = self._held_back_by_escrow(batch, results, keep, now) if refused_for_room else {}
                if held_back and not self._time_to_wait(give_up_at, batch):
                    # The room is there, lent to another replica's escrow that is due back: not a
                    # refusal for the quota. The worker asks once more, with a deadline of its own.
                    results = [(self._escrow_not_back(batch[index].admission, held_back[index]), None)
                               if index in held_back else result for index, result in enumerate(results)]
                    held_back = {}
                waiting = set(held_back)
                new = [r for _, r in results if r is not None]
                for reservation in new:
                    keep[reservation.pod_key] = shared_ledger.StoredReservation(reservation, self.replica, now)
                taken = None if waiting else self._new_escrow(queue, batch, results, holding, now)
                if taken is not None:
                    keep[taken[0].entry_key] = taken[1]
                if new or settling or taken is not None or withdrawn:
                    # Should the write fail without saying whether it landed (a timeout, a reset), the
                    # batch is refused, so whatever of it may be stored is withdrawn (see _Withdrawal).
                    in_flight = [_Withdrawal(r.pod_key, r.admission_uid, now) for r in new
                                 if r.pod_key not in held_before]
                    if taken is not None:
                        in_flight.append(_Withdrawal(taken[0].entry_key, taken[1].reservation.admission_uid, now))
                    written = self.store.write(tree_root, version, keep, pods_counted_through=counted_now)
                    in_flight = []
                    if not written:
                        metrics.LEDGER_WRITES.labels("conflict").inc()
                        conflicts += 1
                        fresh = True
                        # Jitter, so the replicas that just collided do not collide again in lockstep.
                        time.sleep(random.uniform(0, min(MAX_BACKOFF_SECONDS, 0.002 * 2 ** conflicts)))
                        continue
                    metrics.LEDGER_WRITES.labels("ok").inc()
                    metrics.LEDGER_BATCH.observe(len(new) + sum(len(e.admitted) for e in settling))
                    with queue.condition:
                        queue.settling.clear()
                        settling = []
                        if taken is not None:  # opened for admissions once its write succeeded
                            queue.escrows[taken[0].shape.key()] = taken[0]
                queue.withdrawals, withdrawals = [], []  # written, or their entries were gone already
                results = self._refuse_late_answers(queue, batch, results, waiting, held_before, now)
                decided = [(job, result) for index, (job, result) in enumerate(zip(batch, results, strict=True))
                           if index not in waiting]
                self._finish([job for job, _ in decided], [result for _, result in decided])
                # Refused only while other replicas hold escrow in the tree: ask again once they may
                # have given it back, from a fresh read, the verdict judged anew.
                batch = [job for index, job in enumerate(batch) if index in waiting]
                if batch:
                    fresh = True
                    time.sleep(random.uniform(ESCROW_WAIT_SECONDS / 2, ESCROW_WAIT_SECONDS))
            else:
                return
            reason = held or (f"the shared quota ledger of tree {tree_root} kept changing ({conflicts} conflicts "
                              f"in {RETRY_BUDGET_SECONDS:g}s)")
        except LedgerUnavailable as error:
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = self._ledger_problem = str(error)  # not ready until the namespace check passes again
        except Exception as error:  # connection errors of every kind: refuse rather than admit unrecorded
            metrics.LEDGER_WRITES.labels("error").inc()
            reason = self._ledger_problem = f"the shared quota ledger is unreachable: {error}"
        queue.withdrawals.extend(in_flight)
        if batch:
            log.warning("strict accounting: refusing %d admissions: %s", len(batch), reason)
        for job in batch:
            job.verdict = Verdict(False, f"pod not admitted: {reason}; retry shortly", 503, "LedgerUnavailable")

    def _late(self, admission: PodAdmission, when: str) -> Verdict:
        return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted: the quota service "
                       f"{when} after the webhook worker stopped waiting for its answer; retry shortly",
                       503, ANSWER_TOO_LATE)

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

    def _close_escrows(self, queue: _TreeQueue, only_spent: bool) -> bool:
        """Close this replica's open escrows of the tree (the spent ones, or all), for the commit in
        progress to write; whether it closed any. Nothing is admitted from an escrow once closed."""
        with queue.condition:
            now = self.clock()
            closing = [key for key, escrow in queue.escrows.items()
                       if not only_spent or escrow.spent(now, self.state.tree_version)]
            for key in closing:
                escrow = queue.escrows.pop(key)
                escrow.open = False
                queue.settling.append(escrow)
            return bool(closing)

    def _settled(self, keep: dict[str, shared_ledger.StoredReservation], settling: list[_Escrow],
                 now: float) -> dict[str, shared_ledger.StoredReservation]:
        """``keep`` with each closed escrow's entry replaced by a reservation per pod admitted from it."""
        ttl = self.state.ledger.ttl_seconds
        for escrow in settling:
            keep.pop(escrow.entry_key, None)
            for reservation in escrow.admitted:
                if reservation.expires_at > now:
                    keep[reservation.pod_key] = shared_ledger.StoredReservation(
                        reservation, self.replica, reservation.expires_at - ttl)
        return keep

    def _time_to_wait(self, give_up_at: float, batch: list[_Job]) -> bool:
        """Whether the batch may ask again once more: within the budget, and before any of its workers stops waiting."""
        return (time.monotonic() + ESCROW_WAIT_SECONDS < give_up_at
                and self.monotonic() + ESCROW_WAIT_SECONDS < min((job.answer_by for job in batch), default=math.inf))

    def _held_back_by_escrow(self, batch: list[_Job], results: list[tuple[Verdict, Reservation | None]],
                             keep: dict[str, shared_ledger.StoredReservation], now: float) -> dict[int, list[str]]:
        """The jobs refused for room that would be admitted without the escrow other replicas are about
        to give back (window over or nearly, the replica alive to write), with those replicas' names.

        Only these are worth asking again for: a pod that does not fit even without that escrow is
        refused at once. An escrow of a replica whose quota service died (a new one has another name)
        or is stopped is never given back early: it holds its room until it expires, as the invariant
        needs (pods may have been admitted from it), and waiting for it would only turn refusals into
        timeouts."""
        due = {key: item.replica for key, item in keep.items()
               if shared_ledger.is_escrow(key) and item.replica != self.replica
               and now < item.admitted_at + ESCROW_WINDOW_SECONDS + ESCROW_GIVE_BACK_SECONDS}
        if not due:
            return {}
        without = {key: item for key, item in keep.items() if key not in due}
        # The whole batch, in order, as the real judgement charged it: an earlier job's reservation
        # takes room from a later one here too.
        alternative, _ = self.state.judge_batch_holding([job.admission for job in batch], without, now)
        lenders = sorted(set(due.values()))
        return {index: lenders
                for index, ((verdict, _), (instead, _)) in enumerate(zip(results, alternative, strict=True))
                if verdict.reason == QUOTA_EXCEEDED and instead.allowed}

    def _escrow_not_back(self, admission: PodAdmission, lenders: list[str]) -> Verdict:
        return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted yet: the room it needs is "
                       f"held in escrow by webhook replica {', '.join(lenders)}, which had not given it back when the "
                       f"webhook worker stopped waiting; retry shortly", 503, ESCROW_NOT_BACK)

    def _new_escrow(self, queue: _TreeQueue, batch: list[_Job], results: list[tuple[Verdict, Reservation | None]],
                    holding: ReservationLedger, now: float) -> tuple[_Escrow, shared_ledger.StoredReservation] | None:
        """Room for more pods of the shape of the batch's last admitted CREATE, if a fair share is free."""
        if not self.escrow_most_pods:
            return None
        with queue.condition:
            open_shapes = set(queue.escrows)
        for job, (_, reservation) in reversed(list(zip(batch, results, strict=True))):
            if reservation is not None and job.shape is not None and job.shape.key() not in open_shapes:
                shape, admission = job.shape, job.admission
                break
        else:
            return None
        room = self.state.escrow_room(admission, shape, holding, self.escrow_most_pods * ESCROW_SHARE)
        count = room // ESCROW_SHARE
        if count <= 0:
            return None
        entry_key = f"{shared_ledger.ESCROW_KEY_PREFIX}{self.replica}/{next(self._escrow_ids)}"
        entry = Reservation(entry_key, "escrow", shape.quotas, shape.resources(count),
                            now + self.escrow_window + self.state.ledger.ttl_seconds)
        return (_Escrow(entry_key, shape, count, now + self.escrow_window),
                shared_ledger.StoredReservation(entry, self.replica, now))

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
            kept, counted_through = self.state.pruned(stored, now)
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
            keep, counted_through = self.state.pruned(stored, now)
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
