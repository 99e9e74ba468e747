"""Which GPU requests Koordinator's scheduler can ever place (koordinator.md §1.3.1).

The scheduler judges the *pod's* aggregated request, masked to one device type at a time, against
a fixed table of allowed name combinations. A pod outside the table is ``UnschedulableAndUnresolvable``
and would sit Pending forever; refusing it at admission with a precise reason is kinder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .podspec import ContainerResources
from .quantity import Quantity
from .resources import (
    AMD_GPU,
    DEPRECATED_RENAMES,
    GPU_CORE,
    GPU_DEVICE_NAMES,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    GPU_SHARED,
    HYGON_DCU,
    KOORD_FPGA,
    KOORD_GPU,
    KOORD_RDMA,
    NPU_CORE,
    NPU_CPU,
    NPU_DVPP,
    NVIDIA_GPU,
    PERCENT_PER_CARD,
    VENDOR_WHOLE_GPU_NAMES,
    ResourceList,
    gpu_subset,
    mask,
    without_zeros,
)

# The scheduler holds requests as int64 and scales them (x100 per card, x1000 for milli-units):
# anything beyond this overflows there, so no value above it can mean what the user wrote.
MAX_GPU_AMOUNT = (2**63 - 1) // (1000 * PERCENT_PER_CARD)


@dataclass(frozen=True, slots=True)
class GpuRequestProblem:
    """One reason a pod's GPU request can never be scheduled, with what to change."""

    rule: str  # stable id: "negative", "not-integer", "percentage", "combination", "shared", ...
    message: str
    resources: tuple[str, ...] = ()
    container: str | None = None


def _is_percentage(value: int) -> bool:
    return value <= PERCENT_PER_CARD or value % PERCENT_PER_CARD == 0


def _percentage_problem(name: str, quantity: Quantity) -> GpuRequestProblem | None:
    value = quantity.ceil()
    if _is_percentage(value):
        return None
    lower = value // PERCENT_PER_CARD * PERCENT_PER_CARD
    return GpuRequestProblem(
        "percentage",
        f"invalid resource unit {name}: {quantity}: a share of one card must be 1-100, and more than one "
        f"card must be a whole multiple of 100 (use {lower} or {lower + PERCENT_PER_CARD})",
        (name,),
    )


def _shared_problem(name: str, quantity: Quantity, shared: Quantity) -> GpuRequestProblem | None:
    value, devices = quantity.ceil(), shared.ceil()
    if devices > 0 and value % devices == 0 and value // devices <= PERCENT_PER_CARD:
        return None
    return GpuRequestProblem(
        "shared",
        f"invalid resource device requests: {name}={quantity} must split evenly over "
        f"{GPU_SHARED}={shared} devices with at most {PERCENT_PER_CARD} per device",
        (name, GPU_SHARED),
    )


Validator = Callable[[Mapping[str, Quantity]], list[GpuRequestProblem]]


def _ok(_: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
    return []


def _percentages(*names: str) -> Validator:
    def check(request: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
        return [p for name in names if (p := _percentage_problem(name, request[name])) is not None]
    return check


def _split_over_shared(*names: str) -> Validator:
    def check(request: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
        shared = request[GPU_SHARED]
        return [p for name in names if (p := _shared_problem(name, request[name], shared)) is not None]
    return check


def _at_most(name: str, bound: int) -> Validator:
    def check(request: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
        if request[name].ceil() <= bound:
            return []
        return [GpuRequestProblem("combination", f"invalid resource device requests: {name}={request[name]} "
                                                 f"must be at most {bound} here", (name,))]
    return check


def _all(*validators: Validator) -> Validator:
    def check(request: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
        return [problem for validator in validators for problem in validator(request)]
    return check


# The scheduler's ValidDeviceResourceCombinations, keyed by the exact set of GPU names present.
VALID_GPU_COMBINATIONS: Mapping[frozenset[str], Validator] = {
    frozenset({NVIDIA_GPU}): _ok,
    frozenset({AMD_GPU}): _ok,
    frozenset({HYGON_DCU}): _ok,
    frozenset({KOORD_GPU}): _percentages(KOORD_GPU),
    frozenset({GPU_MEMORY}): _ok,
    frozenset({GPU_MEMORY_RATIO}): _percentages(GPU_MEMORY_RATIO),
    frozenset({GPU_CORE, GPU_MEMORY}): _percentages(GPU_CORE),
    frozenset({GPU_CORE, GPU_MEMORY_RATIO}): _percentages(GPU_CORE, GPU_MEMORY_RATIO),
    frozenset({NPU_CORE, GPU_MEMORY_RATIO}): _percentages(GPU_MEMORY_RATIO),
    frozenset({GPU_SHARED, GPU_MEMORY}): _ok,
    frozenset({GPU_SHARED, GPU_MEMORY_RATIO}): _split_over_shared(GPU_MEMORY_RATIO),
    frozenset({GPU_SHARED, GPU_CORE, GPU_MEMORY}): _split_over_shared(GPU_CORE),
    frozenset({GPU_SHARED, GPU_CORE, GPU_MEMORY_RATIO}): _split_over_shared(GPU_CORE, GPU_MEMORY_RATIO),
    frozenset({GPU_SHARED, NPU_CORE, NPU_CPU, GPU_MEMORY}): _at_most(GPU_SHARED, 1),
    frozenset({GPU_SHARED, NPU_CORE, NPU_CPU, NPU_DVPP, GPU_MEMORY}):
        _all(_at_most(GPU_SHARED, 1), _at_most(NPU_DVPP, PERCENT_PER_CARD)),
}


def _combination_hint(names: frozenset[str]) -> str:
    vendors = names & VENDOR_WHOLE_GPU_NAMES
    if vendors and names - vendors:
        return (f"do not mix whole-card {', '.join(sorted(vendors))} with {', '.join(sorted(names - vendors))} "
                f"in one pod; ask for {GPU_CORE} + {GPU_MEMORY_RATIO} (100 per card) instead")
    if len(vendors) > 1:
        return "ask for one GPU vendor per pod"
    if KOORD_GPU in names:
        return f"{KOORD_GPU} cannot be combined with other GPU names; use {GPU_CORE} + {GPU_MEMORY_RATIO}"
    if GPU_MEMORY in names and GPU_MEMORY_RATIO in names:
        return f"ask for either {GPU_MEMORY} (bytes) or {GPU_MEMORY_RATIO} (percent), not both"
    if names & {GPU_CORE, GPU_SHARED, NPU_CORE} and not names & {GPU_MEMORY, GPU_MEMORY_RATIO}:
        return f"add a memory request: {GPU_MEMORY_RATIO} (percent of a card) or {GPU_MEMORY} (bytes)"
    return "see the supported combinations in the README"


def validate_gpu_request(pod_request: Mapping[str, Quantity]) -> list[GpuRequestProblem]:
    """Problems of a pod-level aggregated request (see :func:`podspec.pod_requests`)."""
    problems: list[GpuRequestProblem] = []
    for name in (KOORD_FPGA, KOORD_RDMA):
        if name in pod_request and (p := _percentage_problem(name, pod_request[name])) is not None:
            problems.append(p)
    gpu_request = without_zeros(mask(pod_request, GPU_DEVICE_NAMES))
    if not gpu_request:
        return problems
    names = frozenset(gpu_request)
    validator = VALID_GPU_COMBINATIONS.get(names)
    if validator is None:
        listed = " ".join(sorted(names))
        problems.append(GpuRequestProblem(
            "combination",
            f"invalid resource device requests: [{listed}]: {_combination_hint(names)}",
            tuple(sorted(names)),
        ))
        return problems
    return problems + validator(gpu_request)


def validate_container_values(container: ContainerResources) -> list[GpuRequestProblem]:
    """Per-container value rules the API server would also enforce, reported with the container."""
    problems: list[GpuRequestProblem] = []
    for field, resources in (("requests", container.requests), ("limits", container.limits)):
        for name, quantity in sorted(gpu_subset(resources).items()):
            where = f"{container.label} resources.{field}[{name}]"
            if quantity.amount < 0:
                problems.append(GpuRequestProblem("negative", f"{where}: {quantity} must not be negative",
                                                  (name,), container.name))
            elif quantity.amount > MAX_GPU_AMOUNT:
                problems.append(GpuRequestProblem(
                    "out-of-range", f"{where}: {quantity} is larger than {MAX_GPU_AMOUNT}, beyond what the "
                                    f"scheduler can count", (name,), container.name))
            elif not quantity.is_integer():
                problems.append(GpuRequestProblem(
                    "not-integer",
                    f"{where}: {quantity} must be a whole number (GPU resources are counted in whole "
                    f"units; for a share of a card ask for {GPU_CORE} and {GPU_MEMORY_RATIO} in percent)",
                    (name,), container.name))
        for old, new in sorted(DEPRECATED_RENAMES.items()):
            if old in resources and new in resources:
                # The scheduler renames the old name only when the new one is absent: the old one
                # would stay an unknown extended resource that no node offers.
                problems.append(GpuRequestProblem(
                    "duplicate-name", f"{container.label} resources.{field}: both {old} and {new} are set; "
                                      f"remove {old}", (old, new), container.name))
    for name in sorted(set(gpu_subset(container.requests)) & set(container.limits)):
        if container.requests[name] != container.limits[name]:
            problems.append(GpuRequestProblem(
                "requests-limits",
                f"{container.label}: {name} requests ({container.requests[name]}) and limits "
                f"({container.limits[name]}) must be equal for extended resources",
                (name,), container.name))
    return problems


def validate_pod_gpu(containers: list[ContainerResources], pod_request: ResourceList) -> list[GpuRequestProblem]:
    """Every reason this pod's GPU request cannot be scheduled, most specific first."""
    problems = [p for container in containers for p in validate_container_values(container)]
    if problems:
        return problems
    return [_attribute(problem, containers) for problem in validate_gpu_request(pod_request)]


def _attribute(problem: GpuRequestProblem, containers: list[ContainerResources]) -> GpuRequestProblem:
    """Name the containers that ask for the offending resources: the user fixes containers, not pods."""
    askers = [c for c in containers if set(problem.resources) & set(c.effective_requests())]
    if not askers:
        return problem
    # ``container`` is the name, as validate_container_values sets it; the message carries the labels.
    return GpuRequestProblem(problem.rule,
                             f"{problem.message} (asked for by {', '.join(c.label for c in askers)})",
                             problem.resources, askers[0].name)


def describe(problems: list[GpuRequestProblem]) -> str:
    return "; ".join(problem.message for problem in problems)
