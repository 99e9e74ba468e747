"""The mutating webhook's rewrite applied to whole manifests: pods and workloads' pod templates.

``gpuquota convert`` shows users what the webhook will store; it must be exactly the webhook's
answer, so it is read from the function ``/mutate-pods`` calls (:func:`mutation.admission_mutation`:
the rewrite, and whether the nodes the pod can reach let it be applied), made from the Node
objects in the input. Without any, there are no nodes to look at: ``rewrite: auto`` then rewrites
as ``always`` would (the CLI says so), as the audit and ``explain`` do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import TEMPLATE_PATHS, audit_rewrite_config
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .jsonpatch import Operation, apply, copy_json, diff
from .mutation import admission_mutation
from .placement import NodeView
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
    # The mutating webhook's own answer for this pod (nodes included); with no Node to look at,
    # as `rewrite: always` would make it (audit_rewrite_config: the audit and explain decide alike).
    mutation = admission_mutation(target, audit_rewrite_config(config, nodes), nodes)
    pod = apply(copy_json(dict(target)), mutation.operations()) if mutation.changed else copy_json(dict(target))
    if parent is not None:
        parent[path[-1]] = pod
    else:
        new_obj = pod
    spec = as_mapping(pod.get("spec"), "spec")
    containers = read_containers(spec)
    problems = validate_pod_gpu(containers, pod_requests(spec, containers), config)
    return ConvertedObject(kind, namespace, name, new_obj, diff(dict(obj), new_obj), list(mutation.summary),
                           list(mutation.notes) + list(mutation.warnings), problems)


def unconverted(obj: Mapping[str, Any], reason: str) -> ConvertedObject:
    """``obj`` left as written, for an object that cannot be converted (``skipped`` says why)."""
    kind, namespace, name = _identity(obj)
    return ConvertedObject(kind, namespace, name, copy_json(dict(obj)), [], skipped=reason)

