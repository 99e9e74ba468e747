"""The ElasticQuota tree in canonical GPU units: pod → quota resolution, limits, usage, decisions.

Koordinator compares resource names literally (koordinator.md §3.1), so a quota written in
``nvidia.com/gpu`` never sees a pod asking for ``koordinator.sh/gpu-memory-ratio``. Here every
quota limit and every pod request is first converted with the same table the mutating webhook
uses, and only then compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .canonical import canonicalize_pod_spec, config_identity, pinned_model_key, values_key
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .memo import BoundedMemo
from .podspec import (
    CONTAINER_KINDS,
    MAX_CONTAINERS,
    PodShapeError,
    as_mapping,
    parse_resource_list,
    pod_requests,
    read_containers,
)
from .quantity import ZERO, Quantity
from .resources import (
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    VENDOR_WHOLE_GPU_NAMES,
    GpuFamily,
    ResourceList,
    families_of,
    format_list,
    subtract_lists,
)
from .validation import GpuRequestProblem, validate_pod_gpu

PREFIX = "quota.scheduling.koordinator.sh/"
POD_QUOTA_LABEL = PREFIX + "name"
PARENT_LABEL = PREFIX + "parent"
IS_PARENT_LABEL = PREFIX + "is-parent"
TREE_ID_LABEL = PREFIX + "tree-id"
NAMESPACES_ANNOTATION = PREFIX + "namespaces"
ADMISSION_ANNOTATION = PREFIX + "admission"

ROOT_QUOTA = "koordinator-root-quota"
DEFAULT_QUOTA = "koordinator-default-quota"
SYSTEM_QUOTA = "koordinator-system-quota"
# Quotas Koordinator itself never checks at admission (koordinator.md §3.6).
UNCHECKED_QUOTAS = frozenset({ROOT_QUOTA, SYSTEM_QUOTA})

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class QuotaShapeError(ValueError):
    """An ElasticQuota whose fields cannot be read; the message names quota and field."""


@dataclass(frozen=True, slots=True)
class LimitNote:
    """Something about a quota's limit a human should know (e.g. both GPU families named)."""

    quota: str
    message: str


@dataclass(frozen=True, slots=True)
class QuotaInfo:
    name: str
    namespace: str
    parent: str
    is_parent: bool
    min: ResourceList
    max: ResourceList
    admission: ResourceList | None  # the admission annotation overrides max entirely when set
    bound_namespaces: tuple[str, ...] = ()
    tree_id: str = ""
    resource_version: str = ""
    uid: str = ""  # for Events about the quota (kubectl describe matches them by uid)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def raw_limit(self) -> ResourceList:
        return self.admission if self.admission is not None else self.max


def quota_from_object(obj: Mapping[str, Any]) -> QuotaInfo:
    metadata = _mapping(obj.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise QuotaShapeError("ElasticQuota has no metadata.name")
    labels = _mapping(metadata.get("labels"), f"{name}: metadata.labels")
    annotations = _mapping(metadata.get("annotations"), f"{name}: metadata.annotations")
    spec = _mapping(obj.get("spec"), f"{name}: spec")
    try:
        minimum = parse_resource_list(spec.get("min"), "spec.min")
        maximum = parse_resource_list(spec.get("max"), "spec.max")
        admission_raw = annotations.get(ADMISSION_ANNOTATION)
        admission = _json_resource_list(admission_raw, ADMISSION_ANNOTATION) if admission_raw else None
    except PodShapeError as error:
        raise QuotaShapeError(f"ElasticQuota {name}: {error}") from None
    parent = labels.get(PARENT_LABEL) or ROOT_QUOTA
    return QuotaInfo(
        name=name,
        namespace=str(metadata.get("namespace") or ""),
        parent=str(parent) if name != ROOT_QUOTA else "",
        is_parent=labels.get(IS_PARENT_LABEL) == "true",
        min=minimum,
        max=maximum,
        admission=admission,
        bound_namespaces=_bound_namespaces(annotations.get(NAMESPACES_ANNOTATION)),
        tree_id=str(labels.get(TREE_ID_LABEL) or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        uid=str(metadata.get("uid") or ""),
    )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise QuotaShapeError(f"{where}: expected an object")
    return value


def _json_resource_list(raw: object, where: str) -> ResourceList:
    if not isinstance(raw, str):
        raise PodShapeError(where, "expected a JSON string")
    try:
        loaded = json.loads(raw)
    except ValueError:
        raise PodShapeError(where, "not valid JSON") from None
    return parse_resource_list(loaded, where)


def _bound_namespaces(raw: object) -> tuple[str, ...]:
    # Koordinator ignores an unparsable namespaces annotation; so do we.
    if not isinstance(raw, str):
        return ()
    try:
        loaded = json.loads(raw)
    except ValueError:
        return ()
    return tuple(n for n in loaded if isinstance(n, str)) if isinstance(loaded, list) else ()


def canonical_spellings(resources: Mapping[str, Quantity],
                        config: ConversionConfig = DEFAULT_CONFIG) -> dict[str, list[tuple[Quantity, str]]]:
    """Per canonical name, every (amount, spelling) of a quota's list that speaks for it.

    ``{gpu-memory-ratio: 750, koordinator.sh/gpu: 300}`` gives gpu-memory-ratio two readings,
    750 (as written) and 300 (from koordinator.sh/gpu), and gpu-core one, 300.
    """
    converted: dict[str, list[tuple[Quantity, str]]] = {}
    for name, quantity in resources.items():
        rule = config.rule_for(name)
        if rule is None:
            converted.setdefault(name, []).append((quantity, name))
            continue
        for output, per_unit in rule.outputs.items():
            converted.setdefault(output, []).append((quantity.scaled(per_unit), name))
        if rule.strategy.value == "Retain":
            converted.setdefault(name, []).append((quantity, name))
    return converted


def canonical_resource_list(resources: Mapping[str, Quantity], config: ConversionConfig = DEFAULT_CONFIG,
                            quota: str = "") -> tuple[ResourceList, list[LimitNote]]:
    """A quota's list in canonical names; where two spellings give one name, the stricter wins.

    ``nvidia.com/gpu: 4`` limits ``gpu-memory-ratio`` to 400. A quota that also says
    ``gpu-memory-ratio: 300`` is limited to 300: whichever the writer meant, admitting more than
    either number would break one of the two promises.
    """
    converted = canonical_spellings(resources, config)
    result: ResourceList = {}
    notes: list[LimitNote] = []
    for name, candidates in sorted(converted.items()):
        strictest = min(candidates, key=lambda candidate: candidate[0])
        # In the writer's own format: a limit of 8Gi is quoted back as 8Gi, not 8589934592.
        result[name] = Quantity(strictest[0].amount, strictest[0].format)
        sources = sorted({source for _, source in candidates})
        if len(candidates) > 1:
            spelled = ", ".join(f"{source}={quantity}" for quantity, source in sorted(candidates, key=lambda c: c[1]))
            notes.append(LimitNote(quota, f"{name} is limited by {' and '.join(sources)} ({spelled}); "
                                          f"the stricter value {result[name]} applies"))
    return result, notes


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The few fields of a pod that quota accounting needs (kept small: the cache holds 100k)."""

    namespace: str
    name: str
    uid: str
    quota_label: str
    requests: ResourceList  # canonical, pod-level, zeros removed
    unknown_gpu_memory: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_is_counted(pod: Mapping[str, Any]) -> bool:
    """Non-terminal pods count, pending ones included; terminating pods count until deleted."""
    status = pod.get("status")
    # type() first: decoded JSON is a plain dict, and the ABC check costs more than the lookup.
    phase = status.get("phase") if type(status) is dict or isinstance(status, Mapping) else None
    return phase not in TERMINAL_PHASES


def canonical_pod_requests(spec: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG) -> ResourceList:
    """Pod-level requests after the webhook's rewrite: legacy pods are charged as the webhook would."""
    canonical_spec, _, _, _ = canonicalize_pod_spec(spec, config, whole_pod=False)
    return pod_requests(canonical_spec, read_containers(canonical_spec))


# The quota cache and the audit compute every pod's canonical requests, and a cluster's pods repeat
# a few shapes (the replicas of each workload ask alike), so answers are remembered by everything
# the computation reads of the spec (see spec_shape_key).
_pod_requests: BoundedMemo[ResourceList] = BoundedMemo()


def spec_shape_key(spec: Mapping[str, Any], config: ConversionConfig) -> object | None:
    """What canonical_pod_requests reads of ``spec`` (resources, init restartPolicy, overhead, the
    pinned GPU model) and the config, or None when the spec is not plain JSON of the usual shape:
    then the uncached computation runs and raises its own precise error."""
    try:
        kinds: list[object] = []
        for kind in CONTAINER_KINDS:
            entries = spec.get(kind)
            if entries is None:
                kinds.append(None)
                continue
            if type(entries) is not list or len(entries) > MAX_CONTAINERS:
                return None
            containers: list[object] = []
            for entry in entries:
                if type(entry) is not dict or not isinstance(entry.get("name", ""), str):
                    return None
                resources = entry.get("resources")
                if resources is not None and type(resources) is not dict:
                    return None
                resources = resources or {}
                containers.append((entry.get("restartPolicy"), values_key(resources.get("requests")),
                                   values_key(resources.get("limits"))))
            kinds.append(tuple(containers))
        key = (tuple(kinds), values_key(spec.get("overhead")), pinned_model_key(spec, config),
               config_identity(config))
        hash(key)
    except TypeError:
        return None
    return key


# "The caller did not compute the shape key": None is a real answer of spec_shape_key.
_UNKEYED: Any = object()


def remembered_pod_requests(spec: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG, *,
                            shape: object = _UNKEYED) -> ResourceList:
    """:func:`canonical_pod_requests`, remembered per spec shape; the caller gets its own dict.

    ``shape``: ``spec_shape_key(spec, config)`` when the caller already has it (the audit keys its
    own verdict cache by it too, and computing it is most of the cost of a cache hit).
    """
    key = spec_shape_key(spec, config) if shape is _UNKEYED else shape
    if key is None:
        return canonical_pod_requests(spec, config)
    cached = _pod_requests.get(key)
    if cached is None:
        # An error propagates and is not remembered.
        cached = _pod_requests.remember(key, canonical_pod_requests(spec, config))
    # Quantities are immutable and may be shared; the map is copied so no caller can alter the cache.
    return dict(cached)


_request_texts: BoundedMemo[dict[str, str]] = BoundedMemo()


def remembered_request_texts(spec: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG, *,
                             shape: object = _UNKEYED) -> dict[str, str]:
    """The canonical requests as text by sorted name, as an admission carries them to the quota
    decision; remembered per spec shape like :func:`remembered_pod_requests` (``shape`` the same)."""
    key = spec_shape_key(spec, config) if shape is _UNKEYED else shape
    cached = _request_texts.get(key) if key is not None else None
    if cached is None:
        requests = remembered_pod_requests(spec, config, shape=key)
        cached = {name: str(requests[name]) for name in sorted(requests)}
        if key is not None:
            _request_texts.remember(key, cached)
    return dict(cached)  # a copy: no caller can alter the cache


def spec_names_key(spec: Mapping[str, Any], shape: object) -> object:
    """``shape`` plus the container names in spec order: the key of a per-spec judgement whose
    messages quote the names. Only for a ``shape`` that is not None (``spec_shape_key`` answers
    only for plain lists of dicts with str names, so reading them cannot fail)."""
    return shape, tuple([c.get("name", "") for kind in CONTAINER_KINDS for c in spec.get(kind) or ()])


_gpu_problems: BoundedMemo[tuple[GpuRequestProblem, ...]] = BoundedMemo()


def remembered_gpu_problems(spec: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG, *,
                            shape: object = _UNKEYED) -> list[GpuRequestProblem]:
    """``validate_pod_gpu`` of a spec, remembered per spec shape and container names.

    The validating webhook judges every pod CREATE, and the replicas of a workload ask alike; the
    key is what the judgement reads (the shape of :func:`remembered_pod_requests`) plus the
    container names its messages quote. ``shape``: as for :func:`remembered_pod_requests`, so one
    admission computes it once for both.
    """
    shape_key = spec_shape_key(spec, config) if shape is _UNKEYED else shape
    key = None
    if shape_key is not None:
        key = spec_names_key(spec, shape_key)
        cached = _gpu_problems.get(key)
        if cached is not None:
            return list(cached)
    containers = read_containers(spec)  # a PodShapeError propagates and is not remembered
    problems = validate_pod_gpu(containers, pod_requests(spec, containers), config)
    if key is not None:
        _gpu_problems.remember(key, tuple(problems))
    return problems


def gpu_memory_unknown(requests: Mapping[str, Quantity]) -> bool:
    """Bytes of GPU memory with no ratio: how much of a ratio-limited quota it takes is unknowable."""
    return GPU_MEMORY in requests and GPU_MEMORY_RATIO not in requests


def pod_record(pod: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG, *,
               shape: object = _UNKEYED) -> PodRecord:
    """``shape``: see :func:`remembered_pod_requests`."""
    metadata = as_mapping(pod.get("metadata"), "metadata")
    labels = as_mapping(metadata.get("labels"), "metadata.labels")
    requests = remembered_pod_requests(as_mapping(pod.get("spec"), "spec"), config, shape=shape)
    return PodRecord(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        quota_label=str(labels.get(POD_QUOTA_LABEL) or ""),
        requests=requests,
        unknown_gpu_memory=gpu_memory_unknown(requests),
    )


@dataclass(frozen=True, slots=True)
class Resolution:
    """Which quota a pod belongs to, and why (the rule that matched)."""

    quota: str | None
    rule: str  # "label", "namespace-name", "namespaces-annotation", "default", "label-not-found", "none"


@dataclass
class QuotaTree:
    """All ElasticQuotas of a cluster, by name (quota names are cluster-wide in Koordinator)."""

    quotas: dict[str, QuotaInfo] = field(default_factory=dict)
    config: ConversionConfig = DEFAULT_CONFIG
    _limits: dict[str, tuple[ResourceList, list[LimitNote]]] = field(default_factory=dict, repr=False)
    _by_namespace_annotation: dict[str, str] = field(default_factory=dict, repr=False)
    _children: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, quotas: Iterable[QuotaInfo], config: ConversionConfig = DEFAULT_CONFIG) -> QuotaTree:
        tree = cls(config=config)
        for quota in quotas:
            if keeps(tree.quotas.get(quota.name), quota):
                tree.quotas[quota.name] = quota
        tree._reindex()
        return tree

    def _reindex(self) -> None:
        self._limits.clear()
        self._by_namespace_annotation.clear()
        self._children.clear()
        for quota in sorted(self.quotas.values(), key=lambda q: q.name):
            for namespace in quota.bound_namespaces:
                self._by_namespace_annotation.setdefault(namespace, quota.name)
            if quota.parent:
                self._children.setdefault(quota.parent, []).append(quota.name)

    def upsert(self, quota: QuotaInfo) -> bool:
        """Add or replace a quota; True when pods may now resolve or charge differently.

        Most quota updates only change min/max (the controllers rewrite status and annotations
        often); those need no re-index, which keeps a watch event O(1) instead of O(quotas + pods).
        """
        previous = self.quotas.get(quota.name)
        self.quotas[quota.name] = quota
        self._limits.pop(quota.name, None)
        if previous is not None and _same_place_in_tree(previous, quota):
            return False
        self._reindex()
        return True

    def remove(self, name: str) -> bool:
        if self.quotas.pop(name, None) is None:
            return False
        self._reindex()
        return True

    def get(self, name: str) -> QuotaInfo | None:
        return self.quotas.get(name)

    def children(self, name: str) -> list[str]:
        return list(self._children.get(name, ()))

    def resolve(self, namespace: str, quota_label: str) -> Resolution:
        """koordinator.md §2.4, with admission's strictness: a label naming no quota is an error."""
        if quota_label:
            if quota_label in self.quotas:
                return Resolution(quota_label, "label")
            return Resolution(quota_label, "label-not-found")
        same_name = self.quotas.get(namespace)
        if same_name is not None and same_name.namespace == namespace:
            return Resolution(namespace, "namespace-name")
        bound = self._by_namespace_annotation.get(namespace)
        if bound is not None:
            return Resolution(bound, "namespaces-annotation")
        if DEFAULT_QUOTA in self.quotas:
            return Resolution(DEFAULT_QUOTA, "default")
        return Resolution(None, "none")

    def chain(self, name: str) -> list[QuotaInfo]:
        """The quota and its ancestors up to (not including) the root, leaf first; stops on cycles."""
        chain: list[QuotaInfo] = []
        seen: set[str] = set()
        current = self.quotas.get(name)
        while current is not None and current.name not in seen and current.name != ROOT_QUOTA:
            chain.append(current)
            seen.add(current.name)
            current = self.quotas.get(current.parent) if current.parent else None
        return chain

    def limit(self, name: str) -> tuple[ResourceList, list[LimitNote]]:
        """The canonical limit of a quota (admission annotation, else max) and notes about it."""
        cached = self._limits.get(name)
        if cached is None:
            quota = self.quotas[name]
            cached = canonical_resource_list(quota.raw_limit, self.config, quota.name)
            self._limits[name] = cached
        return cached

    def __iter__(self) -> Iterator[QuotaInfo]:
        return iter(self.quotas.values())


def keeps(kept: QuotaInfo | None, other: QuotaInfo) -> bool:
    """Whether the tree holds ``other`` rather than ``kept``, a quota of the same name.

    Koordinator's webhook refuses a second quota of a name, but two can predate it (and ``gpuquota
    audit`` reports them as quota-duplicate-name). The one in the namespace that sorts first is
    kept, whatever order they are read or watched in, so the limit enforced never depends on it;
    a newer version in the same namespace replaces the old one.
    """
    return kept is None or other.namespace <= kept.namespace


def _same_place_in_tree(a: QuotaInfo, b: QuotaInfo) -> bool:
    # Exactly the fields QuotaTree.resolve and QuotaTree.chain read.
    return (a.namespace, a.parent, a.bound_namespaces) == (b.namespace, b.parent, b.bound_namespaces)


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


def _counts_alike(counted: PodRecord, record: PodRecord) -> bool:
    """Whether charging ``record`` instead of ``counted`` leaves every total as it is: the same
    quota, and the same requests to the format and the order of names (totals keep both)."""
    if (counted.namespace, counted.quota_label, counted.uid, counted.unknown_gpu_memory) != (
            record.namespace, record.quota_label, record.uid, record.unknown_gpu_memory):
        return False
    if counted.requests is record.requests:
        return True
    if len(counted.requests) != len(record.requests):
        return False
    pairs = zip(counted.requests.items(), record.requests.items(), strict=True)
    return all(name == other_name and (quantity is other or (quantity == other and quantity.format is other.format))
               for (name, quantity), (other_name, other) in pairs)


class UsageIndex:
    """Canonical usage per quota, kept incrementally as pods and quotas come and go.

    Each pod is charged to its resolved quota and every ancestor, so an admission decision reads
    its numbers in O(depth) instead of summing all pods.
    """

    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree
        self._pods: dict[str, PodRecord] = {}
        self._charged: dict[str, tuple[str, ...]] = {}  # pod key -> quotas it is charged to
        self._used: dict[str, ResourceList] = {}
        # Quotas whose totals changed since a reader last cleared this (the quota service publishes
        # just those to the webhook workers). ``load`` and ``rebuild`` change all and do not record.
        self.touched: set[str] = set()

    def __len__(self) -> int:
        return len(self._pods)

    def used(self, quota: str) -> ResourceList:
        return dict(self._used.get(quota, {}))

    def used_map(self) -> Mapping[str, ResourceList]:
        """Live, not a copy: the inner maps change in place as pods are charged (see ``_charge``)."""
        return self._used

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def get(self, key: str) -> PodRecord | None:
        return self._pods.get(key)

    def charged_to(self, key: str) -> tuple[str, ...]:
        return self._charged.get(key, ())

    def upsert(self, record: PodRecord) -> None:
        # Most watch events of a pod change its status only: the record is the one counted, and
        # charging it again would rebuild totals (and make the quota service republish them) to
        # the same values.
        counted = self._pods.get(record.key)
        if counted is not None and _counts_alike(counted, record):
            # Moved to the end all the same, where a discard and a charge would put it: the
            # order of pods is the order of every later rebuild.
            self._pods[record.key] = self._pods.pop(record.key)
            self._charged[record.key] = self._charged.pop(record.key)
            return
        self.discard(record.key)
        self._pods[record.key] = record
        self._charge(record)

    def discard(self, key: str) -> PodRecord | None:
        record = self._pods.pop(key, None)
        for quota in self._charged.pop(key, ()):
            self.touched.add(quota)
            self._used[quota] = subtract_lists(self._used.get(quota, {}), record.requests if record else {})
        return record

    # Charging adds the pod's few resources into each quota's totals in place: rebuilding the
    # whole totals map per pod and quota (add_lists) was a third of an audit's time at 100k pods.
    # Safe because ``used`` hands out copies; only ``used_map`` (no caller today) exposes these maps.

    def _charge(self, record: PodRecord) -> None:
        quotas = self._chain_of(record)
        self._charged[record.key] = quotas
        self.touched.update(quotas)
        for quota in quotas:
            used = self._used.setdefault(quota, {})
            for name, quantity in record.requests.items():
                used[name] = used[name] + quantity if name in used else ZERO + quantity

    def load(self, records: Iterable[PodRecord]) -> None:
        """Upsert every record, in order: the same pods, charges and totals (values, formats, the
        order of quotas and names in each map) as calling :meth:`upsert` for each in turn, with one
        difference: a record that a later one of the same key replaces within this call is never
        charged, so it leaves behind none of the zero entries its discard would.

        Charging pod by pod adds each of a pod's resources into its leaf and every ancestor, one
        ``Quantity`` per add: at 100,000 pods that was most of an audit's usage check. Here pods
        are grouped, each group's totals summed as plain ints (exact Fractions for the rare
        fractional amount) and added into each quota once.
        """
        latest: dict[str, PodRecord] = {}
        for record in records:
            key = record.key
            latest.pop(key, None)  # a repeated key moves to the end, as upsert moves it
            latest[key] = record
        if self._pods:
            for key in latest:
                self.discard(key)
        chains: dict[tuple[str, str], tuple[str, ...]] = {}  # the tree does not change during the call
        # Pods alike are counted, not summed one by one: the replicas of a workload share one cached
        # requests map's Quantity objects (remembered_pod_requests hands out copies of the map, not
        # of its values), so a chain, the names and the identities of the values make a group whose
        # total is count x amount. The identities are unique here: every record, hence every value,
        # stays alive in ``latest`` for the whole call.
        groups: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]], list[Any]] = {}
        for key, record in latest.items():
            self._pods[key] = record
            place = (record.namespace, record.quota_label)
            quotas = chains.get(place)
            if quotas is None:
                quotas = chains[place] = self._chain_of(record)
            self._charged[key] = quotas
            if not quotas:
                continue
            requests = record.requests
            group = (quotas, tuple(requests), tuple(map(id, requests.values())))
            counted = groups.get(group)
            if counted is None:
                groups[group] = [requests, 1]
            else:
                counted[1] += 1
        # Per quota, the sum of each name, and the names in the order pods first charge them there
        # (groups are in the order of their first pod, so visiting them in order visits each
        # quota's names in upsert's order).
        totals: dict[str, dict[str, int | Fraction]] = {}
        for (quotas, _, _), (requests, count) in groups.items():
            for quota in quotas:
                sums = totals.setdefault(quota, {})
                for name, quantity in requests.items():
                    exact = quantity.amount
                    # int arithmetic where the amount is whole: Fraction's own is pure Python.
                    added: int | Fraction = exact.numerator * count if exact.denominator == 1 else exact * count
                    sums[name] = sums.get(name, 0) + added
        for quota, sums in totals.items():
            used = self._used.setdefault(quota, {})
            for name, amount in sums.items():
                # upsert's "ZERO + quantity" for a new name: the sum keeps ZERO's (decimal) format.
                total = Quantity(Fraction(amount))
                used[name] = used[name] + total if name in used else ZERO + total

    def _chain_of(self, record: PodRecord) -> tuple[str, ...]:
        resolution = self.tree.resolve(record.namespace, record.quota_label)
        if resolution.quota is None or resolution.rule == "label-not-found":
            return ()
        return tuple(q.name for q in self.tree.chain(resolution.quota))

    def rebuild(self) -> None:
        """Re-resolve every pod after the quota tree changed (labels, parents, namespaces)."""
        self._used.clear()
        self._charged.clear()
        for record in self._pods.values():
            self._charge(record)


def legacy_gpu_names(resources: Iterable[str]) -> list[str]:
    return sorted(set(resources) & VENDOR_WHOLE_GPU_NAMES)


def names_both_families(resources: Iterable[str]) -> bool:
    return families_of(resources) == {GpuFamily.VENDOR, GpuFamily.KOORDINATOR}
