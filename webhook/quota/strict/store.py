"""The ledger store: reads, writes and holds of the ledger ConfigMaps, one per quota tree in the
ledger namespace (``gpuquota_core.shared_ledger`` has the format and the counting rules;
docs/design.md, "The store", the cases below).

Every write carries the resourceVersion it was decided on, so one made on an out-of-date copy is a
conflict and is decided again. What this replica knows of each tree's object is a ``TreeLedger``,
with its lifecycle. A deleted object stays, terminating, while ``LEDGER_FINALIZER`` is on it; one
that disappears at once is caught by the registry (``registry``); what this replica last saw in a
lost object is carried into its next write. What only other replicas knew is gone, so the tree is
held until that has expired: its admissions are refused as LedgerUnavailable meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.ledger import DEFAULT_TTL_SECONDS
from webhook.quota.strict.ledger_object import (
    created_at,
    ledger_body,
    ledger_contents,
    ledger_trees,
    newest_pod_version,
    put_config_map,
)
from webhook.quota.strict.registry import LedgerRegistry, RegistryUnavailable
from webhook.quota.strict.tree_ledger import TreeLedger

log = logging.getLogger("gpuquota.quota")


class LedgerUnavailable(Exception):
    """The shared ledger could not be read or written; the message says why."""


class LedgerStore:
    """Reads and writes the ledger ConfigMaps of one namespace (the module docstring)."""

    def __init__(self, core: Any, namespace: str, *, hold_seconds: float = DEFAULT_TTL_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        # ``core``: a CoreV1Api. Any: with _preload_content=False the client returns the raw
        # response, not the model its annotations promise; the JSON is decoded here directly.
        self.core = core
        self.namespace = namespace
        # How long a tree is held after its object was lost: the reservation TTL plus an escrow's window.
        self.hold_seconds = hold_seconds
        self.clock = clock
        self._trees: dict[str, TreeLedger] = {}  # what this replica knows of each tree's object
        self.registry = LedgerRegistry(self.core, namespace, self.list_trees)
        self._lock = threading.Lock()  # admissions of several trees and the reconciler share the records

    def _tree(self, tree_root: str) -> TreeLedger:
        """The tree's record (lock held)."""
        return self._trees.setdefault(tree_root, TreeLedger())

    def record(self, tree_root: str) -> TreeLedger:
        """A copy of what this replica knows of the tree's object now (its hold, its phase, what it owes)."""
        with self._lock:
            return dataclasses.replace(self._tree(tree_root))

    def read(self, tree_root: str, fresh: bool, listed_before: bool = False) -> tuple[str, shared_ledger.Stored]:
        """(resourceVersion or "" when absent, reservations); from the cache unless ``fresh``.

        ``listed_before``: the registry listed the tree before this read (see ``_missing``)."""
        with self._lock:
            copy = self._tree(tree_root).copy
            if not fresh and copy is not None:
                return copy
        name = shared_ledger.ledger_object_name(tree_root)
        try:
            response = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return self._missing(tree_root, listed_before)
            raise LedgerUnavailable(f"cannot read ConfigMap {self.namespace}/{name}: {error.status} {error.reason}") \
                from None
        body = orjson.loads(response.data)
        metadata = body["metadata"]
        try:
            stored, held, counted_through = ledger_contents(body)
        except shared_ledger.LedgerFormatError as error:
            return self._unreadable(tree_root, metadata, str(error))
        uid = str(metadata.get("uid", ""))
        deleted_at = metadata.get("deletionTimestamp")
        with self._lock:
            record, now = self._tree(tree_root), self.clock()
            if record.known is not None and record.known[0] != uid:
                # Deleted and recreated by someone else since this replica's last look. The
                # deletion came before the new object's creation, and before the hold a replica
                # that noticed it recorded: either bounds when what was lost expires.
                self._log_carried(tree_root, record.lost(now, min(held or float("inf"),
                                                                  created_at(metadata) + self.hold_seconds)))
            terminating = None
            if deleted_at:
                # Deleted, and kept by the finalizer with all it holds: held until that has expired,
                # by every replica that reads it, the ones that never saw it before included. Not
                # until a gang's reservation ends (a gang's waiting time, ten minutes by default): the
                # whole tree would refuse every pod that long. The replica that lets the object go
                # carries the gang reservations still open into the next one (TreeLedger.released).
                until = max([held, *(item.reservation.expires_at for item in stored.values() if item.gang is None)])
                if record.terminating is None:
                    log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s is being deleted; holding the "
                                "tree until what it holds has expired (%.1fs)", self.namespace, name, tree_root,
                                until - now)
                terminating, held = (until, str(deleted_at)), max(held, until)
            result = record.read(uid, str(metadata["resourceVersion"]), stored, held, counted_through, terminating)
            listed = record.listed
        if not listed and not deleted_at:
            # A ledger made before the registry existed, or whose maker stopped before listing it.
            self._register(tree_root)
        return result

    def _missing(self, tree_root: str, listed_before: bool) -> tuple[str, shared_ledger.Stored]:
        """The object is not there: a new tree, or a ledger lost. A replica that knew the object
        holds the tree (``TreeLedger.lost``); one that did not asks the registry whether there was one.

        A tree is listed only once its ledger exists, so a ledger found missing after the registry
        listed its tree was lost. Listed now, but missing a moment before, proves nothing: another
        replica may have made and listed it in between (the first admissions of a new tree do), so the
        ledger is read once more."""
        with self._lock:
            record, now = self._tree(tree_root), self.clock()
            self._log_carried(tree_root, record.lost(now, now + self.hold_seconds))
            record.listed = False  # whoever creates it next lists it again
            judged = record.missing_judged
        if not judged and not listed_before:
            with _registry_errors():
                if self.registry.lists(tree_root):
                    return self.read(tree_root, fresh=True, listed_before=True)
        with self._lock:
            record = self._tree(tree_root)
            if not judged and listed_before and record.lost_while_listed(self.clock(), self.hold_seconds):
                log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s is missing, but the tree is "
                            "listed in %s/%s: it was removed without its finalizer; holding the tree for "
                            "%.1fs, until what it held has expired", self.namespace,
                            shared_ledger.ledger_object_name(tree_root), tree_root, self.namespace,
                            shared_ledger.REGISTRY_OBJECT_NAME, self.hold_seconds)
            return "", dict(record.carried)

    def _log_carried(self, tree_root: str, carried: int) -> None:
        if carried:
            log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s was deleted; carrying the %d "
                        "reservations this replica knew into its next write", self.namespace,
                        shared_ledger.ledger_object_name(tree_root), tree_root, carried)

    def _register(self, tree_root: str) -> None:
        """List the tree in the registry (once per replica until its object is found missing)."""
        with _registry_errors():
            self.registry.add(tree_root)
        with self._lock:
            self._tree(tree_root).listed = True

    def _unreadable(self, tree_root: str, metadata: dict[str, Any], problem: str) -> tuple[str, shared_ledger.Stored]:
        """The object exists but cannot be read (hand-edited, written by an incompatible version): a
        loss of what it held, rebuilt over by the next write. All it may have held was written
        before this read, so it has expired one hold later: the tree is held until then (recorded
        in the rebuilt object for every replica), and its podsCountedThrough is replaced by the
        newest resourceVersion of the pods that exist (``_put``). A deleted one goes once the hold
        ends, as any deleted ledger does (``finish_deletion``)."""
        with self._lock:
            record = self._tree(tree_root)
            deleted_at = metadata.get("deletionTimestamp")
            if record.unreadable(self.clock(), self.hold_seconds, str(deleted_at) if deleted_at else None):
                log.warning("strict accounting: ledger ConfigMap %s/%s of tree %s cannot be read (%s); rebuilding it "
                            "and holding the tree for %.1fs, until what it may have held has expired",
                            self.namespace, shared_ledger.ledger_object_name(tree_root), tree_root, problem,
                            self.hold_seconds)
            return str(metadata["resourceVersion"]), dict(record.carried)

    def list_trees(self) -> list[str]:
        return ledger_trees(self.core, self.namespace)

    def drop_carried(self, tree_root: str) -> None:
        with self._lock:
            self._tree(tree_root).carried = {}

    def known_trees(self) -> set[str]:
        """The trees this replica has read or written, whether or not their object still exists."""
        with self._lock:
            return {tree for tree, record in self._trees.items()
                    if record.known is not None or record.carried or record.copy is not None}

    def finish_deletion(self, tree_root: str, version: str) -> bool:
        """Once everything a deleted object held has expired, drop its finalizer so the apiserver
        removes it; True when that was tried (the caller reads again, and may create a new one)."""
        with self._lock:
            terminating = self._tree(tree_root).terminating
        if terminating is None or not version or self.clock() < terminating[0]:
            return False
        # Unlisted first: a replica that finds it missing afterwards must take the tree for a new one.
        with _registry_errors():
            self.registry.remove(tree_root)
        with self._lock:
            self._tree(tree_root).listed = False
        self.write(tree_root, version, {}, release=True)
        return True

    def write(self, tree_root: str, version: str, stored: shared_ledger.Stored, release: bool = False,
              pods_counted_through: int = 0) -> bool:
        """Store ``stored`` if the object is still at ``version`` (absent: ""); False on a conflict.

        A ledger of a tree the registry does not list is created with nothing new in it (what this
        replica carried, the hold), then the tree is listed, then ``stored`` is written: no ledger holds
        a reservation while a replica that finds it missing could take its tree for a new one.
        (``listed`` is what the registry said when the object was last found missing.)
        """
        with self._lock:
            record = self._tree(tree_root)
            listed, carried = record.listed, dict(record.carried)
        if not version and not release and not listed:
            if not self._put(tree_root, "", carried, pods_counted_through=pods_counted_through):
                return False
            self._register(tree_root)
            if stored == carried:
                return True
            with self._lock:
                copy = self._tree(tree_root).copy
                assert copy is not None  # the create just stored it
                version = copy[0]
        return self._put(tree_root, version, stored, release, pods_counted_through)

    def _put(self, tree_root: str, version: str, stored: shared_ledger.Stored, release: bool = False,
             pods_counted_through: int = 0) -> bool:
        """One create or replace of the object (``write``); False on a conflict, a replace that finds
        the object deleted included (the caller reads again, finds it missing, and creates it with
        what this replica carried). ``pods_counted_through``: as ``batch_plan.pruned`` gives it; the
        object keeps the highest ever recorded. ``release`` drops a deleted object's finalizer."""
        name = shared_ledger.ledger_object_name(tree_root)
        with self._lock:
            rebuilding = self._tree(tree_root).rebuilding_until is not None
        if rebuilding and not release:
            pods_counted_through = max(pods_counted_through, newest_pod_version(self.core))
        with self._lock:
            record = self._tree(tree_root)
            terminating, hold = record.terminating, record.hold_to_record(self.clock())
            counted_through = max(pods_counted_through, record.pods_counted_through)
        body = ledger_body(self.namespace, tree_root, stored.values(), hold, counted_through, release=release,
                           deleted_at=terminating[1] if terminating is not None else None)
        try:
            written = put_config_map(self.core, body, version)
        except ApiException as error:
            with self._lock:
                record = self._tree(tree_root)
                if error.status == 404 and version:
                    now = self.clock()
                    self._log_carried(tree_root, record.lost(now, now + self.hold_seconds))
                # A conflict, or a 5xx (etcd timing out, say), which does not prove the write did not land.
                record.copy = None
            if error.status == 409 or (error.status == 404 and version):
                return False
            raise LedgerUnavailable(f"cannot write ConfigMap {self.namespace}/{name}: {error.status} "
                                    f"{error.reason}") from None
        except BaseException:  # no answer: the write may have landed, so the cached copy may be stale
            with self._lock:
                self._tree(tree_root).copy = None
            raise
        with self._lock:
            record = self._tree(tree_root)
            if release:  # gone now; a read finds it missing, and ``lost`` knows nothing was lost
                record.released(self.clock())
            else:
                record.written(str(written.get("uid", "")), str(written["resourceVersion"]), stored, counted_through)
        return True


@contextlib.contextmanager
def _registry_errors() -> Iterator[None]:
    """The registry's failures are the ledger's: admissions of the tree are refused as LedgerUnavailable."""
    try:
        yield
    except RegistryUnavailable as error:
        raise LedgerUnavailable(str(error)) from None
