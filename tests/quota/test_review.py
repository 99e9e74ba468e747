from __future__ import annotations

from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_review import review_quota
from gpuquota_core.quota_tree import QuotaTree

RATIO = "koordinator.sh/gpu-memory-ratio"


def review(spec: dict[str, dict[str, str]], used: dict[str, str] | None = None) -> tuple[tuple[str, ...], ...]:
    quota = quota_from_object({"metadata": {"name": "q", "namespace": "ns"}, "spec": spec})
    result = review_quota(quota, QuotaTree(), {n: Quantity.parse(v) for n, v in (used or {}).items()})
    return result.problems, result.warnings


def test_both_families_refused_with_migration_hint() -> None:
    problems, _ = review({"max": {"nvidia.com/gpu": "2", RATIO: "200"}})
    assert len(problems) == 1 and "names both nvidia.com/gpu and koordinator.sh/gpu-*" in problems[0]
    assert "gpuquota migrate" in problems[0]


def test_min_above_max_in_canonical_units_and_negative_values() -> None:
    problems, _ = review({"min": {"nvidia.com/gpu": "3"}, "max": {"nvidia.com/gpu": "2"}})
    assert problems == ("spec.min of ns/q is above spec.max in canonical units for: "
                        "koordinator.sh/gpu-core (300 > 200), koordinator.sh/gpu-memory-ratio (300 > 200)",)
    problems, _ = review({"max": {RATIO: "-1"}})
    assert problems == (f"spec.max of ns/q has negative values: {RATIO}",)


def test_warnings_for_legacy_quota_and_max_below_usage() -> None:
    problems, warnings = review({"max": {"nvidia.com/gpu": "1"}}, used={RATIO: "150"})
    assert problems == ()
    assert warnings[0].startswith("ns/q limits legacy nvidia.com/gpu")
    assert warnings[1] == f"new spec.max of ns/q is below current usage for: {RATIO} (max 100, used 150)"


def test_min_above_max_in_any_spelling_is_refused() -> None:
    # The smaller of the two min spellings (300) fits under max; the other (750) does not.
    problems, _ = review({"min": {RATIO: "750", "koordinator.sh/gpu": "300"}, "max": {RATIO: "350"}})

    assert problems == ("spec.min of ns/q is above spec.max in canonical units for: "
                        f"{RATIO} (750 from {RATIO} > 350)",)


def test_min_spellings_that_all_fit_under_max_are_allowed() -> None:
    problems, _ = review({"min": {RATIO: "300", "koordinator.sh/gpu": "200"}, "max": {RATIO: "350"}})

    assert problems == ()
