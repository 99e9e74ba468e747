"""The fast paths of gpuquota_core.quantity, canonical and quota give exactly what the general code gives.

The plain-integer parser, the parse and format caches and the integer arithmetic of ``Quantity``
exist only for speed (docs/benchmarks.md); each is checked here against the Fraction-only code it
short-cuts, over generated input.
"""

from __future__ import annotations

import os
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core import canonical
from gpuquota_core import quantity as q
from gpuquota_core.canonical import canonicalize_resource_list
from gpuquota_core.conversion import DEFAULT_CONFIG, GPU_MODEL_LABEL, ConversionConfig, load_config
from gpuquota_core.pod_records import canonical_pod_requests, remembered_gpu_problems, remembered_pod_requests
from gpuquota_core.podspec import pod_requests, read_containers
from gpuquota_core.quantity import Quantity, QuantityError, QuantityFormat, format_quantity, parse_quantity
from gpuquota_core.resources import add_lists
from gpuquota_core.validation import validate_pod_gpu

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "300"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")

SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
# Whole numbers with every suffix, up to and past the fast path's 32-character bound and the range
# bound, plus near-misses the fast path must hand to the general parser (signs, dots, exponents,
# leading zeros, non-ASCII digits, trailing newline).
plain_texts = st.builds(lambda digits, suffix: f"{digits}{suffix}",
                        st.one_of(st.integers(0, 10**6), st.integers(0, 10**70)).map(str), st.sampled_from(SUFFIXES))
near_misses = st.one_of(
    st.builds(lambda n, s: f"{n}{s}", st.integers(-10**6, 10**6), st.sampled_from(SUFFIXES)),
    st.builds(lambda n, s, tail: f"{n}{s}{tail}", st.integers(0, 10**6), st.sampled_from(SUFFIXES),
              st.sampled_from([".", ".0", "e3", "E", "i", "\n", " ", "0", "Ki"])),
    st.sampled_from(["007", "0Mi", "+5", "٣", "1_000", "", "Ki", "m", "1e", "1K", "1mi"]),
)
amounts = st.one_of(st.integers(-10**20, 10**20).map(Fraction),
                    st.fractions(min_value=-10**6, max_value=10**6, max_denominator=10**9))


def general(text: str) -> Quantity | str:
    """The general parser's answer (its error message when it refuses)."""
    try:
        return q._parse_general(text)
    except QuantityError as error:
        return f"error: {error}"


def public(text: str) -> Quantity | str:
    try:
        return parse_quantity(text)
    except QuantityError as error:
        return f"error: {error}"


@PROFILE
@given(st.one_of(plain_texts, near_misses))
def test_parse_equals_the_general_parser(text: str) -> None:
    fast, slow = public(text), general(text)
    if isinstance(slow, str):
        assert fast == slow
    else:
        assert isinstance(fast, Quantity)
        assert (fast.amount, fast.format, str(fast)) == (slow.amount, slow.format, str(slow))


@PROFILE
@given(plain_texts)
def test_the_plain_path_is_exact_whenever_it_answers(text: str) -> None:
    fast = q._parse_plain(text)
    if fast is not None:
        slow = q._parse_general(text)
        assert (fast.amount, fast.format) == (slow.amount, slow.format)


@pytest.mark.parametrize("text", ["1", "500m", "64Gi", "100", "1n", "3u", "7E", "12Ei", "0"])
def test_the_plain_path_takes_the_common_spellings(text: str) -> None:
    assert q._parse_plain(text) is not None


@pytest.mark.parametrize("text", ["+1", "-1", "1.5", "1e3", "1E3", "٣", "1\n", "1" * 33])
def test_the_plain_path_leaves_everything_else_to_the_general_parser(text: str) -> None:
    assert q._parse_plain(text) is None


def test_the_same_text_parses_to_the_same_value_and_a_bad_one_fails_every_time() -> None:
    assert parse_quantity("250m") is parse_quantity("250m")
    with pytest.raises(QuantityError):
        parse_quantity("1.2.3")
    with pytest.raises(QuantityError):  # errors are never remembered as values
        parse_quantity("1.2.3")


@PROFILE
@given(amounts, amounts)
def test_integer_arithmetic_equals_fraction_arithmetic(a: Fraction, b: Fraction) -> None:
    left, right = Quantity(a, QuantityFormat.BINARY_SI), Quantity(b)
    assert (left + right).amount == a + b
    assert (left - right).amount == a - b
    assert (left + right).format is QuantityFormat.BINARY_SI  # the left operand's format, as before
    assert (left < right) == (a < b)
    assert (left <= right) == (a <= b)
    assert (left > right) == (a > b)
    assert (left >= right) == (a >= b)
    assert type((left + right).amount) is Fraction


@PROFILE
@given(amounts, st.sampled_from(list(QuantityFormat)))
def test_cached_format_equals_a_fresh_one(amount: Fraction, fmt: QuantityFormat) -> None:
    assert format_quantity(amount, fmt) == format_quantity.__wrapped__(amount, fmt)


resource_names = st.sampled_from(["nvidia.com/gpu", "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio",
                                  "koordinator.sh/gpu-memory", "kubernetes.io/gpu", "cpu", "memory"])
raw_values = st.one_of(st.sampled_from(["1", "2", "100", "50", "0.5", "-1", "1Gi", "16Gi", "x"]),
                       st.integers(-2, 300), st.booleans(), st.floats(0, 4, allow_nan=False))


def rewrite_or_error(rewrite: object, raw: dict[str, object], pinned: str | None) -> object:
    try:
        return rewrite(raw, "spec.containers[0].resources.requests", T4_CONFIG, pinned)  # type: ignore[operator]
    except ValueError as error:
        return f"error: {error}"


T4_CONFIG = load_config({"gpuMemoryByModel": {"T4": "16Gi"}})


@PROFILE
@given(st.dictionaries(resource_names, raw_values, max_size=4), st.sampled_from([None, "T4"]))
def test_a_remembered_rewrite_equals_a_fresh_one(raw: dict[str, object], pinned: str | None) -> None:
    first = rewrite_or_error(canonicalize_resource_list, raw, pinned)
    again = rewrite_or_error(canonicalize_resource_list, raw, pinned)  # now from the cache
    assert first == again == rewrite_or_error(canonical._rewrite_resource_list, raw, pinned)


def test_a_remembered_rewrite_cannot_be_changed_by_its_caller() -> None:
    raw = {"nvidia.com/gpu": "1"}
    result, changes, notes = canonicalize_resource_list(raw, "r", DEFAULT_CONFIG, None)
    result.clear()
    changes[0][2].clear()
    notes.append("mine")
    assert canonicalize_resource_list(raw, "r", DEFAULT_CONFIG, None) == canonical._rewrite_resource_list(
        raw, "r", DEFAULT_CONFIG, None)


def test_values_that_are_equal_in_python_are_not_the_same_quantity_in_the_cache() -> None:
    assert canonicalize_resource_list({"nvidia.com/gpu": 1}, "r", DEFAULT_CONFIG, None)[1]
    with pytest.raises(ValueError, match="not True"):
        canonicalize_resource_list({"nvidia.com/gpu": True}, "r", DEFAULT_CONFIG, None)


containers = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", ""])},
    optional={"resources": st.fixed_dictionaries({}, optional={"requests": st.dictionaries(resource_names, raw_values,
                                                                                           max_size=3),
                                                             "limits": st.dictionaries(resource_names, raw_values,
                                                                                       max_size=3)}),
              "restartPolicy": st.sampled_from(["Always", "Never", None])}), max_size=3)
specs = st.fixed_dictionaries({"containers": containers}, optional={
    "initContainers": containers, "overhead": st.dictionaries(st.sampled_from(["cpu", "memory"]), raw_values),
    "nodeSelector": st.just({GPU_MODEL_LABEL: "T4"})})


def requests_or_error(compute: object, spec: dict[str, object], config: ConversionConfig) -> object:
    try:
        return compute(spec, config)  # type: ignore[operator]
    except ValueError as error:
        return f"error: {error}"


@PROFILE
@given(specs, st.sampled_from([DEFAULT_CONFIG, T4_CONFIG]))
def test_remembered_pod_requests_equal_fresh_ones(spec: dict[str, object], config: ConversionConfig) -> None:
    first = requests_or_error(remembered_pod_requests, spec, config)
    again = requests_or_error(remembered_pod_requests, spec, config)
    fresh = requests_or_error(canonical_pod_requests, spec, config)
    assert first == again == fresh
    if isinstance(fresh, dict):  # same amounts and the same formats (they decide how messages print)
        assert {n: str(v) for n, v in first.items()} == {n: str(v) for n, v in fresh.items()}  # type: ignore[union-attr]


def problems_or_error(compute: object, spec: dict[str, object], config: ConversionConfig) -> object:
    try:
        return compute(spec, config)  # type: ignore[operator]
    except ValueError as error:
        return f"error: {error}"


def fresh_gpu_problems(spec: dict[str, object], config: ConversionConfig) -> object:
    containers = read_containers(spec)
    return validate_pod_gpu(containers, pod_requests(spec, containers))


@PROFILE
@given(specs, st.sampled_from([DEFAULT_CONFIG, T4_CONFIG]))
def test_remembered_gpu_problems_equal_fresh_ones(spec: dict[str, object], config: ConversionConfig) -> None:
    first = problems_or_error(remembered_gpu_problems, spec, config)
    again = problems_or_error(remembered_gpu_problems, spec, config)
    assert first == again == problems_or_error(fresh_gpu_problems, spec, config)


def test_remembered_gpu_problems_quote_each_pods_own_container_names() -> None:
    def spec(name: str) -> dict[str, object]:
        return {"containers": [{"name": name, "resources": {"requests": {"nvidia.com/gpu": "-1"}}}]}

    first, second = remembered_gpu_problems(spec("trainer")), remembered_gpu_problems(spec("server"))
    assert first and second
    assert '"trainer"' in first[0].message and '"server"' in second[0].message
    first.clear()  # the caller's own list
    assert remembered_gpu_problems(spec("trainer")) == fresh_gpu_problems(spec("trainer"), DEFAULT_CONFIG)


def test_remembered_pod_requests_are_the_callers_own() -> None:
    spec = {"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    remembered_pod_requests(spec).clear()
    assert remembered_pod_requests(spec) == canonical_pod_requests(spec)


def test_a_spec_of_unusual_shape_gets_the_precise_error() -> None:
    with pytest.raises(ValueError, match="expected a string"):
        remembered_pod_requests({"containers": [{"name": 7}]})
    with pytest.raises(ValueError, match="expected an object"):
        remembered_pod_requests({"containers": [{"name": "a", "resources": {"requests": ["1"]}}]})


resource_lists = st.dictionaries(st.sampled_from(["cpu", "memory", "koordinator.sh/gpu-core"]),
                                 st.builds(Quantity, amounts, st.sampled_from(list(QuantityFormat))), max_size=3)


@PROFILE
@given(st.lists(resource_lists, max_size=4))
def test_add_lists_sums_in_the_format_of_the_first_term(lists: list[dict[str, Quantity]]) -> None:
    # As apimachinery's Quantity.Add: 1Gi + 3Gi is 4Gi, not 4294967296.
    expected: dict[str, Quantity] = {}
    for resources in lists:
        for name, quantity in resources.items():
            expected[name] = expected[name] + quantity if name in expected else quantity
    total = add_lists(*lists)
    assert list(total) == list(expected)
    assert [(v.amount, v.format) for v in total.values()] == [(v.amount, v.format) for v in expected.values()]
