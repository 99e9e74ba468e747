"""The quota service's half of the shared region: take in what workers reserved, publish totals.

Every section of the service that reads or changes the quota state runs between ``enter`` and
``leave`` with the region's lock held, so the totals the workers read are always the service's
exact ones plus what workers reserved since (in the ring, not yet in the ledger).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.quota_decision import requests_of
from gpuquota_core.quota_objects import QuotaInfo
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.resources import add_lists
from gpuquota_core.usage_index import UsageIndex
from webhook.quota.shared_region import SharedRegion
from webhook.quota.snapshot import SlotLayout, encode_tree, nanos_ceil, slot_count, slot_layout

log = logging.getLogger("gpuquota.quota")
# How long the service waits for a worker holding the lock; a worker holds it for microseconds,
# so this is only reached when one hangs inside (gunicorn then replaces it).
LOCK_TIMEOUT_SECONDS = 5.0


class SharedLockTimeout(TimeoutError):
    pass


class Publisher:
    def __init__(self, region: SharedRegion) -> None:
        self.region = region
        self._generation = 0
        self._layout: SlotLayout = {}
        self._tree_changed = True
        self._everything = True  # every slot must be written (first publish, a rebuild, a repair)

    def hold_alive(self) -> None:
        """Called by the service's main thread, which lives as long as the process."""
        locked, _ = self.region.alive_mutex.try_lock()
        if not locked:
            raise RuntimeError("another process holds the quota service's alive mutex")

    # -- the section -----------------------------------------------------------------------

    def enter(self, ledger: ReservationLedger, now: float) -> None:
        locked, owner_died = self.region.state_mutex.lock(LOCK_TIMEOUT_SECONDS)
        if not locked:
            raise SharedLockTimeout(f"a webhook worker held the quota lock for more than {LOCK_TIMEOUT_SECONDS:g}s")
        if owner_died or self.region.needs_repair:
            log.warning("quota service: a process died holding the shared quota lock; republishing every total")
            self._everything = True
        try:
            self._take_reservations(ledger, now)
        except BaseException:
            self.region.state_mutex.unlock()
            raise

    def leave(self, tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, synced: bool) -> None:
        try:
            self._publish(tree, usage, ledger, synced)
        finally:
            self.region.state_mutex.unlock()

    # -- what changes the tree -------------------------------------------------------------

    def tree_replaced(self) -> None:
        self._tree_changed = True

    def quota_changed(self, previous: QuotaInfo | None, current: QuotaInfo | None) -> None:
        """A quota event: a new generation only when what a decision reads of it changed."""
        if _decision_fields(previous) != _decision_fields(current):
            self._tree_changed = True

    def usage_rebuilt(self) -> None:
        self._everything = True

    # -- internals -------------------------------------------------------------------------

    def _take_reservations(self, ledger: ReservationLedger, now: float) -> None:
        for entry in self.region.drain():
            # The worker decided this admission already; here it only becomes a ledger entry,
            # replacing an earlier reservation of the same pod as a service admission would.
            charges = {quota: requests_of(amounts) for quota, amounts in entry["charges"].items()}
            ledger.reserve(entry["key"], entry["uid"], tuple(entry["quotas"]), requests_of(entry["requests"]), now,
                           pod_uid=entry["pod_uid"], charges=charges, caller=entry["caller"])

    def _publish(self, tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, synced: bool) -> None:
        region = self.region
        if not synced:
            region.generation = 0
            return
        if self._tree_changed:
            self._layout = slot_layout(tree)
            self._generation += 1
            self._tree_changed = False
            self._everything = True
            region.generation = 0  # closed while the file and the slots are out of step
            if slot_count(self._layout) > region.slot_capacity:
                log.warning("quota service: %d quota totals do not fit the shared region's %d; every pod "
                            "goes to the quota service", slot_count(self._layout), region.slot_capacity)
                self._layout = {}
                return
            region.write_tree(encode_tree(tree, self._generation, self._layout))
        if not self._layout:
            return
        quotas: Iterable[str] = self._layout if self._everything else usage.touched | ledger.touched
        try:
            for quota in quotas:
                slots = self._layout.get(quota)
                if not slots:
                    continue
                total = add_lists(usage.used(quota), ledger.used(quota))
                for resource, slot in slots.items():
                    amount = total.get(resource)
                    region.write_slot(slot, nanos_ceil(amount) if amount is not None else 0)
        except OverflowError:
            log.warning("quota service: a quota total exceeds what the shared region holds; every pod goes to "
                        "the quota service until the tree changes")
            region.generation = 0
            self._layout = {}  # closed until the tree changes, rather than publish a wrong total
            return
        usage.touched.clear()
        ledger.touched.clear()
        self._everything = False
        region.reservations_held = len(ledger)
        region.needs_repair = False
        region.generation = self._generation


def _decision_fields(quota: QuotaInfo | None) -> QuotaInfo | None:
    return replace(quota, resource_version="") if quota is not None else None
