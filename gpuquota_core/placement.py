"""Where a pod can be scheduled, and whether its GPU request may be rewritten for those nodes.

A node that runs only the vendor device plugin advertises ``nvidia.com/gpu`` and no
``koordinator.sh/*`` names; rewriting the request of a pod that can only land on such nodes turns
it into a request no node it can reach satisfies (Koordinator's names reach a node's allocatable
only from its Device CR: pkg/slo-controller/noderesource/plugins/gpudeviceresource/plugin.go). So
the rewrite looks at the nodes first: ``rewrite: auto`` rewrites only when at least one node the
pod can be scheduled on advertises every name the rewrite would ask for.

"Can be scheduled on" follows kube-scheduler's filters: ``spec.nodeName``, ``nodeSelector``,
required node affinity, and the NoSchedule / NoExecute taints the pod does not tolerate (a cordoned
node counts as tainted ``node.kubernetes.io/unschedulable:NoSchedule``, as the scheduler treats
it). A pod with ``nodeName`` skips the scheduler: the kubelet still checks the selector, the
affinity and NoExecute taints, but not NoSchedule ones. Anything unreadable matches no node, so
the answer errs towards leaving the request as written.

A rewrite keeps the pod's GPU vendor. ``amd.com/gpu`` fits only nodes that advertise it, but the
canonical names name no vendor: every node reporting Koordinator GPUs advertises them, NVIDIA or
AMD. A node's vendor is its ``node.koordinator.sh/gpu-vendor`` label, and a node without one is
NVIDIA, as Koordinator reads it (pkg/scheduler/plugins/deviceshare/allocator_gpu_helper.go). So
``auto`` counts only the nodes of the pod's vendor, and where a node of another vendor that the pod
can reach advertises the canonical names too, the rewrite adds a required node-affinity
requirement on that label, ANDed into each term the pod already has (terms are ORed). Where no
such node is reachable, a single-vendor cluster for one, the pod is left as the rewrite alone makes it.

I/O-free: the webhook feeds it the nodes it watches, ``convert`` and ``audit`` the Node objects in
their input. A :class:`NodeSummary` keeps only what the filters read (labels, taints, the names of
the extended resources the node advertises), so a cluster's nodes stay small in every process.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .memo import BoundedMemo
from .podspec import mapping_or_empty
from .quantity import QuantityError, parse_quantity
from .resources import DEPRECATED_RENAMES, GPU_SHARED, GpuFamily, families_of, is_gpu_name

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
GPU_VENDOR_LABEL = "node.koordinator.sh/gpu-vendor"
# The vendor of a node without GPU_VENDOR_LABEL, as Koordinator's device allocator reads it.
UNLABELLED_VENDOR = "nvidia"
NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"
# Every resource a node has that is not an extended resource: never what a GPU rewrite asks for.
_STANDARD_RESOURCES = frozenset({"cpu", "memory", "pods", "ephemeral-storage", "storage"})
_STANDARD_PREFIXES = ("hugepages-", "attachable-volumes-")
# Names listed in a message before "and N more": enough to recognise a pool, short enough to read.
MAX_NAMED_NODES = 5
# strconv.ParseInt's syntax (base 10, optional sign) and range: what Gt / Lt compare.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = range(-(2**63), 2**63)


class RewritePolicy(Enum):
    AUTO = "auto"  # rewrite only where a reachable node advertises the canonical names
    ALWAYS = "always"  # rewrite regardless of the nodes
    NEVER = "never"  # count in canonical units, rewrite nothing


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeSummary:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    # Extended resources with a non-zero allocatable amount (what NodeResourcesFit can grant).
    resources: frozenset[str]

    @property
    def mixed_gpu(self) -> bool:
        """Both the vendor's whole-card name and koordinator.sh/gpu-* for the same cards."""
        return families_of(self.resources) == {GpuFamily.VENDOR, GpuFamily.KOORDINATOR}


def _is_extended(name: str) -> bool:
    return name not in _STANDARD_RESOURCES and not name.startswith(_STANDARD_PREFIXES)


def node_summary(node: Mapping[str, Any]) -> NodeSummary | None:
    """What the filters read of a Node object; None when it has no name (not a node we can place on)."""
    metadata = node.get("metadata")
    metadata = mapping_or_empty(metadata)
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    raw_labels = metadata.get("labels")
    # Interned: the same keys (and many values: zones, models) repeat on every node.
    labels = {sys.intern(key): sys.intern(value) for key, value in mapping_or_empty(raw_labels).items()
              if isinstance(key, str) and isinstance(value, str)}
    spec = node.get("spec")
    spec = mapping_or_empty(spec)
    taints: list[Taint] = []
    raw_taints = spec.get("taints")
    for raw in raw_taints if isinstance(raw_taints, list) else ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
            continue
        value = raw.get("value")
        effect = raw.get("effect")
        taints.append(Taint(sys.intern(raw["key"]), value if isinstance(value, str) else "",
                            sys.intern(effect) if isinstance(effect, str) else ""))
    if spec.get("unschedulable") is True:
        taints.append(Taint(UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE))
    status = node.get("status")
    status = mapping_or_empty(status)
    # The API server defaults a missing allocatable to the capacity; manifests may carry only that.
    allocatable = status.get("allocatable") if "allocatable" in status else status.get("capacity")
    resources: set[str] = set()
    if isinstance(allocatable, Mapping):
        for resource, amount in allocatable.items():
            if not isinstance(resource, str) or not _is_extended(resource):
                continue
            try:
                if isinstance(amount, (str, int, float)) and parse_quantity(amount).amount > 0:
                    resources.add(sys.intern(resource))
                    # Koordinator's informers rename deprecated names (apis/extension/deprecated.go).
                    if resource in DEPRECATED_RENAMES:
                        resources.add(DEPRECATED_RENAMES[resource])
            except QuantityError:
                continue
    return NodeSummary(name, labels, tuple(taints), frozenset(resources))


class NodeView:
    """The nodes as one generation of a watch (or a set of manifests) shows them.

    Decisions are remembered per view: a new generation is a new view, so nothing remembered can
    outlive the nodes it was computed from.
    """

    __slots__ = ("generation", "memo", "nodes")

    def __init__(self, nodes: Iterable[NodeSummary], generation: int = 0) -> None:
        self.nodes: tuple[NodeSummary, ...] = tuple(nodes)
        self.generation = generation
        self.memo: BoundedMemo[Any] = BoundedMemo()

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> NodeView | None:
        """The Node objects among ``objects``; None when there is none (no view to decide from)."""
        nodes = [summary for obj in objects if obj.get("kind") == "Node"
                 if (summary := node_summary(obj)) is not None]
        return cls(nodes) if nodes else None


# -- a pod's scheduling constraints ---------------------------------------------------------------

Requirement = tuple[str, str, tuple[str, ...]]  # key, operator, values
Term = tuple[tuple[Requirement, ...], tuple[Requirement, ...]]  # matchExpressions, matchFields


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        # An empty key matches every key (the API allows it only with Exists).
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Constraints:
    """What kube-scheduler's filters read of a pod spec, hashable (it keys remembered decisions)."""

    node_name: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[Term, ...] | None = None  # None: no required node affinity
    tolerations: tuple[Toleration, ...] = ()
    unreadable: str = ""  # why the constraints could not be read ("" = they could): no node matches


NO_CONSTRAINTS = Constraints()


class _Unreadable(ValueError):
    pass


def constraints_of(spec: Mapping[str, Any]) -> Constraints:
    """The pod's scheduling constraints; a malformed field makes them match no node."""
    if not any(field in spec for field in ("nodeName", "nodeSelector", "affinity", "tolerations")):
        return NO_CONSTRAINTS
    try:
        return Constraints(_node_name(spec.get("nodeName")), _selector(spec.get("nodeSelector")),
                           _required_terms(spec.get("affinity")), _tolerations(spec.get("tolerations")))
    except _Unreadable as error:
        return Constraints(unreadable=str(error))


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise _Unreadable(f"{where} is not a string")
    return value


def _node_name(value: object) -> str | None:
    if value is None or value == "":
        return None
    return _string(value, "spec.nodeName")


def _selector(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise _Unreadable("spec.nodeSelector is not a map")
    return tuple(sorted((_string(k, "a nodeSelector key"), _string(v, f"nodeSelector[{k}]"))
                        for k, v in value.items()))


def _required_terms(affinity: object) -> tuple[Term, ...] | None:
    if affinity is None:
        return None
    if not isinstance(affinity, Mapping):
        raise _Unreadable("spec.affinity is not an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return None
    if not isinstance(node_affinity, Mapping):
        raise _Unreadable("spec.affinity.nodeAffinity is not an object")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    if not isinstance(required, Mapping):
        raise _Unreadable("requiredDuringSchedulingIgnoredDuringExecution is not an object")
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        terms = []
    if not isinstance(terms, list):
        raise _Unreadable("nodeSelectorTerms is not a list")
    return tuple(_term(term) for term in terms)


def _term(term: object) -> Term:
    if term is None:
        return ((), ())
    if not isinstance(term, Mapping):
        raise _Unreadable("a nodeSelectorTerm is not an object")
    return _requirements(term.get("matchExpressions")), _requirements(term.get("matchFields"))


def _requirements(value: object) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Unreadable("matchExpressions / matchFields is not a list")
    requirements: list[Requirement] = []
    for entry in value:
        if not isinstance(entry, Mapping):
            raise _Unreadable("a node selector requirement is not an object")
        values = entry.get("values")
        if values is None:
            values = []
        if not isinstance(values, list):
            raise _Unreadable("a node selector requirement's values is not a list")
        requirements.append((_string(entry.get("key"), "a node selector requirement's key"),
                             _string(entry.get("operator"), "a node selector requirement's operator"),
                             tuple(_string(v, "a node selector requirement's value") for v in values)))
    return tuple(requirements)


def _tolerations(value: object) -> tuple[Toleration, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Unreadable("spec.tolerations is not a list")
    tolerations: list[Toleration] = []
    for entry in value:
        if not isinstance(entry, Mapping):
            raise _Unreadable("a toleration is not an object")
        fields = [entry.get(name) or "" for name in ("key", "operator", "value", "effect")]
        tolerations.append(Toleration(*(_string(f, "a toleration field") for f in fields)))
    return tuple(tolerations)


# -- the filters ----------------------------------------------------------------------------------

def _int64(text: str) -> int | None:
    if not _INTEGER.fullmatch(text):
        return None
    number = int(text)
    return number if number in _INT64 else None


def requirement_matches(requirement: Requirement, values_by_key: Mapping[str, str]) -> bool:
    key, operator, values = requirement
    present = key in values_by_key
    if operator == "In":
        return present and values_by_key[key] in values
    if operator == "NotIn":
        return not present or values_by_key[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, bound = _int64(values_by_key[key]), _int64(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an operator the API does not define matches nothing


def term_matches(term: Term, node: NodeSummary) -> bool:
    expressions, fields = term
    if not expressions and not fields:
        return False  # an empty term matches no node
    return (all(requirement_matches(r, node.labels) for r in expressions)
            and all(requirement_matches(r, {"metadata.name": node.name}) for r in fields))


def can_be_scheduled_on(constraints: Constraints, node: NodeSummary) -> bool:
    if constraints.unreadable:
        return False
    if constraints.node_name is not None and constraints.node_name != node.name:
        return False
    labels = node.labels
    if any(labels.get(key) != value for key, value in constraints.node_selector):
        return False
    if constraints.terms is not None and not any(term_matches(term, node) for term in constraints.terms):
        return False
    # A pod bound by nodeName never meets the scheduler; only the kubelet's NoExecute check applies.
    effects = (NO_EXECUTE,) if constraints.node_name is not None else (NO_SCHEDULE, NO_EXECUTE)
    return all(any(t.tolerates(taint) for t in constraints.tolerations)
               for taint in node.taints if taint.effect in effects)


def reachable_nodes(constraints: Constraints, nodes: Iterable[NodeSummary]) -> list[NodeSummary]:
    return [node for node in nodes if can_be_scheduled_on(constraints, node)]


# -- the decision ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RewriteDecision:
    rewrite: bool
    warnings: tuple[str, ...] = ()
    # Why the request was left ("" when rewritten): the short form for logs and the audit.
    reason: str = ""
    # The vendor whose nodes the rewritten pod must be kept on by a required node affinity
    # (affinity_keeping_vendor); None when no node of another vendor could take it.
    keep_vendor: str | None = None
    # Those other vendors' nodes, for the warning that says why.
    foreign: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Reach:
    """How a pod's constraints meet one view: the reachable nodes, and which of them are mixed."""

    count: int
    names: tuple[str, ...]
    advertising: bool  # some reachable node (of the pod's vendor, when it has one) advertises every needed name
    mixed: tuple[str, ...] = ()  # reachable nodes advertising the needed names and both GPU families
    # Reachable nodes of another vendor that advertise every needed name: what the rewritten pod
    # could land on unless its vendor is kept.
    foreign: tuple[str, ...] = ()


_NOWHERE = _Reach(0, (), False)


def named(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(names[:MAX_NAMED_NODES])
    return shown if len(names) <= MAX_NAMED_NODES else f"{shown} and {len(names) - MAX_NAMED_NODES} more"


def _reach(constraints: Constraints, needs: frozenset[str], view: NodeView, vendor: str | None = None) -> _Reach:
    key = ("reach", constraints, needs, vendor)
    cached = view.memo.get(key)
    if cached is None:
        reachable = reachable_nodes(constraints, view.nodes)
        advertising = [node for node in reachable if needs <= node.resources]
        foreign = () if vendor is None else tuple(
            node.name for node in advertising if not is_vendors_node(vendor, node))
        cached = view.memo.remember(key, _Reach(
            len(reachable), tuple(node.name for node in reachable), len(advertising) > len(foreign),
            tuple(node.name for node in advertising if node.mixed_gpu), foreign))
    assert isinstance(cached, _Reach)
    return cached


def _where(constraints: Constraints, reach: _Reach, view: NodeView) -> str:
    """The subject of "... advertises <names>": which nodes were looked at."""
    if constraints.unreadable:
        return f"its scheduling constraints cannot be read ({constraints.unreadable}), so no node"
    if not view.nodes:
        return "no node is listed, so none"
    if reach.count == 0:
        return (f"none of the {len(view.nodes)} node(s) listed can take this pod (nodeName, nodeSelector, "
                "required node affinity, taints), so none")
    return f"none of the {reach.count} node(s) this pod can be scheduled on ({named(reach.names)})"


def unadvertised(constraints: Constraints, needs: Iterable[str], view: NodeView,
                 vendor: str | None = None) -> str | None:
    """None when a node the pod can be scheduled on advertises every name in ``needs`` (and is of
    ``vendor``, when given), else why not."""
    needed = frozenset(needs)
    reach = _NOWHERE if constraints.unreadable else _reach(constraints, needed, view, vendor)
    if reach.advertising:
        return None
    if vendor is not None and reach.foreign:
        return (f"the node(s) this pod can be scheduled on that advertise {', '.join(sorted(needed))} "
                f"({named(reach.foreign)}) have another GPU vendor than {vendor_text(vendor)}")
    return f"{_where(constraints, reach, view)} advertises {', '.join(sorted(needed))}"


# -- the vendor -----------------------------------------------------------------------------------

def vendor_requirements(vendor: str) -> tuple[Requirement, ...]:
    """Node selector requirements, any one of which selects ``vendor``'s nodes (and no other's)."""
    labelled = (GPU_VENDOR_LABEL, "In", (vendor,))
    if vendor == UNLABELLED_VENDOR:
        return labelled, (GPU_VENDOR_LABEL, "DoesNotExist", ())
    return (labelled,)


def is_vendors_node(vendor: str, node: NodeSummary) -> bool:
    return any(requirement_matches(requirement, node.labels) for requirement in vendor_requirements(vendor))


def vendor_text(vendor: str) -> str:
    """How messages name a vendor's nodes: by the label that marks them."""
    labelled = f"{GPU_VENDOR_LABEL}={vendor}"
    return f"{labelled} (or no such label)" if vendor == UNLABELLED_VENDOR else labelled


def affinity_keeping_vendor(affinity: object, vendor: str) -> dict[str, Any]:
    """A pod's ``spec.affinity`` whose required node affinity reaches only ``vendor``'s nodes.

    The terms are ORed and a term's expressions ANDed, so the vendor's requirement is added to
    every term; a vendor whose nodes two requirements select (label or no label) doubles each
    term. A term with no expression and no field matches no node and is kept as it is: adding an
    expression would make it match. Only for readable constraints (:func:`constraints_of`).
    """
    alternatives = [{"key": key, "operator": operator, **({"values": list(values)} if values else {})}
                    for key, operator, values in vendor_requirements(vendor)]
    result = dict(mapping_or_empty(affinity))
    node_affinity = dict(mapping_or_empty(result.get("nodeAffinity")))
    required = dict(mapping_or_empty(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")))
    terms = required.get("nodeSelectorTerms")
    kept: list[Any] = []
    if terms is None:
        kept = [{"matchExpressions": [alternative]} for alternative in alternatives]
    for term in terms if isinstance(terms, list) else ():
        fields = mapping_or_empty(term)
        if not fields.get("matchExpressions") and not fields.get("matchFields"):
            kept.append(term)
            continue
        kept.extend({**fields, "matchExpressions": [*(fields.get("matchExpressions") or []), alternative]}
                    for alternative in alternatives)
    required["nodeSelectorTerms"] = kept
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    result["nodeAffinity"] = node_affinity
    return result


def decide_rewrite(policy: RewritePolicy, constraints: Constraints, sources: Iterable[str],
                   needs: Iterable[str], view: NodeView | None, vendor: str | None = None) -> RewriteDecision:
    """Whether a pod whose rewrite would replace ``sources`` with ``needs`` is rewritten, and on
    whose nodes it must be kept.

    ``vendor``: the gpu-vendor of the cards ``sources`` count (None: they name no vendor); only its
    nodes count for ``auto``. ``view`` None: the nodes are not known (yet); ``auto`` then leaves
    the request as written rather than guess, and ``always`` adds no vendor affinity (there is no
    node of another vendor to keep the pod from that it knows of).
    """
    if policy is RewritePolicy.NEVER:
        return RewriteDecision(False, reason="rewrite: never")
    source_text = ", ".join(sorted(set(sources)))
    needed = frozenset(needs)
    need_text = ", ".join(sorted(needed))
    if view is None:
        if policy is RewritePolicy.ALWAYS:
            return RewriteDecision(True)
        reason = (f"the webhook has not listed the cluster's nodes yet, so it cannot tell whether a node this "
                  f"pod can reach advertises {need_text}")
        return RewriteDecision(False, (f"gpuquota left {source_text} as written: {reason}",), reason)
    why = unadvertised(constraints, needed, view, vendor)
    foreign = () if vendor is None or constraints.unreadable else _reach(constraints, needed, view, vendor).foreign
    keep = vendor if foreign else None
    if why is None:
        return RewriteDecision(True, keep_vendor=keep, foreign=foreign)
    if policy is RewritePolicy.ALWAYS:
        return RewriteDecision(True, (f"gpuquota rewrote {source_text} (rewrite: always) although {why}; "
                                      "the pod may stay Pending",), keep_vendor=keep, foreign=foreign)
    return RewriteDecision(False, (f"gpuquota left {source_text} as written: {why}",), why)


def mixed_node_warning(constraints: Constraints, view: NodeView | None,
                       asked: frozenset[str] = frozenset()) -> str | None:
    """A warning for a GPU pod that can land on a node advertising both GPU families.

    ``asked``: the GPU names the pod asks for as stored (:func:`scheduled_names`); only nodes that
    advertise them can take it (an ``amd.com/gpu`` pod never lands on an NVIDIA node).
    """
    if view is None or constraints.unreadable:
        return None
    reach = _reach(constraints, asked, view)
    if not reach.mixed:
        return None
    return (f"gpuquota: this pod can be scheduled on {named(reach.mixed)}, which advertise(s) both a vendor GPU "
            "name and koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out "
            "one card twice (audit check node-mixed-gpu-resources)")


def scheduled_names(names: Iterable[str]) -> frozenset[str]:
    """GPU names as a node must advertise them for the pod to fit: deprecated names renamed, as
    Koordinator's informers do; without ``gpu.shared``, the device count its own webhook adds, which
    nodes publish only behind a feature gate."""
    return frozenset(DEPRECATED_RENAMES.get(name, name) for name in names) - {GPU_SHARED}


def nonzero_names(resources: Iterable[tuple[str, object]]) -> frozenset[str]:
    """The names among (name, quantity) pairs whose amount is not zero (an unreadable one counts):
    a request of zero asks a node for nothing."""
    names: set[str] = set()
    for name, raw in resources:
        try:
            if isinstance(raw, (str, int, float)) and parse_quantity(raw).is_zero():
                continue
        except QuantityError:
            pass
        names.add(name)
    return frozenset(names)


def gpu_names(resources: Iterable[tuple[str, object]]) -> frozenset[str]:
    return nonzero_names((name, raw) for name, raw in resources if is_gpu_name(name))


def spec_resources(spec: object) -> Iterator[tuple[str, object]]:
    """Every (name, quantity) of every container's requests and limits; skips what is not a map."""
    if not isinstance(spec, Mapping):
        return
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            for section in ("requests", "limits"):
                values = resources.get(section) if isinstance(resources, Mapping) else None
                if isinstance(values, Mapping):
                    yield from values.items()


# -- the published form ---------------------------------------------------------------------------
# The quota service watches the nodes; the webhook workers read this document of them (one per
# generation, replaced whole). Each node is [name, labels, [[key, value, effect], ...], [resources]].

def encode_nodes(nodes: Iterable[NodeSummary], generation: int) -> dict[str, Any]:
    return {"generation": generation,
            "nodes": [[n.name, dict(n.labels), [[t.key, t.value, t.effect] for t in n.taints], sorted(n.resources)]
                      for n in nodes]}


def decode_nodes(document: Mapping[str, Any]) -> NodeView:
    intern = sys.intern
    return NodeView((NodeSummary(name, {intern(k): intern(v) for k, v in labels.items()},
                                 tuple(Taint(intern(key), value, intern(effect)) for key, value, effect in taints),
                                 frozenset(intern(r) for r in resources))
                     for name, labels, taints, resources in document["nodes"]), int(document["generation"]))
