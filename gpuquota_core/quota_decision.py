"""The admission decision for one pod against the quota tree: pure, no I/O, no clock.

Used = watched pods (``UsageIndex``) + reservations not yet seen (``ReservationLedger``), less
what an earlier delivery of the same admission reserved (``ReservationLedger.made_by``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Protocol

from .enforcement import PARENT_QUOTA, QUOTA_EXCEEDED, QUOTA_NOT_FOUND, UNKNOWN_GPU_MEMORY
from .gang import FROM_POD_GROUP, GANG_DETAIL, GANG_RESULT_DETAIL, REFUSED, Gang, gang_need
from .ledger import GangReservation, Reservation, ReservationLedger, remaining_need
from .quantity import ZERO, Quantity
from .quota_check import Exceeded, charges_for_chain, check_chain
from .quota_tree import QuotaTree
from .resources import GPU_MEMORY_RATIO, ResourceList, add_lists, format_list, subtract_lists


class Totals(Protocol):
    """What ``decide`` reads of the usage and the ledger: one quota's totals."""

    def used(self, quota: str) -> ResourceList: ...


class GangTotals(Totals, Protocol):
    """What ``decide`` reads of the ledger for a gang member (``ReservationLedger`` has it all)."""

    def gang(self, gang: str) -> GangReservation | None: ...

    def gang_members(self, gang: str) -> tuple[int, ResourceList]: ...

    def gang_hold(self, gang: str) -> ResourceList: ...


@dataclass(frozen=True, slots=True)
class GangOpening:
    """The reservation an admitted gang member opens for the rest of its gang's minimum."""

    gang: str
    need: ResourceList
    min_members: int
    waiting_seconds: int
    pod_group: bool = False  # given up when its PodGroup is deleted


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
    # The gang whose reservation this pod draws from ("" when it is charged like any pod), and the
    # reservations its admission opens: for the rest of its gang's minimum, and for the minimums of
    # the other gangs of its gang group.
    gang: str = ""
    opens_gangs: tuple[GangOpening, ...] = ()


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
           old: PodQuotaRequest | None = None, replay_of: Reservation | None = None,
           gang: tuple[Gang, GangTotals] | None = None) -> Decision:
    """Admit ``pod`` or not. ``gang``: the gang it is a member of (a CREATE's only) and the ledger's
    account of gangs (``ledger`` itself, where it keeps them), so that it is admitted only with room
    for the rest of the gang's minimum."""
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
    if gang is not None and old is None:
        return _decide_gang_member(tree, leaf.name, chain, used, reserved, charges, pod, gang[0], gang[1], replay_of)
    return _decided(tree, leaf.name, chain, used, reserved, charges)


def hold_admitted(ledger: ReservationLedger, decision: Decision, pod_key: str, admission_uid: str,
                  requests: Mapping[str, Quantity], now: float, *, pod_uid: str = "", caller: str = "") -> Reservation:
    """Record an admitted pod in ``ledger`` as the webhook's state does: the gang reservations its
    admission opens (each until its gang's waiting time), then its own reservation, drawing from its
    gang's. The one place both the webhook and the views that replay admissions write a decision."""
    for opening in decision.opens_gangs:
        ledger.open_gang(GangReservation(opening.gang, admission_uid, decision.quotas, opening.need,
                                         opening.min_members, now + opening.waiting_seconds,
                                         pod_group=opening.pod_group))
    return ledger.reserve(pod_key, admission_uid, decision.quotas, requests, now, pod_uid=pod_uid,
                          charges=decision.charges, caller=caller, gang=decision.gang)


def _decided(tree: QuotaTree, leaf: str, chain: tuple[str, ...], used: dict[str, ResourceList],
             reserved: dict[str, ResourceList], charges: dict[str, ResourceList]) -> Decision:
    exceeded = check_chain(tree, leaf, charges, used, reserved)
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


def _decide_gang_member(tree: QuotaTree, leaf: str, chain: tuple[str, ...], used: dict[str, ResourceList],
                        reserved: dict[str, ResourceList], charges: dict[str, ResourceList],
                        pod: PodQuotaRequest, gang: Gang, ledger: GangTotals,
                        replay_of: Reservation | None) -> Decision:
    """A gang member: admitted only if, with it, the room the rest of its gang's minimum takes is
    held too (what the gang's reservation holds, or opens with this member).

    What admitting adds is the member's own charge plus the change in what the gang's reservation
    holds: a member drawing from a reservation adds nothing beyond it, and the member that opens
    one adds the whole minimum's need at once, so two gangs racing for one quota cannot both be
    admitted in part.
    """
    held = ledger.gang(gang.key)
    if held is not None and held.quotas != chain:
        # A member under another quota than the one its gang reserved at draws nothing there:
        # charged like any pod (the audit names gangs whose members disagree).
        return _decided(tree, leaf, chain, used, reserved, charges)
    taking, taken = ledger.gang_members(gang.key)
    # What the reservation holds now, as the ledger's totals count it.
    before = remaining_need(held.need, held.min_members, taking, taken) if held is not None else {}
    count, asked = taking, taken
    if replay_of is not None and replay_of.gang == gang.key:
        # A second delivery of the same admission: its first delivery's draw is this one.
        count, asked = count - 1, subtract_lists(asked, replay_of.requests)
    # The gang keeps the minimum of the member that opened its reservation, as koord-scheduler
    # keeps the one of the first member it sees.
    if held is not None:
        gang = replace(gang, min_members=held.min_members)
    if count >= gang.min_members:
        return _decided(tree, leaf, chain, used, reserved, charges)  # the minimum takes room already
    need = held.need if held is not None else gang_need(gang, pod.requests)
    after = remaining_need(need, gang.min_members, count + 1, add_lists(asked, pod.requests))
    change = subtract_lists(after, before)
    openings: list[GangOpening] = []
    if held is None:
        if after:
            openings.append(GangOpening(gang.key, need, gang.min_members, gang.waiting_seconds,
                                        pod_group=gang.source == FROM_POD_GROUP))
        # koord-scheduler places a gang group only whole: the member that opens its gang's
        # reservation opens those of the group's other gangs too (each not held yet, below its minimum).
        for other in gang.group:
            if ledger.gang(other.key) is not None:
                continue
            members, their_asks = ledger.gang_members(other.key)
            if members >= other.min_members:
                continue
            other_need = gang_need(other, pod.requests)
            change = add_lists(change, remaining_need(other_need, other.min_members, members, their_asks))
            openings.append(GangOpening(other.key, other_need, other.min_members, other.waiting_seconds,
                                        pod_group=other.source == FROM_POD_GROUP))
    with_gang = {quota: _positive(add_lists(charge, change)) for quota, charge in charges.items()}
    exceeded = check_chain(tree, leaf, with_gang, used, reserved)
    if exceeded:
        if held is not None:
            return _decided(tree, leaf, chain, used, reserved, with_gang)
        wanted = remaining_need(need, gang.min_members, count, asked)
        group = [opening for opening in openings if opening.gang != gang.key]
        for opening in group:
            members, their_asks = ledger.gang_members(opening.gang)
            wanted = add_lists(wanted, remaining_need(opening.need, opening.min_members, members, their_asks))
        return _gang_refusal(tree, leaf, exceeded[0], pod, gang, wanted, count,
                             tuple(opening.gang for opening in group))
    return Decision(True, quotas=chain, charges=charges, gang=gang.key if (held is not None or openings) else "",
                    opens_gangs=tuple(openings))


def _gang_refusal(tree: QuotaTree, leaf: str, first: Exceeded, pod: PodQuotaRequest, gang: Gang,
                  wanted: ResourceList, counted: int, group: tuple[str, ...] = ()) -> Decision:
    """The refusal of a gang member whose gang's minimum does not fit: the gang, its need, the room."""
    limit = tree.limit(first.quota.name)[0]
    names = sorted(first.limited)
    free = {name: Quantity(max(limit[name].amount - first.used.get(name, ZERO).amount, Fraction(0)),
                           limit[name].format) for name in names}
    per_member = {name: pod.requests.get(name, ZERO) for name in names}
    how = "its PodGroup's minResources" if gang.min_resources is not None else \
        f"{gang.min_members - counted} × {format_list(per_member) if len(names) > 1 else per_member[names[0]]}"
    if counted:
        how += f", {counted} of {gang.min_members} members already taking room"
    if group:
        how += f", and the minimums of the rest of its gang group: {', '.join(group)}"
    where = first.quota.ref + ("" if first.quota.name == leaf else f" (ancestor of quota {leaf})")
    free_text = format_list(free) if len(names) > 1 else str(free[names[0]])
    message = (f"gang {gang.key} needs {format_list({name: wanted.get(name, ZERO) for name in names})} ({how}) "
               f"at {where}; {free_text} free: pod {pod.namespace}/{pod.name} is a member of gang {gang.key} "
               f"(minimum {gang.min_members} members) and no member is admitted until the whole minimum fits")
    return Decision(False, message=message, reason=QUOTA_EXCEEDED,
                    details={"quota": first.quota.ref, GANG_DETAIL: gang.key, GANG_RESULT_DETAIL: REFUSED})


def _positive(resources: ResourceList) -> ResourceList:
    return {name: quantity for name, quantity in resources.items() if quantity > ZERO}


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
