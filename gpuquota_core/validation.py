"""Which GPU requests Koordinator's scheduler can ever place (pkg/scheduler/plugins/deviceshare/utils.go).

The scheduler judges the *pod's* aggregated request, masked to one device type at a time, against
a fixed table of allowed name combinations. A pod outside the table is ``UnschedulableAndUnresolvable``
and would sit Pending forever; refusing it at admission with a precise reason is kinder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .conversion import DEFAULT_CONFIG, ConversionConfig
from .podspec import ContainerResources, containers_total
from .quantity import ZERO, Quantity
from .reading import MAX_GPU_AMOUNT, in_range, read_list, renamed
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

__all__ = ["KOORDINATOR_WEBHOOK_NAMES", "MAX_GPU_AMOUNT", "REFUSED_WHEN_MUTATING", "VALID_GPU_COMBINATIONS",
           "GpuRequestProblem", "as_koordinator_webhook_leaves", "describe", "pod_gpu_schedulable",
           "refused_when_mutating", "validate_container_values", "validate_gpu_request", "validate_pod_gpu"]


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
        return f"{' and '.join(sorted(vendors))} are different hardware: ask for one GPU vendor per pod"
    if KOORD_GPU in names:
        return f"{KOORD_GPU} cannot be combined with other GPU names; use {GPU_CORE} + {GPU_MEMORY_RATIO}"
    if GPU_MEMORY in names and GPU_MEMORY_RATIO in names:
        return f"ask for either {GPU_MEMORY} (bytes) or {GPU_MEMORY_RATIO} (percent), not both"
    if names & {GPU_CORE, GPU_SHARED, NPU_CORE} and not names & {GPU_MEMORY, GPU_MEMORY_RATIO}:
        return f"add a memory request: {GPU_MEMORY_RATIO} (percent of a card) or {GPU_MEMORY} (bytes)"
    # Otherwise name what Koordinator would take: the combinations that hold every name asked for.
    wider = sorted(" + ".join(sorted(combination)) for combination in VALID_GPU_COMBINATIONS if names < combination)
    if wider:
        return f"Koordinator schedules these names only as one of: {'; '.join(wider)}"
    return ("Koordinator schedules GPU names only in these combinations: "
            + "; ".join(sorted(" + ".join(sorted(combination)) for combination in VALID_GPU_COMBINATIONS)))


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


def validate_container_values(container: ContainerResources,
                              config: ConversionConfig = DEFAULT_CONFIG) -> list[GpuRequestProblem]:
    """Per-container value rules the API server would also enforce, reported with the container,
    and the rules of reading one container (:mod:`reading`): spellings must agree, readings fit."""
    problems: list[GpuRequestProblem] = []
    for field, resources in (("requests", container.requests), ("limits", container.limits)):
        for name, quantity in sorted(gpu_subset(resources).items()):
            where = f"{container.label} resources.{field}[{name}]"
            if quantity.amount < 0:
                problems.append(GpuRequestProblem("negative", f"{where}: {quantity.as_written()} must not be negative",
                                                  (name,), container.name))
            elif not in_range(quantity.amount):
                problems.append(GpuRequestProblem(
                    "out-of-range", f"{where}: {quantity.as_written()} is larger than {MAX_GPU_AMOUNT}, beyond what "
                                    "the scheduler can count", (name,), container.name))
            elif not quantity.is_integer():
                problems.append(GpuRequestProblem(
                    "not-integer",
                    f"{where}: {quantity.as_written()} must be a whole number (GPU resources are counted in whole "
                    f"units; for a share of a card ask for {GPU_CORE} and {GPU_MEMORY_RATIO} in percent)",
                    (name,), container.name))
        for old, new in sorted(DEPRECATED_RENAMES.items()):
            if old in resources and new in resources:
                # The scheduler renames the old name only when the new one is absent: the old one
                # would stay an unknown extended resource that no node offers.
                problems.append(GpuRequestProblem(
                    "duplicate-name", f"{container.label} resources.{field}: both {old} and {new} are set; "
                                      f"remove {old}", (old, new), container.name))
        problems.extend(_reading_problems(container, field, resources, config))
    for name in sorted(set(gpu_subset(container.requests)) & set(container.limits)):
        if container.requests[name] != container.limits[name]:
            problems.append(GpuRequestProblem(
                "requests-limits",
                f"{container.label}: {name} requests ({container.requests[name].as_written()}) and limits "
                f"({container.limits[name].as_written()}) must be equal for extended resources",
                (name,), container.name))
    return problems


def _reading_problems(container: ContainerResources, field: str, resources: ResourceList,
                      config: ConversionConfig) -> list[GpuRequestProblem]:
    """A map whose spellings disagree, or whose reading is past the bound the rewrite keeps."""
    values = renamed(resources) if config.rename_deprecated else dict(resources)
    reading = read_list(values, config)
    where = f"{container.label} resources.{field}"
    problems: list[GpuRequestProblem] = []
    for spelling, output in reading.out_of_range:
        if not in_range(spelling.quantity.amount):
            continue  # already refused as written
        problems.append(GpuRequestProblem(
            "out-of-range", f"{where}[{spelling.name}]: {spelling.quantity} reads as {output}: "
                            f"{Quantity.of(spelling.reads[output])}, larger than {MAX_GPU_AMOUNT}, beyond what the "
                            f"scheduler can count", (spelling.name,), container.name))
    for disagreement in reading.disagreements[:1]:
        names = tuple(sorted({disagreement.first.name, disagreement.second.name}))
        problems.append(GpuRequestProblem(
            "spellings-disagree", f"{where}: {disagreement.describe()}: one container must ask for its GPUs in "
                                  f"one reading; keep one spelling", names, container.name))
    return problems


# The names whose presence makes Koordinator's pod webhook touch an app container
# (pkg/webhook/pod/mutating/device_resource_spec.go).
KOORDINATOR_WEBHOOK_NAMES: frozenset[str] = frozenset({KOORD_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED})


def as_koordinator_webhook_leaves(containers: list[ContainerResources]) -> list[ContainerResources]:
    """The containers as Koordinator's own pod webhook leaves them on CREATE
    (pkg/webhook/pod/mutating/device_resource_spec.go).

    It is installed with Koordinator and on by default, so the scheduler sees its result, not ours:
    in every *app* container (init containers are left alone) that names any of
    :data:`KOORDINATOR_WEBHOOK_NAMES`, ``koordinator.sh/gpu: P`` becomes ``gpu-core: P,
    gpu-memory-ratio: P``, and a missing ``gpu.shared`` is added (ratio/100 for whole cards, else
    core/100 for whole cards without a ratio, else 1). Vendor names are not touched. Applying it
    to its own result changes nothing (the pod may already have been through it).
    """
    result: list[ContainerResources] = []
    for container in containers:
        if container.kind != "containers" or not KOORDINATOR_WEBHOOK_NAMES & (set(container.requests) |
                                                                              set(container.limits)):
            result.append(container)
            continue
        requests, limits = container.effective_requests(), dict(container.limits)
        if KOORD_GPU in requests:
            percent = Quantity.of(requests[KOORD_GPU].ceil())
            for target in (requests, limits):
                target.pop(KOORD_GPU, None)
                target[GPU_CORE] = target[GPU_MEMORY_RATIO] = percent
        if GPU_SHARED not in requests:
            requests[GPU_SHARED] = limits[GPU_SHARED] = Quantity.of(_injected_shared(requests))
        result.append(replace(container, requests=requests, limits=limits))
    return result


def _injected_shared(requests: Mapping[str, Quantity]) -> int:
    def whole_cards(name: str) -> int | None:
        value = requests[name].ceil()
        return value // PERCENT_PER_CARD if value > PERCENT_PER_CARD and value % PERCENT_PER_CARD == 0 else None
    if GPU_MEMORY_RATIO in requests:
        return whole_cards(GPU_MEMORY_RATIO) or 1
    if GPU_CORE in requests:
        return whole_cards(GPU_CORE) or 1
    return 1


def _after_koordinator_webhook(containers: list[ContainerResources],
                               pod_request: ResourceList) -> tuple[list[ContainerResources], ResourceList]:
    """The containers and the pod's request once Koordinator's pod webhook has run."""
    after = as_koordinator_webhook_leaves(containers)
    if all(a is b for a, b in zip(after, containers, strict=True)):
        return containers, pod_request
    before_total, after_total = containers_total(containers), containers_total(after)
    request = dict(pod_request)
    # pod_request is the containers' total plus the overhead: keep the overhead's part exactly.
    for name in set(before_total) | set(after_total):
        overhead = pod_request.get(name, ZERO) - before_total.get(name, ZERO)
        request[name] = after_total.get(name, ZERO) + overhead
    return after, without_zeros(request)


def validate_pod_gpu(containers: list[ContainerResources], pod_request: ResourceList,
                     config: ConversionConfig = DEFAULT_CONFIG) -> list[GpuRequestProblem]:
    """Every reason this pod's GPU request cannot be scheduled, most specific first.

    The pod is judged as the scheduler will see it, after Koordinator's own pod webhook too
    (:func:`as_koordinator_webhook_leaves`). A problem the pod has as written is reported in the
    user's spelling; one that only that webhook's ``gpu.shared`` brings says so.
    """
    problems = [p for container in containers for p in validate_container_values(container, config)]
    if problems:
        return problems
    after, after_request = _after_koordinator_webhook(containers, pod_request)
    judged = validate_gpu_request(after_request)
    if not judged or after is containers:
        return [_attribute(problem, containers) for problem in judged]
    as_written = validate_gpu_request(pod_request)
    if as_written:
        return [_attribute(problem, containers) for problem in as_written]
    return [_attribute(_after_webhook_note(problem), after) for problem in judged]


# The rules the mutating call refuses itself rather than leave to the validating call: a container
# that names its GPUs twice, in spellings that disagree or in a deprecated name beside its new one.
# The API server runs every other mutator between the two calls, and Koordinator's pod webhook
# resolves both by keeping one spelling (it turns koordinator.sh/gpu into gpu-core and
# gpu-memory-ratio over whatever the container already says): such a pod would reach validation in
# a reading its user never wrote, and be admitted in it.
REFUSED_WHEN_MUTATING: frozenset[str] = frozenset({"spellings-disagree", "duplicate-name"})


def refused_when_mutating(containers: list[ContainerResources], pod_request: ResourceList,
                          config: ConversionConfig = DEFAULT_CONFIG) -> list[GpuRequestProblem]:
    """What the validating call would refuse this pod for, when the mutating call must refuse it
    first (:data:`REFUSED_WHEN_MUTATING`); empty otherwise. The same problems, so the same message."""
    problems = validate_pod_gpu(containers, pod_request, config)
    return problems if any(p.rule in REFUSED_WHEN_MUTATING for p in problems) else []


def _after_webhook_note(problem: GpuRequestProblem) -> GpuRequestProblem:
    return GpuRequestProblem(problem.rule, f"{problem.message}, once Koordinator's pod webhook has added {GPU_SHARED} "
                                           f"to the app containers", problem.resources, problem.container)


def pod_gpu_schedulable(containers: list[ContainerResources], pod_request: ResourceList,
                        config: ConversionConfig = DEFAULT_CONFIG) -> bool:
    """Whether Koordinator's scheduler can place this pod's GPU request at all (after its webhook)."""
    if any(validate_container_values(container, config) for container in containers):
        return False
    _, after_request = _after_koordinator_webhook(containers, pod_request)
    return not validate_gpu_request(after_request)


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
