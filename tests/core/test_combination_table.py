"""Every row of Koordinator's device-combination table (pkg/scheduler/plugins/deviceshare/utils.go),
and what it refuses.

The scheduler judges the pod's aggregated request against this table; a pod outside it is
unschedulable forever. Row ids name the table's rows so a failure points at the rule.
"""

from __future__ import annotations

import pytest

from gpuquota_core.canonical import canonicalize_pod
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.quantity import Quantity
from gpuquota_core.validation import validate_gpu_request

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
SHARED = "koordinator.sh/gpu.shared"
KOORD_GPU = "koordinator.sh/gpu"
NPU_CORE = "huawei.com/npu-core"
NPU_CPU = "huawei.com/npu-cpu"
NPU_DVPP = "huawei.com/npu-dvpp"


def r(pairs: dict[str, str]) -> dict[str, Quantity]:
    return {name: Quantity.parse(value) for name, value in pairs.items()}


VALID_ROWS = [
    pytest.param({"nvidia.com/gpu": "2"}, id="nvidia"),
    pytest.param({"amd.com/gpu": "1"}, id="amd"),
    pytest.param({"dcu.com/gpu": "3"}, id="dcu"),
    pytest.param({KOORD_GPU: "50"}, id="koordinator-gpu-share"),
    pytest.param({KOORD_GPU: "200"}, id="koordinator-gpu-two-cards"),
    pytest.param({MEMORY: "8Gi"}, id="memory-only"),
    pytest.param({RATIO: "100"}, id="ratio-only"),
    pytest.param({RATIO: "300"}, id="ratio-three-cards"),
    pytest.param({CORE: "50", MEMORY: "8Gi"}, id="core+memory"),
    pytest.param({CORE: "50", RATIO: "50"}, id="core+ratio"),
    pytest.param({CORE: "200", RATIO: "200"}, id="core+ratio-two-cards"),
    pytest.param({NPU_CORE: "4", RATIO: "50"}, id="npu-core+ratio"),
    pytest.param({SHARED: "2", MEMORY: "8Gi"}, id="shared+memory"),
    pytest.param({SHARED: "2", RATIO: "100"}, id="shared+ratio-50-per-device"),
    pytest.param({SHARED: "2", CORE: "100", MEMORY: "8Gi"}, id="shared+core+memory"),
    pytest.param({SHARED: "2", CORE: "100", RATIO: "100"}, id="shared+core+ratio"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"}, id="shared+npu-core+npu-cpu+memory"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", NPU_DVPP: "100", MEMORY: "8Gi"},
                 id="shared+npu-core+npu-cpu+dvpp+memory"),
    pytest.param({"koordinator.sh/fpga": "100"}, id="fpga"),
    pytest.param({"koordinator.sh/rdma": "50"}, id="rdma"),
]


@pytest.mark.parametrize("pairs", VALID_ROWS)
def test_every_row_of_the_table_is_accepted(pairs: dict[str, str]) -> None:
    assert validate_gpu_request(r(pairs)) == []


INVALID = [
    pytest.param({CORE: "50"}, "combination", id="core-alone"),
    pytest.param({SHARED: "2"}, "combination", id="shared-alone"),
    pytest.param({SHARED: "2", CORE: "100"}, "combination", id="shared+core"),
    pytest.param({NPU_CORE: "4"}, "combination", id="npu-core-alone"),
    pytest.param({NPU_CORE: "4", MEMORY: "8Gi"}, "combination", id="npu-core+memory"),
    pytest.param({MEMORY: "8Gi", RATIO: "50"}, "combination", id="memory+ratio"),
    pytest.param({CORE: "50", MEMORY: "8Gi", RATIO: "50"}, "combination", id="core+memory+ratio"),
    pytest.param({SHARED: "1", MEMORY: "8Gi", RATIO: "50"}, "combination", id="shared+memory+ratio"),
    pytest.param({"nvidia.com/gpu": "1", CORE: "100"}, "combination", id="vendor+core"),
    pytest.param({"nvidia.com/gpu": "1", RATIO: "100"}, "combination", id="vendor+ratio"),
    pytest.param({"nvidia.com/gpu": "1", "amd.com/gpu": "1"}, "combination", id="two-vendors"),
    pytest.param({KOORD_GPU: "100", RATIO: "100"}, "combination", id="koordinator-gpu+other"),
    pytest.param({RATIO: "150"}, "percentage", id="ratio-101-199"),
    pytest.param({RATIO: "250"}, "percentage", id="ratio-250"),
    pytest.param({KOORD_GPU: "101"}, "percentage", id="koordinator-gpu-101"),
    pytest.param({CORE: "150", MEMORY: "8Gi"}, "percentage", id="core+memory-150"),
    pytest.param({CORE: "50", RATIO: "150"}, "percentage", id="core+ratio-150"),
    pytest.param({SHARED: "1", RATIO: "101"}, "shared", id="shared-ratio-over-100-per-device"),
    pytest.param({SHARED: "3", RATIO: "100"}, "shared", id="shared-ratio-not-a-multiple"),
    pytest.param({SHARED: "2", CORE: "300", RATIO: "100"}, "shared", id="shared-core-over-100-per-device"),
    pytest.param({SHARED: "2", NPU_CORE: "4", NPU_CPU: "2", MEMORY: "8Gi"}, "combination", id="npu-shared-over-1"),
    pytest.param({SHARED: "1", NPU_CORE: "4", NPU_CPU: "2", NPU_DVPP: "101", MEMORY: "8Gi"}, "combination",
                 id="npu-dvpp-over-100"),
    pytest.param({"koordinator.sh/rdma": "150"}, "percentage", id="rdma-150"),
]


@pytest.mark.parametrize(("pairs", "rule"), INVALID)
def test_every_invalid_combination_is_refused_with_its_rule(pairs: dict[str, str], rule: str) -> None:
    problems = validate_gpu_request(r(pairs))

    assert problems, f"{pairs} should be refused"
    assert problems[0].rule == rule
    assert all(p.message for p in problems)


def test_combination_message_lists_the_names_and_says_what_to_do() -> None:
    [problem] = validate_gpu_request(r({"nvidia.com/gpu": "1", CORE: "100"}))

    assert problem.message == (
        "invalid resource device requests: [koordinator.sh/gpu-core nvidia.com/gpu]: do not mix whole-card "
        "nvidia.com/gpu with koordinator.sh/gpu-core in one pod; ask for koordinator.sh/gpu-core + "
        "koordinator.sh/gpu-memory-ratio (100 per card) instead")


def pod_with(pairs: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "resources": {"requests": dict(pairs), "limits": dict(pairs)}}]}}


CONVERSIONS = [
    pytest.param({"nvidia.com/gpu": "2"}, {CORE: "200", RATIO: "200"}, id="nvidia-N-to-100N"),
    pytest.param({"amd.com/gpu": "1"}, {CORE: "100", RATIO: "100"}, id="amd"),
    pytest.param({"dcu.com/gpu": "4"}, {CORE: "400", RATIO: "400"}, id="dcu"),
    pytest.param({KOORD_GPU: "50"}, {CORE: "50", RATIO: "50"}, id="koordinator-gpu-P-to-P"),
    pytest.param({"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "50"},
                 {CORE: "50", RATIO: "50"}, id="deprecated-names-renamed"),
    pytest.param({CORE: "50", RATIO: "50"}, {CORE: "50", RATIO: "50"}, id="canonical-untouched"),
    pytest.param({CORE: "50", MEMORY: "8Gi"}, {CORE: "50", MEMORY: "8Gi"}, id="memory-bytes-never-guessed"),
    pytest.param({"cpu": "2", "nvidia.com/gpu": "1"}, {"cpu": "2", CORE: "100", RATIO: "100"}, id="others-kept"),
]


@pytest.mark.parametrize(("given", "expected"), CONVERSIONS)
def test_default_conversion_rows(given: dict[str, str], expected: dict[str, str]) -> None:
    result = canonicalize_pod(pod_with(given), DEFAULT_CONFIG)

    resources = result.obj["spec"]["containers"][0]["resources"]
    assert resources == {"requests": expected, "limits": expected}
    assert validate_gpu_request(r(expected)) == []
    again = canonicalize_pod(result.obj, DEFAULT_CONFIG)
    assert not again.changed
