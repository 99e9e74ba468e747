"""Review of an ElasticQuota object on CREATE/UPDATE: refusals and warnings, pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quantity import ZERO, Quantity
from .quota import QuotaInfo, QuotaTree, canonical_resource_list, legacy_gpu_names, names_both_families
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
                            f"progress; the next 'gpuquota migrate apply' step drops the legacy keys")
        elif names_both_families(resources):
            problems.append(f"{field_name} of {quota.ref} names both nvidia.com/gpu and koordinator.sh/gpu-* "
                            f"resources; migrate it to koordinator.sh/gpu-core and gpu-memory-ratio "
                            f"(nvidia.com/gpu: N becomes N*100 of each): see 'gpuquota migrate'")
    minimum, _ = canonical_resource_list(quota.min, tree.config, quota.name)
    maximum, _ = canonical_resource_list(quota.max, tree.config, quota.name)
    over = sorted(name for name, q in minimum.items() if name in maximum and q > maximum[name])
    if over:
        problems.append(f"spec.min of {quota.ref} is above spec.max in canonical units for: " +
                        ", ".join(f"{n} ({minimum[n]} > {maximum[n]})" for n in over))
    legacy = legacy_gpu_names(quota.max)
    if legacy and not names_both_families(quota.max):
        warnings.append(f"{quota.ref} limits legacy {', '.join(legacy)}; it is enforced as "
                        f"koordinator.sh/gpu-core and gpu-memory-ratio (x100): consider 'gpuquota migrate'")
    below = _below_usage(maximum, used)
    if below:
        warnings.append(f"new spec.max of {quota.ref} is below current usage for: " +
                        ", ".join(f"{n} (max {maximum[n]}, used {used[n]})" for n in below))
    return QuotaReview(tuple(problems), tuple(warnings))


def _below_usage(maximum: ResourceList, used: Mapping[str, Quantity]) -> list[str]:
    return sorted(name for name, q in maximum.items() if not q < ZERO and used.get(name, ZERO) > q)
