"""The decision check: what a pod adds to each quota of its chain, and the first limit it would pass."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .quantity import ZERO, Quantity
from .quota_objects import UNCHECKED_QUOTAS, QuotaInfo
from .quota_tree import QuotaTree
from .resources import ResourceList, format_list


@dataclass(frozen=True, slots=True)
class Exceeded:
    """One quota on the chain that the pod would push past its limit."""

    quota: QuotaInfo
    leaf: str
    requested: ResourceList
    used: ResourceList
    limited: ResourceList
    # The part of ``used`` held by reservations of admissions whose pods no watch has shown yet:
    # said in the message, so a refusal during an outage does not read as a quota full of pods.
    reserved: ResourceList = field(default_factory=dict)

    @property
    def message(self) -> str:
        names = sorted(self.limited)
        # A total of many pods has no format of its own: it is quoted in the format of the limit
        # it is compared with, as Kubernetes prints quantities (memory=4Gi, not 4294967296).
        used = {name: Quantity(self.used[name].amount, self.limited[name].format)
                for name in names if not self.used.get(name, ZERO).is_zero()}
        reserved = {name: Quantity(self.reserved[name].amount, self.limited[name].format)
                    for name in names if not self.reserved.get(name, ZERO).is_zero()}
        text = f"exceeded quota: {self.quota.ref}, requested: {format_list(_pick(self.requested, names))}, " \
               f"used: {format_list(used)}"
        if reserved:
            held = str(next(iter(reserved.values()))) if len(names) == 1 else format_list(reserved)
            text += f" ({held} of it reserved by admissions not yet seen)"
        text += f", limited: {format_list(_pick(self.limited, names))}"
        if self.quota.name != self.leaf:
            text += f" (ancestor of quota {self.leaf})"
        return text


def _pick(resources: Mapping[str, Quantity], names: list[str]) -> ResourceList:
    return {name: resources.get(name, ZERO) for name in names}


def added_requests(request: Mapping[str, Quantity], counted: Mapping[str, Quantity]) -> ResourceList:
    """What ``request`` adds on top of what the same pod is already counted for (never negative)."""
    if not counted:  # a CREATE, nearly every admission: nothing to take off
        return {name: asked for name, asked in request.items() if asked > ZERO}
    return {name: asked - counted.get(name, ZERO) for name, asked in request.items()
            if asked > counted.get(name, ZERO)}


def charges_for_chain(chain: Iterable[str], request: Mapping[str, Quantity],
                      counted: Mapping[str, ResourceList] | None = None) -> dict[str, ResourceList]:
    """Per quota of ``chain``, what admitting ``request`` adds there.

    ``counted`` is what the pod already takes in each quota (the old version of an UPDATE): a pod
    moved between two leaves of one parent adds nothing to the parent, only to the new leaf.
    """
    counted = counted or {}
    return {quota: added_requests(request, counted.get(quota, {})) for quota in chain}


def check_chain(tree: QuotaTree, leaf: str, charges: Mapping[str, ResourceList],
                used_of: Mapping[str, ResourceList],
                reserved_of: Mapping[str, ResourceList] | None = None) -> list[Exceeded]:
    """Every quota from ``leaf`` up to the root whose limit ``used + charge`` would exceed.

    ``charges``: what admitting adds in each quota of the chain (:func:`charges_for_chain`). Only
    names present in a quota's limit are enforced there (names absent from max are unlimited, as
    in Koordinator).
    """
    exceeded: list[Exceeded] = []
    for quota in tree.chain(leaf):
        if quota.name in UNCHECKED_QUOTAS:
            continue
        limit, _ = tree.limit(quota.name)
        used = used_of.get(quota.name, {})
        adds = charges[quota.name]
        over: ResourceList = {}
        for name, asked in adds.items():
            if name in limit and not asked.is_zero() and used.get(name, ZERO) + asked > limit[name]:
                over[name] = limit[name]
        if over:
            exceeded.append(Exceeded(quota, leaf, dict(adds), dict(used), over,
                                     dict((reserved_of or {}).get(quota.name, {}))))
    return exceeded
