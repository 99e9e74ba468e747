"""What the mutating webhook answers for a pod: the JSON Patch, the rewrites, the notes.

Computing it means rewriting the pod (:func:`canonical.canonical_view`) and diffing the result
against the request, most of a ``/mutate-pods`` call's own work (see docs/benchmarks.md, "Mechanisms kept").
The replicas of a workload send the same shape again and again, so the answer is remembered by a
key that holds everything the rewrite and the diff read, and nothing else: the resource maps
of every container (values with their types, in order), container names, positions and restart
policies, the pod overhead, the order of the fields the patch touches, the pinned GPU model, the
state of the one annotation written, and the config. Anything outside plain JSON of the usual
shape takes the uncached path, which raises its own precise error.
``tests/core/test_answers_do_not_depend_on_earlier_pods.py`` checks, on generated pods, that the
remembered answer is the computed one.

Whether the rewrite is applied depends on the nodes (:func:`admission_mutation`): that decision is
remembered separately, per node view and scheduling constraints (gpuquota_core.placement), so
the memo above never holds an answer that depends on the nodes. So is the node affinity that keeps
a rewritten pod on its GPU vendor's nodes: it is added there, only where a node of another vendor
the pod can reach advertises the canonical names too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .canonical import (
    ORIGINAL_RESOURCES_ANNOTATION,
    RESOURCE_FIELDS,
    Rewrite,
    canonical_view,
    config_identity,
    pinned_model_key,
    values_key,
)
from .conversion import ConversionConfig
from .jsonpatch import Operation, copy_json, diff
from .memo import BoundedMemo
from .placement import (
    GPU_VENDOR_LABEL,
    NodeView,
    affinity_keeping_vendor,
    constraints_of,
    decide_rewrite,
    gpu_names,
    mixed_node_warning,
    named,
    nonzero_names,
    scheduled_names,
    spec_resources,
)
from .podspec import CONTAINER_KINDS, MAX_CONTAINERS, PodShapeError, mapping_or_empty, pod_requests, read_containers
from .validation import GpuRequestProblem, refused_when_mutating


@dataclass(frozen=True, slots=True)
class PodMutation:
    """The rewrite of one pod as the webhook reports it; ``changed`` is False for canonical input."""

    patch: tuple[Operation, ...]
    rewrites: tuple[Rewrite, ...]
    notes: tuple[str, ...]  # things left alone on purpose, with the reason
    summary: tuple[str, ...]  # one line per container and resource (see CanonicalResult.summary)
    # Each rewritten resource once per container (requests and limits change together): the metric.
    rewritten_sources: tuple[str, ...]
    # The names the rewrite asks a node for (non-zero outputs), and whether the pod asks for a GPU
    # before or after it: what the placement decision reads.
    needs: frozenset[str] = frozenset()
    asks_gpu: bool = False
    # The GPU names the pod asks a node for as written and as rewritten (scheduled_names): where it
    # can fit, for the mixed-node warning.
    asked_as_written: frozenset[str] = frozenset()
    asked_rewritten: frozenset[str] = frozenset()
    # Why the rewrite was not applied, or what to know about where the pod can land (full text).
    warnings: tuple[str, ...] = ()
    # The resources a rewrite would have replaced, when it was not applied (admission_mutation).
    left_sources: tuple[str, ...] = ()
    left_reason: str = ""
    # The gpu-vendor of the cards the rewritten names counted (None: they name no vendor, or the
    # pod asks for two vendors' cards and is left as written).
    vendor: str | None = None
    # The vendor whose nodes the required node affinity added by admission_mutation keeps the pod on.
    kept_on_vendor: str | None = None
    # What the validating call would refuse the pod for, when the mutating call refuses it itself
    # (validation.REFUSED_WHEN_MUTATING); nothing is rewritten then.
    refusal: tuple[GpuRequestProblem, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    def operations(self) -> list[Operation]:
        """The patch as a list the caller owns: a remembered answer is never handed out to be changed."""
        # An operation is a flat dict; only its value can nest (the annotations object).
        return [{**operation, "value": copy_json(operation["value"])} if "value" in operation else dict(operation)
                for operation in self.patch]


def pod_mutation(pod: object, config: ConversionConfig) -> PodMutation:
    """The rewrite of ``pod`` wherever it lands (the nodes are :func:`admission_mutation`'s business)."""
    view = canonical_view(pod, config)
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    refusal = _refusal(spec, config)
    if refusal:
        return PodMutation((), (), tuple(view.notes), (), (), asks_gpu=True, refusal=refusal)
    patch = tuple(diff(pod, view.obj)) if view.changed else ()
    sources = tuple(source for _container, source in dict.fromkeys((r.container, r.source) for r in view.rewrites))
    needs = nonzero_names((name, amount) for r in view.rewrites for name, amount in r.outputs.items())
    as_written = gpu_names(spec_resources(spec))
    rewritten = gpu_names(spec_resources(view.obj.get("spec"))) if view.changed else as_written
    vendors = {rule.vendor for r in view.rewrites if r.kind == "convert"
               if (rule := config.rule_for(r.source)) is not None and rule.vendor is not None}
    return PodMutation(patch, tuple(view.rewrites), tuple(view.notes), tuple(view.summary()), sources,
                       needs, bool(as_written or rewritten), scheduled_names(as_written), scheduled_names(rewritten),
                       vendor=vendors.pop() if len(vendors) == 1 else None)


def _refusal(spec: object, config: ConversionConfig) -> tuple[GpuRequestProblem, ...]:
    if not isinstance(spec, Mapping):
        return ()
    try:
        containers = read_containers(spec)
        request = pod_requests(spec, containers)
    except PodShapeError:
        return ()  # the validating call answers a pod it cannot read
    return tuple(refused_when_mutating(containers, request, config))


def admission_mutation(pod: object, config: ConversionConfig, nodes: NodeView | None) -> PodMutation:
    """What the mutating webhook answers: the rewrite, applied only where ``config.rewrite`` and the
    nodes the pod can reach allow it (``nodes`` None: not listed yet), with the warnings to show;
    or, with ``refusal`` set, no rewrite: a pod the mutating call refuses."""
    mutation = remembered_pod_mutation(pod, config)
    if mutation.refusal or (not mutation.changed and not mutation.asks_gpu):
        return mutation
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    constraints = constraints_of(mapping_or_empty(spec))
    warnings: list[str] = []
    if mutation.changed:
        decision = decide_rewrite(config.rewrite, constraints, mutation.rewritten_sources, mutation.needs, nodes,
                                  mutation.vendor)
        if not decision.rewrite:
            mutation = replace(mutation, patch=(), rewrites=(), summary=(), rewritten_sources=(),
                               left_sources=mutation.rewritten_sources, left_reason=decision.reason)
        warnings.extend(decision.warnings)
        if decision.rewrite and decision.keep_vendor is not None and isinstance(spec, Mapping):
            kept = {**spec, "affinity": affinity_keeping_vendor(spec.get("affinity"), decision.keep_vendor)}
            mutation = replace(mutation, patch=mutation.patch + tuple(diff(spec, kept, "/spec")),
                               kept_on_vendor=decision.keep_vendor)
            # Where the pod as stored can land: the mixed-node warning below is about those nodes.
            constraints = constraints_of(kept)
            warnings.append(
                f"gpuquota kept the pod on {decision.keep_vendor} nodes (required node affinity on "
                f"{GPU_VENDOR_LABEL}): {', '.join(sorted(mutation.needs))} name no vendor, and "
                f"{named(decision.foreign)} of another vendor advertise(s) them")
    if mutation.asks_gpu:
        asked = mutation.asked_rewritten if mutation.changed else mutation.asked_as_written
        mixed = mixed_node_warning(constraints, nodes, asked)
        if mixed is not None:
            warnings.append(mixed)
    return replace(mutation, warnings=tuple(warnings)) if warnings else mutation


_mutations: BoundedMemo[PodMutation] = BoundedMemo()


def remembered_pod_mutation(pod: object, config: ConversionConfig) -> PodMutation:
    """:func:`pod_mutation`, remembered per :func:`mutation_key`."""
    key = mutation_key(pod, config)
    if key is None:
        return pod_mutation(pod, config)
    cached = _mutations.get(key)
    if cached is None:
        cached = _mutations.remember(key, pod_mutation(pod, config))
    return cached


def mutation_key(pod: object, config: ConversionConfig) -> object | None:
    """Everything :func:`pod_mutation` reads of ``pod`` and ``config``, or None (not plain JSON)."""
    if type(pod) is not dict:
        return None
    spec = pod.get("spec")
    if spec is None:
        spec = {}
    elif type(spec) is not dict:
        return None
    try:
        # The patch lists its operations in the order of the fields it changes, so the order of the
        # container kinds in the spec and of spec and metadata in the pod is part of the answer.
        kinds = tuple((kind, _containers_key(spec[kind])) for kind in spec if kind in CONTAINER_KINDS)
        pinned = pinned_model_key(spec, config)
        first = next((field for field in pod if field == "spec" or field == "metadata"), None)
        # Whether the pod as a whole is rewritten reads its total request, so the overhead too.
        key = (kinds, pinned, first, _metadata_key(pod), config_identity(config), values_key(spec.get("overhead")))
        hash(key)
    except TypeError:
        return None
    return key


def _containers_key(entries: object) -> object:
    if entries is None:
        return None
    if type(entries) is not list or len(entries) > MAX_CONTAINERS:
        raise TypeError("not plain JSON")
    containers: list[object] = []
    for entry in entries:
        if type(entry) is not dict:
            raise TypeError("not plain JSON")
        name = entry.get("name")
        resources = entry.get("resources")
        if resources is not None and type(resources) is not dict:
            raise TypeError("not plain JSON")
        fields = () if resources is None else tuple(
            (field, values_key(resources[field])) for field in resources if field in RESOURCE_FIELDS)
        # A name that is not a string is labelled by position, whatever it is. restartPolicy makes
        # an init container a sidecar, which changes the pod's total the whole-pod judgement reads.
        containers.append((name if type(name) is str else None, fields, entry.get("restartPolicy")))
    return tuple(containers)


def _metadata_key(pod: Mapping[str, Any]) -> object:
    """The state of what the rewrite writes in metadata: the original-resources annotation."""
    level: Mapping[str, Any] = pod
    for field in ("metadata", "annotations"):
        if field not in level:
            return field, "absent"
        level = level[field]
        if level is None:
            return field, "null"
        if type(level) is not dict:
            raise TypeError("not plain JSON")
    if ORIGINAL_RESOURCES_ANNOTATION not in level:
        return "not annotated"
    value = level[ORIGINAL_RESOURCES_ANNOTATION]
    # Only a string is read back (anything else is replaced whole).
    return "annotated", value if type(value) is str else None
