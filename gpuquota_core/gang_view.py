"""Gangs as the views show them: whether a gang's whole minimum fits now and the room at each level
(``explain``), how many of a workload's pods the webhook would admit one after another (``explain``),
and each gang's members and reservation (``quota``) and what the audit says of them.

Nothing here decides anew: the count of a workload's pods that fit replays the webhook's own
``quota_decision.decide`` pod after pod on a scratch copy of the ledger, and a gang's need and what
it still holds come from ``gang.gang_need`` and ``ledger.remaining_need``, as the admission reads
them (``gpuquota_core.gang`` for which pods form a gang).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .enforcement import EnforcementConfig, InTurn, Relaxed, in_turn
from .gang import Gang, gang_metadata, gang_need, gang_of
from .ledger import ReservationLedger, remaining_need
from .quantity import ZERO, Quantity
from .quota_decision import Decision, PodQuotaRequest, Totals, decide, hold_admitted
from .quota_objects import UNCHECKED_QUOTAS, QuotaInfo
from .quota_tree import QuotaTree
from .quota_view import chain_headroom, pods_that_fit
from .resources import ResourceList, add_lists, format_list, is_gpu_name, subtract_lists
from .usage_index import UsageIndex

# How many of a workload's pods fit now, in the words of the verdict and of `explain -o json`.
FIT_ALL, FIT_SOME, FIT_NONE = "all", "some", "none"


def how_many_fit(replicas: int, fit: int) -> str:
    """``all``, ``some`` or ``none`` of ``replicas`` pods, ``fit`` of them fitting now."""
    if fit >= replicas:
        return FIT_ALL
    return FIT_SOME if fit > 0 else FIT_NONE


@dataclass(frozen=True, slots=True)
class GangLevel:
    """One quota and resource of a gang's chain: the room before and after the rest of its minimum."""

    quota: QuotaInfo
    resource: str
    limit: Quantity
    used: Quantity  # stored usage plus reservations, the gang's own reservation included
    needs: Quantity  # what admitting the rest of the gang's minimum adds here
    before: Quantity
    after: Quantity

    @property
    def fits(self) -> bool:
        return self.needs.is_zero() or not self.after < ZERO

    def as_dict(self) -> dict[str, Any]:
        return {"quota": self.quota.name, "namespace": self.quota.namespace, "resource": self.resource,
                "limit": str(self.limit), "used": str(self.used), "needs": str(self.needs),
                "freeBefore": str(self.before), "freeAfter": str(self.after), "fits": self.fits}


@dataclass(frozen=True, slots=True)
class GangFit:
    """Whether a gang's whole minimum fits now, for a member about to be created."""

    gang: Gang
    members: int  # members taking room already: stored, or reserved by an admission not yet seen
    need: ResourceList  # the room the whole minimum takes
    rest: ResourceList  # of the need, what its members do not take yet
    held: ResourceList  # of the rest, what the gang's live reservation holds already
    levels: tuple[GangLevel, ...]
    # The other gangs of its gang group whose minimums its first member reserves too, and what they
    # need beyond what their members take (included in each level's GANG ADDS).
    group: tuple[str, ...] = ()
    group_rest: ResourceList = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Its minimum of members takes room already: a new member is charged like any pod."""
        return self.members >= self.gang.min_members

    @property
    def fits(self) -> bool:
        return all(level.fits for level in self.levels)

    def summary(self) -> str:
        gang = self.gang
        head = f"{gang.key} ({gang.source}), minimum {gang.min_members} members, {self.members} taking room"
        if self.complete:
            return f"{head}: its minimum is reached, a new member is charged like any pod"
        how = "its PodGroup's minResources" if gang.min_resources is not None else \
            f"{gang.min_members} × one member's request"
        held = f", its reservation holding {format_list(self.held)}" if self.held else ""
        group = (f", with the minimums of the rest of its gang group ({', '.join(self.group)}), "
                 f"{format_list(self.group_rest)}" if self.group else "")
        verdict = "fits now" if self.fits else "does not fit now"
        return (f"{head}: the minimum needs {format_list(self.need)} ({how}); the rest of it, "
                f"{format_list(self.rest)}{held}{group}, {verdict}")

    def as_dict(self) -> dict[str, Any]:
        fields = {"gang": self.gang.key, "source": self.gang.source, "minMembers": self.gang.min_members,
                  "members": self.members, "need": _texts(self.need), "rest": _texts(self.rest),
                  "held": _texts(self.held), "complete": self.complete, "fits": self.fits,
                  "levels": [level.as_dict() for level in self.levels]}
        if self.group:  # a gang of a gang group: the other gangs its first member reserves for too
            fields.update(group=list(self.group), groupRest=_texts(self.group_rest))
        return fields


def gang_fit(tree: QuotaTree, leaf: str, gang: Gang, requests: Mapping[str, Quantity], ledger: ReservationLedger,
             used_of: Callable[[str], ResourceList]) -> GangFit:
    """The gang of a member asking ``requests`` under ``leaf``, against ``ledger`` (reservations, its
    stored members through ``members_stored``) and ``used_of`` (what each quota counts, reservations
    included), as ``decide`` reads them for the member's CREATE."""
    members, asked = ledger.gang_members(gang.key)
    reservation = ledger.gang(gang.key)
    need = reservation.need if reservation is not None else gang_need(gang, requests)
    rest = remaining_need(need, gang.min_members, members, asked)
    held = ledger.gang_hold(gang.key)
    group: list[str] = []
    group_rest: ResourceList = {}
    if reservation is None and members < gang.min_members:
        # As decide does: the member that opens its gang's reservation opens its group's too.
        for other in gang.group:
            others, their_asks = ledger.gang_members(other.key)
            if ledger.gang(other.key) is None and others < other.min_members:
                group.append(other.key)
                group_rest = add_lists(group_rest, remaining_need(gang_need(other, requests), other.min_members,
                                                                 others, their_asks))
    adds = {name: quantity for name, quantity in add_lists(subtract_lists(rest, held), group_rest).items()
            if quantity > ZERO}
    levels: list[GangLevel] = []
    for quota in tree.chain(leaf) if leaf in tree.quotas else []:
        if quota.name in UNCHECKED_QUOTAS:
            continue
        limit = tree.limit(quota.name)[0]
        used = used_of(quota.name)
        for name in sorted(n for n in limit if is_gpu_name(n) or n in adds):
            before = limit[name] - used.get(name, ZERO)
            needs = adds.get(name, ZERO)
            levels.append(GangLevel(quota, name, limit[name], used.get(name, ZERO), needs, before, before - needs))
    return GangFit(gang, members, need, rest, held, tuple(levels), tuple(group), group_rest)


def decide_member(tree: QuotaTree, usage: Totals, ledger: ReservationLedger, pod: PodQuotaRequest,
                  gang: Gang | None) -> Decision:
    """The webhook's quota decision on creating ``pod``, a member of ``gang`` (None: of none), against
    ``ledger`` as its account of gangs: the one call every view makes of ``decide`` for a gang member."""
    return decide(tree, usage, ledger, pod, gang=(gang, ledger) if gang is not None else None)


def workload_in_turn(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, pod: PodQuotaRequest,
                     gang: Gang | None, replicas: int, now: float, enforcement: EnforcementConfig,
                     each: tuple[Relaxed, ...] = ()) -> InTurn:
    """What the webhook does with ``replicas`` pods like ``pod`` created one after another now, under
    ``enforcement``: how many the quota decision admits, and whether warn or dry-run lets the rest
    through (``enforcement.in_turn``, the webhook's own rule). ``each``: the would-denies the first
    pod carries. ``ledger`` is changed: pass a scratch copy (``scratch_ledger``)."""
    fit, refusal = _in_turn(tree, usage, ledger, pod, gang, replicas, now)
    return in_turn(enforcement, replicas, fit, None if refusal is None else (refusal.reason, refusal.message), each)


def _in_turn(tree: QuotaTree, usage: UsageIndex, ledger: ReservationLedger, pod: PodQuotaRequest,
             gang: Gang | None, replicas: int, now: float) -> tuple[int, Decision | None]:
    """How many of ``replicas`` pods like ``pod`` the quota decision admits one after another, and
    its refusal of the next one (None when all are admitted).

    Gang members are replayed through ``decide`` one by one, each admitted one reserving as the
    webhook's state does (the first opening its gang's reservation), until the gang's minimum takes
    room; the pods after that are plain pods alike, counted from the room left
    (``quota_view.pods_that_fit``), so a Deployment of many replicas costs no more than one.
    """
    admitted = 0
    resolution = tree.resolve(pod.namespace, pod.quota_label)
    while admitted < replicas and gang is not None and ledger.gang_members(gang.key)[0] < gang.min_members:
        member = replace(pod, name=f"{pod.name}{admitted}")
        decision = decide_member(tree, usage, ledger, member, gang)
        if not decision.allowed:
            return admitted, decision
        if not decision.quotas:
            return replicas, None  # not quota-checked: every pod alike is admitted
        hold_admitted(ledger, decision, f"{member.namespace}/{member.name}",
                      f"replay-{member.namespace}/{member.name}", member.requests, now)
        admitted += 1
    if admitted >= replicas:
        return replicas, None
    plain = replace(pod, name=f"{pod.name}{admitted}")
    decision = decide(tree, usage, ledger, plain)
    if not decision.allowed:
        return admitted, decision
    levels = chain_headroom(tree, resolution, pod.requests, lambda quota: add_lists(usage.used(quota),
                                                                                   ledger.used(quota)))
    room = pods_that_fit(levels)
    if room is None or admitted + room >= replicas:
        return replicas, None
    # The pods that fit held at once, as their reservations would add up, so that the refusal of
    # the next one is the webhook's own, its figures and pod name included.
    ledger.reserve(f"{plain.namespace}/replay-{plain.name}", f"replay-{plain.namespace}/{plain.name}",
                   decision.quotas, {name: q.scaled(room) for name, q in plain.requests.items()}, now,
                   charges={quota: {name: q.scaled(room) for name, q in charge.items()}
                            for quota, charge in decision.charges.items()})
    admitted += room
    return admitted, decide(tree, usage, ledger, replace(pod, name=f"{pod.name}{admitted}"))


def scratch_ledger(base: ReservationLedger, usage: UsageIndex) -> ReservationLedger:
    """A ledger to replay admissions on: ``base``'s reservations and gang reservations, members
    stored read from ``usage``; ``base`` is left as it is."""
    scratch = ReservationLedger(base.ttl_seconds, members_stored=usage.gang_members)
    for reservation in base.reservations():
        scratch.hold(reservation)
    for held in base.gangs():
        scratch.open_gang(held)
    return scratch


def pod_gang(namespace: str, metadata: Mapping[str, Any], pod_groups: Mapping[str, Any]) -> Gang | None:
    """The gang of a pod with this metadata, as the webhook reads it from a CREATE."""
    labels = metadata.get("labels")
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    return gang_of(namespace, labels, gang_metadata(metadata.get("annotations")), pod_groups)


def _texts(resources: Mapping[str, Quantity]) -> dict[str, str]:
    return {name: str(quantity) for name, quantity in sorted(resources.items())}




# -- what the audit says of gangs ------------------------------------------------------------------

GANG_NEVER_FITS = "gang-never-fits"
GANG_PARTLY_ADMITTED = "gang-partly-admitted"
GANG_MEMBERS_DISAGREE = "gang-members-disagree"
GANG_CHECKS = frozenset({GANG_NEVER_FITS, GANG_PARTLY_ADMITTED, GANG_MEMBERS_DISAGREE})


@dataclass(frozen=True, slots=True)
class GangMember:
    """A pod (stored, counted) or a workload's template (the pods it will create) naming a gang."""

    kind: str
    namespace: str
    name: str
    gang: Gang  # as this member reads it (its own minimum, the PodGroup's when it names one)
    leaf: str | None  # the quota it resolves to (None: not quota-checked)
    requests: ResourceList  # canonical, one pod's
    stored: bool

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GangProblem:
    """One audit finding about a gang, on the object ``kind namespace/name`` that stands for it."""

    check: str
    error: bool  # an error (else a warning)
    kind: str
    namespace: str
    name: str
    message: str
    details: dict[str, Any]


def gang_problems(tree: QuotaTree, members: Iterable[GangMember], pod_groups: Iterable[str]) -> list[GangProblem]:
    """What the audit reports of each gang its ``members`` name. ``pod_groups``: the PodGroups
    present (``namespace/name``): a gang with one is reported on it, else on its first member
    (workloads before pods, by namespace and name)."""
    groups = set(pod_groups)
    by_gang: dict[str, list[GangMember]] = {}
    for member in members:
        by_gang.setdefault(member.gang.key, []).append(member)
    problems: list[GangProblem] = []
    for key, found in sorted(by_gang.items()):
        found.sort(key=lambda m: (m.stored, m.namespace, m.kind, m.name))
        if key in groups:
            namespace, name = key.split("/", 1)
            owner = ("PodGroup", namespace, name)
        else:
            owner = (found[0].kind, found[0].namespace, found[0].name)
        problems += [GangProblem(check, error, *owner, message, details)
                     for check, error, message, details in _gang_findings(tree, key, found)]
    return problems


def _gang_findings(tree: QuotaTree, key: str, members: list[GangMember]) -> list[tuple[str, bool, str, dict[str, Any]]]:
    findings: list[tuple[str, bool, str, dict[str, Any]]] = []
    never = _never_fits(tree, key, members)
    if never is not None:
        findings.append((GANG_NEVER_FITS, True, *never))
    stored = [m for m in members if m.stored]
    first = members[0].gang
    if stored and len(stored) < first.min_members:
        asked: ResourceList = {}
        for member in stored:
            asked = add_lists(asked, member.requests)
        need = gang_need(stored[0].gang, stored[0].requests)
        rest = remaining_need(need, first.min_members, len(stored), asked)
        message = (f"gang {key} has {len(stored)} of its minimum {first.min_members} members stored, holding "
                   f"{format_list(_gpu(asked)) or 'no GPU'}: koord-scheduler binds none of them until "
                   f"{first.min_members - len(stored)} more are admitted"
                   + (f", which need {format_list(rest)} more" if rest else "")
                   + f"; the webhook holds that room for them only until the gang's waiting time "
                     f"({first.waiting_seconds} s) after its first admission")
        findings.append((GANG_PARTLY_ADMITTED, False, message,
                         {"gang": key, "members": len(stored), "minMembers": first.min_members,
                          "holding": _texts(asked), "rest": _texts(rest),
                          "stored": [m.ref for m in stored]}))
    disagreement = _disagreement(key, members)
    if disagreement is not None:
        findings.append((GANG_MEMBERS_DISAGREE, False, *disagreement))
    return findings


def _never_fits(tree: QuotaTree, key: str, members: list[GangMember]) -> tuple[str, dict[str, Any]] | None:
    """The first member whose gang's need is above a limit of its chain on its own, and where."""
    for member in members:
        if member.leaf is None or member.leaf not in tree.quotas or tree.quotas[member.leaf].is_parent:
            continue  # not quota-checked, or refused for its place whatever its gang (ParentQuota)
        need = gang_need(member.gang, member.requests)
        for quota in tree.chain(member.leaf):
            if quota.name in UNCHECKED_QUOTAS:
                continue
            limit = tree.limit(quota.name)[0]
            over = {name: amount for name, amount in sorted(need.items()) if name in limit and amount > limit[name]}
            if over:
                how = "its PodGroup's minResources" if member.gang.min_resources is not None else \
                    f"{member.gang.min_members} × {format_list(_only(member.requests, over))}"
                message = (f"gang {key} needs {format_list(over)} ({how}), above the limit "
                           f"{format_list(_only(limit, over))} of quota {quota.ref}: no member is ever admitted "
                           f"(read from {member.ref})")
                return message, {"gang": key, "quota": quota.ref, "need": _texts(over),
                                 "limit": _texts(_only(limit, over)), "member": member.ref}
    return None


def _disagreement(key: str, members: list[GangMember]) -> tuple[str, dict[str, Any]] | None:
    minimums = {m.gang.min_members for m in members}
    if len(minimums) > 1:
        said = "; ".join(f"{m.ref}: {m.gang.min_members}" for m in members)
        return (f"members of gang {key} disagree about its minimum ({said}): koord-scheduler reads each pod's own, "
                "and the webhook's reservation is sized by the member that opens it",
                {"gang": key, "minimums": {m.ref: m.gang.min_members for m in members}})
    if any(m.gang.min_resources is not None for m in members):
        return None  # the PodGroup's minResources gives the total, whatever each member asks
    asks = {tuple(sorted((n, str(q)) for n, q in m.requests.items())) for m in members}
    if len(asks) > 1:
        said = "; ".join(f"{m.ref}: {format_list(m.requests) or 'nothing'}" for m in members)
        return (f"members of gang {key} ask for different resources and no PodGroup minResources gives the total "
                f"({said}): its need is judged from the member whose admission opens the reservation, so it "
                "depends on which comes first",
                {"gang": key, "requests": {m.ref: _texts(m.requests) for m in members}})
    return None


def _only(resources: Mapping[str, Quantity], names: Iterable[str]) -> ResourceList:
    return {name: resources[name] for name in names if name in resources}


def _gpu(resources: Mapping[str, Quantity]) -> ResourceList:
    return {name: quantity for name, quantity in resources.items() if is_gpu_name(name)}


__all__ = ["FIT_ALL", "FIT_NONE", "FIT_SOME", "GANG_CHECKS", "GANG_MEMBERS_DISAGREE", "GANG_NEVER_FITS",
           "GANG_PARTLY_ADMITTED", "GangFit", "GangLevel", "GangMember", "GangProblem", "decide_member", "gang_fit",
           "gang_problems", "how_many_fit", "pod_gang", "scratch_ledger", "workload_in_turn"]
