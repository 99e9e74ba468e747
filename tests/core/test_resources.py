"""Resource names, the two GPU families, and resource-list arithmetic."""

from __future__ import annotations

import pytest

from gpuquota_core.quantity import Quantity
from gpuquota_core.resources import (
    DEPRECATED_RENAMES,
    GPU_DEVICE_NAMES,
    GpuFamily,
    add_lists,
    families_of,
    format_list,
    gpu_family,
    gpu_subset,
    is_gpu_name,
    mask,
    max_lists,
    subtract_lists,
    without_zeros,
)


def q(text: str) -> Quantity:
    return Quantity.parse(text)


@pytest.mark.parametrize(("name", "family"), [
    ("nvidia.com/gpu", GpuFamily.VENDOR), ("amd.com/gpu", GpuFamily.VENDOR), ("dcu.com/gpu", GpuFamily.VENDOR),
    ("koordinator.sh/gpu", GpuFamily.KOORDINATOR), ("koordinator.sh/gpu-core", GpuFamily.KOORDINATOR),
    ("koordinator.sh/gpu-memory", GpuFamily.KOORDINATOR), ("koordinator.sh/gpu-memory-ratio", GpuFamily.KOORDINATOR),
    ("koordinator.sh/gpu.shared", GpuFamily.KOORDINATOR), ("huawei.com/npu-core", None), ("cpu", None),
    ("kubernetes.io/gpu", None), ("koordinator.sh/gpu-resource", None)])
def test_gpu_family(name: str, family: GpuFamily | None) -> None:
    assert gpu_family(name) is family


def test_families_of_a_mixed_list() -> None:
    assert families_of(["cpu", "nvidia.com/gpu", "koordinator.sh/gpu-core"]) == {GpuFamily.VENDOR,
                                                                                  GpuFamily.KOORDINATOR}
    assert families_of(["cpu", "memory"]) == set()


def test_gpu_names_include_deprecated_spellings_but_not_rdma_or_cpu() -> None:
    assert is_gpu_name("kubernetes.io/gpu-core")
    assert is_gpu_name("huawei.com/npu-dvpp")
    assert not is_gpu_name("cpu")
    assert not is_gpu_name("koordinator.sh/rdma")
    assert set(DEPRECATED_RENAMES.values()) - GPU_DEVICE_NAMES == {"koordinator.sh/rdma", "koordinator.sh/fpga"}


def test_list_arithmetic() -> None:
    left = {"cpu": q("1"), "nvidia.com/gpu": q("2")}
    right = {"nvidia.com/gpu": q("1"), "memory": q("1Gi")}

    assert add_lists(left, right) == {"cpu": q("1"), "nvidia.com/gpu": q("3"), "memory": q("1Gi")}
    assert add_lists() == {}
    assert subtract_lists(left, right) == {"cpu": q("1"), "nvidia.com/gpu": q("1"), "memory": q("-1Gi")}
    assert max_lists(left, {"nvidia.com/gpu": q("5"), "cpu": q("500m")}) == {"cpu": q("1"), "nvidia.com/gpu": q("5")}
    # Inputs are never modified.
    assert left == {"cpu": q("1"), "nvidia.com/gpu": q("2")}


def test_mask_zeros_subset_and_format() -> None:
    resources = {"cpu": q("1"), "nvidia.com/gpu": q("0"), "koordinator.sh/gpu-core": q("50")}

    assert mask(resources, ["cpu", "absent"]) == {"cpu": q("1")}
    assert without_zeros(resources) == {"cpu": q("1"), "koordinator.sh/gpu-core": q("50")}
    assert gpu_subset(resources) == {"nvidia.com/gpu": q("0"), "koordinator.sh/gpu-core": q("50")}
    assert format_list(resources) == "cpu=1,koordinator.sh/gpu-core=50,nvidia.com/gpu=0"
    assert format_list({"b": q("1Gi"), "a": q("1500m")}, ": ") == "a: 1500m,b: 1Gi"
