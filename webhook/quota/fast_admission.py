"""A worker admits a pod CREATE itself when the shared totals show room, else asks the quota service.

The round trip to the quota service was most of what validating a pod cost (docs/benchmarks.md).
With local accounting the service shares its totals with the workers (webhook.quota.shared_region). A
worker reduces the same ``decide`` to integer bounds once per pod shape and tree generation
(webhook.quota.snapshot.fit_check), checks them under the region's lock, and reserves in
place: it raises the totals and leaves the reservation in the ring for the service's ledger.

The worker only ever says yes. Everything it cannot answer exactly goes to the service, which
has the whole state and writes the messages: a pod that does not fit (the service may still admit
a retried admission that the totals count twice), an UPDATE, a region not ready (not synced yet,
a tree being republished, a repair after a crash), a service that died (its alive mutex tells at
once), and any caller that might be near its reservation bound. The totals and charges are
rounded up, the limits down, and the totals include every reservation made, so a yes from the
totals is a yes from the service.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuquota_core.memo import BoundedMemo
from gpuquota_core.quota_objects import POD_QUOTA_LABEL
from webhook.admission.quota_port import (
    ALLOW,
    PodAdmission,
    QuotaDecider,
    QuotaFigure,
    ReportsQuotaFigures,
    Verdict,
    quota_requests,
)
from webhook.quota.shared_region import MAX_SLOT_VALUE, SharedRegion
from webhook.quota.snapshot import FitCheck, TreeSnapshot, decode_tree, fit_check

# A worker holds the lock for microseconds; one that waits longer than this asks the service.
LOCK_WAIT_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class _PublishedTree:
    """One generation's tree, and per pod shape the plan of what decide() checks against it (so
    an admission is a few integer additions, no quantity arithmetic). The plans belong to this
    tree's slot layout, hence one object: a thread holding an older one never mixes the two."""

    snapshot: TreeSnapshot
    plans: BoundedMemo[_Plan | _Refused]


@dataclass(frozen=True, slots=True)
class _Plan:
    """One pod shape's check against one tree, and its charges as the ring entry writes them."""

    check: FitCheck
    charges_text: dict[str, dict[str, str]]


class _Refused:
    """decide() refuses this shape whatever is used: the service answers, with its message."""


_REFUSED = _Refused()


class FastAdmission:
    """A QuotaDecider: the shared totals where they answer, ``service`` for everything else."""

    def __init__(self, region_path: Path, service: QuotaDecider) -> None:
        self.region_path = region_path
        self.service = service
        self._region: SharedRegion | None = None
        self._pid = 0
        self._tree: _PublishedTree | None = None  # replaced whole: threads read it once each

    def alive(self) -> tuple[bool, str]:
        return self.service.alive()

    def ready(self) -> tuple[bool, str]:
        return self.service.ready()

    def quota_figures(self) -> list[QuotaFigure] | None:
        return self.service.quota_figures() if isinstance(self.service, ReportsQuotaFigures) else None

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return self.service.review_elasticquota(quota)

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        if admission.operation == "CREATE":
            region = self._mapped()
            if region is not None and not region.alive_mutex.owner_alive():
                # Totals nobody maintains any more. A restarted service creates a new region in
                # the same place: map it afresh next time, and let the service answer meanwhile.
                self._region = None
            elif region is not None and self._admit(region, admission):
                return ALLOW
        return self.service.admit_pod(admission)

    def _mapped(self) -> SharedRegion | None:
        if self._region is None or self._pid != os.getpid():  # a mapping is per process
            self._region, self._pid = SharedRegion.open(self.region_path), os.getpid()
            # A region created by a new service numbers its generations from the start again: a
            # tree read from the old one could carry the same number and another slot layout.
            self._tree = None
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
                tree = self._tree
                if tree is not None and tree.snapshot.generation == generation:
                    return self._decide_and_reserve(region, tree, admission)
            finally:
                region.state_mutex.unlock()
            # Read outside the lock: the file is replaced whole, and the generation is checked again.
            document = region.read_tree()
            if document is None:
                return False
            self._tree = _PublishedTree(decode_tree(document), BoundedMemo())
        return False

    def _decide_and_reserve(self, region: SharedRegion, tree: _PublishedTree, admission: PodAdmission) -> bool:
        # Each caller's reservations are at most all of them: below the bound, no caller reaches it.
        if region.reservations_held + region.pending() + 1 > region.max_held:
            return False
        plan = _plan(tree, admission)
        if isinstance(plan, _Refused) or not plan.check.fits(region.read_slot):
            return False
        check = plan.check
        if admission.dry_run or not check.quotas:
            return True
        raised = [(slot, region.read_slot(slot) + charge) for slot, charge, _limit in check.bounds]
        if any(value > MAX_SLOT_VALUE for _slot, value in raised):  # every new total must fit first
            return False
        entry = {"key": f"{admission.namespace}/{admission.name}", "uid": admission.uid,
                 "pod_uid": admission.pod_uid, "caller": admission.caller, "quotas": check.quotas,
                 "requests": admission.canonical_requests, "charges": plan.charges_text}
        # The ring first: a worker dying between the two leaves a reservation whose totals the
        # service republishes, never raised totals it does not know about.
        if not region.push(entry):
            return False
        for slot, value in raised:
            region.write_slot(slot, value)
        return True


def _plan(tree: _PublishedTree, admission: PodAdmission) -> _Plan | _Refused:
    # Everything decide() reads of a CREATE but the pod's name, which only its messages use.
    key = (admission.namespace, admission.labels.get(POD_QUOTA_LABEL, ""), admission.unknown_gpu_memory,
           tuple(admission.canonical_requests.items()))
    plan = tree.plans.get(key)
    if plan is None:
        check = fit_check(tree.snapshot.tree, tree.snapshot.layout, quota_requests(admission)[0])
        if check is None:
            plan = tree.plans.remember(key, _REFUSED)
        else:
            text = {quota: {name: str(q) for name, q in charges.items()} for quota, charges in check.charges.items()}
            plan = tree.plans.remember(key, _Plan(check, text))
    return plan
