"""The admission decision for one pod against the quota tree: pure, no I/O, no clock.

Used = watched pods (``UsageIndex``) + reservations not yet seen (``ReservationLedger``), less
what an earlier delivery of the same admission reserved (``ReservationLedger.made_by``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .enforcement import PARENT_QUOTA, QUOTA_EXCEEDED, QUOTA_NOT_FOUND, UNKNOWN_GPU_MEMORY
from .ledger import Reservation
from .quantity import ZERO, Quantity
from .quota_check import charges_for_chain, check_chain
from .quota_tree import QuotaTree
from .resources import GPU_MEMORY_RATIO, ResourceList, add_lists, subtract_lists


class Totals(Protocol):
    """What ``decide`` reads of the usage and the ledger: one quota's totals."""

    def used(self, quota: str) -> ResourceList: ...


@dataclass(frozen=True, slots=True)
class PodQuotaRequest:
    namespace: str
    name: str
    quota_label: str
    requests: ResourceList  # canonical, pod-level
    unknown_gpu_memory: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    quotas: tuple[str, ...] = ()  # chain to charge when allowed (leaf first)
    # Per quota of the chain, what admitting adds there (less than the request where an UPDATE's
    # old version is already counted).
    charges: dict[str, ResourceList] = field(default_factory=dict)
    message: str = ""
    reason: str = ""
    details: dict[str, str] = field(default_factory=dict)


def needs_check(new: PodQuotaRequest, old: PodQuotaRequest | None, tree: QuotaTree) -> bool:
    """UPDATE is judged again only when the quota changes or a request grows."""
    if old is None or _grows(new, old):
        return True
    if _same_quota_label(new, old):
        return False  # the same quota, whatever the tree holds
    return tree.resolve(new.namespace, new.quota_label) != tree.resolve(old.namespace, old.quota_label)


def quota_use_unchanged(new: PodQuotaRequest, old: PodQuotaRequest) -> bool:
    """An UPDATE that keeps its namespace and quota label and grows no request.

    The pod then resolves to the same quota for no more than before, whatever the tree holds, so
    there is nothing to decide: a webhook worker answers it without the quota service, and the
    metadata updates a GPU pod needs (finalizers, labels) pass even while that service is down.
    """
    return _same_quota_label(new, old) and not _grows(new, old)


def _same_quota_label(new: PodQuotaRequest, old: PodQuotaRequest) -> bool:
    return new.namespace == old.namespace and new.quota_label == old.quota_label


def _grows(new: PodQuotaRequest, old: PodQuotaRequest) -> bool:
    return any(asked > old.requests.get(name, ZERO) for name, asked in new.requests.items())


def decide(tree: QuotaTree, usage: Totals, ledger: Totals, pod: PodQuotaRequest,
           old: PodQuotaRequest | None = None, replay_of: Reservation | None = None) -> Decision:
    resolution = tree.resolve(pod.namespace, pod.quota_label)
    if resolution.rule == "label-not-found":
        # Koordinator's quota admission refuses the same pod with the same words; ours follow them.
        return Decision(False, message=f"elastic quota {pod.quota_label} not found: pod {pod.namespace}/{pod.name} "
                        f"names ElasticQuota {pod.quota_label!r} in label quota.scheduling.koordinator.sh/name, "
                        f"but no such quota exists", reason=QUOTA_NOT_FOUND)
    if resolution.quota is None:
        return Decision(True)
    leaf = tree.quotas[resolution.quota]
    if leaf.is_parent:
        # Koordinator's ElasticQuota pod check says this first (pkg/webhook/elasticquota/pod_check.go), then our reason.
        return Decision(False, message=f"pod can not be linked to a parentQuotaGroup,quota:{leaf.name}, "
                        f"pod:{pod.name}: pod {pod.namespace}/{pod.name} cannot use ElasticQuota {leaf.ref}: it is "
                        f"a parent quota (is-parent=true); use one of its leaf quotas", reason=PARENT_QUOTA)
    chain = tuple(q.name for q in tree.chain(leaf.name))
    if pod.unknown_gpu_memory:
        for name in chain:
            if GPU_MEMORY_RATIO in tree.limit(name)[0]:
                return Decision(False, message=(
                    f"pod {pod.namespace}/{pod.name} requests koordinator.sh/gpu-memory in bytes, which cannot be "
                    f"converted to koordinator.sh/gpu-memory-ratio (no GPU model mapping), but quota "
                    f"{tree.quotas[name].ref} limits gpu-memory-ratio: request koordinator.sh/gpu-memory-ratio "
                    f"instead, or add a model mapping to the conversion config"), reason=UNKNOWN_GPU_MEMORY)
    counted = _counted_by_old_version(tree, old)
    reserved: dict[str, ResourceList] = {name: ledger.used(name) for name in chain}
    if replay_of is not None:
        for name in set(chain) & set(replay_of.quotas):
            reserved[name] = subtract_lists(reserved[name], replay_of.charge_of(name))
    used = {name: add_lists(usage.used(name), reserved[name]) for name in chain}
    charges = charges_for_chain(chain, pod.requests, counted)
    exceeded = check_chain(tree, leaf.name, charges, used, reserved)
    if exceeded:
        first = exceeded[0]
        # A quota naming both GPU families is judged by the stricter spelling; say so, or the
        # user sees a limit that matches neither number they wrote.
        notes = [note.message for note in tree.limit(first.quota.name)[1]
                 if note.message.split(" ", 1)[0] in first.limited]
        message = first.message + "".join(f"; {note}" for note in notes)
        return Decision(False, message=message, reason=QUOTA_EXCEEDED,
                        details={"quota": first.quota.ref})
    return Decision(True, quotas=chain, charges=charges)


def _counted_by_old_version(tree: QuotaTree, old: PodQuotaRequest | None) -> dict[str, ResourceList]:
    """What the old version of an UPDATE already takes in each quota of its own chain."""
    if old is None:
        return {}
    resolution = tree.resolve(old.namespace, old.quota_label)
    if resolution.quota is None or resolution.rule == "label-not-found":
        return {}
    return {quota.name: old.requests for quota in tree.chain(resolution.quota)}


def requests_of(strings: Mapping[str, str]) -> ResourceList:
    return {name: Quantity.parse(value) for name, value in strings.items()}
