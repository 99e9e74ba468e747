"""The reconciler: every half TTL, drop expired, long-confirmed and provably lost reservations from
every ledger, so room comes back without waiting for the next admission of its tree.

With a writer Lease it runs at the holder (and at a replica in the degraded mode); a replica that
forwards to a holder skips its rounds, whose writes would only meet the holder's as conflicts.

When is a reservation's room provably free before its TTL? Only when its pod can never be stored.
The webhook timeout (5 s) does not prove it: it bounds how long the apiserver waits for our answer,
not the create. After the validating webhooks the apiserver still writes the pod to etcd, and that
write is bounded only by the create request's own deadline (kube-apiserver ``--request-timeout``,
60 s by default; a client may ask for less). With etcd paused, a create admitted just before the
pause lands when etcd resumes, however late our answer was. So the rule (:meth:`Reconciler.lost`):
past the create deadline (``create_deadline_seconds``, the apiserver's default), a consistent GET of
the pod that finds no pod with the reservation's uid proves the create failed, and its room is
released. Under the default TTL (30 s) the TTL releases first; the rule earns its place with a TTL
at or above the create deadline, the only setting under which a reservation never expires while
its create can still land (docs/reliability.md, "Known limits").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import orjson
from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from webhook.quota import metrics
from webhook.quota.state import QuotaState
from webhook.quota.strict.batch_plan import pruned
from webhook.quota.strict.store import LedgerStore, LedgerUnavailable

log = logging.getLogger("gpuquota.quota")
# How long after its admission a pod create can still be written to etcd: kube-apiserver's
# --request-timeout (its default), which bounds the whole create request, the storage write after
# the admission webhooks included. Not the webhook timeout: that bounds only the wait for our answer.
DEFAULT_CREATE_DEADLINE_SECONDS = 60.0


class Reconciler:
    def __init__(self, state: QuotaState, store: LedgerStore, *, clock: Callable[[], float],
                 create_deadline_seconds: float = DEFAULT_CREATE_DEADLINE_SECONDS,
                 forwarding: Callable[[], bool] = lambda: False) -> None:
        self.state, self.store = state, store
        self.clock = clock
        self.create_deadline_seconds = create_deadline_seconds
        self.forwarding = forwarding  # whether another replica writes the ledgers now (the writer Lease)

    def reconcile_once(self) -> int:
        """One round over the trees with an object (any replica's) and those this replica wrote to,
        whose object may have been deleted since: it is recreated with the reservations this replica
        carried over. Returns how many reservations it dropped."""
        dropped = 0
        for tree_root in sorted(set(self.store.list_trees()) | self.store.known_trees()):
            version, stored = self.store.read(tree_root, fresh=True)
            if self.store.finish_deletion(tree_root, version):
                continue
            now = self.clock()
            with self.state.snapshot() as view:
                keep, counted_through = pruned(view, stored, now)
            lost = self.lost(keep, now)
            for pod_key in lost:
                del keep[pod_key]
            changed = len(keep) < len(stored) or self.store.record(tree_root).owes_rewrite()
            if not version and not keep:
                self.store.drop_carried(tree_root)  # nothing left worth recreating the object for
            elif changed and self.store.write(tree_root, version, keep, pods_counted_through=counted_through):
                dropped += len(stored) - len(keep)
                if lost:
                    log.info("strict accounting: released %d reservations of creates that can no longer land "
                             "(tree %s): %s", len(lost), tree_root, ", ".join(sorted(lost)))
        return dropped

    def lost(self, stored: shared_ledger.Stored, now: float) -> set[str]:
        """Reservations whose pod provably never landed and never can (the module docstring)."""
        lost: set[str] = set()
        for pod_key, item in stored.items():
            reservation = item.reservation
            if not reservation.pod_uid or now < item.admitted_at + self.create_deadline_seconds:
                continue
            namespace, _, name = pod_key.partition("/")
            if self.pod_uid(namespace, name) != reservation.pod_uid:
                lost.add(pod_key)
        return lost

    def pod_uid(self, namespace: str, name: str) -> str | None:
        """The uid of the pod stored under that name, None when there is none (a consistent read)."""
        try:
            response = self.store.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise LedgerUnavailable(f"cannot read pod {namespace}/{name}: {error.status} {error.reason}") from None
        return str(orjson.loads(response.data)["metadata"].get("uid", ""))

    def run(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            if self.forwarding():
                continue
            try:
                dropped = self.reconcile_once()
            except Exception as error:  # the next round tries again; admissions prune as they write
                log.warning("strict accounting: reconcile failed: %s", error)
                continue
            if dropped:
                metrics.RESERVATIONS_EXPIRED.inc(dropped)
                log.info("strict accounting: released %d stale reservations", dropped)
