"""Plan the move of ElasticQuota trees from vendor GPU keys to canonical keys (I/O-free).

Koordinator's quota webhook requires a child's max keys to equal its parent's on every update
(koordinator.md §4.2); with ``ElasticQuotaEnableUpdateResourceKey`` only child ⊆ parent. So with
the gate the plan goes top-down adding canonical keys (legacy kept), then bottom-up dropping the
legacy keys: every intermediate state satisfies child ⊆ parent. Without the gate a tree below a
non-root parent cannot be changed one quota at a time, and the plan says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import audit_objects
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .podspec import PodShapeError, parse_resource_list
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


# -- rollback ------------------------------------------------------------------------------------
#
# ``gpuquota migrate rollback`` undoes ``apply`` in the reverse of apply's order. Apply moves a
# quota through at most three states: the original (s0), with the gate the union of legacy and
# canonical max keys (s1, "add-canonical"), and the canonical spec (s2, "drop-legacy"/"convert").
# Rollback walks the same states backwards: top-down "re-add-legacy" (s2 -> s1) for every quota of
# a multi-level tree, then bottom-up "restore" (s1 -> s0, or s2 -> s0 for a single-step quota),
# so the parent/child key relation holds at every step exactly as it did on the way forward.

Spec = Mapping[str, Mapping[str, str]]  # {"min": {...}, "max": {...}}

REVERSED_PHASE = {"drop-legacy": "re-add-legacy", "add-canonical": "restore", "convert": "restore"}


class RollbackSourceError(ValueError):
    """A backup item or pre-migration annotation that cannot be read; the message names the quota."""


@dataclass(frozen=True, slots=True)
class Refusal:
    quota: str
    namespace: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"quota": self.quota, "namespace": self.namespace, "reason": self.reason}


@dataclass(slots=True)
class RollbackPlan:
    steps: list[Step]  # phases "re-add-legacy" and "restore"
    refused: list[Refusal]  # quotas that changed since the migration (or are gone): nothing is written
    unchanged: list[str] = field(default_factory=list)  # "namespace/name" already at the original spec

    def as_dict(self) -> dict[str, Any]:
        return {"steps": [s.as_dict() for s in self.steps], "refused": [r.as_dict() for r in self.refused],
                "unchanged": self.unchanged}


def _meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = _meta_of(obj)
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = _meta_of(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def _spec_of(obj: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    result: dict[str, dict[str, str]] = {}
    for section in ("min", "max"):
        value = spec.get(section)
        result[section] = {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}
    return result


def has_migration_annotations(obj: Mapping[str, Any]) -> bool:
    annotations = _annotations(obj)
    return PRE_MIGRATION_SPEC_ANNOTATION in annotations or MIGRATION_IN_PROGRESS_ANNOTATION in annotations


def original_from_annotation(obj: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
    """The spec ``migrate apply`` recorded before its first step, or None when there is none."""
    raw = _annotations(obj).get(PRE_MIGRATION_SPEC_ANNOTATION)
    if raw is None:
        return None
    namespace, name = _key(obj)
    try:
        loaded = json.loads(str(raw))
    except ValueError:
        loaded = None
    if not isinstance(loaded, Mapping) or not all(isinstance(loaded.get(s, {}), Mapping) for s in ("min", "max")):
        raise RollbackSourceError(f"ElasticQuota {namespace}/{name}: annotation {PRE_MIGRATION_SPEC_ANNOTATION} "
                                  "is not a JSON object with min and max")
    return _spec_of({"spec": loaded})


def originals_from_backup(objects: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, str]]]:
    """(namespace, name) -> original spec, from the List ``migrate apply --backup`` wrote."""
    originals: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for obj in objects:
        if obj.get("kind") != "ElasticQuota":
            continue
        key = _key(obj)
        if not key[1]:
            raise RollbackSourceError("an ElasticQuota in the backup has no metadata.name")
        originals[key] = _spec_of(obj)
    return originals


def _same(left: Spec, right: Spec) -> bool:
    try:
        return all(parse_resource_list(dict(left.get(s, {})), s) == parse_resource_list(dict(right.get(s, {})), s)
                   for s in ("min", "max"))
    except PodShapeError:
        return False


def _with_spec(obj: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    old = obj.get("spec")
    return {**obj, "spec": {**(old if isinstance(old, Mapping) else {}),
                            "min": dict(spec["min"]), "max": dict(spec["max"])}}


def _describe(spec: Spec) -> str:
    return "; ".join(f"{section} {{{', '.join(f'{k}: {v}' for k, v in sorted(spec[section].items()))}}}"
                     for section in ("min", "max"))


def plan_rollback(objects: Iterable[Mapping[str, Any]],
                  originals: Mapping[tuple[str, str], Spec] | None = None,
                  config: ConversionConfig = DEFAULT_CONFIG) -> RollbackPlan:
    """The steps that bring live quotas back to their original spec, in the reverse of apply's order.

    ``objects``: the live cluster (all ElasticQuotas, for the tree). ``originals``: (namespace,
    name) -> {"min", "max"} from a backup; without it, every quota's pre-migration annotation.
    A quota whose spec is not one of the states ``migrate apply`` leaves (someone changed it since)
    is refused; the caller writes nothing when any quota is refused.
    """
    objects = list(objects)
    live = {_key(o): o for o in objects if o.get("kind") == "ElasticQuota"}
    if originals is None:
        originals = {key: recorded for key, obj in live.items()
                     if (recorded := original_from_annotation(obj)) is not None}
    refused: list[Refusal] = []
    wanted: dict[tuple[str, str], Spec] = {}
    for key, original in sorted(originals.items()):
        if key in live:
            wanted[key] = original
        else:
            refused.append(Refusal(key[1], key[0], "not found in the cluster; nothing to restore it onto"))
    # The world as it was before apply, so the forward plan (and its intermediate states) is
    # recomputed exactly; the gate is assumed on, since without it apply never touches a tree.
    before_world = [_with_spec(o, wanted[_key(o)]) if _key(o) in wanted else o for o in objects]
    forward = [s for s in plan_migration(before_world, True, config).steps if (s.namespace, s.quota) in wanted]
    states: dict[tuple[str, str], list[Spec]] = {key: [spec] for key, spec in wanted.items()}
    for step in forward:
        states[(step.namespace, step.quota)].append(step.after)
    position: dict[tuple[str, str], int] = {}
    unchanged: list[str] = []
    for key, sequence in states.items():
        current = _spec_of(live[key])
        matches = [index for index, state in enumerate(sequence) if _same(current, state)]
        if not matches:
            refused.append(Refusal(key[1], key[0], (
                f"changed since the migration: its spec is {_describe(current)}, which is neither the original "
                f"({_describe(sequence[0])}) nor a state `gpuquota migrate apply` writes")))
            continue
        position[key] = matches[-1]
        if matches[-1] == 0 and not has_migration_annotations(live[key]):
            unchanged.append(f"{key[0]}/{key[1]}")
    refused.extend(_key_relation_refusals(live, {key: states[key][0] for key in position}))
    steps: list[Step] = []
    done: dict[tuple[str, str], int] = {}
    for step in reversed(forward):
        key = (step.namespace, step.quota)
        if key not in position:
            continue
        # The forward steps of one quota, counted from the end: this is its k-th state.
        index = len(states[key]) - 1 - done.get(key, 0)
        done[key] = done.get(key, 0) + 1
        if index > position[key]:
            continue  # apply never got this quota this far
        steps.append(Step(step.quota, step.namespace, REVERSED_PHASE[step.phase],
                          states[key][index], states[key][index - 1]))
    for key, index in sorted(position.items()):
        if index == 0 and has_migration_annotations(live[key]):
            # Back at its original spec but still marked: one update that only drops the annotations.
            steps.append(Step(key[1], key[0], "restore", states[key][0], states[key][0]))
    refused.sort(key=lambda r: (r.namespace, r.quota))
    return RollbackPlan(steps, refused, sorted(unchanged))


def _key_relation_refusals(live: Mapping[tuple[str, str], Mapping[str, Any]],
                           restored: Mapping[tuple[str, str], Spec]) -> list[Refusal]:
    """Quotas whose restored max keys would not fit their parent's (or a child's) after the rollback.

    Koordinator refuses any update that leaves a child's max keys outside its parent's (identical
    keys without ElasticQuotaEnableUpdateResourceKey), so rolling back part of a migrated tree, or
    a leaf that was converted in one step under a canonical parent, cannot succeed there.
    """
    infos = {key: quota_from_object(obj) for key, obj in live.items()}
    by_name = {info.name: key for key, info in infos.items()}
    final = {key: set(restored[key]["max"]) if key in restored else set(info.max) for key, info in infos.items()}
    refusals: list[Refusal] = []
    for key in sorted(restored):
        info = infos[key]
        parent = by_name.get(info.parent) if info.parent != ROOT_QUOTA else None
        if parent is not None and not final[key] <= final[parent]:
            kept = "is restored too" if parent in restored else "is not rolled back"
            refusals.append(Refusal(info.name, info.namespace, (
                f"its original max keys {sorted(final[key])} are not within those of its parent "
                f"{infos[parent].name} {sorted(final[parent])}, which {kept}: Koordinator refuses that update; "
                "roll back the whole tree together, or restore this quota by hand")))
            continue
        for child in sorted(k for k, i in infos.items() if i.parent == info.name and k not in restored):
            if not final[child] <= final[key]:
                refusals.append(Refusal(info.name, info.namespace, (
                    f"its child {infos[child].name} is not rolled back and keeps max keys {sorted(final[child])}, "
                    f"which are not within its original {sorted(final[key])}: Koordinator refuses that update; "
                    "roll back the whole tree together, or restore this quota by hand")))
                break
    return refusals
