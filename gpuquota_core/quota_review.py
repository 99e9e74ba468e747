"""Review of an ElasticQuota object on CREATE/UPDATE: refusals and warnings, pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quantity import ZERO, Quantity
from .quota_objects import (
    QuotaInfo,
    canonical_resource_list,
    canonical_spellings,
    legacy_gpu_names,
    names_both_families,
)
from .quota_tree import QuotaTree
from .resources import ResourceList


@dataclass(frozen=True, slots=True)
class QuotaReview:
    problems: tuple[str, ...]  # any problem refuses the quota
    warnings: tuple[str, ...]


def review_quota(quota: QuotaInfo, tree: QuotaTree, used: Mapping[str, Quantity],
                 migrating: bool = False) -> QuotaReview:
    """``migrating``: the quota is marked as between two steps of ``gpuquota migrate apply``."""
    problems: list[str] = []
    warnings: list[str] = []
    for field_name, resources in (("spec.min", quota.min), ("spec.max", quota.max)):
        negative = sorted(name for name, q in resources.items() if q < ZERO)
        if negative:
            problems.append(f"{field_name} of {quota.ref} has negative values: {', '.join(negative)}")
        if names_both_families(resources) and migrating:
            warnings.append(f"{field_name} of {quota.ref} names both GPU families while its migration is in "
                            "progress; the next step of 'gpuquota migrate apply --all-at-once --backup NEW_FILE' "
                            "drops the legacy keys")
        elif names_both_families(resources):
            problems.append(f"{field_name} of {quota.ref} names both nvidia.com/gpu and koordinator.sh/gpu-* "
                            f"resources; migrate it to koordinator.sh/gpu-core and gpu-memory-ratio "
                            f"(nvidia.com/gpu: N becomes N*100 of each): see 'gpuquota migrate plan'")
    maximum, _ = canonical_resource_list(quota.max, tree.config, quota.name)
    over = _min_above_max(canonical_spellings(quota.min, tree.config), maximum)
    if over:
        problems.append(f"spec.min of {quota.ref} is above spec.max in canonical units for: " + ", ".join(over))
    legacy = legacy_gpu_names(quota.max)
    if legacy and not names_both_families(quota.max):
        warnings.append(f"{quota.ref} limits legacy {', '.join(legacy)}; it is enforced as "
                        f"koordinator.sh/gpu-core and gpu-memory-ratio (x100): consider 'gpuquota migrate plan'")
    below = _below_usage(maximum, used)
    if below:
        warnings.append(f"new spec.max of {quota.ref} is below current usage for: " +
                        ", ".join(f"{n} (max {maximum[n]}, used {used[n]})" for n in below))
    return QuotaReview(tuple(problems), tuple(warnings))


def _min_above_max(minimum: Mapping[str, list[tuple[Quantity, str]]], maximum: ResourceList) -> list[str]:
    """Every spelling of min that promises more than max allows, one entry per canonical name.

    Each spelling of min is a promise on its own: a min that says 750 in one spelling and 300 in
    another is above a max of 350 whichever the writer meant, so no spelling may exceed it.
    """
    over: list[str] = []
    for name in sorted(set(minimum) & set(maximum)):
        above = sorted({(source, amount) for amount, source in minimum[name] if amount > maximum[name]},
                       key=lambda pair: pair[0])
        if not above:
            continue
        if len(minimum[name]) == 1:
            over.append(f"{name} ({above[0][1]} > {maximum[name]})")
        else:
            spelled = ", ".join(f"{amount} from {source}" for source, amount in above)
            over.append(f"{name} ({spelled} > {maximum[name]})")
    return over


def _below_usage(maximum: ResourceList, used: Mapping[str, Quantity]) -> list[str]:
    return sorted(name for name, q in maximum.items() if not q < ZERO and used.get(name, ZERO) > q)
