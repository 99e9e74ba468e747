"""The mutating webhook's rewrite applied to whole manifests: pods and workloads' pod templates.

``gpuquota convert`` shows users what the webhook will store; it must be exactly the webhook's
rewrite, so both go through :func:`canonical.canonicalize_pod`, and whether it is applied is the
webhook's decision too (:func:`placement.decide_rewrite`), made from the Node objects in the input.
Without any, there are no nodes to look at: ``rewrite: auto`` then rewrites as ``always`` would
(the CLI says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import TEMPLATE_PATHS
from .canonical import CanonicalResult, canonicalize_pod
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .jsonpatch import Operation, copy_json, diff
from .placement import (
    NodeView,
    RewritePolicy,
    constraints_of,
    decide_rewrite,
    gpu_names,
    mixed_node_warning,
    nonzero_names,
    spec_resources,
)
from .podspec import PodShapeError, as_mapping, mapping_or_empty, pod_requests, read_containers
from .validation import GpuRequestProblem, validate_pod_gpu


@dataclass
class ConvertedObject:
    kind: str
    namespace: str
    name: str
    obj: dict[str, Any]
    patch: list[Operation]
    summary: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[GpuRequestProblem] = field(default_factory=list)
    skipped: str = ""  # why the object was passed through untouched ("" = it was considered)

    @property
    def ref(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{where}{self.name}"


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = obj.get("metadata")
    metadata = mapping_or_empty(metadata)
    return (str(obj.get("kind") or "?"), str(metadata.get("namespace") or ""),
            str(metadata.get("name") or metadata.get("generateName") or "?"))


def convert_object(obj: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG,
                   nodes: NodeView | None = None) -> ConvertedObject:
    """The object with canonical GPU requests; raises PodShapeError on an unreadable pod spec.

    ``nodes``: the Node objects to decide with, as the webhook does; None: no nodes to look at.
    """
    kind, namespace, name = _identity(obj)
    if kind == "Pod":
        path: tuple[str, ...] = ()
    elif kind in TEMPLATE_PATHS:
        path = TEMPLATE_PATHS[kind]
    else:
        return ConvertedObject(kind, namespace, name, copy_json(dict(obj)), [], skipped="no pod spec")
    new_obj = copy_json(dict(obj))
    parent: dict[str, Any] | None = None
    target: Any = new_obj
    for step in path:
        parent, target = target, target.get(step) if isinstance(target, Mapping) else None
    if not isinstance(target, Mapping):
        raise PodShapeError(".".join(path), "missing pod template")
    result, warnings = _placed(canonicalize_pod(target, config), target, config, nodes)
    if parent is not None:
        parent[path[-1]] = result.obj
    else:
        new_obj = result.obj
    spec = as_mapping(result.obj.get("spec"), "spec")
    containers = read_containers(spec)
    problems = validate_pod_gpu(containers, pod_requests(spec, containers), config)
    return ConvertedObject(kind, namespace, name, new_obj, diff(dict(obj), new_obj), result.summary(),
                           list(result.notes) + warnings, problems)


def unconverted(obj: Mapping[str, Any], reason: str) -> ConvertedObject:
    """``obj`` left as written, for an object that cannot be converted (``skipped`` says why)."""
    kind, namespace, name = _identity(obj)
    return ConvertedObject(kind, namespace, name, copy_json(dict(obj)), [], skipped=reason)


def _placed(result: CanonicalResult, pod: Mapping[str, Any], config: ConversionConfig,
            nodes: NodeView | None) -> tuple[CanonicalResult, list[str]]:
    """The rewrite if the webhook would apply it where this pod can land, else the pod as written."""
    spec = pod.get("spec")
    constraints = constraints_of(mapping_or_empty(spec))
    warnings: list[str] = []
    if result.changed:
        # No nodes to look at is not "not listed yet": convert shows what a rewrite would store.
        policy = RewritePolicy.ALWAYS if nodes is None and config.rewrite is RewritePolicy.AUTO else config.rewrite
        needs = nonzero_names((name, amount) for r in result.rewrites for name, amount in r.outputs.items())
        decision = decide_rewrite(policy, constraints, [r.source for r in result.rewrites], needs, nodes)
        warnings.extend(decision.warnings)
        if not decision.rewrite:
            result = CanonicalResult(copy_json(dict(pod)), [], list(result.notes))
    spec = result.obj.get("spec")
    if gpu_names(spec_resources(spec)):
        mixed = mixed_node_warning(constraints, nodes)
        if mixed is not None:
            warnings.append(mixed)
    return result, warnings
