"""The quota tree and per-quota totals as the webhook workers read them from the quota service.

The quota service publishes its tree (one JSON document per generation) and, per quota and per
resource that quota limits, one total: watched usage plus reservations, in nano-units. A worker
rebuilds the same :class:`QuotaTree` from the document and reduces the very same ``decide`` to
integer bounds per pod shape (:func:`fit_check`), so the two can only differ in the direction of
caution: totals and charges are rounded up, limits down, and a worker that finds a pod does not
fit leaves the answer to the service.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpuquota_core.quantity import Quantity, QuantityFormat
from gpuquota_core.quota_decision import PodQuotaRequest, decide
from gpuquota_core.quota_objects import UNCHECKED_QUOTAS, QuotaInfo
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.resources import ResourceList

NANOS_PER_UNIT = 10**9

# (quota, resource) -> the index of that total in the service's table
SlotLayout = dict[str, dict[str, int]]


def nanos_ceil(quantity: Quantity) -> int:
    """The quantity in nano-units, rounded up: a total read back is never less than the truth."""
    return math.ceil(quantity.amount * NANOS_PER_UNIT)


def nanos_floor(quantity: Quantity) -> int:
    """Rounded down: a limit read back is never more than the truth."""
    return math.floor(quantity.amount * NANOS_PER_UNIT)


def slot_layout(tree: QuotaTree) -> SlotLayout:
    """One slot per quota and limited resource; names a quota does not limit it never checks."""
    layout: SlotLayout = {}
    index = 0
    for name in sorted(tree.quotas):
        limit, _ = tree.limit(name)
        slots = layout[name] = {}
        for resource in sorted(limit):
            slots[resource] = index
            index += 1
    return layout


def slot_count(layout: SlotLayout) -> int:
    return sum(len(slots) for slots in layout.values())


def encode_tree(tree: QuotaTree, generation: int, layout: SlotLayout) -> dict[str, Any]:
    return {"generation": generation, "quotas": [_encode_quota(q) for q in tree.quotas.values()], "slots": layout}


@dataclass(frozen=True, slots=True)
class TreeSnapshot:
    generation: int
    tree: QuotaTree
    layout: SlotLayout


def decode_tree(document: Mapping[str, Any]) -> TreeSnapshot:
    tree = QuotaTree.build(_decode_quota(q) for q in document["quotas"])
    layout = {quota: dict(slots) for quota, slots in document["slots"].items()}
    return TreeSnapshot(int(document["generation"]), tree, layout)


@dataclass(frozen=True, slots=True)
class FitCheck:
    """``decide`` for one pod shape against one published tree, reduced to integer bounds.

    ``bounds`` holds, per total the pod is checked against, (slot, charge, limit) in nano-units:
    the charge rounded up, the limit rounded down, so a pod that fits here fits the exact
    decision too. ``quotas`` and ``charges`` are that decision's, for the reservation.
    """

    quotas: tuple[str, ...]
    charges: dict[str, ResourceList]
    bounds: tuple[tuple[int, int, int], ...]

    def fits(self, read: Callable[[int], int]) -> bool:
        return all(read(slot) + charge <= limit for slot, charge, limit in self.bounds)


class _NothingUsed:
    def used(self, quota: str) -> ResourceList:
        return {}


_NOTHING_USED = _NothingUsed()


def fit_check(tree: QuotaTree, layout: SlotLayout, pod: PodQuotaRequest) -> FitCheck | None:
    """The :class:`FitCheck` of a pod CREATE, or None when ``decide`` refuses it whatever is used.

    Built by ``decide`` itself on zero totals, so its rules stay stated once: what it refuses with
    nothing used (an unknown quota, a parent quota, a request over the limit by itself) it
    refuses with anything used, as usage is never negative. ``layout`` is the tree's own.
    """
    decision = decide(tree, _NOTHING_USED, _NOTHING_USED, pod)
    if not decision.allowed:
        return None
    bounds = []
    for quota in decision.quotas:
        if quota in UNCHECKED_QUOTAS:
            continue
        limit, _ = tree.limit(quota)
        for name, asked in decision.charges[quota].items():
            if name in limit and not asked.is_zero():
                bounds.append((layout[quota][name], nanos_ceil(asked), nanos_floor(limit[name])))
    return FitCheck(decision.quotas, decision.charges, tuple(bounds))


def _encode_list(resources: ResourceList | None) -> list[list[Any]] | None:
    # Amounts as exact fraction text ("3/2"): a quantity may exceed what a JSON integer carries.
    if resources is None:
        return None
    return [[name, str(q.amount), q.format.value] for name, q in resources.items()]


def _decode_list(entries: list[list[Any]] | None) -> ResourceList | None:
    if entries is None:
        return None
    return {name: Quantity(Fraction(amount), QuantityFormat(fmt)) for name, amount, fmt in entries}


def _encode_quota(quota: QuotaInfo) -> dict[str, Any]:
    return {"name": quota.name, "namespace": quota.namespace, "parent": quota.parent, "is_parent": quota.is_parent,
            "min": _encode_list(quota.min), "max": _encode_list(quota.max), "admission": _encode_list(quota.admission),
            "bound_namespaces": list(quota.bound_namespaces), "tree_id": quota.tree_id}


def _decode_quota(entry: Mapping[str, Any]) -> QuotaInfo:
    return QuotaInfo(name=entry["name"], namespace=entry["namespace"], parent=entry["parent"],
                     is_parent=entry["is_parent"], min=_decode_list(entry["min"]) or {},
                     max=_decode_list(entry["max"]) or {}, admission=_decode_list(entry["admission"]),
                     bound_namespaces=tuple(entry["bound_namespaces"]), tree_id=entry["tree_id"])
