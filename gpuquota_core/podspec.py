"""Reading container resources out of a pod (or pod template) spec, and summing them per pod.

Everything here accepts untrusted JSON: a wrong type anywhere becomes a :class:`PodShapeError` that
names the field, never a ``TypeError`` deep inside the webhook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .quantity import QuantityError, parse_quantity
from .resources import ResourceList, add_lists, max_lists, without_zeros

CONTAINER_KINDS: tuple[str, ...] = ("initContainers", "containers")
# Containers beyond this are hostile input, not a pod: the API server's own limit is far lower in
# practice because of the 1.5 MiB object size.
MAX_CONTAINERS = 1000


class PodShapeError(ValueError):
    """A pod whose JSON does not have the shape of a Pod (wrong type or unparsable quantity)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True, slots=True)
class ContainerResources:
    kind: str  # "containers" or "initContainers"
    index: int
    name: str
    requests: ResourceList
    limits: ResourceList
    # Init containers with restartPolicy Always are sidecars: they run beside the app containers.
    restartable: bool = False

    @property
    def path(self) -> str:
        return f"spec.{self.kind}[{self.index}]"

    @property
    def label(self) -> str:
        kind = "init container" if self.kind == "initContainers" else "container"
        return f'{kind} "{self.name}"'

    def effective_requests(self) -> ResourceList:
        """Requests as the API server defaults them: a limit with no request is also the request."""
        merged = dict(self.limits)
        merged.update(self.requests)
        return merged


def mapping_or_empty(value: object) -> Mapping[str, Any]:
    """``value`` read leniently as an object: anything that is not a mapping (absent, a list, a
    string) reads as empty. For fields whose bad shape another check reports, or that only inform."""
    if type(value) is dict:  # decoded JSON: skips the slower ABC check, as in as_mapping
        return value
    return value if isinstance(value, Mapping) else {}


def as_mapping(value: object, path: str, error: Callable[[str], Exception] | None = None) -> Mapping[str, Any]:
    """``value`` read as an object: absent (None) is empty; anything else that is not a mapping raises
    PodShapeError at ``path``, or ``error(path)`` where the caller's domain has its own error."""
    # Decoded JSON is always a plain dict; checking that first skips the much slower ABC check
    # (this runs several times per container of every pod the quota cache sees).
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodShapeError(path, f"expected an object, got {type(value).__name__}") if error is None else error(path)
    return value


def as_list(value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodShapeError(path, f"expected a list, got {type(value).__name__}")
    return value


def parse_resource_list(value: object, path: str) -> ResourceList:
    resources: ResourceList = {}
    for name, raw in as_mapping(value, path).items():
        if not isinstance(name, str):
            raise PodShapeError(path, "resource names must be strings")
        try:
            resources[name] = parse_quantity(raw)
        except QuantityError as error:
            raise PodShapeError(f"{path}[{name}]", str(error)) from None
    return resources


def read_containers(spec: object, path: str = "spec") -> list[ContainerResources]:
    """Every container and init container with its parsed requests and limits, in spec order."""
    spec = as_mapping(spec, path)
    containers: list[ContainerResources] = []
    for kind in CONTAINER_KINDS:
        entries = as_list(spec.get(kind), f"{path}.{kind}")
        if len(entries) > MAX_CONTAINERS:
            raise PodShapeError(f"{path}.{kind}", f"more than {MAX_CONTAINERS} containers")
        for index, entry in enumerate(entries):
            where = f"{path}.{kind}[{index}]"
            container = as_mapping(entry, where)
            name = container.get("name", "")
            if not isinstance(name, str):
                raise PodShapeError(f"{where}.name", "expected a string")
            resources = as_mapping(container.get("resources"), f"{where}.resources")
            containers.append(ContainerResources(
                kind=kind,
                index=index,
                name=name or f"#{index}",
                requests=parse_resource_list(resources.get("requests"), f"{where}.resources.requests"),
                limits=parse_resource_list(resources.get("limits"), f"{where}.resources.limits"),
                restartable=kind == "initContainers" and container.get("restartPolicy") == "Always",
            ))
    return containers


def pod_requests(spec: object, containers: list[ContainerResources] | None = None) -> ResourceList:
    """The pod's total request the way kube-scheduler (component-helpers ``PodRequests``) sums it.

    App containers and sidecars add up; each ordinary init container runs alone (beside the sidecars
    started before it), so only the largest of those counts; the pod overhead comes on top.
    """
    spec = as_mapping(spec, "spec")
    if containers is None:
        containers = read_containers(spec)
    total = containers_total(containers)
    overhead = parse_resource_list(spec.get("overhead"), "spec.overhead")
    if overhead:  # rare (RuntimeClass overhead); skipping the empty sum saves an add per resource
        total = add_lists(total, overhead)
    return without_zeros(total)


def containers_total(containers: list[ContainerResources]) -> ResourceList:
    """The containers' part of :func:`pod_requests`: no overhead, zeros kept."""
    app_total: ResourceList = {}
    sidecars_so_far: ResourceList = {}
    init_peak: ResourceList = {}
    for container in containers:
        requests = container.effective_requests()
        if container.kind == "containers":
            app_total = add_lists(app_total, requests)
        elif container.restartable:
            app_total = add_lists(app_total, requests)
            sidecars_so_far = add_lists(sidecars_so_far, requests)
            # The scheduler also maxes the running sidecar total into the init peak; it only matters
            # for negative values (which validation refuses), but the sum must be the scheduler's.
            init_peak = max_lists(init_peak, sidecars_so_far)
        else:
            init_peak = max_lists(init_peak, add_lists(requests, sidecars_so_far))
    return max_lists(app_total, init_peak)
