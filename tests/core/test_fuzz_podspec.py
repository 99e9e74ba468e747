"""Hostile input to the pod walker: it answers, or raises PodShapeError / QuantityError.

The walker (``podspec.read_containers``, ``pod_requests``, ``canonical.canonicalize_pod`` and
``validation.validate_pod_gpu``) reads JSON from outside. Any other exception would be a 500 from
the webhook, so the inputs here are random JSON, realistic pods with random parts replaced,
wrong types, unicode and huge quantities, duplicate containers, and nesting far deeper than
Python's recursion limit. Budgets and seeds are fixed (see docs/fuzzing.md for a longer run).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuquota_core.canonical import canonical_view, canonicalize_pod, canonicalize_pod_spec
from gpuquota_core.conversion import GPU_MODEL_LABEL, load_config
from gpuquota_core.jsonpatch import apply, copy_json, diff
from gpuquota_core.podspec import PodShapeError, as_mapping, pod_requests, read_containers
from gpuquota_core.quantity import QuantityError
from gpuquota_core.validation import validate_pod_gpu

EXAMPLES = int(os.environ.get("GPUQUOTA_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("GPUQUOTA_FUZZ_RANDOM") != "1",
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DOCUMENTED = (PodShapeError, QuantityError)
CONFIG = load_config({"gpuMemoryByModel": {"T4": "16Gi"}})

GPU_NAMES = ["nvidia.com/gpu", "amd.com/gpu", "dcu.com/gpu", "koordinator.sh/gpu", "koordinator.sh/gpu-core",
             "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio", "koordinator.sh/gpu.shared",
             "huawei.com/npu-core", "huawei.com/npu-cpu", "huawei.com/npu-dvpp", "kubernetes.io/gpu",
             "kubernetes.io/gpu-core", "koordinator.sh/rdma", "cpu"]
HOSTILE_QUANTITIES = ["1e308", "-1e308", "1e-308", "9" * 63, "9" * 65, "0.5", "100m", "-1", "-0", "+1", "1e63",
                      "1E", "1Ei", "NaN", "Inf", "", " 1", "1\n", "１", "1e", "0x1", "1.5Gi", "1n", "1.0000000001"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
                    st.sampled_from(HOSTILE_QUANTITIES))
keys = st.one_of(st.sampled_from([*GPU_NAMES, "containers", "initContainers", "resources", "requests", "limits",
                                  "name", "spec", "metadata", "annotations", "overhead", "restartPolicy"]),
                 st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(keys, inner, max_size=4)),
                           max_leaves=25)
quantities = st.one_of(st.sampled_from(HOSTILE_QUANTITIES), st.integers(-(10**80), 10**80),
                       st.floats(), st.text(max_size=12), st.decimals(allow_nan=False).map(str))
resource_names = st.one_of(st.sampled_from(GPU_NAMES), st.text(min_size=1, max_size=20),
                           st.text(alphabet=st.characters(min_codepoint=0x80), min_size=1, max_size=8))


def realistic_pod(resources: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {"nodeSelector": {GPU_MODEL_LABEL: "T4"},
                     "initContainers": [{"name": "init", "resources": {"limits": dict(resources)}},
                                        {"name": "proxy", "restartPolicy": "Always",
                                         "resources": {"requests": dict(resources)}}],
                     "containers": [{"name": "main", "image": "x",
                                     "resources": {"requests": dict(resources), "limits": dict(resources)}}],
                     "overhead": {"cpu": "100m"}}}


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found.extend(paths(value, (*prefix, index)))
    return found


def replace_at(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return document


@st.composite
def mutated_pods(draw: st.DrawFn) -> Any:
    resources = draw(st.dictionaries(resource_names, quantities, max_size=5))
    document: Any = realistic_pod(resources)
    for _ in range(draw(st.integers(0, 3))):
        targets = paths(document)
        path = draw(st.sampled_from(targets))
        document = replace_at(document, path, draw(json_values))
    if draw(st.booleans()) and isinstance(document, dict) and isinstance(document.get("spec"), dict):
        containers = document["spec"].get("containers")
        if isinstance(containers, list) and containers:
            # Duplicate containers: same name, same (shared) resource maps.
            document["spec"]["containers"] = containers + containers
    return document


def deep(depth: int, leaf: Any, as_list: bool) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if as_list else {"x": value}
    return value


@st.composite
def deeply_nested_pods(draw: st.DrawFn) -> Any:
    nesting = deep(draw(st.integers(1_000, 5_000)), draw(scalars), draw(st.booleans()))
    document = realistic_pod({"nvidia.com/gpu": "1"})
    where = draw(st.sampled_from(["container-field", "resources", "requests-value", "spec-field", "containers"]))
    if where == "container-field":
        document["spec"]["containers"][0]["extra"] = nesting
    elif where == "resources":
        document["spec"]["containers"][0]["resources"]["claims"] = nesting
    elif where == "requests-value":
        document["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = nesting
    elif where == "spec-field":
        document["spec"]["affinity"] = nesting
    else:
        document["spec"]["containers"] = nesting
    return document


def walk(document: Any) -> None:
    """Everything the webhook does with a pod, in its order; only documented errors may escape."""
    result = canonicalize_pod(document, CONFIG)
    spec = as_mapping(result.obj.get("spec"), "spec")
    containers = read_containers(spec)
    problems = validate_pod_gpu(containers, pod_requests(spec, containers))
    assert all(problem.rule and problem.message for problem in problems)
    if isinstance(document, dict):
        # The webhook diffs the shared view; its patch applies back to the canonical pod.
        view = canonical_view(document, CONFIG).obj
        assert view == result.obj
        assert diff(apply(document, diff(document, view)), result.obj) == []
        # And a second pass over the webhook's own output changes nothing.
        assert not canonicalize_pod(result.obj, CONFIG).changed


def survives(document: Any) -> None:
    try:
        walk(document)
    except DOCUMENTED as error:
        assert str(error)
    # Reading alone (the validating webhook and the quota path) obeys the same contract.
    for reader in (read_containers, pod_requests, lambda spec: canonicalize_pod_spec(spec, CONFIG)):
        with contextlib.suppress(*DOCUMENTED):
            reader(document.get("spec") if isinstance(document, dict) else document)


@FUZZ
@given(json_values)
def test_random_json(document: Any) -> None:
    survives(document)


@FUZZ
@given(mutated_pods())
def test_realistic_pods_with_random_parts_replaced(document: Any) -> None:
    survives(document)


@FUZZ
@given(st.dictionaries(resource_names, quantities, max_size=6))
def test_hostile_resource_maps_in_every_container_kind(resources: dict[str, Any]) -> None:
    survives(realistic_pod(resources))


@settings(max_examples=max(EXAMPLES // 10, 10), deadline=None,
          derandomize=os.environ.get("GPUQUOTA_FUZZ_RANDOM") != "1",
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(deeply_nested_pods())
def test_nesting_deeper_than_the_recursion_limit(document: Any) -> None:
    try:
        result = canonicalize_pod(document, CONFIG)
        spec = as_mapping(result.obj.get("spec"), "spec")
        containers = read_containers(spec)
        validate_pod_gpu(containers, pod_requests(spec, containers))
        assert diff(apply(document, diff(document, result.obj)), result.obj) == []
        assert diff(copy_json(document), document) == []
    except DOCUMENTED as error:
        assert str(error)
