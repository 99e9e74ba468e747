"""The quota tree as people read it: per quota and GPU resource, the limit, what is used (and by
which family of requests), what is reserved, what is free, and which quota on the chain binds first.

Everything here is derived with the functions the webhook decides with (``QuotaTree.resolve``,
``QuotaTree.limit``, ``UsageIndex``, ``charges_for_chain``, ``shared_ledger.holding_room``), so a
number shown is the number the validating webhook compares. Pure: callers load the objects.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .canonical import ORIGINAL_RESOURCES_ANNOTATION, original_resources
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .gang import POD_GROUP_KIND, Gang, PodGroupInfo, gang_metadata, gang_need, gang_of, pod_group_info
from .ledger import ReservationLedger, remaining_need
from .pod_records import canonical_resource_list as canonical_requests
from .pod_records import pod_is_counted, pod_record
from .podspec import CONTAINER_KINDS, as_mapping, mapping_or_empty
from .quantity import ZERO, Quantity
from .quota_check import charges_for_chain
from .quota_integrity import DUPLICATE_NAME, PARENT_CYCLE, PARENT_MISSING, PARENT_UNREADABLE, TreeProblem
from .quota_objects import UNCHECKED_QUOTAS, QuotaInfo, canonical_resource_list
from .quota_tree import QuotaTree, Resolution
from .resources import (
    DEPRECATED_RENAMES,
    PERCENT_PER_CARD,
    PERCENTAGE_NAMES,
    GpuFamily,
    ResourceList,
    families_of,
    is_gpu_name,
)
from .shared_ledger import StoredReservation, holding_room, tree_of
from .usage_index import UsageIndex

SCHEMA_VERSION = 1
# At or above this share of its limit a quota shows as near full (a warning colour on a terminal).
NEAR_FULL = Fraction(4, 5)

# Which requests a pod wrote, before any rewrite: whole cards of a vendor name, Koordinator's
# percent names (the share pods), or both in one pod.
FAMILY_VENDOR = GpuFamily.VENDOR.value
FAMILY_KOORDINATOR = GpuFamily.KOORDINATOR.value
FAMILY_MIXED = "mixed"
FAMILIES = (FAMILY_VENDOR, FAMILY_KOORDINATOR, FAMILY_MIXED)

RULE_TEXT: Mapping[str, str] = {
    "label": "the pod's quota.scheduling.koordinator.sh/name label names it",
    "namespace-name": "it is the quota named after the pod's namespace, in that namespace",
    "namespaces-annotation": "its quota.scheduling.koordinator.sh/namespaces annotation lists the pod's namespace",
    "default": "no label, namespace or annotation matched: the default quota",
    "label-not-found": "the pod's quota.scheduling.koordinator.sh/name label names a quota that does not exist",
    "none": "no label, namespace or annotation matched and there is no default quota: not quota-checked",
}


def cards(quantity: Quantity) -> str:
    """A percent-of-a-card amount in cards: ``350`` -> ``3.5``; exact, at most two decimals shown."""
    value = quantity.amount / PERCENT_PER_CARD
    if value.denominator == 1:
        return str(value.numerator)
    hundredths = value * 100
    if hundredths.denominator == 1:
        return f"{value.numerator / value.denominator:.2f}".rstrip("0")
    return f"~{float(value):.2f}"


def with_cards(resource: str, quantity: Quantity) -> str:
    """``350 (3.5 cards)`` for percent-of-a-card names, the plain quantity for any other."""
    if resource not in PERCENTAGE_NAMES:
        return str(quantity)
    count = cards(quantity)
    return f"{quantity} ({count} {'card' if count in ('1', '-1') else 'cards'})"


def written_family(pod: Mapping[str, Any]) -> str | None:
    """The GPU family a pod's author wrote: read from the original-resources annotation for what
    the mutating webhook rewrote, from the spec for the rest. None for a pod without GPU names."""
    originals = original_resources(pod) or {}
    spec = pod.get("spec")
    spec = mapping_or_empty(spec)
    names: set[str] = set()
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind)
        recorded_kind = originals.get(kind)
        recorded: Mapping[str, Any] = mapping_or_empty(recorded_kind)
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, Mapping):
                continue
            container_name = entry.get("name")
            fields = recorded.get(container_name) if isinstance(container_name, str) else None
            if isinstance(fields, Mapping) and fields:
                # Rewritten: the spec now holds the webhook's names, the annotation the author's.
                names.update(name for values in fields.values() if isinstance(values, Mapping) for name in values)
                continue
            resources = entry.get("resources")
            for values in (resources.get(f) for f in ("requests", "limits")) if isinstance(resources, Mapping) else ():
                if isinstance(values, Mapping):
                    names.update(str(name) for name in values)
    families = families_of(DEPRECATED_RENAMES.get(name, name) for name in names)
    if not families:
        return None
    if len(families) > 1:
        return FAMILY_MIXED
    return next(iter(families)).value


def _annotated(pod: Mapping[str, Any]) -> bool:
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and ORIGINAL_RESOURCES_ANNOTATION in annotations


@dataclass(frozen=True, slots=True)
class ChargedPod:
    namespace: str
    name: str
    quota: str  # the leaf it resolves to
    rule: str
    family: str | None
    rewritten: bool  # the mutating webhook rewrote it (original-resources annotation present)
    requests: ResourceList  # canonical, GPU names only

    def as_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "quota": self.quota, "rule": self.rule,
                "family": self.family, "rewritten": self.rewritten,
                "requests": {name: str(q) for name, q in sorted(self.requests.items())}}


@dataclass(frozen=True, slots=True)
class ResourceView:
    resource: str
    min: Quantity | None
    limit: Quantity | None  # None: this quota does not limit it (an ancestor does)
    used: Quantity
    used_by_family: dict[str, Quantity]
    reserved: Quantity | None  # None: not known (no readable ledger for this tree)
    binds_first: str  # the quota of the chain with the least room ("" when none limits it)
    chain_free: Quantity | None  # that least room: what one more pod here can take

    @property
    def taken(self) -> Quantity:
        return self.used + (self.reserved or ZERO)

    @property
    def free(self) -> Quantity | None:
        return None if self.limit is None else self.limit - self.taken

    @property
    def state(self) -> str:
        """ok, near-full, full or over (against this quota's own limit); unlimited without one."""
        if self.limit is None:
            return "unlimited"
        if self.taken > self.limit:
            return "over"
        if self.taken == self.limit:
            return "full"
        if self.limit.amount > 0 and self.taken.amount / self.limit.amount >= NEAR_FULL:
            return "near-full"
        return "ok"

    def as_dict(self) -> dict[str, Any]:
        def text(q: Quantity | None) -> str | None:
            return None if q is None else str(q)
        return {"name": self.resource, "min": text(self.min), "limit": text(self.limit), "used": str(self.used),
                "usedByFamily": {family: str(q) for family, q in self.used_by_family.items()},
                "reserved": text(self.reserved), "free": text(self.free), "state": self.state,
                "bindsFirst": self.binds_first or None, "chainFree": text(self.chain_free)}


@dataclass(frozen=True, slots=True)
class QuotaView:
    quota: QuotaInfo
    depth: int
    limit_source: str  # "admission" (the annotation overrides max) or "max"
    resources: tuple[ResourceView, ...]
    pods: tuple[ChargedPod, ...]  # charged to this quota as their leaf, largest first
    # Why this quota does not fit in the tree (quota_integrity's checks): its figures above its own
    # limit are not what Koordinator enforces. Empty for a quota in an intact tree.
    broken: tuple[TreeProblem, ...] = ()

    @property
    def broken_because(self) -> str:
        """A few words for the table beside the quota's name (the full messages are the view's notes)."""
        return "; ".join(dict.fromkeys(_BROKEN_WORDS[p.check].format(parent=p.quota.parent) for p in self.broken))

    def as_dict(self, with_pods: bool) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.quota.name, "namespace": self.quota.namespace,
                                "parent": self.quota.parent or None, "depth": self.depth,
                                "isParent": self.quota.is_parent, "limitSource": self.limit_source,
                                "resources": [r.as_dict() for r in self.resources]}
        if self.broken:
            data["broken"] = [{"check": p.check, "message": p.message} for p in self.broken]
        if with_pods:
            data["pods"] = [p.as_dict() for p in self.pods]
        return data


_BROKEN_WORDS = {
    DUPLICATE_NAME: "name used twice",
    PARENT_MISSING: "parent {parent} missing",
    PARENT_UNREADABLE: "parent {parent} unreadable",
    PARENT_CYCLE: "in a parent cycle",
}


# What a gang's row says of it (``quota``): its minimum of members is stored; a live reservation of
# the webhook holds the rest of it; or neither is known to hold the rest.
GANG_COMPLETE, GANG_RESERVED, GANG_PARTIAL = "complete", "reserved", "partial"


@dataclass(frozen=True, slots=True)
class GangRow:
    """One gang under a quota: its stored members, its need, and what a reservation holds for it.

    Files hold no reservations: a gang partly stored holds the rest of its minimum in the webhook's
    view only while the reservation its first member opened lives (the gang's waiting time), which
    no file records; so offline ``reserved`` is unknown (None) and ``rest`` is what the rest of the
    minimum would need, now or when it is created again.
    """

    gang: str  # namespace/name
    source: str  # where its minimum is read from (gpuquota_core.gang), "" for a reservation alone
    quota: str  # the leaf its members are charged to (or its reservation was made at)
    min_members: int
    stored: int  # members stored and counted
    asked: ResourceList  # what the stored members ask, in total
    need: ResourceList  # the room the whole minimum takes
    rest: ResourceList  # of the need, what the stored members do not take
    reserved: ResourceList | None  # what a live reservation holds now; None: not known
    expires_at: float | None = None  # the reservation's end (wall clock), live

    @property
    def state(self) -> str:
        if self.stored >= self.min_members:
            return GANG_COMPLETE
        return GANG_RESERVED if self.reserved else GANG_PARTIAL

    def as_dict(self) -> dict[str, Any]:
        def texts(resources: Mapping[str, Quantity]) -> dict[str, str]:
            return {name: str(q) for name, q in sorted(resources.items())}
        return {"gang": self.gang, "source": self.source or None, "quota": self.quota,
                "minMembers": self.min_members, "stored": self.stored, "asked": texts(self.asked),
                "need": texts(self.need), "rest": texts(self.rest),
                "reserved": None if self.reserved is None else texts(self.reserved), "state": self.state,
                "expiresAt": self.expires_at}


@dataclass(frozen=True, slots=True)
class TreeView:
    quotas: tuple[QuotaView, ...]
    unreadable_pods: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # Every quota that does not fit in the tree, as the audit reports it (errors there): the view is
    # then not the tree Koordinator enforces, and ``gpuquota quota`` says so and ends 1.
    problems: tuple[TreeProblem, ...] = ()
    gangs: tuple[GangRow, ...] = ()

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    def problem_messages(self) -> list[str]:
        """Each distinct message once (a cycle or a repeated name is one message for all its members)."""
        return list(dict.fromkeys(problem.message for problem in self.problems))

    def select(self, name: str | None = None, namespace: str | None = None,
               among: Collection[str] | None = None, with_ancestors: bool = True) -> TreeView:
        """The quotas matching ``name`` / ``namespace`` / named in ``among`` (those a label selector
        chose) with their ancestors (the tree stays readable; not ``with_ancestors``, as ``-o name``
        lists only what was asked for), and with ``name`` its descendants too."""
        by_name = {view.quota.name: view for view in self.quotas}
        wanted: set[str] = set()
        for view in self.quotas:
            quota = view.quota
            if name is not None and quota.name != name:
                continue
            if among is not None and quota.name not in among:
                continue
            if namespace is not None and quota.namespace != namespace and namespace not in quota.bound_namespaces:
                continue
            wanted.add(quota.name)
        if name is not None:
            # Descendants: every quota whose chain passes through a wanted one.
            for view in self.quotas:
                if _ancestors(view.quota, by_name) & wanted:
                    wanted.add(view.quota.name)
        for quota_name in list(wanted) if with_ancestors else []:
            wanted |= _ancestors(by_name[quota_name].quota, by_name)
        return TreeView(tuple(v for v in self.quotas if v.quota.name in wanted), self.unreadable_pods, self.notes,
                        tuple(p for p in self.problems if p.quota.name in wanted),
                        gangs=tuple(g for g in self.gangs if g.quota in wanted))

    def as_dict(self, with_pods: bool = False) -> dict[str, Any]:
        return {"schemaVersion": SCHEMA_VERSION, "kind": "QuotaUsage",
                "quotas": [view.as_dict(with_pods) for view in self.quotas],
                "gangs": [gang.as_dict() for gang in self.gangs],
                "unreadablePods": list(self.unreadable_pods), "notes": list(self.notes),
                "treeProblems": [{"check": p.check, "namespace": p.quota.namespace, "name": p.quota.name,
                                  "message": p.message} for p in self.problems]}


def _ancestors(quota: QuotaInfo, by_name: Mapping[str, QuotaView]) -> set[str]:
    found: set[str] = set()
    parent = quota.parent
    while parent and parent in by_name and parent not in found:
        found.add(parent)
        parent = by_name[parent].quota.parent
    return found


def tree_order(tree: QuotaTree) -> list[tuple[QuotaInfo, int]]:
    """Every quota once, parents above their children (depth first, by name), with its depth."""
    ordered: list[tuple[QuotaInfo, int]] = []
    seen: set[str] = set()

    def visit(name: str, depth: int) -> None:
        if name in seen:
            return
        seen.add(name)
        ordered.append((tree.quotas[name], depth))
        for child in sorted(tree.children(name)):
            visit(child, depth + 1)

    roots = sorted(q.name for q in tree if not q.parent or q.parent not in tree.quotas)
    for root in roots:
        visit(root, 0)
    # What no root reaches is a parent cycle and the quotas below it. The members are drawn side by
    # side at the top, never as parent and child: none of them is the other's parent in any tree.
    in_cycle = {name for name in tree.quotas if name not in seen and _on_cycle(tree, name)}
    seen |= in_cycle
    for name in sorted(in_cycle):
        ordered.append((tree.quotas[name], 0))
        for child in sorted(set(tree.children(name)) - in_cycle):
            visit(child, 1)
    return ordered


def _on_cycle(tree: QuotaTree, name: str) -> bool:
    """Whether following parent labels from ``name`` comes back to it."""
    walked: set[str] = set()
    current = tree.quotas[name].parent
    while current in tree.quotas and current not in walked:
        if current == name:
            return True
        walked.add(current)
        current = tree.quotas[current].parent
    return False


def build_view(tree: QuotaTree, pods: Iterable[Mapping[str, Any]], *,
               reservations: Mapping[str, StoredReservation] | None = None,
               ledger_trees: Iterable[str] | None = None, now: float = 0.0,
               config: ConversionConfig = DEFAULT_CONFIG, problems: Iterable[TreeProblem] = (),
               pod_groups: Mapping[str, PodGroupInfo] | None = None) -> TreeView:
    """The usage view of ``tree`` with ``pods`` charged as the webhook's usage index charges them.

    ``reservations``: the strict-accounting ledgers' entries (``shared_ledger.decode``) with
    ``ledger_trees`` the tree roots whose ledger object was read; reserved is unknown (None) for the
    other trees. Without ``ledger_trees`` every tree is known (offline: nothing is reserved).
    ``problems``: :func:`quota_integrity.tree_problems` of the quotas the tree was built from (the
    tree itself keeps one copy of a repeated name, so it cannot find them all).
    ``pod_groups``: the PodGroups, by ``namespace/name``, for the gangs their members form.
    """
    problems = tuple(problems)
    usage = UsageIndex(tree)
    # By pod key: a pod listed twice counts once, as its later version (UsageIndex.upsert's rule).
    charged: dict[str, ChargedPod] = {}
    gang_of_pod: dict[str, Gang] = {}  # pod key -> the gang it is a member of
    unreadable: list[str] = []
    for pod in pods:
        if not pod_is_counted(pod):
            continue
        try:
            record = pod_record(pod, config)
        except ValueError:
            metadata = pod.get("metadata")
            metadata = mapping_or_empty(metadata)
            unreadable.append(f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}")
            continue
        usage.upsert(record)
        charged.pop(record.key, None)
        gang_of_pod.pop(record.key, None)
        if record.gang:
            metadata = as_mapping(pod.get("metadata"), "metadata")
            gang = gang_of(record.namespace, mapping_or_empty(metadata.get("labels")),
                           gang_metadata(metadata.get("annotations")), pod_groups or {})
            if gang is not None:
                gang_of_pod[record.key] = gang
        if usage.charged_to(record.key):
            resolution = tree.resolve(record.namespace, record.quota_label)
            charged[record.key] = ChargedPod(record.namespace, record.name, usage.charged_to(record.key)[0],
                                             resolution.rule, written_family(pod), _annotated(pod),
                                             {n: q for n, q in record.requests.items() if is_gpu_name(n)})
    ledger = holding_room(reservations or {}, usage, now, 0.0)
    known = None if ledger_trees is None else set(ledger_trees)

    def reserved_of(quota: str) -> ResourceList | None:
        if known is not None and tree_of(tree, quota) not in known:
            return None
        return ledger.used(quota)

    by_family: dict[str, dict[str, ResourceList]] = {}
    by_leaf: dict[str, list[ChargedPod]] = {}
    for key, pod_view in charged.items():
        by_leaf.setdefault(pod_view.quota, []).append(pod_view)
        # A pod without GPU names adds nothing to any GPU total; its family does not matter.
        family = pod_view.family or FAMILY_KOORDINATOR
        for charged_quota in usage.charged_to(key):
            totals = by_family.setdefault(charged_quota, {}).setdefault(family, {})
            for name, quantity in pod_view.requests.items():
                totals[name] = totals.get(name, ZERO) + quantity

    views: list[QuotaView] = []
    for quota, depth in tree_order(tree):
        chain = tree.chain(quota.name)
        own_limit = _own_limit(tree, quota)
        own_min = canonical_resource_list(quota.min, tree.config, quota.name)[0]
        used = usage.used(quota.name)
        families = by_family.get(quota.name, {})
        resources: list[ResourceView] = []
        for name in limited_gpu_resources(tree, quota.name):
            reserved = reserved_of(quota.name)
            binds, least = _binding(tree, chain, name, usage, reserved_of)
            resources.append(ResourceView(
                resource=name, min=own_min.get(name), limit=own_limit.get(name),
                used=used.get(name, ZERO),
                # vendor and koordinator always; mixed only where such pods exist.
                used_by_family={family: families.get(family, {}).get(name, ZERO)
                                for family in FAMILIES if family in families or family != FAMILY_MIXED},
                reserved=None if reserved is None else reserved.get(name, ZERO),
                binds_first=binds, chain_free=least))
        own_pods = sorted(by_leaf.get(quota.name, ()), key=_size_key)
        views.append(QuotaView(quota, depth, "admission" if quota.admission is not None else "max",
                               tuple(resources), tuple(own_pods),
                               _problems_of(quota.name, problems)))
    notes = tuple(sorted({note.message for quota in tree if quota.name not in UNCHECKED_QUOTAS
                          for note in tree.limit(quota.name)[1]}))
    # Offline (no ledger_trees) no file says what a gang's reservation holds: unknown, not 0.
    gangs = _gang_rows(tree, usage, gang_of_pod, ledger,
                       lambda quota: known is not None and tree_of(tree, quota) in known)
    return TreeView(tuple(views), tuple(unreadable), notes, problems, gangs=gangs)


def _gang_rows(tree: QuotaTree, usage: UsageIndex, gang_of_pod: Mapping[str, Gang], ledger: ReservationLedger,
               known: Callable[[str], bool]) -> tuple[GangRow, ...]:
    """Each gang with a member stored or a live reservation, by quota then name. ``known``: whether
    reservations of a quota's tree were read (else what a reservation holds is unknown)."""
    members: dict[str, list[str]] = {}
    for key, gang in gang_of_pod.items():
        if usage.charged_to(key):
            members.setdefault(gang.key, []).append(key)
    reservations = {held.gang: held for held in ledger.gangs()}
    rows: list[GangRow] = []
    for key in sorted(set(members) | set(reservations)):
        held = reservations.get(key)
        # The members the webhook counts (every stored pod naming the gang, as its admission does).
        stored, asked = usage.gang_members(key)
        charged = sorted(members.get(key, []))
        if charged:
            # Read as the first stored member reads its gang (the audit names members that disagree).
            first = usage.get(charged[0])
            gang = gang_of_pod[charged[0]]
            quota = usage.charged_to(charged[0])[0]
            need = held.need if held is not None else gang_need(gang, first.requests if first else {})
            minimum, source = gang.min_members, gang.source
        elif held is not None:
            quota, need, minimum, source = held.quotas[0], dict(held.need), held.min_members, ""
        else:
            continue
        reserved = (ledger.gang_hold(key) if held is not None else {}) if known(quota) else None
        rows.append(GangRow(key, source, quota, minimum, stored, _gpu_only(asked),
                            _gpu_only(need), _gpu_only(remaining_need(need, minimum, stored, asked)),
                            None if reserved is None else _gpu_only(reserved),
                            held.expires_at if held is not None and known(quota) else None))
    return tuple(sorted(rows, key=lambda row: (row.quota, row.gang)))


def _gpu_only(resources: Mapping[str, Quantity]) -> ResourceList:
    return {name: quantity for name, quantity in resources.items() if is_gpu_name(name)}


def _problems_of(name: str, problems: Iterable[TreeProblem]) -> tuple[TreeProblem, ...]:
    """The problems of a quota's name, each once (both copies of a repeated name have the same)."""
    return tuple({(p.check, p.message): p for p in problems if p.quota.name == name}.values())


def _own_limit(tree: QuotaTree, quota: QuotaInfo) -> ResourceList:
    return tree.limit(quota.name)[0] if quota.name not in UNCHECKED_QUOTAS else {}


def pod_groups_of(objects: Iterable[Mapping[str, Any]]) -> dict[str, PodGroupInfo]:
    """The readable PodGroups among ``objects``, by ``namespace/name``, as the webhook's state reads
    them."""
    return {info.key: info for obj in objects if obj.get("kind") == POD_GROUP_KIND
            and (info := pod_group_info(obj, canonical_requests)) is not None}


def limited_gpu_resources(tree: QuotaTree, name: str) -> list[str]:
    """The GPU resources a quota's rows show: those it or any ancestor limits (canonical names, sorted).

    What an ancestor limits counts here too: usage under that ancestor adds up from its children.
    """
    limited: set[str] = set()
    for member in tree.chain(name):
        if member.name not in UNCHECKED_QUOTAS:
            limited.update(n for n in tree.limit(member.name)[0] if is_gpu_name(n))
    return sorted(limited)


@dataclass(frozen=True, slots=True)
class QuotaFigures:
    """One quota and GPU resource as the webhook counts them: the numbers its metrics export."""

    quota: str
    tree: str  # the root of the quota's tree (the quota itself for a root)
    resource: str  # canonical name
    used: Quantity  # watched pods charged to it
    limit: Quantity | None  # the admission annotation, else max; None where only an ancestor limits it
    min: Quantity | None
    reserved: Quantity | None  # admitted, not yet seen by the watch; None where not known


def quota_figures(tree: QuotaTree, usage: UsageIndex,
                  reserved_of: Callable[[str], ResourceList | None]) -> list[QuotaFigures]:
    """Per quota (tree order) and per row of :func:`limited_gpu_resources`: what ``gpuquota quota`` shows
    as min, limit, used and reserved, from the live usage index and ``reserved_of`` (a ledger's ``used``)."""
    figures: list[QuotaFigures] = []
    for quota, _depth in tree_order(tree):
        own_limit = _own_limit(tree, quota)
        own_min = canonical_resource_list(quota.min, tree.config, quota.name)[0]
        used = usage.used(quota.name)
        reserved = reserved_of(quota.name)
        root = tree_of(tree, quota.name)
        for name in limited_gpu_resources(tree, quota.name):
            figures.append(QuotaFigures(quota.name, root, name, used.get(name, ZERO), own_limit.get(name),
                                        own_min.get(name), None if reserved is None else reserved.get(name, ZERO)))
    return figures


def _size_key(pod: ChargedPod) -> tuple[Any, ...]:
    # Largest first: by the sum of its GPU amounts, then by name for a stable order.
    return (-sum((q.amount for q in pod.requests.values()), Fraction(0)), pod.namespace, pod.name)


def _binding(tree: QuotaTree, chain: list[QuotaInfo], name: str, usage: UsageIndex,
             reserved_of: Callable[[str], ResourceList | None]) -> tuple[str, Quantity | None]:
    """The quota of ``chain`` (leaf first) with the least room for ``name``, and that room.

    The leaf wins a tie: ``check_chain`` reports the nearest quota first too.
    """
    best: tuple[str, Quantity | None] = ("", None)
    for member in chain:
        if member.name in UNCHECKED_QUOTAS:
            continue
        limit = tree.limit(member.name)[0].get(name)
        if limit is None:
            continue
        room = limit - usage.used(member.name).get(name, ZERO) - (reserved_of(member.name) or {}).get(name, ZERO)
        if best[1] is None or room < best[1]:
            best = (member.name, room)
    return best


@dataclass(frozen=True, slots=True)
class LevelHeadroom:
    """One quota and resource on a pod's chain: room before and after admitting the pod."""

    quota: QuotaInfo
    resource: str
    limit: Quantity
    used: Quantity  # watched usage plus reservations
    charge: Quantity  # what the pod adds here
    before: Quantity
    after: Quantity

    @property
    def fits(self) -> bool:
        return self.charge.is_zero() or not self.after < ZERO

    def as_dict(self) -> dict[str, Any]:
        return {"quota": self.quota.name, "namespace": self.quota.namespace, "resource": self.resource,
                "limit": str(self.limit), "used": str(self.used), "charge": str(self.charge),
                "freeBefore": str(self.before), "freeAfter": str(self.after), "fits": self.fits}


def chain_headroom(tree: QuotaTree, resolution: Resolution, requests: Mapping[str, Quantity],
                   used_of: Callable[[str], ResourceList]) -> list[LevelHeadroom]:
    """Per quota of the pod's chain (leaf first) and per resource it limits that the pod asks for
    or that is a GPU name: the room before and after, as ``check_chain`` counts it for a CREATE."""
    if resolution.quota is None or resolution.quota not in tree.quotas:
        return []
    chain = [q for q in tree.chain(resolution.quota) if q.name not in UNCHECKED_QUOTAS]
    charges = charges_for_chain([q.name for q in chain], requests)
    levels: list[LevelHeadroom] = []
    for quota in chain:
        limit = tree.limit(quota.name)[0]
        used = used_of(quota.name)
        adds = charges[quota.name]
        for name in sorted(n for n in limit if is_gpu_name(n) or n in adds):
            taken = used.get(name, ZERO)
            charge = adds.get(name, ZERO)
            before = limit[name] - taken
            levels.append(LevelHeadroom(quota, name, limit[name], taken, charge, before, before - charge))
    return levels


def pods_that_fit(levels: Iterable[LevelHeadroom]) -> int | None:
    """How many pods alike fit side by side in the room ``levels`` show before admitting any (a
    workload's replicas); None when the pod charges nothing that is limited."""
    counts = [max(level.before.amount, Fraction(0)) // level.charge.amount
              for level in levels if level.charge.amount > 0]
    return int(min(counts)) if counts else None


# Where each workload kind says how many of its pods run at once, and the API server's default.
_REPLICA_FIELDS: Mapping[str, tuple[tuple[str, ...], int]] = {
    "Deployment": (("spec", "replicas"), 1),
    "StatefulSet": (("spec", "replicas"), 1),
    "ReplicaSet": (("spec", "replicas"), 1),
    "ReplicationController": (("spec", "replicas"), 1),
    "Job": (("spec", "parallelism"), 1),
    "CronJob": (("spec", "jobTemplate", "spec", "parallelism"), 1),
}


def workload_replicas(obj: Mapping[str, Any]) -> int | None:
    """How many pods of its template a workload runs at once (a Job's parallelism, a Deployment's
    replicas, ...); None for a kind that does not say (a DaemonSet: one per node) or a value that
    is not a whole number."""
    where = _REPLICA_FIELDS.get(str(obj.get("kind")))
    if where is None:
        return None
    path, default = where
    current: Any = obj
    for step in path[:-1]:
        current = current.get(step) if isinstance(current, Mapping) else None
    value = current.get(path[-1], default) if isinstance(current, Mapping) else default
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def describe_rule(resolution: Resolution) -> str:
    return RULE_TEXT.get(resolution.rule, resolution.rule)


__all__ = ["GANG_COMPLETE", "GANG_PARTIAL", "GANG_RESERVED", "SCHEMA_VERSION", "ChargedPod", "GangRow",
           "LevelHeadroom", "QuotaFigures", "QuotaView", "ResourceView", "TreeView",
           "build_view", "cards", "chain_headroom", "describe_rule", "limited_gpu_resources", "pod_groups_of",
           "pods_that_fit", "quota_figures", "tree_order", "with_cards", "workload_replicas", "written_family"]
