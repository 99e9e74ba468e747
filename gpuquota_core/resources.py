"""GPU resource names and the two families Koordinator accounts them under.

The whole rule set of the product rests on one distinction: *vendor* names count whole cards
(``nvidia.com/gpu: 2``) while *koordinator* names count percent of a card (``gpu-core: 200``).
ElasticQuota compares names literally, so the two families never see each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum

from .quantity import ZERO, Quantity

NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
HYGON_DCU = "dcu.com/gpu"
KOORD_GPU = "koordinator.sh/gpu"
GPU_CORE = "koordinator.sh/gpu-core"
GPU_MEMORY = "koordinator.sh/gpu-memory"
GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
GPU_SHARED = "koordinator.sh/gpu.shared"
NPU_CORE = "huawei.com/npu-core"
NPU_CPU = "huawei.com/npu-cpu"
NPU_DVPP = "huawei.com/npu-dvpp"
KOORD_RDMA = "koordinator.sh/rdma"
KOORD_FPGA = "koordinator.sh/fpga"

# One whole card in koordinator's percent units.
PERCENT_PER_CARD = 100

VENDOR_WHOLE_GPU_NAMES: frozenset[str] = frozenset({NVIDIA_GPU, AMD_GPU, HYGON_DCU})
KOORDINATOR_GPU_NAMES: frozenset[str] = frozenset({KOORD_GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, GPU_SHARED})
HUAWEI_NPU_NAMES: frozenset[str] = frozenset({NPU_CORE, NPU_CPU, NPU_DVPP})
# The scheduler's GPU device type: every name its combination table looks at.
GPU_DEVICE_NAMES: frozenset[str] = VENDOR_WHOLE_GPU_NAMES | KOORDINATOR_GPU_NAMES | HUAWEI_NPU_NAMES
# Names whose value is "percent of one device": 1..100, or whole multiples of 100.
PERCENTAGE_NAMES: frozenset[str] = frozenset({KOORD_GPU, GPU_CORE, GPU_MEMORY_RATIO, KOORD_RDMA, KOORD_FPGA})

# Old `kubernetes.io/` spellings that Koordinator's informers still rename (only when the new name
# is not already present).
DEPRECATED_RENAMES: Mapping[str, str] = {
    "kubernetes.io/gpu": KOORD_GPU,
    "kubernetes.io/gpu-core": GPU_CORE,
    "kubernetes.io/gpu-memory": GPU_MEMORY,
    "kubernetes.io/gpu-memory-ratio": GPU_MEMORY_RATIO,
    "kubernetes.io/rdma": KOORD_RDMA,
    "kubernetes.io/fpga": KOORD_FPGA,
}

# Native ResourceQuota spells extended resources with a prefix.
RESOURCEQUOTA_PREFIXES: tuple[str, ...] = ("requests.", "limits.")


class GpuFamily(Enum):
    VENDOR = "vendor"  # whole cards: nvidia.com/gpu, amd.com/gpu, dcu.com/gpu
    KOORDINATOR = "koordinator"  # percent of a card: koordinator.sh/gpu-*


def gpu_family(name: str) -> GpuFamily | None:
    if name in VENDOR_WHOLE_GPU_NAMES:
        return GpuFamily.VENDOR
    if name in KOORDINATOR_GPU_NAMES:
        return GpuFamily.KOORDINATOR
    return None


def families_of(names: Iterable[str]) -> set[GpuFamily]:
    return {family for name in names if (family := gpu_family(name)) is not None}


def is_gpu_name(name: str) -> bool:
    return name in GPU_DEVICE_NAMES or name in DEPRECATED_RENAMES


ResourceList = dict[str, Quantity]


def add_lists(*lists: Mapping[str, Quantity]) -> ResourceList:
    """The sums, each in the format of its first term, as apimachinery's ``Quantity.Add`` keeps it
    (a zero adopts the format of what is added to it): ``1Gi + 3Gi`` prints ``4Gi``."""
    total: ResourceList = {}
    for resources in lists:
        for name, quantity in resources.items():
            if name in total:
                total[name] = total[name] + quantity
            else:
                total[name] = quantity
    return total


def subtract_lists(left: Mapping[str, Quantity], right: Mapping[str, Quantity]) -> ResourceList:
    result = dict(left)
    for name, quantity in right.items():
        result[name] = result.get(name, ZERO) - quantity
    return result


def max_lists(left: Mapping[str, Quantity], right: Mapping[str, Quantity]) -> ResourceList:
    result = dict(left)
    for name, quantity in right.items():
        if name not in result or quantity > result[name]:
            result[name] = quantity
    return result


def mask(resources: Mapping[str, Quantity], names: Iterable[str]) -> ResourceList:
    wanted = set(names)
    return {name: quantity for name, quantity in resources.items() if name in wanted}


def without_zeros(resources: Mapping[str, Quantity]) -> ResourceList:
    return {name: quantity for name, quantity in resources.items() if not quantity.is_zero()}


def gpu_subset(resources: Mapping[str, Quantity]) -> ResourceList:
    return {name: quantity for name, quantity in resources.items() if is_gpu_name(name)}


def format_list(resources: Mapping[str, Quantity], separator: str = "=") -> str:
    """``a=1,b=2`` sorted by name: the native quota message format."""
    return ",".join(f"{name}{separator}{resources[name]}" for name in sorted(resources))


def format_names(names: Iterable[str]) -> str:
    """``[a, b]`` sorted, as YAML writes a flow list: resource names in a message, never a Python
    list's ``['a', 'b']``."""
    return "[" + ", ".join(sorted(names)) + "]"
