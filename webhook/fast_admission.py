"""A worker admits a pod CREATE itself when the shared totals show room, else asks the quota service.

The round trip to the quota service was most of what validating a pod cost (docs/benchmarks.md).
With local accounting the service shares its totals with the workers (webhook.shared_region), and
a worker runs the same ``decide`` on them, under the region's lock, and reserves in place: it
raises the totals and leaves the reservation in the ring for the service's ledger.

The worker only ever says yes. Everything it cannot answer exactly goes to the service, which
has the whole state and writes the messages: a pod that does not fit (the service may still admit
a retried admission that the totals count twice), an UPDATE, a region not ready (not synced yet,
a tree being republished, a repair after a crash), a service that died (its alive mutex tells at
once), and any caller that might be near its reservation bound. The totals are rounded up and
include every reservation made, so a yes from the totals is a yes from the service.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuquota_core.quota_decision import decide
from gpuquota_core.quota_snapshot import PublishedTotals, TreeSnapshot, decode_tree, nanos_ceil
from gpuquota_core.resources import ResourceList

from .quota_port import ALLOW, PodAdmission, QuotaDecider, Verdict, quota_requests
from .shared_region import SLOT_BYTES, SharedRegion

# A worker holds the lock for microseconds; one that waits longer than this asks the service.
LOCK_WAIT_SECONDS = 0.05


class _NoReservations:
    """The published totals include the ledger already."""

    def used(self, quota: str) -> ResourceList:
        return {}


_NO_RESERVATIONS = _NoReservations()


class FastAdmission:
    """A QuotaDecider: the shared totals where they answer, ``service`` for everything else."""

    def __init__(self, region_path: Path, service: QuotaDecider) -> None:
        self.region_path = region_path
        self.service = service
        self._region: SharedRegion | None = None
        self._pid = 0
        self._snapshot: TreeSnapshot | None = None

    def ready(self) -> tuple[bool, str]:
        return self.service.ready()

    def review_elasticquota(self, operation: str, quota: dict[str, Any], old_quota: dict[str, Any] | None,
                            dry_run: bool) -> Verdict:
        return self.service.review_elasticquota(operation, quota, old_quota, dry_run)

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        if admission.operation == "CREATE":
            region = self._mapped()
            if region is not None and region.alive_mutex.owner_alive() and self._admit(region, admission):
                return ALLOW
        return self.service.admit_pod(admission)

    def _mapped(self) -> SharedRegion | None:
        if self._region is None or self._pid != os.getpid():  # a mapping is per process
            self._region, self._pid = SharedRegion.open(self.region_path), os.getpid()
        return self._region

    def _admit(self, region: SharedRegion, admission: PodAdmission) -> bool:
        """True when admitted (and reserved) from the totals; False leaves the answer to the service."""
        for _ in range(2):  # a second pass after reading a newer tree
            locked, owner_died = region.state_mutex.lock(LOCK_WAIT_SECONDS)
            if not locked:
                return False
            try:
                if owner_died:
                    region.needs_repair = True  # the service rewrites every total before the next yes
                    return False
                generation = region.generation
                if generation == 0 or region.needs_repair:
                    return False
                snapshot = self._snapshot
                if snapshot is not None and snapshot.generation == generation:
                    return self._decide_and_reserve(region, snapshot, admission)
            finally:
                region.state_mutex.unlock()
            # Read outside the lock: the file is replaced whole, and the generation is checked again.
            document = region.read_tree()
            if document is None:
                return False
            self._snapshot = decode_tree(document)
        return False

    def _decide_and_reserve(self, region: SharedRegion, snapshot: TreeSnapshot, admission: PodAdmission) -> bool:
        # Each caller's reservations are at most all of them: below the bound, no caller reaches it.
        if region.reservations_held + region.pending() + 1 > region.max_held:
            return False
        pod, _ = quota_requests(admission)
        decision = decide(snapshot.tree, PublishedTotals(snapshot.layout, region.read_slot), _NO_RESERVATIONS, pod)
        if not decision.allowed:
            return False
        if admission.dry_run or not decision.quotas:
            return True
        raised: list[tuple[int, int]] = []
        for quota in decision.quotas:
            slots = snapshot.layout.get(quota, {})
            for resource, amount in decision.charges[quota].items():
                slot = slots.get(resource)
                if slot is not None:
                    raised.append((slot, region.read_slot(slot) + nanos_ceil(amount)))
        entry = {"key": f"{pod.namespace}/{pod.name}", "uid": admission.uid, "pod_uid": admission.pod_uid,
                 "caller": admission.caller, "quotas": decision.quotas,
                 "requests": admission.canonical_requests,
                 "charges": {quota: {name: str(q) for name, q in charges.items()}
                             for quota, charges in decision.charges.items()}}
        try:
            for _slot, value in raised:  # every new total must fit before anything is written
                value.to_bytes(SLOT_BYTES, "little", signed=True)
        except OverflowError:
            return False
        # The ring first: a worker dying between the two leaves a reservation whose totals the
        # service republishes, never raised totals it does not know about.
        if not region.push(entry):
            return False
        for slot, value in raised:
            region.write_slot(slot, value)
        return True
