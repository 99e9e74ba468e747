"""Validation against Koordinator's device table (pkg/scheduler/plugins/deviceshare/utils.go), with exact messages.

Every row of the table is accepted and converts to the canonical output the table gives; every
invalid combination the reference names is refused with its rule. Ids name the rows.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest

from gpuquota_core.canonical import canonicalize_pod
from gpuquota_core.podspec import pod_requests, read_containers
from gpuquota_core.quantity import Quantity
from gpuquota_core.validation import (
    MAX_GPU_AMOUNT,
    VALID_GPU_COMBINATIONS,
    GpuRequestProblem,
    as_koordinator_webhook_leaves,
    describe,
    validate_gpu_request,
    validate_pod_gpu,
)

NVIDIA, AMD, DCU = "nvidia.com/gpu", "amd.com/gpu", "dcu.com/gpu"
KGPU = "koordinator.sh/gpu"
CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
SHARED = "koordinator.sh/gpu.shared"
NPU_CORE, NPU_CPU, NPU_DVPP = "huawei.com/npu-core", "huawei.com/npu-cpu", "huawei.com/npu-dvpp"
FPGA, RDMA = "koordinator.sh/fpga", "koordinator.sh/rdma"
PERCENT_HELP = "a share of one card must be 1-100, and more than one card must be a whole multiple of 100"


def r(pairs: dict[str, str]) -> dict[str, Quantity]:
    return {name: Quantity.parse(value) for name, value in pairs.items()}


def rules(pairs: dict[str, str]) -> list[str]:
    return [problem.rule for problem in validate_gpu_request(r(pairs))]


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p"}, "spec": spec}


def box(name: str, pairs: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": dict(pairs), "limits": dict(pairs)}, **extra}


def problems_of(obj: dict[str, Any]) -> list[GpuRequestProblem]:
    containers = read_containers(obj["spec"])
    return validate_pod_gpu(containers, pod_requests(obj["spec"], containers))


# (row id, container request as written, canonical form after the webhook's rewrite)
ROWS = [
    pytest.param({NVIDIA: "2"}, {CORE: "200", RATIO: "200"}, id="row-nvidia.com/gpu"),
    pytest.param({AMD: "1"}, {CORE: "100", RATIO: "100"}, id="row-amd.com/gpu"),
    pytest.param({DCU: "3"}, {CORE: "300", RATIO: "300"}, id="row-dcu.com/gpu"),
    pytest.param({KGPU: "50"}, {CORE: "50", RATIO: "50"}, id="row-koordinator.sh/gpu-share"),
    pytest.param({KGPU: "200"}, {CORE: "200", RATIO: "200"}, id="row-koordinator.sh/gpu-whole-cards"),
    pytest.param({MEMORY: "8Gi"}, {MEMORY: "8Gi"}, id="row-gpu-memory"),
    pytest.param({RATIO: "50"}, {RATIO: "50"}, id="row-gpu-memory-ratio"),
    pytest.param({CORE: "50", MEMORY: "8Gi"}, {CORE: "50", MEMORY: "8Gi"}, id="row-gpu-core+gpu-memory"),
    pytest.param({CORE: "200", RATIO: "200"}, {CORE: "200", RATIO: "200"}, id="row-gpu-core+gpu-memory-ratio"),
    pytest.param({SHARED: "2", MEMORY: "8Gi"}, {SHARED: "2", MEMORY: "8Gi"}, id="row-gpu.shared+gpu-memory"),
    pytest.param({SHARED: "2", RATIO: "100"}, {SHARED: "2", RATIO: "100"}, id="row-gpu.shared+gpu-memory-ratio"),
    pytest.param({SHARED: "2", CORE: "100", MEMORY: "8Gi"}, {SHARED: "2", CORE: "100", MEMORY: "8Gi"},
                 id="row-gpu.shared+gpu-core+gpu-memory"),
    pytest.param({SHARED: "2", CORE: "200", RATIO: "200"}, {SHARED: "2", CORE: "200", RATIO: "200"},
                 id="row-gpu.shared+gpu-core+gpu-memory-ratio"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"},
                 {SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"},
                 id="row-gpu.shared+npu-core+npu-cpu+memory"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", NPU_DVPP: "100", MEMORY: "8Gi"},
                 {SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", NPU_DVPP: "100", MEMORY: "8Gi"},
                 id="row-gpu.shared+npu-core+npu-cpu+npu-dvpp+memory"),
    pytest.param({FPGA: "100"}, {FPGA: "100"}, id="row-koordinator.sh/fpga"),
    pytest.param({RDMA: "50"}, {RDMA: "50"}, id="row-koordinator.sh/rdma"),
]


@pytest.mark.parametrize(("given", "canonical"), ROWS)
def test_every_row_converts_to_the_tables_output_and_is_accepted(given: dict[str, str],
                                                                  canonical: dict[str, str]) -> None:
    assert validate_gpu_request(r(given)) == []

    result = canonicalize_pod(pod(box("main", given)))

    assert result.obj["spec"]["containers"][0]["resources"] == {"requests": canonical, "limits": canonical}
    assert problems_of(result.obj) == []


def test_the_table_has_exactly_the_fifteen_gpu_rows() -> None:
    assert len(VALID_GPU_COMBINATIONS) == 15


COMBINATION = "invalid resource device requests"
INVALID = [
    pytest.param({CORE: "50"}, f"{COMBINATION}: [{CORE}]: add a memory request: {RATIO} (percent of a card) or "
                 f"{MEMORY} (bytes)", id="gpu-core-alone"),
    pytest.param({SHARED: "2"}, f"{COMBINATION}: [{SHARED}]: add a memory request: {RATIO} (percent of a card) or "
                 f"{MEMORY} (bytes)", id="gpu.shared-alone"),
    pytest.param({SHARED: "2", CORE: "100"}, f"{COMBINATION}: [{CORE} {SHARED}]: add a memory request: {RATIO} "
                 f"(percent of a card) or {MEMORY} (bytes)", id="gpu.shared+gpu-core"),
    pytest.param({NPU_CORE: "4"}, f"{COMBINATION}: [{NPU_CORE}]: add a memory request: {RATIO} (percent of a card) "
                 f"or {MEMORY} (bytes)", id="npu-core-alone"),
    pytest.param({NPU_CORE: "4", MEMORY: "8Gi"}, f"{COMBINATION}: [{NPU_CORE} {MEMORY}]: Koordinator schedules these "
                 f"names only as one of: {NPU_CORE} + {NPU_CPU} + {NPU_DVPP} + {MEMORY} + {SHARED}; {NPU_CORE} + "
                 f"{NPU_CPU} + {MEMORY} + {SHARED}", id="npu-core+gpu-memory"),
    pytest.param({MEMORY: "8Gi", RATIO: "50"}, f"{COMBINATION}: [{MEMORY} {RATIO}]: ask for either {MEMORY} (bytes) "
                 f"or {RATIO} (percent), not both", id="gpu-memory+gpu-memory-ratio"),
    pytest.param({CORE: "50", MEMORY: "8Gi", RATIO: "50"}, f"{COMBINATION}: [{CORE} {MEMORY} {RATIO}]: ask for "
                 f"either {MEMORY} (bytes) or {RATIO} (percent), not both", id="gpu-core+gpu-memory+gpu-memory-ratio"),
    pytest.param({SHARED: "1", MEMORY: "8Gi", RATIO: "50"}, f"{COMBINATION}: [{MEMORY} {RATIO} {SHARED}]: ask for "
                 f"either {MEMORY} (bytes) or {RATIO} (percent), not both",
                 id="gpu.shared+gpu-memory+gpu-memory-ratio"),
    pytest.param({NVIDIA: "1", AMD: "1"}, f"{COMBINATION}: [{AMD} {NVIDIA}]: {AMD} and {NVIDIA} are different "
                 "hardware: ask for one GPU vendor per pod", id="two-vendors"),
    pytest.param({KGPU: "100", RATIO: "100"}, f"{COMBINATION}: [{KGPU} {RATIO}]: {KGPU} cannot be combined with other "
                 f"GPU names; use {CORE} + {RATIO}", id="koordinator.sh/gpu+gpu-memory-ratio"),
    pytest.param({NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"}, f"{COMBINATION}: [{NPU_CORE} {NPU_CPU} {MEMORY}]: "
                 f"Koordinator schedules these names only as one of: {NPU_CORE} + {NPU_CPU} + {NPU_DVPP} + {MEMORY} + "
                 f"{SHARED}; {NPU_CORE} + {NPU_CPU} + {MEMORY} + {SHARED}", id="npu-without-shared"),
]


@pytest.mark.parametrize(("pairs", "message"), INVALID)
def test_invalid_combinations_are_refused_with_the_names_and_a_fix(pairs: dict[str, str], message: str) -> None:
    [problem] = validate_gpu_request(r(pairs))

    assert (problem.rule, problem.message) == ("combination", message)
    assert problem.resources == tuple(sorted(pairs))


KOORDINATOR_NAMES = [KGPU, CORE, RATIO, MEMORY, SHARED]


@pytest.mark.parametrize("vendor", [NVIDIA, AMD, DCU])
@pytest.mark.parametrize("other", KOORDINATOR_NAMES)
def test_any_vendor_mixed_with_any_koordinator_name_is_refused(vendor: str, other: str) -> None:
    [problem] = validate_gpu_request(r({vendor: "1", other: "100"}))

    assert problem.rule == "combination"
    assert problem.message == (
        f"{COMBINATION}: [{' '.join(sorted([vendor, other]))}]: do not mix whole-card {vendor} with {other} in one "
        f"pod; ask for {CORE} + {RATIO} (100 per card) instead")


@pytest.mark.parametrize(("first", "second"), list(combinations([NVIDIA, AMD, DCU], 2)))
def test_every_pair_of_vendors_is_refused(first: str, second: str) -> None:
    assert rules({first: "1", second: "1"}) == ["combination"]


@pytest.mark.parametrize("other", [CORE, RATIO, MEMORY, SHARED, NPU_CORE])
def test_koordinator_gpu_with_any_other_gpu_name_is_refused(other: str) -> None:
    assert rules({KGPU: "100", other: "100"}) == ["combination"]


PERCENTAGE = [
    pytest.param(RATIO, "1", True, id="1"), pytest.param(RATIO, "100", True, id="100"),
    pytest.param(RATIO, "101", False, id="101"), pytest.param(RATIO, "150", False, id="150"),
    pytest.param(RATIO, "199", False, id="199"), pytest.param(RATIO, "200", True, id="200"),
    pytest.param(RATIO, "250", False, id="250"), pytest.param(RATIO, "300", True, id="300"),
    pytest.param(KGPU, "101", False, id="koordinator.sh/gpu-101"), pytest.param(KGPU, "400", True, id="gpu-400"),
    pytest.param(FPGA, "150", False, id="fpga-150"), pytest.param(RDMA, "250", False, id="rdma-250"),
    pytest.param(RDMA, "200", True, id="rdma-200"),
    # Value() rounds a fraction up before the rule: 100.5 counts as 101.
    pytest.param(RATIO, "100500m", False, id="fraction-rounds-up-to-101"),
    pytest.param(RATIO, "99500m", True, id="fraction-rounds-up-to-100"),
]


@pytest.mark.parametrize(("name", "value", "ok"), PERCENTAGE)
def test_percentage_rule(name: str, value: str, ok: bool) -> None:
    problems = validate_gpu_request(r({name: value}))

    assert [p.rule for p in problems] == ([] if ok else ["percentage"])


def test_percentage_message_suggests_the_nearest_valid_values() -> None:
    [problem] = validate_gpu_request(r({RATIO: "250"}))
    assert problem.message == f"invalid resource unit {RATIO}: 250: {PERCENT_HELP} (use 200 or 300)"
    [problem] = validate_gpu_request(r({CORE: "150", MEMORY: "1Gi"}))
    assert problem.message == f"invalid resource unit {CORE}: 150: {PERCENT_HELP} (use 100 or 200)"
    assert [p.rule for p in validate_gpu_request(r({CORE: "150", RATIO: "250"}))] == ["percentage", "percentage"]


SHARED_RULE = [
    pytest.param({SHARED: "2", RATIO: "100"}, [], id="ratio-100-over-2-is-50-each"),
    pytest.param({SHARED: "1", RATIO: "101"}, ["shared"], id="ratio-101-over-1-is-over-100"),
    pytest.param({SHARED: "3", RATIO: "100"}, ["shared"], id="ratio-not-a-multiple-of-shared"),
    pytest.param({SHARED: "2", RATIO: "250"}, ["shared"], id="ratio-125-per-device"),
    pytest.param({SHARED: "2", CORE: "300", RATIO: "200"}, ["shared"], id="core-150-per-device"),
    pytest.param({SHARED: "4", CORE: "100", RATIO: "102"}, ["shared"], id="ratio-not-divisible-with-core"),
    pytest.param({SHARED: "3", CORE: "301", MEMORY: "8Gi"}, ["shared"], id="core-not-divisible-with-memory"),
    pytest.param({SHARED: "3", CORE: "300", MEMORY: "7"}, [], id="memory-never-checked-against-shared"),
    pytest.param({SHARED: "3", MEMORY: "1"}, [], id="shared+memory-always-ok"),
    pytest.param({SHARED: "2", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"}, ["combination"], id="npu-shared-over-1"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", NPU_DVPP: "101", MEMORY: "8Gi"}, ["combination"],
                 id="npu-dvpp-over-100"),
]


@pytest.mark.parametrize(("pairs", "expected"), SHARED_RULE)
def test_shared_rule(pairs: dict[str, str], expected: list[str]) -> None:
    assert rules(pairs) == expected


def test_shared_and_npu_messages() -> None:
    [problem] = validate_gpu_request(r({SHARED: "3", RATIO: "100"}))
    assert problem.message == (f"{COMBINATION}: {RATIO}=100 must split evenly over {SHARED}=3 devices with at most "
                               "100 per device")
    assert problem.resources == (RATIO, SHARED)
    [problem] = validate_gpu_request(r({SHARED: "2", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"}))
    assert problem.message == f"{COMBINATION}: {SHARED}=2 must be at most 1 here"


def test_zeros_and_other_resources_do_not_count() -> None:
    assert validate_gpu_request(r({NVIDIA: "0", CORE: "50", RATIO: "50", "cpu": "4"})) == []
    assert validate_gpu_request(r({"cpu": "1"})) == []
    assert validate_gpu_request({}) == []


# --- whole pods: per-container value rules, then the pod-level table, naming the containers -------

def test_a_mix_across_containers_is_refused_naming_both_containers() -> None:
    [problem] = problems_of(pod(box("train", {NVIDIA: "1"}), box("sidecar", {RATIO: "50"})))

    assert problem.rule == "combination"
    assert problem.container == "train"
    assert problem.message == (
        f"{COMBINATION}: [{RATIO} {NVIDIA}]: do not mix whole-card {NVIDIA} with {RATIO} in one pod; ask for "
        f"{CORE} + {RATIO} (100 per card) instead (asked for by container \"train\", container \"sidecar\")")


def test_the_npu_row_is_refused_once_koordinators_webhook_adds_gpu_shared() -> None:
    # The scheduler's table accepts npu-core + gpu-memory-ratio, and the rewrite leaves it alone ...
    given = pod(box("main", {NPU_CORE: "4", RATIO: "50"}))
    assert validate_gpu_request(r({NPU_CORE: "4", RATIO: "50"})) == []
    assert not canonicalize_pod(given).changed
    # ... but Koordinator's pod webhook adds gpu.shared: 1 (it has a ratio), and that set is no row.
    [problem] = problems_of(given)

    assert problem.rule == "combination"
    assert problem.message.startswith(f"{COMBINATION}: [{NPU_CORE} {RATIO} {SHARED}]: ")
    assert problem.message.endswith(f", once Koordinator's pod webhook has added {SHARED} to the app containers "
                                    '(asked for by container "main")')


def test_after_the_rewrite_the_pod_total_is_judged_in_percent() -> None:
    rewritten = canonicalize_pod(pod(box("train", {NVIDIA: "1"}), box("sidecar", {RATIO: "25"}))).obj

    # core 100 (train) is fine; ratio 100 + 25 = 125 is no whole number of cards, nor does it split
    # over the two devices Koordinator's pod webhook asks for (gpu.shared: 1 per app container).
    [problem] = problems_of(rewritten)
    assert problem.rule == "percentage"
    assert problem.message == (f"invalid resource unit {RATIO}: 125: {PERCENT_HELP} (use 100 or 200) "
                               "(asked for by container \"train\", container \"sidecar\")")
    # 100 + 50 = 150 over 2 devices is 75 each: once that webhook has run, Koordinator places it.
    assert problems_of(canonicalize_pod(pod(box("train", {NVIDIA: "1"}), box("sidecar", {RATIO: "50"}))).obj) == []
    fixed = canonicalize_pod(pod(box("train", {NVIDIA: "1"}), box("sidecar", {CORE: "100", RATIO: "100"}))).obj
    assert problems_of(fixed) == []


def test_gpu_core_alone_names_its_container() -> None:
    [problem] = problems_of(pod(box("main", {CORE: "50"}), box("plain", {"cpu": "1"})))

    assert problem.message.endswith('(asked for by container "main")')
    assert problem.container == "main"


def test_init_containers_are_aggregated_like_the_scheduler() -> None:
    # The init container (2 cards) is the larger; the app container's ratio makes the pod's set
    # {vendor, ratio}: refused, and the init container is named.
    [problem] = problems_of(pod(box("main", {RATIO: "50"}), init=[box("warm", {NVIDIA: "2"})]))
    assert problem.rule == "combination"
    assert problem.message.endswith('(asked for by init container "warm", container "main")')
    # A sidecar's share adds to the app containers: 60 + 50 = 110, not a valid percentage.
    problems = problems_of(pod(box("main", {CORE: "60", RATIO: "60"}),
                               init=[box("proxy", {CORE: "50", RATIO: "50"}, restartPolicy="Always")]))
    assert [(p.rule, p.resources) for p in problems] == [("percentage", (CORE,)), ("percentage", (RATIO,))]
    assert problems[0].message.startswith(f"invalid resource unit {CORE}: 110: ")


PER_CONTAINER = [
    pytest.param({NVIDIA: "-1"}, "negative", 'container "main" resources.requests[nvidia.com/gpu]: -1 must not be '
                 "negative", id="negative"),
    pytest.param({NVIDIA: "0.5"}, "not-integer", 'container "main" resources.requests[nvidia.com/gpu]: 0.5 must be '
                 "a whole number (GPU resources are counted in whole units; for a share of a card ask for "
                 f"{CORE} and {RATIO} in percent)", id="half-a-gpu"),
    pytest.param({NVIDIA: "100m"}, "not-integer", 'container "main" resources.requests[nvidia.com/gpu]: 100m must be '
                 "a whole number (GPU resources are counted in whole units; for a share of a card ask for "
                 f"{CORE} and {RATIO} in percent)", id="100m-gpu"),
    pytest.param({RATIO: "1e-3"}, "not-integer", f'container "main" resources.requests[{RATIO}]: 1e-3 must be '
                 "a whole number (GPU resources are counted in whole units; for a share of a card ask for "
                 f"{CORE} and {RATIO} in percent)", id="exponent-fraction"),
    pytest.param({NVIDIA: "1e17"}, "out-of-range", f'container "main" resources.requests[{NVIDIA}]: 1e17 is larger '
                 f"than {MAX_GPU_AMOUNT}, beyond what the scheduler can count", id="beyond-int64"),
    pytest.param({"kubernetes.io/gpu-core": "-5"}, "negative", 'container "main" resources.requests'
                 "[kubernetes.io/gpu-core]: -5 must not be negative", id="deprecated-name-negative"),
]


@pytest.mark.parametrize(("pairs", "rule", "message"), PER_CONTAINER)
def test_per_container_value_rules(pairs: dict[str, str], rule: str, message: str) -> None:
    problems = problems_of(pod({"name": "main", "resources": {"requests": pairs}}))

    assert [(p.rule, p.message, p.container) for p in problems] == [(rule, message, "main")]


def test_requests_must_equal_limits() -> None:
    given = pod({"name": "main", "resources": {"requests": {CORE: "50", RATIO: "50"},
                                               "limits": {CORE: "50", RATIO: "60"}}})

    [problem] = problems_of(given)

    assert problem.rule == "requests-limits"
    assert problem.message == f'container "main": {RATIO} requests (50) and limits (60) must be equal for extended ' \
                              "resources"


def test_fractions_never_sneak_through_after_the_rewrite() -> None:
    # 0.5 and 100m GPUs stay as written (not whole cards) and are refused; nothing rounds them to 0.
    for value in ("0.5", "100m", "1n", "999m", "1.000000001"):
        rewritten = canonicalize_pod(pod(box("main", {NVIDIA: value}))).obj
        assert [p.rule for p in problems_of(rewritten)] == ["not-integer", "not-integer"], value


def test_describe_joins_messages() -> None:
    problems = validate_gpu_request(r({CORE: "150", RATIO: "250"}))

    assert describe(problems) == "; ".join(p.message for p in problems)
    assert describe([]) == ""


def test_an_old_name_beside_its_new_name_is_refused() -> None:
    given = pod(box("main", {"kubernetes.io/gpu-core": "50", CORE: "50", RATIO: "50"}))

    problems = problems_of(canonicalize_pod(given).obj)

    assert [(p.rule, p.message) for p in problems] == [
        ("duplicate-name", f'container "main" resources.requests: both kubernetes.io/gpu-core and {CORE} are set; '
                           "remove kubernetes.io/gpu-core"),
        ("duplicate-name", f'container "main" resources.limits: both kubernetes.io/gpu-core and {CORE} are set; '
                           "remove kubernetes.io/gpu-core")]


# --- issue 27 §2: where the webhook's judgement followed a different reading than Koordinator's ----

@pytest.mark.parametrize(("given", "message"), [
    pytest.param({NVIDIA: "1", CORE: "100", RATIO: "200"},
                 f'container "main" resources.requests: {NVIDIA}: 1 (read as {RATIO}: 100) and {RATIO}: 200 disagree: '
                 "one container must ask for its GPUs in one reading; keep one spelling", id="vendor-and-ratio"),
    pytest.param({KGPU: "2", CORE: "1"},
                 f'container "main" resources.requests: {KGPU}: 2 (read as {CORE}: 2) and {CORE}: 1 disagree: '
                 "one container must ask for its GPUs in one reading; keep one spelling",
                 id="koordinator-gpu-and-core"),
])
def test_a_container_whose_spellings_disagree_is_refused_naming_both(given: dict[str, str], message: str) -> None:
    problems = problems_of(pod({"name": "main", "resources": {"requests": given}}))

    assert [(p.rule, p.message, p.container) for p in problems] == [("spellings-disagree", message, "main")]


def test_a_container_whose_spellings_agree_is_judged_by_its_one_reading() -> None:
    rewritten = canonicalize_pod(pod(box("main", {NVIDIA: "1", CORE: "100", RATIO: "100"}))).obj

    assert problems_of(rewritten) == []


def test_vendors_mixed_in_one_pod_are_refused_naming_both() -> None:
    given = pod(box("main", {DCU: "112", NVIDIA: "101"}))

    [problem] = problems_of(canonicalize_pod(given).obj)

    assert problem.message == (f"{COMBINATION}: [{DCU} {NVIDIA}]: {DCU} and {NVIDIA} are different hardware: ask "
                               'for one GPU vendor per pod (asked for by container "main")')
    [across] = problems_of(canonicalize_pod(pod(box("a", {DCU: "112"}), box("b", {NVIDIA: "101"}))).obj)
    assert across.message.endswith('are different hardware: ask for one GPU vendor per pod (asked for by container '
                                   '"a", container "b")')


@pytest.mark.parametrize(("count", "message"), [
    pytest.param("92233720368548", f'container "main" resources.requests[{AMD}]: 92233720368548 is larger than '
                 f"{MAX_GPU_AMOUNT}, beyond what the scheduler can count", id="count-past-the-bound"),
    pytest.param("1000000000000", f'container "main" resources.requests[{AMD}]: 1T reads as {CORE}: 100T, larger '
                 f"than {MAX_GPU_AMOUNT}, beyond what the scheduler can count", id="reading-past-the-bound"),
])
def test_huge_vendor_counts_are_left_unrewritten_and_refused(count: str, message: str) -> None:
    given = pod({"name": "main", "resources": {"requests": {AMD: count}}})

    rewritten = canonicalize_pod(given)

    assert not rewritten.changed
    assert [(p.rule, p.message) for p in problems_of(rewritten.obj)] == [("out-of-range", message)]


def test_an_init_container_larger_than_the_app_container_is_admitted_as_koordinator_would() -> None:
    given = pod(box("main", {AMD: "2"}), init=[box("init", {AMD: "3"})])

    # The rewrite leaves it as written (see test_canonical), and as written Koordinator places it.
    assert problems_of(canonicalize_pod(given).obj) == []
    # Rewritten anyway (by an earlier release), Koordinator's webhook gives the app container
    # gpu.shared: 2, and 300 over 2 devices is more than one card each: refused, saying why.
    rewritten = pod(box("main", {CORE: "200", RATIO: "200"}), init=[box("init", {CORE: "300", RATIO: "300"})])
    assert [p.rule for p in problems_of(rewritten)] == ["shared", "shared"]


def test_zero_requests_ask_for_nothing() -> None:
    given = pod(box("main", {MEMORY: "1Gi"}), box("cpu-only", {NVIDIA: "0"}))

    assert problems_of(canonicalize_pod(given).obj) == []
    assert problems_of(pod(box("cpu-only", {NVIDIA: "0", "cpu": "1"}))) == []


@pytest.mark.parametrize("zeros", [{KGPU: "0"}, {CORE: "0", RATIO: "0"}])
def test_zero_koordinator_names_are_refused_as_koordinators_webhook_leaves_them(zeros: dict[str, str]) -> None:
    # Koordinator's pod webhook reacts to the names, not the amounts: it adds gpu.shared: 1, and
    # gpu.shared alone is no row of the table. (Our rewrite never writes these zeros.)
    [problem] = problems_of(pod(box("main", {"cpu": "1", **zeros})))

    assert problem.message == (f"{COMBINATION}: [{SHARED}]: add a memory request: {RATIO} (percent of a card) or "
                               f"{MEMORY} (bytes), once Koordinator's pod webhook has added {SHARED} to the app "
                               'containers (asked for by container "main")')


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param({KGPU: "200"}, {CORE: "200", RATIO: "200", SHARED: "2"}, id="koordinator-gpu-whole-cards"),
    pytest.param({CORE: "100", MEMORY: "4000", RATIO: "50"}, {CORE: "100", MEMORY: "4000", RATIO: "50", SHARED: "1"},
                 id="share"),
    pytest.param({CORE: "100", MEMORY: "8000", RATIO: "200"},
                 {CORE: "100", MEMORY: "8000", RATIO: "200", SHARED: "2"}, id="ratio-decides"),
    pytest.param({CORE: "300", MEMORY: "8Gi"}, {CORE: "300", MEMORY: "8Gi", SHARED: "3"}, id="core-without-ratio"),
    pytest.param({SHARED: "4", RATIO: "200"}, {SHARED: "4", RATIO: "200"}, id="shared-already-there"),
    pytest.param({NVIDIA: "2"}, {NVIDIA: "2"}, id="vendor-untouched"),
])
def test_koordinators_pod_webhook_as_the_validation_applies_it(given: dict[str, str],
                                                               expected: dict[str, str]) -> None:
    containers = read_containers(pod(box("main", given), init=[box("init", given)])["spec"])

    after = as_koordinator_webhook_leaves(containers)

    assert after[0] == containers[0]  # init containers are left alone
    assert after[1].requests == after[1].limits == r(expected)
    assert as_koordinator_webhook_leaves(after) == after
