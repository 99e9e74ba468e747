"""canonicalize_pod: the mutating webhook's rewrite, on the raw pod JSON."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuquota_core.canonical import (
    ORIGINAL_RESOURCES_ANNOTATION,
    canonical_view,
    canonicalize_pod,
    canonicalize_pod_spec,
    original_resources,
)
from gpuquota_core.conversion import GPU_MODEL_LABEL, load_config
from gpuquota_core.podspec import PodShapeError

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
SHARED = "koordinator.sh/gpu.shared"
PINNED_T4 = {"nodeSelector": {GPU_MODEL_LABEL: "T4"}}
T4_CONFIG = load_config({"gpuMemoryByModel": {"T4": "16Gi"}})


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": body}


def box(name: str, requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
        **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "registry/x:1", "resources": resources, **extra}


def both(pairs: dict[str, Any], name: str = "main") -> dict[str, Any]:
    return box(name, dict(pairs), dict(pairs))


def resources_of(obj: dict[str, Any], index: int = 0, kind: str = "containers") -> dict[str, Any]:
    resources: dict[str, Any] = obj["spec"][kind][index]["resources"]
    return resources


def annotation(obj: dict[str, Any]) -> Any:
    return json.loads(obj["metadata"]["annotations"][ORIGINAL_RESOURCES_ANNOTATION])


def test_requests_and_limits_are_rewritten_together_and_the_original_recorded() -> None:
    given = pod(box("main", {"cpu": "1", "nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2", "memory": "1Gi"}))
    before = copy.deepcopy(given)

    result = canonicalize_pod(given)

    assert resources_of(result.obj) == {
        "requests": {"cpu": "1", CORE: "200", RATIO: "200"},
        "limits": {"memory": "1Gi", CORE: "200", RATIO: "200"}}
    assert annotation(result.obj) == {"containers": {"main": {"requests": {"nvidia.com/gpu": "2"},
                                                              "limits": {"nvidia.com/gpu": "2"}}}}
    assert result.summary() == [
        f'container "main" nvidia.com/gpu: 2 -> {CORE}: 200, {RATIO}: 200']
    assert [(r.field, r.kind) for r in result.rewrites] == [("requests", "convert"), ("limits", "convert")]
    assert result.notes == []
    assert given == before  # the input is never modified
    # Everything the rewrite does not own is untouched.
    assert result.obj["spec"]["containers"][0]["image"] == "registry/x:1"
    assert result.obj["metadata"]["name"] == "p" and result.obj["kind"] == "Pod"


def test_the_annotation_is_compact_sorted_json() -> None:
    result = canonicalize_pod(pod(both({"nvidia.com/gpu": "1"})))

    assert result.obj["metadata"]["annotations"][ORIGINAL_RESOURCES_ANNOTATION] == (
        '{"containers":{"main":{"limits":{"nvidia.com/gpu":"1"},"requests":{"nvidia.com/gpu":"1"}}}}')
    assert original_resources(result.obj) == annotation(result.obj)


def test_init_containers_and_sidecars_are_rewritten_too() -> None:
    given = pod(both({"amd.com/gpu": "1"}),
                init=[both({"koordinator.sh/gpu": "50"}, "warmup"),
                      {**both({"amd.com/gpu": "1"}, "proxy"), "restartPolicy": "Always"}])

    result = canonicalize_pod(given)

    assert resources_of(result.obj, 0, "initContainers")["limits"] == {CORE: "50", RATIO: "50"}
    assert resources_of(result.obj, 1, "initContainers")["requests"] == {CORE: "100", RATIO: "100"}
    assert resources_of(result.obj)["limits"] == {CORE: "100", RATIO: "100"}
    assert annotation(result.obj)["initContainers"] == {
        "warmup": {"requests": {"koordinator.sh/gpu": "50"}, "limits": {"koordinator.sh/gpu": "50"}},
        "proxy": {"requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}}}
    assert result.summary() == [
        f'init container "warmup" koordinator.sh/gpu: 50 -> {CORE}: 50, {RATIO}: 50',
        f'init container "proxy" amd.com/gpu: 1 -> {CORE}: 100, {RATIO}: 100',
        f'container "main" amd.com/gpu: 1 -> {CORE}: 100, {RATIO}: 100']


def test_a_second_pass_changes_nothing() -> None:
    once = canonicalize_pod(pod(both({"nvidia.com/gpu": "3", "cpu": "2"}),
                                init=[both({"kubernetes.io/gpu": "20"}, "i")]))

    twice = canonicalize_pod(once.obj)

    assert not twice.changed
    assert twice.rewrites == [] and twice.notes == []
    assert twice.obj == once.obj


def test_canonical_input_is_returned_unchanged_as_a_copy() -> None:
    given = pod(both({CORE: "50", RATIO: "50"}))

    result = canonicalize_pod(given)

    assert not result.changed
    assert result.obj == given and result.obj is not given
    assert result.obj["spec"] is not given["spec"]
    assert ORIGINAL_RESOURCES_ANNOTATION not in result.obj["metadata"].get("annotations", {})


DEPRECATED = [
    pytest.param({"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory-ratio": "50"}, {CORE: "50", RATIO: "50"},
                 id="core-and-ratio"),
    pytest.param({"kubernetes.io/gpu-core": "50", "kubernetes.io/gpu-memory": "8Gi"}, {CORE: "50", MEMORY: "8Gi"},
                 id="core-and-memory"),
    pytest.param({"kubernetes.io/gpu": "50"}, {CORE: "50", RATIO: "50"}, id="gpu-renamed-then-converted"),
    pytest.param({"kubernetes.io/rdma": "100"}, {"koordinator.sh/rdma": "100"}, id="rdma"),
    pytest.param({"kubernetes.io/fpga": "100"}, {"koordinator.sh/fpga": "100"}, id="fpga"),
]


@pytest.mark.parametrize(("given", "expected"), DEPRECATED)
def test_deprecated_names_are_renamed(given: dict[str, str], expected: dict[str, str]) -> None:
    result = canonicalize_pod(pod(both(given)))

    assert resources_of(result.obj) == {"requests": expected, "limits": expected}
    assert annotation(result.obj)["containers"]["main"]["requests"] == given
    assert not canonicalize_pod(result.obj).changed


def test_renaming_reports_both_steps_of_the_old_gpu_name() -> None:
    result = canonicalize_pod(pod(box("main", limits={"kubernetes.io/gpu": "50"})))

    assert [(r.source, r.kind, dict(r.outputs)) for r in result.rewrites] == [
        ("kubernetes.io/gpu", "rename", {"koordinator.sh/gpu": "50"}),
        ("koordinator.sh/gpu", "convert", {CORE: "50", RATIO: "50"})]
    assert annotation(result.obj) == {"containers": {"main": {"limits": {"kubernetes.io/gpu": "50"}}}}


def test_an_old_name_beside_its_new_name_is_left_with_a_note() -> None:
    result = canonicalize_pod(pod(box("main", {"kubernetes.io/gpu-core": "50", CORE: "50", RATIO: "50"})))

    assert not result.changed
    assert result.notes == ["spec.containers[0].resources.requests: both kubernetes.io/gpu-core and "
                            f"{CORE} are set; both left as is"]


def test_renaming_can_be_switched_off() -> None:
    result = canonicalize_pod(pod(both({"kubernetes.io/gpu-core": "50"})), load_config({"renameDeprecated": False}))

    assert not result.changed


LEFT_ALONE = [
    pytest.param({"nvidia.com/gpu": "0.5"}, "spec.containers[0].resources.requests[nvidia.com/gpu]: 0.5 is not a "
                 "whole number of cards; left as is", id="half-a-card"),
    pytest.param({"nvidia.com/gpu": "100m"}, "spec.containers[0].resources.requests[nvidia.com/gpu]: 100m is not a "
                 "whole number of cards; left as is", id="100m-cards"),
    pytest.param({"nvidia.com/gpu": "-1"}, "spec.containers[0].resources.requests[nvidia.com/gpu]: negative value -1 "
                 "left for validation to refuse", id="negative"),
    pytest.param({"nvidia.com/gpu": "1", CORE: "-100"}, "spec.containers[0].resources.requests: nvidia.com/gpu: 1 "
                 f"(read as {CORE}: 100) and {CORE}: -100 disagree; left as is for validation to refuse",
                 id="negative-core-beside-vendor"),
    pytest.param({"nvidia.com/gpu": "1", CORE: "0.5"}, "spec.containers[0].resources.requests: nvidia.com/gpu: 1 "
                 f"(read as {CORE}: 100) and {CORE}: 0.5 disagree; left as is for validation to refuse",
                 id="fractional-core-beside-vendor"),
    pytest.param({"amd.com/gpu": "92233720368548"}, "spec.containers[0].resources.requests[amd.com/gpu]: "
                 f"92233720368548 reads as {CORE}: 9223372036854800, larger than 92233720368547; left as is",
                 id="huge-vendor-count-is-not-multiplied-past-the-bound"),
]


@pytest.mark.parametrize(("given", "note"), LEFT_ALONE)
def test_what_cannot_be_converted_exactly_is_left_for_validation(given: dict[str, str], note: str) -> None:
    result = canonicalize_pod(pod(box("main", given)))

    assert not result.changed
    assert resources_of(result.obj) == {"requests": given}
    assert result.notes == [note]


def test_koordinator_gpu_fractions_round_up_never_down() -> None:
    result = canonicalize_pod(pod(both({"koordinator.sh/gpu": "0.5"}), both({"koordinator.sh/gpu": "100m"}, "b")))

    assert resources_of(result.obj, 0)["requests"] == {CORE: "1", RATIO: "1"}
    assert resources_of(result.obj, 1)["requests"] == {CORE: "1", RATIO: "1"}


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param({"nvidia.com/gpu": "1e3"}, {CORE: "100k", RATIO: "100k"}, id="exponent"),
    pytest.param({"nvidia.com/gpu": "2000m"}, {CORE: "200", RATIO: "200"}, id="whole-in-milli"),
    pytest.param({"nvidia.com/gpu": 2}, {CORE: "200", RATIO: "200"}, id="yaml-int"),
])
def test_other_spellings_of_whole_cards(given: dict[str, Any], expected: dict[str, str]) -> None:
    assert resources_of(canonicalize_pod(pod(box("main", given))).obj) == {"requests": expected}


@pytest.mark.parametrize("zero", [{"nvidia.com/gpu": "0"}, {"amd.com/gpu": "0"}, {"dcu.com/gpu": "0"},
                                  {"koordinator.sh/gpu": "0"}])
def test_a_zero_request_is_never_turned_into_canonical_keys(zero: dict[str, str]) -> None:
    # Charts write nvidia.com/gpu: 0 for CPU-only variants; core 0 + ratio 0 would draw gpu.shared: 1
    # from Koordinator's pod webhook and get the pod refused. The zero stays as written: it asks
    # for nothing, and the scheduler drops zeros before it looks.
    result = canonicalize_pod(pod(both({"cpu": "1", **zero})))

    assert not result.changed and result.notes == []
    assert resources_of(result.obj)["requests"] == {"cpu": "1", **zero}


def test_a_zero_vendor_count_beside_gpu_memory_leaves_one_gpu_at_that_memory() -> None:
    given = pod(both({MEMORY: "1Gi"}), both({"nvidia.com/gpu": "0"}, "sidecar"))

    result = canonicalize_pod(given)

    assert not result.changed
    assert result.obj == given


def test_a_card_named_twice_with_the_same_amount_is_written_once() -> None:
    result = canonicalize_pod(pod(both({"nvidia.com/gpu": "1", CORE: "100", RATIO: "100"})))

    # One card, not two: the vendor count and the hand-written names say the same.
    assert resources_of(result.obj) == {"requests": {CORE: "100", RATIO: "100"}, "limits": {CORE: "100", RATIO: "100"}}
    assert result.rewrites[0].outputs == {CORE: "100", RATIO: "100"}
    assert not canonicalize_pod(result.obj).changed


@pytest.mark.parametrize("given", [
    pytest.param({"nvidia.com/gpu": "1", CORE: "100", RATIO: "200"}, id="vendor-and-ratio"),
    pytest.param({"koordinator.sh/gpu": "2", CORE: "1"}, id="koordinator-gpu-and-core"),
])
def test_a_card_named_twice_with_different_amounts_is_left_for_validation(given: dict[str, str]) -> None:
    result = canonicalize_pod(pod(both(given)))

    assert not result.changed
    assert resources_of(result.obj)["requests"] == given
    assert "disagree; left as is for validation to refuse" in result.notes[0]


def test_vendors_mixed_in_one_pod_are_not_pooled() -> None:
    one_container = canonicalize_pod(pod(both({"dcu.com/gpu": "112", "nvidia.com/gpu": "101"})))
    assert not one_container.changed
    assert one_container.notes[0] == ("spec.containers[0].resources.requests: dcu.com/gpu and nvidia.com/gpu are "
                                      "different hardware; left as is for validation to refuse")

    two_containers = canonicalize_pod(pod(both({"dcu.com/gpu": "112"}, "a"), both({"nvidia.com/gpu": "101"}, "b")))
    assert not two_containers.changed
    assert two_containers.notes == ['spec: the pod asks for dcu.com/gpu (container "a") and nvidia.com/gpu '
                                    '(container "b"): different hardware, not one pool of cards; left as written']


def test_an_init_container_larger_than_the_app_containers_keeps_the_pod_as_written() -> None:
    # Rewritten, the init container's 300 would meet the gpu.shared: 2 Koordinator's pod webhook adds
    # to the app container only (300 over 2 devices is 150 per device): refused. As written,
    # Koordinator schedules it on 3 cards.
    given = pod(both({"amd.com/gpu": "2"}), init=[both({"amd.com/gpu": "3"}, "init")])

    result = canonicalize_pod(given)

    assert not result.changed and result.obj == given
    assert result.notes[0].startswith("spec: left as written: Koordinator schedules the pod as written, but could not "
                                      f"schedule it rewritten (invalid resource device requests: {CORE}=300 must split "
                                      f"evenly over {SHARED}=2 devices")
    # Smaller init containers are rewritten as before.
    assert canonicalize_pod(pod(both({"amd.com/gpu": "3"}), init=[both({"amd.com/gpu": "2"}, "init")])).changed


def test_gpu_memory_bytes_are_never_guessed() -> None:
    given = pod(both({CORE: "50", MEMORY: "8Gi"}))

    assert not canonicalize_pod(given).changed
    # A config with the card size is not enough: the pod must also pin the model.
    assert not canonicalize_pod(given, T4_CONFIG).changed
    # Pinned, but to a model the config does not know.
    assert not canonicalize_pod(pod(both({MEMORY: "8Gi"}), nodeSelector={GPU_MODEL_LABEL: "A100"}), T4_CONFIG).changed


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param({MEMORY: "8Gi"}, {RATIO: "50"}, id="half-a-T4"),
    pytest.param({CORE: "50", MEMORY: "4Gi"}, {CORE: "50", RATIO: "25"}, id="with-core"),
    pytest.param({MEMORY: "5Gi"}, {RATIO: "32"}, id="31.25-rounds-up"),
    pytest.param({SHARED: "2", MEMORY: "5Gi"}, {SHARED: "2", RATIO: "32"}, id="with-shared-stays-divisible"),
    pytest.param({SHARED: "3", MEMORY: "5Gi"}, {SHARED: "3", RATIO: "33"}, id="shared-3-rounds-to-multiple"),
])
def test_gpu_memory_becomes_a_ratio_when_the_model_is_pinned_and_known(given: dict[str, str],
                                                                       expected: dict[str, str]) -> None:
    result = canonicalize_pod(pod(both(given), **PINNED_T4), T4_CONFIG)

    assert resources_of(result.obj) == {"requests": expected, "limits": expected}
    assert [r.kind for r in result.rewrites] == ["memory-to-ratio", "memory-to-ratio"]
    assert not canonicalize_pod(result.obj, T4_CONFIG).changed


def test_memory_beside_a_ratio_is_left_for_validation() -> None:
    given = pod(both({MEMORY: "8Gi", RATIO: "50"}), **PINNED_T4)

    assert not canonicalize_pod(given, T4_CONFIG).changed


def test_a_retain_rule_adds_its_outputs_once() -> None:
    config = load_config({"transformations": [
        {"input": "example.com/vgpu", "outputs": {RATIO: "25"}, "strategy": "Retain"}]})

    once = canonicalize_pod(pod(both({"example.com/vgpu": "2"})), config)
    twice = canonicalize_pod(once.obj, config)

    assert resources_of(once.obj)["requests"] == {"example.com/vgpu": "2", RATIO: "50"}
    assert not twice.changed and twice.notes == []
    clash = canonicalize_pod(pod(box("main", {"example.com/vgpu": "2", RATIO: "10"})), config)
    assert not clash.changed
    assert clash.notes == ["spec.containers[0].resources.requests: example.com/vgpu: 2 (read as "
                           f"{RATIO}: 50) and {RATIO}: 10 disagree; left as is for validation to refuse"]


def test_a_custom_table_with_per_unit_fractions_rounds_up() -> None:
    config = load_config({"transformations": [{"input": "example.com/third", "outputs": {RATIO: "333m"}}]})

    result = canonicalize_pod(pod(both({"example.com/third": "1"})), config)

    assert resources_of(result.obj)["requests"] == {RATIO: "1"}


def test_an_earlier_annotation_is_kept_and_a_forged_one_replaced() -> None:
    earlier = {"containers": {"main": {"requests": {"nvidia.com/gpu": "1"}}}}
    given = pod(box("main", {"amd.com/gpu": "1"}))
    given["metadata"]["annotations"] = {ORIGINAL_RESOURCES_ANNOTATION: json.dumps(earlier), "other": "x"}

    result = canonicalize_pod(given)

    assert annotation(result.obj) == {"containers": {"main": {"requests": {"nvidia.com/gpu": "1",
                                                                           "amd.com/gpu": "1"}}}}
    assert result.obj["metadata"]["annotations"]["other"] == "x"
    for forged in ('{"containers": 5}', '{"containers": {"main": []}}', '{"containers": {"main": {"requests": 1}}}',
                   "not json", "[" * 100_000, "[]"):
        given["metadata"]["annotations"] = {ORIGINAL_RESOURCES_ANNOTATION: forged}
        assert annotation(canonicalize_pod(given).obj) == {"containers": {"main": {"requests": {"amd.com/gpu": "1"}}}}


def test_original_resources_reads_only_what_we_wrote() -> None:
    assert original_resources({}) is None
    assert original_resources({"metadata": {"annotations": {ORIGINAL_RESOURCES_ANNOTATION: "[1]"}}}) is None
    assert original_resources({"metadata": {"annotations": {ORIGINAL_RESOURCES_ANNOTATION: "{bad"}}}) is None
    assert original_resources({"metadata": {"annotations": {ORIGINAL_RESOURCES_ANNOTATION: 3}}}) is None
    assert original_resources({"metadata": []}) is None


def test_unnamed_containers_are_recorded_by_index() -> None:
    result = canonicalize_pod(pod({"resources": {"limits": {"nvidia.com/gpu": "1"}}}))

    assert annotation(result.obj) == {"containers": {"#0": {"limits": {"nvidia.com/gpu": "1"}}}}
    assert result.summary() == [f'container "#0" nvidia.com/gpu: 1 -> {CORE}: 100, {RATIO}: 100']


def test_untouched_containers_are_the_same_objects_in_the_spec() -> None:
    plain = box("sidecar", {"cpu": "1"})
    spec = {"containers": [both({"nvidia.com/gpu": "1"}), plain], "initContainers": None}

    new_spec, rewrites, notes, originals = canonicalize_pod_spec(spec)

    assert new_spec["containers"][1] is plain
    assert new_spec["initContainers"] is None
    assert len(rewrites) == 2 and notes == []
    assert originals == {"containers": {"main": {"requests": {"nvidia.com/gpu": "1"},
                                                 "limits": {"nvidia.com/gpu": "1"}}}}


def test_deeply_nested_unknown_fields_do_not_hit_the_recursion_limit() -> None:
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(5000):
        cursor["x"] = {}
        cursor = cursor["x"]
    given = pod({**both({"nvidia.com/gpu": "1"}), "deep": deep})

    result = canonicalize_pod(given)

    assert resources_of(result.obj)["limits"] == {CORE: "100", RATIO: "100"}
    assert result.obj["spec"]["containers"][0]["deep"] is not deep


@pytest.mark.parametrize(("given", "message"), [
    pytest.param([], "pod: expected an object, got list", id="pod-list"),
    pytest.param({"spec": "x"}, "spec: expected an object, got str", id="spec-string"),
    pytest.param({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "x"}}}]}},
                 "spec.containers[0].resources.limits[nvidia.com/gpu]: quantities must match the regular expression "
                 "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': 'x'", id="bad-quantity"),
    pytest.param({"metadata": "x", "spec": {"containers": [both({"nvidia.com/gpu": "1"})]}},
                 "metadata: expected an object, got str", id="metadata-string"),
    pytest.param({"metadata": {"annotations": []}, "spec": {"containers": [both({"nvidia.com/gpu": "1"})]}},
                 "metadata.annotations: expected an object, got list", id="annotations-list"),
])
def test_unreadable_pods_raise_pod_shape_error(given: Any, message: str) -> None:
    with pytest.raises(PodShapeError) as error:
        canonicalize_pod(given)
    assert str(error.value) == message


def test_an_old_name_beside_a_convertible_new_name_blocks_both_so_a_second_pass_agrees() -> None:
    # Converting koordinator.sh/gpu here would let the next pass rename kubernetes.io/gpu into its
    # place and convert again (found by the idempotence property).
    given = pod(box("main", {"kubernetes.io/gpu": "0", "koordinator.sh/gpu": "0"}))

    result = canonicalize_pod(given)

    assert not result.changed
    assert result.notes == ["spec.containers[0].resources.requests: both kubernetes.io/gpu and koordinator.sh/gpu "
                            "are set; both left as is"]


def test_old_and_new_memory_names_together_are_not_turned_into_a_ratio() -> None:
    # Converting koordinator.sh/gpu-memory would let the next pass rename kubernetes.io/gpu-memory.
    given = pod(both({"kubernetes.io/gpu-memory": "8Gi", MEMORY: "8Gi"}), **PINNED_T4)

    result = canonicalize_pod(given, T4_CONFIG)

    assert not result.changed
    assert result.notes[0] == ("spec.containers[0].resources.requests: both kubernetes.io/gpu-memory and "
                               f"{MEMORY} are set; both left as is")


def test_the_view_shares_what_the_rewrite_did_not_touch_and_changes_nothing_it_was_given() -> None:
    env = [{"name": "A", "value": "1"}]
    given = pod(box("main", {"nvidia.com/gpu": "1"}), box("sidecar", {"cpu": "1"}))
    given["spec"]["containers"][0]["env"] = env
    before = json.dumps(given, sort_keys=True)

    view = canonical_view(given)

    assert view.obj == canonicalize_pod(given).obj
    assert json.dumps(given, sort_keys=True) == before
    containers = view.obj["spec"]["containers"]
    assert containers[0]["env"] is env  # shared: the webhook's diff skips it by identity
    assert containers[1] is given["spec"]["containers"][1]  # an untouched container is the input's own
    assert containers[0] is not given["spec"]["containers"][0]
    # canonicalize_pod still hands out a copy its caller may change.
    assert canonicalize_pod(given).obj["spec"]["containers"][0]["env"] is not env
