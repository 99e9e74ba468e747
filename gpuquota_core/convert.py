"""The mutating webhook's rewrite applied to whole manifests: pods and workloads' pod templates.

``gpuquota convert`` shows users what the webhook will store; it must be exactly the webhook's
rewrite, so both go through :func:`canonical.canonicalize_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import TEMPLATE_PATHS
from .canonical import canonicalize_pod
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .jsonpatch import Operation, copy_json, diff
from .podspec import PodShapeError, as_mapping, pod_requests, read_containers
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
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return (str(obj.get("kind") or "?"), str(metadata.get("namespace") or ""),
            str(metadata.get("name") or metadata.get("generateName") or "?"))


def convert_object(obj: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG) -> ConvertedObject:
    """The object with canonical GPU requests; raises PodShapeError on an unreadable pod spec."""
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
    result = canonicalize_pod(target, config)
    if parent is not None:
        parent[path[-1]] = result.obj
    else:
        new_obj = result.obj
    spec = as_mapping(result.obj.get("spec"), "spec")
    containers = read_containers(spec)
    problems = validate_pod_gpu(containers, pod_requests(spec, containers), config)
    return ConvertedObject(kind, namespace, name, new_obj, diff(dict(obj), new_obj), result.summary(),
                           list(result.notes), problems)
