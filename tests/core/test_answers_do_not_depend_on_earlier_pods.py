"""The remembered mutation (gpuquota_core.mutation) is exactly the computed one, and so are the
remembered request texts an admission carries to the quota decision (gpuquota_core.pod_records).

The memo exists only for speed (docs/benchmarks.md), and its key must hold everything the rewrite
and the diff read. Generated pods are drawn from a small alphabet so that many of them share a key
and differ only where the key must tell them apart: value types (1, 1.0, True), field order,
absent against null fields, the annotation's state, the pinned model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core import mutation, pod_records
from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION, canonicalize_pod
from gpuquota_core.conversion import DEFAULT_CONFIG, GPU_MODEL_LABEL, ConversionConfig
from gpuquota_core.jsonpatch import apply, copy_json
from gpuquota_core.memo import BoundedMemo
from gpuquota_core.mutation import PodMutation, mutation_key, pod_mutation, remembered_pod_mutation
from gpuquota_core.pod_records import canonical_pod_requests, remembered_request_texts
from gpuquota_core.podspec import PodShapeError
from gpuquota_core.quantity import QuantityError

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")

CONFIGS = [DEFAULT_CONFIG, ConversionConfig(gpu_memory_by_model={"A100": 80 * 2**30}),
           ConversionConfig(rename_deprecated=False)]
NAMES = ["nvidia.com/gpu", "nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio",
         "koordinator.sh/gpu-memory", "kubernetes.io/gpu", "koordinator.sh/gpu.shared", "cpu"]
# Mostly values that convert, so most pods are rewritten; some odd ones, so some are not.
VALUES = st.one_of(st.sampled_from(["1", "2", "100", "50", "8Gi", 1]), st.sampled_from(["1", "2", "8Gi"]),
                   st.sampled_from(["0.5", "-1", 1.0, True, "bogus"]))
ANNOTATED = '{"containers":{"a":{"requests":{"nvidia.com/gpu":"1"}}}}'

resource_maps = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=3)


@st.composite
def resources(draw: st.DrawFn) -> object:
    fields = draw(st.permutations(["requests", "limits", "claims"]))
    return {field: draw(resource_maps) for field in fields if draw(st.integers(0, 3))}


@st.composite
def containers(draw: st.DrawFn) -> object:
    entries = []
    for _ in range(draw(st.integers(1, 2))):
        entry: dict[str, Any] = {"name": draw(st.sampled_from(["a", "b", "", 7])), "image": "x"}
        if draw(st.integers(0, 3)):
            entry["resources"] = draw(resources())
        entries.append(entry)
    return entries


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for kind in draw(st.permutations(["containers", "initContainers", "restartPolicy"])):
        if kind == "containers" or draw(st.booleans()):
            spec[kind] = "Never" if kind == "restartPolicy" else draw(containers())
    if draw(st.booleans()):
        spec["nodeSelector"] = {GPU_MODEL_LABEL: draw(st.sampled_from(["A100", "T4"]))}
    metadata = draw(st.sampled_from([
        "absent", None, {}, {"annotations": None}, {"annotations": {}}, {"annotations": {"team": "x"}},
        {"annotations": {ORIGINAL_RESOURCES_ANNOTATION: ANNOTATED}},
        {"annotations": {ORIGINAL_RESOURCES_ANNOTATION: 5}},
        {"name": "p", "annotations": {ORIGINAL_RESOURCES_ANNOTATION: "junk", "other": "y"}},
    ]))
    pod: dict[str, Any] = {}
    for field in draw(st.permutations(["kind", "metadata", "spec"])):
        if field == "kind":
            pod["kind"] = "Pod"
        elif field == "spec":
            pod["spec"] = spec
        elif metadata != "absent":
            pod["metadata"] = metadata
    return pod


def outcome(compute: Any, pod: object, config: ConversionConfig) -> PodMutation | str:
    try:
        result: PodMutation = compute(pod, config)
    except (PodShapeError, QuantityError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return result


@pytest.fixture(autouse=True)
def empty_memo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(mutation, "_mutations", BoundedMemo())
    yield


SWAPS: list[object] = ["1", 1, 1.0, True, "A100", "T4", "a", 7, "", None, {}, []]


@st.composite
def look_alikes(draw: st.DrawFn, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with a few small changes anywhere in it: keys reordered, a value swapped for one of
    another type or spelling, a field dropped. Many keep the memo key, so a key that leaves out
    something the answer depends on gives two pods one answer, and the test sees it."""
    variant = copy_json(pod)
    for _ in range(draw(st.integers(1, 3))):
        nodes: list[dict[str, Any] | list[Any]] = []
        stack: list[Any] = [variant]
        while stack:
            node = stack.pop()
            if isinstance(node, dict | list):
                nodes.append(node)
                stack.extend(node.values() if isinstance(node, dict) else node)
        node = draw(st.sampled_from(nodes))
        slots = list(node) if isinstance(node, dict) else list(range(len(node)))
        change = draw(st.sampled_from(["reorder", "swap", "drop"]))
        if change == "reorder" and isinstance(node, dict):
            items = list(node.items())[::-1]
            node.clear()
            node.update(items)
        elif slots and change == "swap":
            node[draw(st.sampled_from(slots))] = copy_json(draw(st.sampled_from(SWAPS)))
        elif slots and change == "drop":
            del node[draw(st.sampled_from(slots))]
    return variant


@PROFILE
@given(data=st.data(), config=st.sampled_from(CONFIGS))
def test_the_remembered_mutation_is_the_computed_one(data: st.DataObject, config: ConversionConfig) -> None:
    mutation._mutations = BoundedMemo()
    base = data.draw(pods())
    batch = [base] + [data.draw(look_alikes(base)) for _ in range(8)]
    # Twice over: the second pass answers every keyed pod from the memo, filled by its look-alikes.
    for pod in batch + batch[::-1]:
        assert outcome(remembered_pod_mutation, pod, config) == outcome(pod_mutation, pod, config)


@PROFILE
@given(pod=pods(), config=st.sampled_from(CONFIGS))
def test_the_patch_turns_the_pod_into_its_canonical_form(pod: dict[str, Any], config: ConversionConfig) -> None:
    result = outcome(remembered_pod_mutation, pod, config)
    if isinstance(result, str):
        return
    assert apply(pod, result.operations()) == (canonicalize_pod(pod, config).obj if result.changed else pod)


def test_keys_tell_apart_what_the_answer_depends_on() -> None:
    def pod(requests: dict[str, object], metadata: object = "absent", spec_first: bool = True) -> dict[str, Any]:
        spec = {"containers": [{"name": "a", "resources": {"requests": requests}}]}
        fields: list[tuple[str, object]] = [("spec", spec)]
        if metadata != "absent":
            fields.insert(len(fields) if spec_first else 0, ("metadata", metadata))
        return dict(fields)

    keys = [mutation_key(p, DEFAULT_CONFIG) for p in (
        pod({"nvidia.com/gpu": 1}), pod({"nvidia.com/gpu": True}), pod({"nvidia.com/gpu": 1.0}),
        pod({"nvidia.com/gpu": 1}, metadata=None), pod({"nvidia.com/gpu": 1}, metadata={}),
        pod({"nvidia.com/gpu": 1}, metadata={}, spec_first=False),
        pod({"nvidia.com/gpu": 1}, metadata={"annotations": {ORIGINAL_RESOURCES_ANNOTATION: ANNOTATED}}),
    )]
    assert None not in keys and len(set(keys)) == len(keys)
    assert mutation_key(pod({"nvidia.com/gpu": 1}), CONFIGS[1]) != keys[0]
    # Not plain JSON, or too odd to key: the uncached path runs (and raises its own error).
    assert mutation_key(pod({"nvidia.com/gpu": [1]}), DEFAULT_CONFIG) is None
    assert mutation_key({"spec": {"containers": {"a": 1}}}, DEFAULT_CONFIG) is None


# Pairs that rewrite to different answers (another patch order, op or value) while looking alike;
# the generated look-alikes above reach them too rarely to rely on.
GPU = {"nvidia.com/gpu": "1"}
NEAR_TWINS = {
    "resource fields in another order": (
        {"spec": {"containers": [{"name": "a", "resources": {"requests": GPU, "limits": GPU}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": GPU, "requests": GPU}}]}}),
    "container kinds in another order": (
        {"spec": {"containers": [{"name": "a", "resources": {"limits": GPU}}],
                  "initContainers": [{"name": "i", "resources": {"limits": GPU}}]}},
        {"spec": {"initContainers": [{"name": "i", "resources": {"limits": GPU}}],
                  "containers": [{"name": "a", "resources": {"limits": GPU}}]}}),
    "another pinned model": (
        {"spec": {"nodeSelector": {GPU_MODEL_LABEL: "A100"},
                  "containers": [{"name": "a", "resources": {"limits": {"koordinator.sh/gpu-memory": "8Gi"}}}]}},
        {"spec": {"nodeSelector": {GPU_MODEL_LABEL: "T4"},
                  "containers": [{"name": "a", "resources": {"limits": {"koordinator.sh/gpu-memory": "8Gi"}}}]}}),
    # A sidecar adds to the app containers, which only they get gpu.shared for from Koordinator's
    # webhook: 200 + 100 over 2 devices is refused, so the pod is left as written; an ordinary init
    # container of 100 under the app's 200 is rewritten.
    "init container or sidecar": (
        {"spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}],
                  "initContainers": [{"name": "i", "resources": {"limits": {"amd.com/gpu": "1"}}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}],
                  "initContainers": [{"name": "i", "restartPolicy": "Always",
                                      "resources": {"limits": {"amd.com/gpu": "1"}}}]}}),
    # The pod's total, which the whole-pod judgement reads, includes the overhead.
    "another overhead": (
        {"spec": {"containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}]}},
        {"spec": {"overhead": {"amd.com/gpu": "1"},
                  "containers": [{"name": "a", "resources": {"limits": {"amd.com/gpu": "2"}}}]}}),
    "null annotations or none": (
        {"metadata": {"annotations": None}, "spec": {"containers": [{"name": "a", "resources": {"limits": GPU}}]}},
        {"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": GPU}}]}}),
}
MODEL_CONFIG = ConversionConfig(gpu_memory_by_model={"A100": 80 * 2**30, "T4": 16 * 2**30})


@pytest.mark.parametrize("case", sorted(NEAR_TWINS))
def test_near_twins_get_their_own_answers(case: str) -> None:
    first, second = NEAR_TWINS[case]
    assert pod_mutation(first, MODEL_CONFIG).patch != pod_mutation(second, MODEL_CONFIG).patch
    assert mutation_key(first, MODEL_CONFIG) != mutation_key(second, MODEL_CONFIG)
    assert remembered_pod_mutation(first, MODEL_CONFIG) == pod_mutation(first, MODEL_CONFIG)
    assert remembered_pod_mutation(second, MODEL_CONFIG) == pod_mutation(second, MODEL_CONFIG)


def test_a_caller_changing_its_patch_does_not_change_the_remembered_one() -> None:
    pod = {"metadata": {}, "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    operations = remembered_pod_mutation(pod, DEFAULT_CONFIG).operations()
    for operation in operations:
        operation["path"] = "/changed"
        if isinstance(operation.get("value"), dict):
            operation["value"].clear()
    assert remembered_pod_mutation(pod, DEFAULT_CONFIG) == pod_mutation(pod, DEFAULT_CONFIG)


def request_texts(compute: Any, spec: Any, config: ConversionConfig) -> dict[str, str] | str:
    try:
        return dict(compute(spec, config))
    except (PodShapeError, QuantityError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def computed_texts(spec: Any, config: ConversionConfig) -> dict[str, str]:
    requests = canonical_pod_requests(spec, config)
    return {name: str(requests[name]) for name in sorted(requests)}


@PROFILE
@given(data=st.data(), config=st.sampled_from(CONFIGS))
def test_the_remembered_request_texts_are_the_computed_ones(data: st.DataObject, config: ConversionConfig) -> None:
    pod_records._request_texts, pod_records._pod_requests = BoundedMemo(), BoundedMemo()
    base = data.draw(pods())
    batch = [base] + [data.draw(look_alikes(base)) for _ in range(8)]
    for pod in batch + batch[::-1]:  # the second pass answers keyed specs from the memo
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            continue  # the webhook reads the spec with as_mapping before it asks (as for the requests)
        assert request_texts(remembered_request_texts, spec, config) == request_texts(computed_texts, spec, config)


def test_a_caller_changing_its_request_texts_does_not_change_the_remembered_ones() -> None:
    spec = {"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "2"}}}]}
    first = remembered_request_texts(spec)
    assert first == {"cpu": "2", "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
    first["cpu"] = "999"
    assert remembered_request_texts(spec)["cpu"] == "2"
