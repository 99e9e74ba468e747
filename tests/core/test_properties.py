"""Properties of the core over generated input (hypothesis).

Budgets are fixed and the runs derandomized (a fixed seed per test), so ``make test`` costs the
same every time and a failure reproduces; ``GPUQUOTA_PROPERTY_EXAMPLES=20000
GPUQUOTA_PROPERTY_RANDOM=1`` runs a longer, randomized search (docs/fuzzing.md).
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuquota_core.canonical import canonicalize_pod
from gpuquota_core.conversion import GPU_MODEL_LABEL, ConversionConfig, load_config
from gpuquota_core.jsonpatch import apply, diff
from gpuquota_core.podspec import pod_requests, read_containers
from gpuquota_core.quantity import Quantity, QuantityFormat, format_quantity, parse_quantity
from gpuquota_core.resources import VENDOR_WHOLE_GPU_NAMES, GpuFamily, families_of
from gpuquota_core.validation import validate_pod_gpu

EXAMPLES = int(os.environ.get("GPUQUOTA_PROPERTY_EXAMPLES", "150"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1")

CORE = "koordinator.sh/gpu-core"
RATIO = "koordinator.sh/gpu-memory-ratio"
MEMORY = "koordinator.sh/gpu-memory"
SHARED = "koordinator.sh/gpu.shared"
KGPU = "koordinator.sh/gpu"
VENDORS = sorted(VENDOR_WHOLE_GPU_NAMES)
T4_BYTES = 16 * 2**30
T4 = load_config({"gpuMemoryByModel": {"T4": "16Gi"}})
CONFIGS = st.sampled_from([ConversionConfig(), T4])

# Quantity spellings a user can write for a GPU count: whole, milli, fractions, exponents, binary
# suffixes, and sizes near the limits of what the parser accepts.
numbers = st.one_of(st.integers(0, 10**4), st.integers(0, 10**70))
quantity_texts = st.one_of(
    st.integers(0, 64).map(str),
    st.builds(lambda n, s: f"{n}{s}", st.integers(0, 5000),
              st.sampled_from(["", "m", "u", "n", "k", "M", "Ki", "e0", "e1", "e2", "e-1", "e-3", "E"])),
    st.builds(lambda whole, frac: f"{whole}.{frac}", st.integers(0, 20), st.integers(0, 10**12)),
    st.builds(lambda n, e: f"{n}e{e}", st.integers(1, 99), st.integers(-70, 70)),
    st.sampled_from(["0.5", "100m", "1n", "999m", "1.000000001", "1e308", "1e63", "1e62", "-1", "-100m"]),
)
names = st.sampled_from([*VENDORS, KGPU, CORE, RATIO, MEMORY, SHARED, "kubernetes.io/gpu",
                         "kubernetes.io/gpu-core", "kubernetes.io/gpu-memory", "kubernetes.io/gpu-memory-ratio",
                         "cpu"])
resource_maps = st.dictionaries(names, quantity_texts, max_size=4)


def pod_of(containers: list[dict[str, str]], init: list[dict[str, str]] | None = None,
           pinned: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "resources": {"requests": dict(r), "limits": dict(r)}} for i, r in enumerate(containers)]}
    if init:
        spec["initContainers"] = [
            {"name": f"i{i}", "resources": {"requests": dict(r), "limits": dict(r)}, **(
                {"restartPolicy": "Always"} if i % 2 else {})} for i, r in enumerate(init)]
    if pinned:
        spec["nodeSelector"] = {GPU_MODEL_LABEL: "T4"}
    return {"metadata": {"name": "p"}, "spec": spec}


def readable(texts: dict[str, str]) -> bool:
    try:
        for text in texts.values():
            parse_quantity(text)
    except ValueError:
        return False
    return True


def problems(obj: dict[str, Any]) -> list[Any]:
    containers = read_containers(obj["spec"])
    return validate_pod_gpu(containers, pod_requests(obj["spec"], containers))


@PROFILE
@given(st.lists(resource_maps.filter(readable), min_size=1, max_size=3),
       st.lists(resource_maps.filter(readable), max_size=2), st.booleans(), CONFIGS)
def test_conversion_is_idempotent(containers: list[dict[str, str]], init: list[dict[str, str]], pinned: bool,
                                  config: ConversionConfig) -> None:
    once = canonicalize_pod(pod_of(containers, init, pinned), config)

    twice = canonicalize_pod(once.obj, config)

    assert (twice.changed, twice.rewrites) == (False, [])
    assert diff(once.obj, twice.obj) == []


@PROFILE
@given(st.lists(st.tuples(st.sampled_from(VENDORS), st.integers(0, 10**9)), min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(VENDORS), st.integers(0, 10**9)), max_size=2))
def test_totals_are_preserved_at_100_per_card(app: list[tuple[str, int]], init: list[tuple[str, int]]) -> None:
    given_pod = pod_of([{name: str(n)} for name, n in app], [{name: str(n)} for name, n in init])
    before = pod_requests(given_pod["spec"])

    result = canonicalize_pod(given_pod)
    after_pod = result.obj
    after = pod_requests(after_pod["spec"])

    vendors = {name for name, count in app + init if count}
    if not result.changed:
        # Two vendors are different hardware (never pooled), and a pod Koordinator places only as
        # written (an init container above the app containers) stays so; zeros ask for nothing.
        assert after_pod == given_pod
        assert len(vendors) > 1 or result.notes or not vendors
        return
    # The scheduler's aggregate (sum, sidecars, init max) commutes with the 100-per-card rewrite.
    cards = sum((q.amount for name, q in before.items() if name in VENDOR_WHOLE_GPU_NAMES), Fraction(0))
    if len(vendors) == 1:
        assert after.get(CORE, Quantity.of(0)).amount == 100 * cards
        assert after.get(RATIO, Quantity.of(0)).amount == 100 * cards
    assert not set(after) & VENDOR_WHOLE_GPU_NAMES
    for container in read_containers(after_pod["spec"]):
        if any(not q.is_zero() for q in container.requests.values()):
            assert container.requests.get(CORE) == container.requests.get(RATIO) == container.limits.get(CORE)


@PROFILE
@given(st.lists(resource_maps.filter(readable), min_size=1, max_size=3), st.booleans(), CONFIGS)
def test_both_families_survive_only_in_pods_that_are_refused(containers: list[dict[str, str]], pinned: bool,
                                                            config: ConversionConfig) -> None:
    result = canonicalize_pod(pod_of(containers, pinned=pinned), config)

    aggregate = pod_requests(result.obj["spec"])
    nonzero = [name for name, q in aggregate.items() if not q.is_zero()]
    if families_of(nonzero) == {GpuFamily.VENDOR, GpuFamily.KOORDINATOR}:
        assert problems(result.obj)
    for container in result.obj["spec"]["containers"]:
        for written in container["resources"].values():
            values = {n: parse_quantity(t) for n, t in written.items()}
            clean = all(q.is_integer() and 0 <= q.amount < 10**12 for q in values.values())
            if clean and not result.notes:
                # Whole, non-negative, in range, nothing left alone on purpose: every vendor count
                # that asks for something was converted (zeros ask for nothing and stay).
                assert not {n for n, q in values.items() if n in VENDOR_WHOLE_GPU_NAMES and not q.is_zero()}


@PROFILE
@given(st.sampled_from([*VENDORS, KGPU, "kubernetes.io/gpu"]), quantity_texts.filter(lambda t: readable({"t": t})),
       st.sampled_from([{}, {CORE: "50"}, {CORE: "100", RATIO: "100"}, {"cpu": "1"}]))
def test_no_rounding_or_overflow_lets_a_pod_through_with_less(name: str, text: str, beside: dict[str, str]) -> None:
    asked = parse_quantity(text).amount
    per_unit = 100 if name in VENDOR_WHOLE_GPU_NAMES else 1
    given_pod = pod_of([{**beside, name: text}])

    result = canonicalize_pod(given_pod).obj

    if problems(result):
        return  # refused: nothing gets through
    got = pod_requests(result["spec"])
    for output in (CORE, RATIO):
        # Two spellings of one card are one card when they agree (and refused when they do not),
        # so the pod gets at least each of its readings.
        already = parse_quantity(beside.get(output, "0")).amount
        assert got.get(output, Quantity.of(0)).amount >= max(already, asked * per_unit), (name, text, got)


@PROFILE
@given(st.integers(1, 2**40), st.integers(1, 8))
def test_memory_to_ratio_never_gives_less_memory(memory: int, shared: int) -> None:
    result = canonicalize_pod(pod_of([{MEMORY: str(memory), SHARED: str(shared)}], pinned=True), T4).obj

    [container] = read_containers(result["spec"])
    if RATIO not in container.requests:
        # Koordinator places the bytes as written; the ratio (over 100 per device) it would refuse.
        assert container.requests[MEMORY].amount == memory and shared * 100 * T4_BYTES < memory * 100
        return
    ratio = container.requests[RATIO].amount
    assert ratio * T4_BYTES >= memory * 100
    assert ratio % shared == 0


amounts = st.builds(lambda n, k: Fraction(n, 10**k), st.integers(-(10**30), 10**30), st.integers(0, 9))
formats = st.sampled_from(list(QuantityFormat))


@PROFILE
@given(amounts, formats)
def test_formatting_round_trips_exactly(amount: Fraction, fmt: QuantityFormat) -> None:
    text = format_quantity(amount, fmt)

    parsed = parse_quantity(text)

    assert parsed.amount == amount
    assert str(parsed) == text or parse_quantity(str(parsed)).amount == amount
    assert str(parse_quantity(str(parsed))) == str(parsed)


@PROFILE
@given(quantity_texts.filter(lambda t: readable({"t": t})))
def test_parsing_never_rounds_down(text: str) -> None:
    quantity = parse_quantity(text)
    exact = _exact_value(text)

    assert abs(quantity.amount) >= abs(exact)
    assert abs(quantity.amount) - abs(exact) < Fraction(1, 10**9)


def _exact_value(text: str) -> Fraction:
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if text.endswith(suffix):
            return Fraction(text[:-2]) * factor
    decimal = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "E": 18}
    if text[-1] in decimal:
        return Fraction(text[:-1]) * Fraction(10) ** decimal[text[-1]]
    if "e" in text:
        mantissa, exponent = text.split("e")
        return Fraction(mantissa) * Fraction(10) ** int(exponent)
    return Fraction(text)


@PROFILE
@given(amounts, amounts)
def test_quantity_arithmetic_and_order_match_exact_fractions(left: Fraction, right: Fraction) -> None:
    a, b = Quantity.of(left), Quantity.of(right)

    assert (a + b).amount == left + right and (a - b).amount == left - right
    assert (a < b) == (left < right) and (a == b) == (left == right)


json_keys = st.text(alphabet=st.sampled_from("ab/~01-"), max_size=4)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(json_keys, inner, max_size=3)),
    max_leaves=15)


@PROFILE
@given(json_values, json_values)
def test_applying_the_diff_yields_the_target(original: Any, changed: Any) -> None:
    operations = diff(original, changed)

    patched = apply(original, operations)

    assert diff(patched, changed) == []
    assert (operations == []) == (diff(changed, original) == [])


@PROFILE
@given(st.lists(resource_maps.filter(readable), min_size=1, max_size=3), CONFIGS)
def test_the_webhooks_patch_turns_the_pod_into_the_canonical_pod(containers: list[dict[str, str]],
                                                                 config: ConversionConfig) -> None:
    given_pod = pod_of(containers, pinned=True)
    result = canonicalize_pod(given_pod, config)

    assert apply(given_pod, diff(given_pod, result.obj)) == result.obj
