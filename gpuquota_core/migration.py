"""Plan the move of ElasticQuota trees from vendor GPU keys to canonical keys (I/O-free).

Koordinator's quota webhook requires a child's max keys to equal its parent's on every update
(koordinator.md §4.2); with ``ElasticQuotaEnableUpdateResourceKey`` only child ⊆ parent. So with
the gate the plan goes top-down adding canonical keys (legacy kept), then bottom-up dropping the
legacy keys: every intermediate state satisfies child ⊆ parent. Without the gate a tree below a
non-root parent cannot be changed one quota at a time, and the plan says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import audit_objects
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .quota import ROOT_QUOTA, QuotaInfo, canonical_resource_list, legacy_gpu_names, quota_from_object
from .resources import ResourceList

# Written by ``gpuquota migrate apply``: the spec before the first migration step (for rollback),
# and a marker that a tree is between "add-canonical" and "drop-legacy", the one state in which a
# quota may name both GPU families.
PRE_MIGRATION_SPEC_ANNOTATION = "gpuquota.koord-gpuquota.io/pre-migration-spec"
MIGRATION_IN_PROGRESS_ANNOTATION = "gpuquota.koord-gpuquota.io/migration"
IN_PROGRESS = "in-progress"


@dataclass(frozen=True, slots=True)
class Step:
    quota: str
    namespace: str
    phase: str  # "add-canonical" or "drop-legacy"
    before: Mapping[str, Mapping[str, str]]  # {"min": {...}, "max": {...}}
    after: Mapping[str, Mapping[str, str]]

    def as_dict(self) -> dict[str, Any]:
        return {"quota": self.quota, "namespace": self.namespace, "phase": self.phase,
                "before": {k: dict(v) for k, v in self.before.items()},
                "after": {k: dict(v) for k, v in self.after.items()}}


@dataclass(slots=True)
class Plan:
    steps: list[Step]
    blocked: list[str]  # why a tree must be changed at once
    revisit: list[dict[str, Any]] = field(default_factory=list)  # workloads / ResourceQuotas to update

    def as_dict(self) -> dict[str, Any]:
        return {"steps": [s.as_dict() for s in self.steps], "blocked": self.blocked, "revisit": self.revisit}


def _text(resources: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in sorted(resources.items())}


def _depth(quota: QuotaInfo, by_name: Mapping[str, QuotaInfo]) -> int:
    depth, current, seen = 0, quota, {quota.name}
    while current.parent in by_name and current.parent not in seen:
        seen.add(current.parent)
        current = by_name[current.parent]
        depth += 1
    return depth


def plan_migration(objects: Iterable[Mapping[str, Any]], update_resource_key_gate: bool = False,
                   config: ConversionConfig = DEFAULT_CONFIG) -> Plan:
    objects = list(objects)
    quotas = [quota_from_object(o) for o in objects if o.get("kind") == "ElasticQuota"]
    by_name = {q.name: q for q in quotas}
    legacy = [q for q in quotas if legacy_gpu_names(set(q.min) | set(q.max))]
    order = sorted(legacy, key=lambda q: (_depth(q, by_name), q.name))
    converted: dict[str, tuple[ResourceList, ResourceList]] = {}
    for quota in order:
        new_min, _ = canonical_resource_list(quota.min, config, quota.name)
        new_max, _ = canonical_resource_list(quota.max, config, quota.name)
        converted[quota.name] = (new_min, new_max)
    blocked: list[str] = []
    steps: list[Step] = []
    # A leaf under an already-canonical parent converts in one update (its keys then equal the
    # parent's); only legacy parents and their legacy children need coordinated steps.
    legacy_names = {q.name for q in legacy}
    parents = {q.parent for q in quotas}
    nested = [q for q in order if q.name in parents or (q.parent != ROOT_QUOTA and q.parent in legacy_names)]
    if nested and not update_resource_key_gate:
        blocked.append("quotas " + ", ".join(q.name for q in nested) + " are in a multi-level tree: with "
                       "ElasticQuotaEnableUpdateResourceKey off Koordinator requires identical max keys between "
                       "parent and child on every update, so these quotas must be changed at once (or enable the "
                       "gate and re-plan)")
    for quota in order:
        before = {"min": _text(quota.min), "max": _text(quota.max)}
        new_min, new_max = converted[quota.name]
        if quota in nested and update_resource_key_gate:
            union_max = {**quota.max, **{k: v for k, v in new_max.items() if k not in quota.max}}
            steps.append(Step(quota.name, quota.namespace, "add-canonical", before,
                              {"min": _text(quota.min), "max": _text(union_max)}))
        else:
            steps.append(Step(quota.name, quota.namespace, "convert", before,
                              {"min": _text(new_min), "max": _text(new_max)}))
    if update_resource_key_gate:
        for quota in reversed([q for q in order if q in nested]):
            new_min, new_max = converted[quota.name]
            union_max = {**quota.max, **{k: v for k, v in new_max.items() if k not in quota.max}}
            steps.append(Step(quota.name, quota.namespace, "drop-legacy",
                              {"min": _text(quota.min), "max": _text(union_max)},
                              {"min": _text(new_min), "max": _text(new_max)}))
    # The same checks as `gpuquota audit`, so plan and audit agree on what else must change.
    report = audit_objects(objects, ("workloads", "resourcequotas"), config)
    # Usage is computed in canonical units, i.e. against exactly the limits the plan writes.
    usage = audit_objects(objects, ("quotas",), config)
    for finding in usage.findings:
        if finding.check == "quota-over-limit" and finding.name in converted:
            blocked.append(f"quota {finding.name}: {finding.message}; raise the limit before migrating")
    revisit = [{"kind": f.kind, "namespace": f.namespace, "name": f.name, "check": f.check, "message": f.message}
               for f in report.findings]
    return Plan(steps, blocked, revisit)
