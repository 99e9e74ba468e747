"""Properties of the core over generated input (hypothesis), and hostile input to its readers.

Example counts are fixed (``settings``) so the suite's cost is predictable; docs/security.md
records them.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuquota_core.canonical import canonicalize_pod
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.jsonpatch import apply, diff
from gpuquota_core.podspec import PodShapeError, as_mapping, pod_requests, read_containers
from gpuquota_core.quantity import Quantity, QuantityError, parse_quantity
from gpuquota_core.resources import VENDOR_WHOLE_GPU_NAMES
from gpuquota_core.validation import validate_pod_gpu
from webhook.admission.review import BadRequest, decode_review

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
VENDORS = sorted(VENDOR_WHOLE_GPU_NAMES)
PROPERTY_EXAMPLES = 100
FUZZ_EXAMPLES = 150

cards = st.integers(min_value=0, max_value=10**6)
gpu_names = st.sampled_from([*VENDORS, "koordinator.sh/gpu", CORE, RATIO, "koordinator.sh/gpu-memory",
                             "koordinator.sh/gpu.shared", "kubernetes.io/gpu-core", "cpu", "memory"])
quantity_text = st.one_of(
    cards.map(str),
    st.builds(lambda n, s: f"{n}{s}", cards, st.sampled_from(["", "m", "k", "Ki", "Mi", "Gi", "e2", "E"])),
    st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False, allow_infinity=False).map(str),
)


def pod_of(containers: list[dict[str, str]], init: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "resources": {"requests": dict(r), "limits": dict(r)}} for i, r in enumerate(containers)]}
    if init:
        spec["initContainers"] = [
            {"name": f"i{i}", "resources": {"requests": dict(r), "limits": dict(r)}} for i, r in enumerate(init)]
    return {"metadata": {"name": "p"}, "spec": spec}


resource_maps = st.dictionaries(gpu_names, quantity_text, max_size=4)
vendor_maps = st.dictionaries(st.sampled_from(VENDORS), cards.map(str), min_size=1, max_size=1)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(st.lists(resource_maps, min_size=1, max_size=3), st.lists(resource_maps, max_size=2))
def test_conversion_is_idempotent(containers: list[dict[str, str]], init: list[dict[str, str]]) -> None:
    once = canonicalize_pod(pod_of(containers, init), DEFAULT_CONFIG)

    twice = canonicalize_pod(once.obj, DEFAULT_CONFIG)

    assert not twice.changed
    assert twice.obj == once.obj


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(st.lists(vendor_maps, min_size=1, max_size=4))
def test_whole_cards_become_exactly_100_per_card_and_no_vendor_name_is_left(
        containers: list[dict[str, str]]) -> None:
    result = canonicalize_pod(pod_of(containers), DEFAULT_CONFIG)

    if len({name for given_map in containers for name, v in given_map.items() if int(v)}) > 1:
        # Different vendors are different hardware: never pooled into one count of cards.
        assert not result.changed
        return
    for given_map, container in zip(containers, result.obj["spec"]["containers"], strict=True):
        [count] = [int(v) for v in given_map.values()]
        if count == 0:
            assert container["resources"]["requests"] == given_map  # a zero asks for nothing
            continue
        for field in ("requests", "limits"):
            out = container["resources"][field]
            assert not set(out) & VENDOR_WHOLE_GPU_NAMES
            assert parse_quantity(out[CORE]).amount == 100 * count
            assert parse_quantity(out[RATIO]).amount == 100 * count


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(st.lists(resource_maps, min_size=1, max_size=3))
def test_conversion_never_lowers_what_a_pod_asks_for(containers: list[dict[str, str]]) -> None:
    """In canonical units the pod asks for at least what it asked for before: no rounding down."""
    before = pod_of(containers)
    try:
        spec = before["spec"]
        asked = pod_requests(spec, read_containers(spec))
    except (PodShapeError, QuantityError):
        return
    after = canonicalize_pod(before, DEFAULT_CONFIG).obj["spec"]
    got = pod_requests(after, read_containers(after))
    vendor = {n: q for n, q in asked.items() if n in VENDOR_WHOLE_GPU_NAMES}
    if not all(q.is_integer() for q in vendor.values()):
        return  # left as written for /validate-pods and the API server (extended resources are integers)
    if set(got) & VENDOR_WHOLE_GPU_NAMES:
        # Conversion declined: either the pod is left exactly as written (Koordinator schedules it
        # so, but could not schedule it rewritten: nothing lowered), or it mixes families in a way
        # /validate-pods refuses, so it cannot get through with less.
        containers_after = read_containers(after)
        assert after == spec or validate_pod_gpu(containers_after, pod_requests(after, containers_after))
        return
    # A container naming one card in two spellings that agree keeps one of them (Koordinator reads
    # it so), so the pod's canonical total is at least each spelling's own amount, never their sum.
    vendor_cards = sum((q.amount for q in vendor.values()), Fraction(0))
    for name in (CORE, RATIO):
        assert got.get(name, Quantity.of(0)).amount >= max(asked.get(name, Quantity.of(0)).amount,
                                                         100 * vendor_cards)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(json_values, json_values)
def test_json_patch_diff_applies_back(original: Any, changed: Any) -> None:
    assert apply(original, diff(original, changed)) == changed


def hostile_pod(draw: st.DrawFn) -> Any:
    resources = draw(st.one_of(
        st.dictionaries(st.one_of(gpu_names, st.text(max_size=12)),
                        st.one_of(quantity_text, st.text(max_size=12), st.integers(), st.floats(), st.none(),
                                  st.sampled_from(["1e308", "-1", "0.5", "100m", "9" * 80, "1e-9", "+Inf"])),
                        max_size=4),
        json_values))
    container = draw(st.one_of(
        st.fixed_dictionaries({"name": st.one_of(st.text(max_size=6), st.integers()),
                               "resources": st.one_of(st.fixed_dictionaries({"requests": st.just(resources),
                                                                             "limits": json_values}),
                                                      json_values)}),
        json_values))
    containers = draw(st.one_of(st.lists(st.just(container), max_size=3), json_values))
    return draw(st.one_of(st.just({"metadata": {"name": "p"}, "spec": {"containers": containers}}),
                          st.just({"spec": containers}), json_values))


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.composite(hostile_pod)())
def test_pod_walker_answers_or_raises_only_documented_errors(pod: Any) -> None:
    try:
        if not isinstance(pod, dict):
            raise PodShapeError("", "not an object")
        result = canonicalize_pod(pod, DEFAULT_CONFIG)
        spec = as_mapping(result.obj.get("spec"), "spec")
        containers = read_containers(spec)
        validate_pod_gpu(containers, pod_requests(spec, containers))
    except (PodShapeError, QuantityError):
        pass


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.builds(lambda r: json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                                 "request": r}).encode(), json_values)))
def test_review_decoder_answers_or_raises_bad_request(body: bytes) -> None:
    try:
        decode_review(body)
    except BadRequest as error:
        assert error.reason


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.text(max_size=80))
def test_quantity_parser_accepts_or_refuses_with_quantity_error(text: str) -> None:
    try:
        parse_quantity(text)
    except QuantityError as error:
        assert str(error)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(quantity_text)
def test_quantity_round_trips_through_its_canonical_string(text: str) -> None:
    quantity = parse_quantity(text)

    assert parse_quantity(str(quantity)).amount == quantity.amount
