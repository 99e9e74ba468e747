"""What one pod counts against its quota: its canonical requests (after the webhook's rewrite),
whether it counts at all, and the small record the usage index keeps of it; the answers are
remembered per pod shape because a cluster's pods repeat a few shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .canonical import canonicalize_pod_spec, config_identity, pinned_model_key, values_key
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .gang import gang_metadata, names_gang
from .memo import BoundedMemo
from .podspec import CONTAINER_KINDS, MAX_CONTAINERS, as_mapping, pod_requests, read_containers
from .quota_objects import POD_QUOTA_LABEL
from .resources import GPU_MEMORY, GPU_MEMORY_RATIO, ResourceList
from .validation import GpuRequestProblem, validate_pod_gpu

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodRecord:
    """The few fields of a pod that quota accounting needs (kept small: the cache holds 100k)."""

    namespace: str
    name: str
    uid: str
    quota_label: str
    requests: ResourceList  # canonical, pod-level, zeros removed
    unknown_gpu_memory: bool = False
    gang: str = ""  # namespace/name of the gang its labels or annotations name (gpuquota_core.gang)

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


def canonical_resource_list(resources: Mapping[str, Any]) -> ResourceList:
    """A resource list written like one container's requests (a PodGroup's minResources), in
    canonical units: the GPUs in it read as a container asking for them would be."""
    container = {"name": "total", "resources": {"requests": dict(resources), "limits": dict(resources)}}
    return canonical_pod_requests({"containers": [container]})


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


def gpu_memory_unknown(requests: Mapping[str, object]) -> bool:
    """Bytes of GPU memory with no ratio: how much of a ratio-limited quota it takes is unknowable."""
    return GPU_MEMORY in requests and GPU_MEMORY_RATIO not in requests


def pod_record(pod: Mapping[str, Any], config: ConversionConfig = DEFAULT_CONFIG, *,
               shape: object = _UNKEYED) -> PodRecord:
    """``shape``: see :func:`remembered_pod_requests`."""
    metadata = as_mapping(pod.get("metadata"), "metadata")
    labels = as_mapping(metadata.get("labels"), "metadata.labels")
    requests = remembered_pod_requests(as_mapping(pod.get("spec"), "spec"), config, shape=shape)
    namespace = str(metadata.get("namespace") or "")
    gang = names_gang(labels, gang_metadata(metadata.get("annotations")))
    return PodRecord(
        namespace=namespace,
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        quota_label=str(labels.get(POD_QUOTA_LABEL) or ""),
        requests=requests,
        unknown_gpu_memory=gpu_memory_unknown(requests),
        gang=f"{namespace}/{gang}" if gang else "",
    )
