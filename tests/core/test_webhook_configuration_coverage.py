"""The GPU names in the webhook configurations' matchConditions cover what the core acts on.

matchConditions decide which pods reach the webhook at all; a resource name the core converts or
validates but the CEL expression misses would let such pods through unconverted and unchecked.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.resources import DEPRECATED_RENAMES, KOORDINATOR_GPU_NAMES, VENDOR_WHOLE_GPU_NAMES

CONFIGURATIONS = Path(__file__).resolve().parents[2] / "manifests" / "webhooks" / "webhook-configurations.yaml"
PREFIXES = ("koordinator.sh/gpu", "kubernetes.io/gpu")


def gpu_expressions() -> list[str]:
    expressions = []
    for document in yaml.safe_load_all(CONFIGURATIONS.read_text(encoding="utf-8")):
        for webhook in document["webhooks"]:
            for condition in webhook.get("matchConditions", []):
                if condition["name"] == "names-a-gpu-resource":
                    expressions.append(condition["expression"])
    return expressions


def test_both_pod_webhooks_filter_on_gpu_names() -> None:
    assert len(gpu_expressions()) == 2


def test_every_name_the_core_handles_is_matched() -> None:
    # RDMA and FPGA renames are not GPU requests: they are applied only to pods that reach the
    # webhook for a GPU name anyway.
    deprecated_gpu = {old for old, new in DEPRECATED_RENAMES.items() if new in KOORDINATOR_GPU_NAMES}
    names = set(DEFAULT_CONFIG.input_names) | VENDOR_WHOLE_GPU_NAMES | KOORDINATOR_GPU_NAMES | deprecated_gpu
    for expression in gpu_expressions():
        missed = sorted(n for n in names if not n.startswith(PREFIXES) and f"'{n}'" not in expression)
        assert missed == []
        for prefix in PREFIXES:
            assert f"name.startsWith('{prefix}')" in expression
