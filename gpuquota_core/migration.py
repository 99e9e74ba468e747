"""Plan the move of ElasticQuota trees from vendor GPU keys to canonical keys (I/O-free).

Koordinator's quota webhook (pkg/webhook/elasticquota/quota_topology_check.go) requires a child's
max keys to equal its parent's on every update; with ``ElasticQuotaEnableUpdateResourceKey`` only
child ⊆ parent. So with the gate the plan goes top-down adding canonical keys (legacy kept), then
bottom-up dropping the legacy keys: every intermediate state satisfies child ⊆ parent. Without the
gate a tree below a non-root parent cannot be changed one quota at a time, and the plan says so;
``all_at_once`` plans the maintenance-window procedure instead (detach, convert, reattach: see the
section "all at once" below).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .audit import audit_objects
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .gang_view import GANG_CHECKS
from .pod_records import pod_is_counted, pod_record
from .podspec import CONTAINER_KINDS, PodShapeError, mapping_or_empty, parse_resource_list
from .quantity import ZERO, Quantity, QuantityError
from .quota_admission import IN_PROGRESS, MIGRATION_IN_PROGRESS_ANNOTATION, review_quota_object
from .quota_integrity import PARENT_MISSING, tree_problems
from .quota_objects import (
    PARENT_LABEL,
    PREFIX,
    ROOT_QUOTA,
    QuotaInfo,
    QuotaShapeError,
    canonical_resource_list,
    legacy_gpu_names,
    quota_from_object,
)
from .quota_tree import QuotaTree
from .resources import VENDOR_WHOLE_GPU_NAMES, ResourceList, format_names
from .unjudged import ADMISSION_REVIEW
from .usage_index import UsageIndex

# Written by ``gpuquota migrate apply``: the spec before the first migration step (for rollback),
# and (MIGRATION_IN_PROGRESS_ANNOTATION, defined beside the webhook's quota review that reads it) a
# marker that a tree is between "add-canonical" and "drop-legacy", the one state in which a quota
# may name both GPU families.
PRE_MIGRATION_SPEC_ANNOTATION = "gpuquota.koord-gpuquota.io/pre-migration-spec"
# What koord-scheduler's quota controller writes on an ElasticQuota whenever its pods come and go: its
# usage summaries (Koordinator's apis/extension/elastic_quota.go), beside the status. A step planned
# from an object is still the right step after such a write, so a write refused for it is retried.
KOORDINATOR_SUMMARY_ANNOTATIONS = frozenset(
    PREFIX + name
    for name in ("runtime", "request", "child-request", "guaranteed", "allocated", "non-preemptible-request",
                 "non-preemptible-used"))


@dataclass(frozen=True, slots=True)
class Step:
    quota: str
    namespace: str
    phase: str  # "convert", "add-canonical", "drop-legacy", "detach-convert", "reattach", ... (see below)
    before: Mapping[str, Mapping[str, str]]  # {"min": {...}, "max": {...}}
    after: Mapping[str, Mapping[str, str]]
    # Only the all-at-once procedure moves quotas: the parent label before and after this step
    # (None when the step leaves the label alone).
    parent_before: str | None = None
    parent_after: str | None = None

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"quota": self.quota, "namespace": self.namespace, "phase": self.phase,
                                  "before": {k: dict(v) for k, v in self.before.items()},
                                  "after": {k: dict(v) for k, v in self.after.items()}}
        if self.parent_after is not None:
            result["parent"] = {"before": self.parent_before, "after": self.parent_after}
        return result


# Why a quota's step is blocked (stable ids, in ``migrate plan -o json``): besides the audit's
# quota-parent-missing, quota-duplicate-name and quota-parent-cycle (gpuquota_core.quota_integrity).
MULTI_LEVEL_TREE = "multi-level-tree"  # gate off: a parent and its children must change at once
OVER_LIMIT = "over-limit"  # usage already exceeds the canonical limit the step writes
TREE_ID = "tree-id"  # all-at-once: a quota with a tree id cannot be detached
KOORDINATOR_REFUSES = "koordinator-refuses"  # Koordinator's ElasticQuota webhook would refuse the step
REFUSED_BY_WEBHOOK = "refused-by-webhook"  # gpuquota's own ElasticQuota webhook would refuse the step
# An ElasticQuota that cannot be read: its place in the tree and its step are unknown, so no plan
# over the objects given can be trusted; the readable quotas are still planned, to show the rest.
UNREADABLE_QUOTA = "unreadable-quota"
# Not a block: a quota keeps its vendor keys beside the canonical ones while pods charged to it still
# store vendor names (a ``revisit`` entry says so; re-planning once they are replaced finishes it).
VENDOR_PODS_RUNNING = "vendor-pods-running"
# Phases after which ``migrate apply`` leaves a quota marked as migrating (cli/migrate.py writes the
# marker; the webhook then admits both GPU families in it).
MARKED_PHASES = frozenset({"add-canonical", "detach-convert"})


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why the plan cannot be applied, for one quota; ``reason`` is a stable id (see above)."""

    quota: str
    namespace: str
    reason: str
    message: str
    file: str | None = None  # the manifest the quota was read from, where known

    def as_dict(self) -> dict[str, str]:
        result = {"quota": self.quota, "namespace": self.namespace, "reason": self.reason, "message": self.message}
        return {**result, "file": self.file} if self.file else result


@dataclass(slots=True)
class Plan:
    steps: list[Step]
    blocked: list[Blocked]  # any entry blocks the whole plan (apply writes nothing)
    revisit: list[dict[str, Any]] = field(default_factory=list)  # workloads / ResourceQuotas to update
    # --all-at-once only: which steps form the maintenance window and which limits do not hold during it.
    window: list[str] = field(default_factory=list)
    # Objects given that the plan does not take into account, and why (an AdmissionReview): never silence.
    notes: list[str] = field(default_factory=list)

    def blocked_quotas(self) -> set[str]:
        return {entry.quota for entry in self.blocked}

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"steps": [s.as_dict() for s in self.steps],
                                  "blocked": [b.as_dict() for b in self.blocked], "revisit": self.revisit}
        if self.window:
            result["window"] = self.window
        if self.notes:
            result["notes"] = self.notes
        return result


def _text(resources: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in sorted(resources.items())}


def _depth(quota: QuotaInfo, by_name: Mapping[str, QuotaInfo]) -> int:
    depth, current, seen = 0, quota, {quota.name}
    while current.parent in by_name and current.parent not in seen:
        seen.add(current.parent)
        current = by_name[current.parent]
        depth += 1
    return depth


Origin = Callable[[Mapping[str, Any]], str | None]


def plan_migration(objects: Iterable[Mapping[str, Any]], update_resource_key_gate: bool = False,
                   config: ConversionConfig = DEFAULT_CONFIG, all_at_once: bool = False,
                   origin: Origin | None = None) -> Plan:
    """The steps of the migration. ``all_at_once`` (gate off only): the detach/convert/reattach
    procedure for multi-level trees instead of a blocked plan (see ``sequence_all_at_once``).

    An ElasticQuota that cannot be read is an ``unreadable-quota`` entry of ``blocked`` and the
    others are planned without it; an AdmissionReview is a note. ``origin`` names the file an
    object was read from, for both.
    """
    objects, unreadable_quotas = _without_unreadable_quotas(objects)
    unreadable = [_unreadable_block(obj, error, origin(obj) if origin is not None else None)
                  for obj, error in unreadable_quotas]
    notes = _not_planned(objects, origin)
    if all_at_once and not update_resource_key_gate:
        plan = _plan_all_at_once(objects, config)
    else:
        plan = _plan_step_by_step(objects, update_resource_key_gate, config)
    plan.blocked[:0] = unreadable
    plan.notes.extend(notes)
    unreadable_names = {entry.quota for entry in unreadable if entry.quota}
    if unreadable_names:
        # Left out of the tree, an unreadable parent would read as a missing one: say what it is.
        parents = {info.name: info.parent for info in (quota_from_object(o) for o in objects
                                                       if o.get("kind") == "ElasticQuota")}
        plan.blocked = [_below_unreadable(entry, parents[entry.quota])
                        if entry.reason == PARENT_MISSING and parents.get(entry.quota) in unreadable_names else entry
                        for entry in plan.blocked]
    return plan


def _without_unreadable_quotas(objects: Iterable[Mapping[str, Any]],
                               ) -> tuple[list[Mapping[str, Any]], list[tuple[Mapping[str, Any], QuotaShapeError]]]:
    """The objects without the ElasticQuotas that cannot be read, and each of those with its error
    (plan and rollback each say it in their own form: a block, a refusal)."""
    readable: list[Mapping[str, Any]] = []
    unreadable: list[tuple[Mapping[str, Any], QuotaShapeError]] = []
    for obj in objects:
        if obj.get("kind") == "ElasticQuota":
            try:
                quota_from_object(obj)
            except QuotaShapeError as error:
                unreadable.append((obj, error))
                continue
        readable.append(obj)
    return readable, unreadable


def _unreadable_block(obj: Mapping[str, Any], error: QuotaShapeError, file: str | None) -> Blocked:
    namespace, name = _key(obj)
    ref = f"{namespace}/{name or '?'}" if namespace else (name or "?")
    # quota_from_object starts most messages with the name; the reference here already says it.
    detail = str(error).removeprefix(f"ElasticQuota {name}: ").removeprefix(f"{name}: ") if name else str(error)
    where = f"{file}: " if file else ""
    return Blocked(name, namespace, UNREADABLE_QUOTA,
                   f"{where}ElasticQuota {ref} cannot be read: {detail}; where it sits in the tree and what its step "
                   "would be are unknown, so no plan over these quotas can be trusted: fix it and re-plan", file)


def _below_unreadable(entry: Blocked, parent: str) -> Blocked:
    return Blocked(entry.quota, entry.namespace, UNREADABLE_QUOTA,
                   f"ElasticQuota {entry.namespace}/{entry.quota} is below {parent}, an ElasticQuota that cannot be "
                   "read: its step cannot be judged until that quota is fixed")


def _not_planned(objects: Iterable[Mapping[str, Any]], origin: Origin | None) -> list[str]:
    notes = []
    for obj in objects:
        if obj.get("kind") == "AdmissionReview":
            file = origin(obj) if origin is not None else None
            notes.append(f"{f'{file}: ' if file else ''}AdmissionReview not planned: {ADMISSION_REVIEW}")
    return notes


def _plan_step_by_step(objects: list[Mapping[str, Any]], update_resource_key_gate: bool,
                       config: ConversionConfig) -> Plan:
    quotas = [quota_from_object(o) for o in objects if o.get("kind") == "ElasticQuota"]
    by_name = {q.name: q for q in quotas}
    legacy = [q for q in quotas if legacy_gpu_names(set(q.min) | set(q.max))]
    order = sorted(legacy, key=lambda q: (_depth(q, by_name), q.name))
    converted: dict[str, tuple[ResourceList, ResourceList]] = {}
    for quota in order:
        new_min, _ = canonical_resource_list(quota.min, config, quota.name)
        new_max, _ = canonical_resource_list(quota.max, config, quota.name)
        converted[quota.name] = (new_min, new_max)
    blocked = _tree_blocks(quotas, {q.name for q in legacy})
    vendor_pods = _vendor_pods_charged(objects, quotas, config)
    # koord-scheduler counts a pod under the names its stored spec holds, masked to the quota's max
    # keys: a quota that dropped nvidia.com/gpu would stop counting the pods still running with it.
    # Such a quota (and every ancestor, whose subtree holds those pods) keeps its vendor keys beside
    # the canonical ones, in the migrating state, until a later plan finds those pods replaced. Only
    # where Koordinator's ElasticQuota webhook allows the extra keys: under the root, or (with
    # ElasticQuotaEnableUpdateResourceKey) under a parent that keeps them too.
    keeps_vendor_keys: set[str] = set()
    for quota in order:
        if vendor_pods.get(quota.name) and (quota.parent == ROOT_QUOTA or (
                update_resource_key_gate and quota.parent in keeps_vendor_keys)):
            keeps_vendor_keys.add(quota.name)
    steps: list[Step] = []
    # A leaf under an already-canonical parent converts in one update (its keys then equal the
    # parent's); only legacy parents and their legacy children need coordinated steps.
    legacy_names = {q.name for q in legacy}
    parents = {q.parent for q in quotas}
    nested = [q for q in order if q.name in parents or (q.parent != ROOT_QUOTA and q.parent in legacy_names)]
    if nested and not update_resource_key_gate:
        message = ("quotas " + ", ".join(q.name for q in nested) + " are in a multi-level tree: with "
                   "ElasticQuotaEnableUpdateResourceKey off Koordinator requires identical max keys between "
                   "parent and child on every update, so these quotas must be changed at once (re-plan with "
                   "--all-at-once for the maintenance-window procedure, or enable the gate and re-plan)")
        blocked.extend(Blocked(q.name, q.namespace, MULTI_LEVEL_TREE, message) for q in nested)
    for quota in order:
        before = {"min": _text(quota.min), "max": _text(quota.max)}
        new_min, new_max = converted[quota.name]
        if (quota in nested and update_resource_key_gate) or quota.name in keeps_vendor_keys:
            union_min, union_max = _union(quota.min, new_min), _union(quota.max, new_max)
            steps.append(Step(quota.name, quota.namespace, "add-canonical", before,
                              {"min": _text(union_min), "max": _text(union_max)}))
        else:
            steps.append(Step(quota.name, quota.namespace, "convert", before,
                              {"min": _text(new_min), "max": _text(new_max)}))
    if update_resource_key_gate:
        for quota in reversed([q for q in order if q in nested and q.name not in keeps_vendor_keys]):
            new_min, new_max = converted[quota.name]
            union_min, union_max = _union(quota.min, new_min), _union(quota.max, new_max)
            steps.append(Step(quota.name, quota.namespace, "drop-legacy",
                              {"min": _text(union_min), "max": _text(union_max)},
                              {"min": _text(new_min), "max": _text(new_max)}))
    blocked.extend(_webhook_refusals(objects, steps, config))
    blocked.extend(_over_limit(objects, set(converted), config))
    kept = [_vendor_pods_note(quota, vendor_pods[quota.name], quota.name in keeps_vendor_keys)
            for quota in order if vendor_pods.get(quota.name)]
    return Plan(steps, blocked, kept + _revisit(objects, config))


def _vendor_pods_charged(objects: list[Mapping[str, Any]], quotas: list[QuotaInfo],
                         config: ConversionConfig) -> dict[str, list[str]]:
    """Per quota, the pods charged to it or below it whose stored spec asks for whole cards by a
    vendor name (``nvidia.com/gpu: 1``): the pods koord-scheduler counts only under that name."""
    tree = QuotaTree.build(quotas, config)
    usage = UsageIndex(tree)
    found: dict[str, list[str]] = {}
    for obj in objects:
        if obj.get("kind") != "Pod" or not pod_is_counted(obj) or not stored_vendor_names(obj):
            continue
        try:
            record = pod_record(obj, config)
        except ValueError:
            continue  # the audit reports a pod it cannot read; it holds nothing a plan can count
        usage.upsert(record)
        for quota in usage.charged_to(record.key):
            found.setdefault(quota, []).append(f"{record.namespace}/{record.name}")
    return found


def stored_vendor_names(pod: Mapping[str, Any]) -> set[str]:
    """The vendor whole-card names with a non-zero amount in any container of the pod as stored."""
    spec = mapping_or_empty(pod.get("spec"))
    names: set[str] = set()
    for kind in CONTAINER_KINDS:
        entries = spec.get(kind)
        for entry in entries if isinstance(entries, list) else ():
            resources = mapping_or_empty(entry.get("resources")) if isinstance(entry, Mapping) else {}
            for field_name in ("requests", "limits"):
                for name, value in mapping_or_empty(resources.get(field_name)).items():
                    if name in VENDOR_WHOLE_GPU_NAMES and _nonzero(value):
                        names.add(str(name))
    return names


def _nonzero(value: Any) -> bool:
    try:
        return Quantity.parse(value) != ZERO
    except (QuantityError, TypeError):
        return True  # unreadable: validation refuses such a pod; counted as asking, to be safe


def _vendor_pods_note(quota: QuotaInfo, pods: list[str], kept: bool) -> dict[str, Any]:
    """The revisit entry of a quota with pods that store vendor names: kept keys, or a warning where
    Koordinator's key rules leave no way to keep them."""
    shown = ", ".join(sorted(pods)[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    names = ", ".join(legacy_gpu_names(set(quota.max) | set(quota.min)))
    why = (f"{len(pods)} pod(s) charged to it still store {names} ({shown}), and koord-scheduler counts a pod only "
           "under the names it stores")
    if kept:
        message = (f"keeps {names} beside the canonical keys: {why}; run `gpuquota migrate plan` again once they "
                   "are replaced (recreated through the webhook) to drop the vendor keys")
    else:
        message = (f"koord-scheduler will not count these pods in this quota after the step: {why}, and "
                   f"Koordinator's key rules do not let this quota keep {names} below its parent {quota.parent}; "
                   "gpuquota's webhook still counts them, or replace them (recreate through the webhook) first")
    return {"kind": "ElasticQuota", "namespace": quota.namespace, "name": quota.name, "check": VENDOR_PODS_RUNNING,
            "message": message}


def _union(legacy: ResourceList, canonical: ResourceList) -> ResourceList:
    """``legacy`` with the canonical keys it lacks added: the state between add-canonical and
    drop-legacy. Min as well as max: Koordinator's ElasticQuota webhook requires a child's min keys
    to be within its parent's on every update, whatever the gates (checkSubAndParentGroupQuotaKey in
    pkg/webhook/elasticquota/quota_topology_check.go), so a child's canonical min must find the
    canonical keys already in its parent's min when the child drops its legacy ones."""
    return {**legacy, **{key: value for key, value in canonical.items() if key not in legacy}}


def _tree_blocks(quotas: list[QuotaInfo], migrated: set[str]) -> list[Blocked]:
    """A quota to be migrated that does not fit in the tree (a repeated name, a missing parent, a
    parent cycle): where its step leaves it cannot be known, nor what Koordinator will say."""
    return [Blocked(p.quota.name, p.quota.namespace, p.check, p.message)
            for p in tree_problems(quotas) if p.quota.name in migrated]


def _webhook_refusals(objects: list[Mapping[str, Any]], steps: list[Step], config: ConversionConfig) -> list[Blocked]:
    """Every step gpuquota's own validating webhook would refuse, replaying the steps in order.

    ``review_quota_object`` is what ``/validate-elasticquotas`` runs on each write ``apply`` sends
    (its server-side dry run would stop the run there). Not judged when a name is used twice: which
    object a step writes is then unknown (the plan is blocked for it already).
    """
    quota_objects = [o for o in objects if o.get("kind") == "ElasticQuota"]
    by_name = {_key(o)[1]: o for o in quota_objects}
    if len(by_name) != len(quota_objects):
        return []
    tree = QuotaTree.build((quota_from_object(o) for o in quota_objects), config)
    refusals: list[Blocked] = []
    for number, step in enumerate(steps, 1):
        written = _as_written(by_name[step.quota], step)
        review = review_quota_object(written, tree, {})
        if review.problems:
            refusals.append(Blocked(step.quota, step.namespace, REFUSED_BY_WEBHOOK,
                                    f"step {number} ({step.phase} {step.namespace}/{step.quota}) would be refused by "
                                    f"gpuquota's ElasticQuota webhook: {'; '.join(review.problems)}"))
        tree.upsert(quota_from_object(written))
        by_name[step.quota] = written
    return refusals


def _as_written(obj: Mapping[str, Any], step: Step) -> dict[str, Any]:
    """The quota as ``apply`` writes it in ``step``: spec, parent label and the migration marker."""
    metadata = dict(_meta_of(obj))
    labels = dict(metadata.get("labels") or {})
    if step.parent_after is not None:
        labels[PARENT_LABEL] = step.parent_after
    annotations = {k: v for k, v in _annotations(obj).items() if k != MIGRATION_IN_PROGRESS_ANNOTATION}
    if step.phase in MARKED_PHASES:
        annotations[MIGRATION_IN_PROGRESS_ANNOTATION] = IN_PROGRESS
    return {**obj, "metadata": {**metadata, "labels": labels, "annotations": annotations},
            "spec": {"min": dict(step.after["min"]), "max": dict(step.after["max"])}}


def _over_limit(objects: list[Mapping[str, Any]], migrated: set[str], config: ConversionConfig) -> list[Blocked]:
    # Usage is computed in canonical units, i.e. against exactly the limits the plan writes.
    usage = audit_objects(objects, ("quotas",), config)
    return [Blocked(finding.name, finding.namespace, OVER_LIMIT,
                    f"quota {finding.name}: {finding.message}; raise the limit before migrating")
            for finding in usage.findings if finding.check == "quota-over-limit" and finding.name in migrated]


def _revisit(objects: list[Mapping[str, Any]], config: ConversionConfig) -> list[dict[str, Any]]:
    # The same checks as `gpuquota audit`, so plan and audit agree on what else must change.
    report = audit_objects(objects, ("workloads", "resourcequotas"), config)
    # Gangs are about room, which a migration does not change: no workload is revisited for them.
    return [{"kind": f.kind, "namespace": f.namespace, "name": f.name, "check": f.check, "message": f.message}
            for f in report.findings if f.check not in GANG_CHECKS]


# -- rollback ------------------------------------------------------------------------------------
#
# ``gpuquota migrate rollback`` undoes ``apply`` in the reverse of apply's order. Apply moves a
# quota through at most three states: the original (s0), with the gate the union of legacy and
# canonical keys in max and min (s1, "add-canonical"), and the canonical spec (s2, "drop-legacy"/"convert").
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
    return mapping_or_empty(metadata)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = _meta_of(obj)
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = _meta_of(obj).get("annotations")
    return mapping_or_empty(annotations)


def _spec_of(obj: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    spec = obj.get("spec")
    spec = mapping_or_empty(spec)
    result: dict[str, dict[str, str]] = {}
    for section in ("min", "max"):
        value = spec.get(section)
        result[section] = {str(k): str(v) for k, v in mapping_or_empty(value).items()}
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


@dataclass(slots=True)
class Backup:
    """What a ``migrate apply --backup`` file holds, and the ElasticQuotas in it that cannot be read."""

    originals: dict[tuple[str, str], dict[str, dict[str, str]]]  # (namespace, name) -> original spec
    parents: dict[tuple[str, str], str]  # (namespace, name) -> original parent label
    refused: list[Refusal]  # one per item that cannot be read, naming it and the file


def read_backup(objects: Iterable[Mapping[str, Any]], file: str) -> Backup:
    """The originals and parents of a backup; an item that cannot be read is a refusal naming it and
    ``file`` (its original spec is unknown, so it cannot be restored), never the end of the others."""
    backup = Backup({}, {}, [])
    for obj in objects:
        if obj.get("kind") != "ElasticQuota":
            continue
        key = _key(obj)
        try:
            if not key[1]:
                raise QuotaShapeError("metadata.name: missing")
            parent = quota_from_object(obj).parent
        except QuotaShapeError as error:
            backup.refused.append(_unreadable_refusal(
                obj, error, f"in the backup {file}", "its original spec is unknown, so it cannot be restored: "
                "fix that item of the backup and run rollback again"))
            continue
        backup.originals[key] = _spec_of(obj)
        backup.parents[key] = parent
    return backup


def originals_from_annotations(objects: Iterable[Mapping[str, Any]],
                               ) -> tuple[dict[tuple[str, str], dict[str, dict[str, str]]], list[Refusal]]:
    """(namespace, name) -> the spec each live quota's pre-migration annotation recorded, and a
    refusal for each annotation that cannot be read (the others are still returned)."""
    originals: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    refused: list[Refusal] = []
    for obj in objects:
        if obj.get("kind") != "ElasticQuota":
            continue
        try:
            recorded = original_from_annotation(obj)
        except RollbackSourceError as error:
            namespace, name = _key(obj)
            refused.append(Refusal(name or "?", namespace, str(error).removeprefix(f"ElasticQuota {namespace}/{name}: ")
                                   + ": its original spec is unknown, so it cannot be restored; restore it by hand"))
            continue
        if recorded is not None:
            originals[_key(obj)] = recorded
    return originals, refused


def _unreadable_refusal(obj: Mapping[str, Any], error: QuotaShapeError, where: str, consequence: str) -> Refusal:
    namespace, name = _key(obj)
    # quota_from_object starts most messages with the name; the refusal line already says it.
    detail = str(error).removeprefix(f"ElasticQuota {name}: ").removeprefix(f"{name}: ") if name else str(error)
    return Refusal(name or "?", namespace, f"{where}: cannot be read: {detail}; {consequence}")


def _same(left: Spec, right: Spec) -> bool:
    try:
        return all(parse_resource_list(dict(left.get(s, {})), s) == parse_resource_list(dict(right.get(s, {})), s)
                   for s in ("min", "max"))
    except PodShapeError:
        return False


def _with_spec(obj: Mapping[str, Any], spec: Spec) -> dict[str, Any]:
    old = obj.get("spec")
    return {**obj, "spec": {**mapping_or_empty(old),
                            "min": dict(spec["min"]), "max": dict(spec["max"])}}


def _describe(spec: Spec) -> str:
    return "; ".join(f"{section} {{{', '.join(f'{k}: {v}' for k, v in sorted(spec[section].items()))}}}"
                     for section in ("min", "max"))


def plan_rollback(objects: Iterable[Mapping[str, Any]],
                  originals: Mapping[tuple[str, str], Spec] | None = None,
                  config: ConversionConfig = DEFAULT_CONFIG,
                  original_parents: Mapping[tuple[str, str], str] | None = None,
                  all_at_once: bool | None = None) -> RollbackPlan:
    """The steps that bring live quotas back to their original spec, in the reverse of apply's order.

    ``objects``: the live cluster (all ElasticQuotas, for the tree). ``originals``: (namespace,
    name) -> {"min", "max"} from a backup; without it, every quota's pre-migration annotation.
    A quota whose spec is not one of the states ``migrate apply`` leaves (someone changed it since)
    is refused; the caller writes nothing when any quota is refused.

    ``all_at_once``: undo ``migrate apply --all-at-once`` (gate off) with the same
    detach/restore/reattach procedure; None decides from the quotas: a pre-migration annotation
    that recorded the parent, or a parent label that differs from ``original_parents`` (the
    backup's), means the all-at-once procedure wrote them.
    """
    # Where such a quota sits in the tree is unknown, so no rollback over that tree can be trusted.
    objects, unreadable_quotas = _without_unreadable_quotas(objects)
    refused = [_unreadable_refusal(obj, error, "in the cluster", "where it sits in the tree is unknown, so no "
                                   "rollback over these quotas can be trusted: fix it and run rollback again")
               for obj, error in unreadable_quotas]
    unreadable = {(r.namespace, r.quota) for r in refused}
    live = {_key(o): o for o in objects if o.get("kind") == "ElasticQuota"}
    if originals is None:
        originals, annotation_refusals = originals_from_annotations(objects)
        refused.extend(annotation_refusals)
    wanted: dict[tuple[str, str], Spec] = {}
    for key, original in sorted(originals.items()):
        if key in live:
            wanted[key] = original
        elif key not in unreadable:
            refused.append(Refusal(key[1], key[0], "not found in the cluster; nothing to restore it onto"))
    parents = dict(original_parents or {})
    if all_at_once is None:
        live_parents = {key: quota_from_object(live[key]).parent for key in wanted}
        all_at_once = any(recorded_parent(live[key]) is not None
                          or parents.get(key, live_parents[key]) != live_parents[key] for key in wanted)
    if all_at_once:
        return _rollback_all_at_once(objects, live, wanted, parents, refused, config)
    # The world as it was before apply, so the forward plan (and its intermediate states) is
    # recomputed exactly; the gate is assumed on: without it apply only touches a tree with
    # --all-at-once, which is handled above.
    before_world = [_with_spec(o, wanted[_key(o)]) if _key(o) in wanted else o for o in objects]
    forward = [s for s in plan_migration(before_world, True, config).steps if (s.namespace, s.quota) in wanted]
    states: dict[tuple[str, str], list[Spec]] = {key: [spec] for key, spec in wanted.items()}
    for step in forward:
        states[(step.namespace, step.quota)].append(step.after)
    position, unchanged = _locate(states, live, refused, "gpuquota migrate apply", lambda key: True)
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


def _locate(states: Mapping[tuple[str, str], list[Spec]], live: Mapping[tuple[str, str], Mapping[str, Any]],
            refused: list[Refusal], writer: str, in_original_place: Callable[[tuple[str, str]], bool],
            ) -> tuple[dict[tuple[str, str], int], list[str]]:
    """Where each live quota stands in the sequence of states ``writer`` takes it through.

    Returns the index of its current state per quota, and the quotas still untouched (original
    state, original place, no migration annotations). A quota in none of the states was changed by
    someone else since: it is refused, so rollback never overwrites a change it did not make.
    """
    position: dict[tuple[str, str], int] = {}
    unchanged: list[str] = []
    for key, sequence in states.items():
        current = _spec_of(live[key])
        matches = [index for index, state in enumerate(sequence) if _same(current, state)]
        if not matches:
            refused.append(Refusal(key[1], key[0], (
                f"changed since the migration: its spec is {_describe(current)}, which is neither the original "
                f"({_describe(sequence[0])}) nor a state `{writer}` writes")))
            continue
        position[key] = matches[-1]
        if matches[-1] == 0 and in_original_place(key) and not has_migration_annotations(live[key]):
            unchanged.append(f"{key[0]}/{key[1]}")
    return position, unchanged


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
                f"its original max keys {format_names(final[key])} are not within those of its parent "
                f"{infos[parent].name} {format_names(final[parent])}, which {kept}: Koordinator refuses that update; "
                "roll back the whole tree together, or restore this quota by hand")))
            continue
        for child in sorted(k for k, i in infos.items() if i.parent == info.name and k not in restored):
            if not final[child] <= final[key]:
                refusals.append(Refusal(info.name, info.namespace, (
                    f"its child {infos[child].name} is not rolled back and keeps max keys "
                    f"{format_names(final[child])}, which are not within its original {format_names(final[key])}: "
                    "Koordinator refuses that update; "
                    "roll back the whole tree together, or restore this quota by hand")))
                break
    return refusals


# -- all at once (ElasticQuotaEnableUpdateResourceKey off) ---------------------------------------
#
# With the gate off, Koordinator's ElasticQuota webhook (validateQuotaTopology,
# pkg/webhook/elasticquota/quota_topology_check.go)
# judges every create or update of a quota Q against Q's current neighbours, and only Q:
#   * Q's parent is the root quota and Q is not is-parent: no topology check at all;
#   * otherwise Q's max keys must be identical to its parent's (unless that is the root quota)
#     and to each current child's.
# In a tree of two or more attached quotas with the same keys, whichever quota changes keys first
# then differs from an attached neighbour, so no order of spec updates alone is accepted. What the
# rules do accept: a quota whose parent label says root (and, if it is a parent, whose children
# are all elsewhere) may change its keys freely, and a quota may be attached under a parent whose
# keys equal its own. The procedure, depth first, children before their parent:
#   * a legacy quota whose parent is legacy too is moved to the root and converted in one update
#     ("detach-convert"); its own children were already put back under it, so a converted subtree
#     stays whole and only its link upward is cut;
#   * a quota whose parent keeps its keys (or whose parent is the root) converts in place ("convert");
#   * right after a quota is converted, its detached children go back under it ("reattach").
# Each link is cut from the child's conversion to its parent's, the shortest these rules allow.
# While cut, the child's pods are bounded by its own subtree only: neither Koordinator nor
# koord-gpuquota's webhook apply the parent's (or any ancestor's) limit to them. ``_window`` says
# so in the plan, in canonical units.

FORWARD_PHASES: Mapping[str, str] = {"detach": "detach-convert", "in-place": "convert", "reattach": "reattach"}
ROLLBACK_PHASES: Mapping[str, str] = {"detach": "detach-restore", "in-place": "restore", "reattach": "reattach"}
DETACH_PHASES = frozenset({"detach-convert", "detach-restore"})


@dataclass(frozen=True, slots=True)
class Placement:
    """What Koordinator's topology check looks at for one quota."""

    parent: str
    is_parent: bool
    max_keys: frozenset[str]
    tree_id: str = ""


def placement_of(quota: QuotaInfo) -> Placement:
    return Placement(quota.parent, quota.is_parent, frozenset(quota.max), quota.tree_id)


def koordinator_topology_refusal(world: Mapping[str, Placement], name: str,
                                 update_resource_key_gate: bool = False) -> str | None:
    """Koordinator's ElasticQuota webhook on an update that leaves ``world[name]`` as given.

    Only the topology checks (pkg/webhook/elasticquota/quota_topology_check.go) a migration can trip
    (parent present and is-parent, tree id, max keys equal to the parent's and every child's; child
    ⊆ parent with the gate), with Koordinator's wording. None when the update would be accepted.
    """
    quota = world[name]
    if quota.parent == ROOT_QUOTA and not quota.is_parent:
        return None

    def key_problem(child: str, parent: str) -> str | None:
        child_keys, parent_keys = world[child].max_keys, world[parent].max_keys
        if update_resource_key_gate:
            if child_keys <= parent_keys:
                return None
            relation = "are not all included in"
        else:
            if child_keys == parent_keys:
                return None
            relation = "are not the same with"
        return (f"failed to check sub and parent group quotaKey, err: checkSubAndParentGroupQuotaKey failed: "
                f"{child}'s max keys {relation} {parent}'s")

    if quota.parent != ROOT_QUOTA:
        parent = world.get(quota.parent)
        if parent is None:
            return f"{name} has parentName {quota.parent} but not find parentInfo in quotaInfoMap"
        if not parent.is_parent:
            return f"{name} has parentName {quota.parent} but the parentQuotaInfo's IsParent is false"
        if parent.tree_id != quota.tree_id:
            return f"{name} tree id is different from parent {quota.parent}, [{quota.tree_id}] vs [{parent.tree_id}]"
        problem = key_problem(name, quota.parent)
        if problem:
            return problem
    for child in sorted(n for n, p in world.items() if p.parent == name and n != name):
        problem = key_problem(child, name)
        if problem:
            return problem
    return None


@dataclass(frozen=True, slots=True)
class Placed:
    """A quota's spec and parent label, before or after the procedure."""

    spec: Spec
    parent: str


def sequence_all_at_once(namespaces: Mapping[str, str], current: Mapping[str, Placed],
                         target: Mapping[str, Placed], phases: Mapping[str, str] = FORWARD_PHASES) -> list[Step]:
    """The detach/convert/reattach order that takes every quota from ``current`` to ``target``.

    Keys of all three mappings are quota names (names are cluster-wide in Koordinator). The tree
    walked is ``target``'s (the parents the quotas end under); a quota whose target equals its
    current state gets no step, except a reattach when it sits detached below a parent that moves.
    """
    names = set(current)

    def keys_change(name: str) -> bool:
        return set(current[name].spec["max"]) != set(target[name].spec["max"])

    children: dict[str, list[str]] = {}
    for name in sorted(names):
        children.setdefault(target[name].parent, []).append(name)
    steps: list[Step] = []
    detached: set[str] = set()
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for child in children.get(name, []):
            visit(child)
        now, goal = current[name], target[name]
        # Post-order: the parent has not been written yet, so it still has its current keys.
        parent_moves = goal.parent in names and keys_change(goal.parent)
        detach = parent_moves and (keys_change(name) or now.parent != goal.parent)
        where = ROOT_QUOTA if detach else goal.parent
        spec_changes = not _same(now.spec, goal.spec)
        moved = now.parent != where
        if spec_changes or moved:
            kind = "detach" if detach else ("in-place" if spec_changes else "reattach")
            steps.append(Step(name, namespaces[name], phases[kind], now.spec, goal.spec,
                              now.parent if moved else None, where if moved else None))
        if detach:
            detached.add(name)
        for child in children.get(name, []):
            if child in detached:
                steps.append(Step(child, namespaces[child], phases["reattach"], target[child].spec,
                                  target[child].spec, ROOT_QUOTA, name))

    for root in sorted(n for n in names if target[n].parent not in names):
        visit(root)
    for rest in sorted(names - seen):  # a parent cycle: no root to start from
        visit(rest)
    return steps


def simulate_koordinator(placements: Mapping[str, Placement], steps: Iterable[Step],
                         update_resource_key_gate: bool = False) -> list[str]:
    """Every step Koordinator's ElasticQuota webhook would refuse, replaying ``steps`` in order."""
    return [message for _, message in koordinator_refusals(placements, steps, update_resource_key_gate)]


def koordinator_refusals(placements: Mapping[str, Placement], steps: Iterable[Step],
                         update_resource_key_gate: bool = False) -> list[tuple[Step, str]]:
    """:func:`simulate_koordinator` with the step each refusal is about."""
    world = dict(placements)
    refusals: list[tuple[Step, str]] = []
    for number, step in enumerate(steps, 1):
        old = world[step.quota]
        world[step.quota] = Placement(step.parent_after if step.parent_after is not None else old.parent,
                                      old.is_parent, frozenset(step.after["max"]), old.tree_id)
        refusal = koordinator_topology_refusal(world, step.quota, update_resource_key_gate)
        if refusal:
            refusals.append((step, f"step {number} ({step.phase} {step.namespace}/{step.quota}) would be refused by "
                                   f"Koordinator's ElasticQuota webhook: {refusal}"))
    return refusals


def recorded_parent(obj: Mapping[str, Any]) -> str | None:
    """The parent label ``migrate apply --all-at-once`` recorded with the original spec, if any."""
    raw = _annotations(obj).get(PRE_MIGRATION_SPEC_ANNOTATION)
    try:
        loaded = json.loads(str(raw)) if raw is not None else None
    except ValueError:
        return None
    parent = loaded.get("parent") if isinstance(loaded, Mapping) else None
    return parent if isinstance(parent, str) and parent else None


def _in_progress(obj: Mapping[str, Any]) -> bool:
    return _annotations(obj).get(MIGRATION_IN_PROGRESS_ANNOTATION) == IN_PROGRESS


def _plan_all_at_once(objects: list[Mapping[str, Any]], config: ConversionConfig) -> Plan:
    quota_objects = [o for o in objects if o.get("kind") == "ElasticQuota"]
    infos = {info.name: info for info in (quota_from_object(o) for o in quota_objects)}
    current: dict[str, Placed] = {}
    target: dict[str, Placed] = {}
    migrated: set[str] = set()
    for obj in quota_objects:
        info = infos[_key(obj)[1]]
        before = {"min": _text(info.min), "max": _text(info.max)}
        after = before
        if legacy_gpu_names(set(info.min) | set(info.max)):
            new_min, _ = canonical_resource_list(info.min, config, info.name)
            new_max, _ = canonical_resource_list(info.max, config, info.name)
            after = {"min": _text(new_min), "max": _text(new_max)}
            migrated.add(info.name)
        # A quota an earlier, stopped run left detached goes back under the parent it recorded.
        parent = info.parent
        if parent == ROOT_QUOTA and _in_progress(obj) and (recorded := recorded_parent(obj)) is not None:
            parent = recorded
        current[info.name] = Placed(before, info.parent)
        target[info.name] = Placed(after, parent)
    steps = sequence_all_at_once({n: i.namespace for n, i in infos.items()}, current, target)
    blocked = _tree_blocks([quota_from_object(o) for o in quota_objects], {step.quota for step in steps})
    tree_ids = [Blocked(step.quota, step.namespace, TREE_ID,
                        f"quota {step.quota} has tree-id {infos[step.quota].tree_id!r}: Koordinator requires a "
                        "quota's tree id to equal its parent's and never lets it change, so it cannot be detached to "
                        "the root quota; the all-at-once procedure cannot migrate this tree (enable "
                        "ElasticQuotaEnableUpdateResourceKey and use the step-by-step plan)")
                for step in steps if step.phase in DETACH_PHASES and infos[step.quota].tree_id]
    blocked.extend(tree_ids)
    if not tree_ids:
        placements = {n: placement_of(i) for n, i in infos.items()}
        blocked.extend(Blocked(step.quota, step.namespace, KOORDINATOR_REFUSES, message)
                       for step, message in koordinator_refusals(placements, steps))
    blocked.extend(_webhook_refusals(objects, steps, config))
    blocked.extend(_over_limit(objects, migrated, config))
    return Plan(steps, blocked, _revisit(objects, config), _window(steps, infos, target))


def _braces(resources: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(resources.items())) + "}"


def _window(steps: list[Step], infos: Mapping[str, QuotaInfo], target: Mapping[str, Placed]) -> list[str]:
    """The maintenance window of an all-at-once plan: which limits do not hold, in canonical units."""
    spans: dict[str, tuple[int, int]] = {}
    for number, step in enumerate(steps, 1):
        if step.phase in DETACH_PHASES or (step.parent_after == ROOT_QUOTA and step.quota not in spans):
            spans[step.quota] = (number, number)
        elif step.phase == "reattach" and step.quota in spans:
            spans[step.quota] = (spans[step.quota][0], number)
    if not spans:
        return []
    first, last = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    lines = [f"steps {first}-{last} are one maintenance window: with ElasticQuotaEnableUpdateResourceKey off, "
             "Koordinator refuses any update that leaves an attached parent and child with different max keys, so "
             f"{', '.join(sorted(spans))} leave their parent (parent label {ROOT_QUOTA}) while keys change and are "
             "reattached right after; run the whole plan with `gpuquota migrate apply --all-at-once --backup FILE` "
             "and let nothing else edit these quotas until it ends"]

    def ancestors(name: str) -> list[str]:
        chain, seen = [], {name}
        parent = target[name].parent
        while parent in target and parent not in seen:
            chain.append(parent)
            seen.add(parent)
            parent = target[parent].parent
        return chain

    for name, (start, end) in sorted(spans.items(), key=lambda item: item[1]):
        chain = ancestors(name)
        parent = chain[0] if chain else target[name].parent
        above = f" nor by {', '.join(chain[1:])} above it" if len(chain) > 1 else ""
        lines.append(f"steps {start}-{end}: {name} is detached from {parent}: pods in its subtree are limited by its "
                     f"own max {_braces(target[name].spec['max'])} (canonical units) and not by {parent}'s max "
                     f"{_braces(target[parent].spec['max']) if parent in target else '{}'}{above}")
    children: dict[str, list[str]] = {}
    for name in sorted(target):
        children.setdefault(target[name].parent, []).append(name)

    def reach(name: str, key: str, seen: frozenset[str]) -> Quantity | None:
        """How much of ``key`` pods under ``name`` can hold during the window (None: unbounded).

        Conservatively, a quota detached at any time in the window counts as detached throughout.
        """
        own = parse_resource_list(dict(target[name].spec["max"]), "spec.max").get(key)
        kids = [c for c in children.get(name, []) if c not in seen]
        if not kids:
            return own
        attached: Quantity | None = Quantity.parse(0)
        loose: Quantity | None = Quantity.parse(0)
        for kid in kids:
            bound = reach(kid, key, seen | {name})
            if kid in spans:
                loose = None if loose is None or bound is None else loose + bound
            else:
                attached = None if attached is None or bound is None else attached + bound
        capped = own if attached is None else attached if own is None else min(own, attached)
        return None if capped is None or loose is None else capped + loose

    for parent in sorted({a for n in spans for a in ancestors(n)}):
        limit = parse_resource_list(dict(target[parent].spec["max"]), "spec.max")
        reached = {key: reach(parent, key, frozenset()) for key in limit}
        over = {key: "unbounded" if q is None else q - limit[key] for key, q in reached.items()
                if q is None or limit[key] < q}
        shown = {key: "unbounded" if q is None else q for key, q in reached.items()}
        if not over:
            lines.append(f"{parent}: its max {_braces(limit)} still holds during the window: with every detached "
                         f"quota held to its own max, pods under {parent} can use at most {_braces(shown)}")
        else:
            lines.append(f"{parent}: during the window pods under {parent} can use up to {_braces(shown)}, above "
                         f"its max {_braces(limit)} by {_braces(over)}: keep the window short, or lower the "
                         "children's max first")
    return lines


def _with_parent(obj: Mapping[str, Any], parent: str) -> dict[str, Any]:
    metadata = dict(_meta_of(obj))
    labels = metadata.get("labels")
    metadata["labels"] = {**mapping_or_empty(labels), PARENT_LABEL: parent}
    return {**obj, "metadata": metadata}


def _rollback_all_at_once(objects: list[Mapping[str, Any]], live: Mapping[tuple[str, str], Mapping[str, Any]],
                          wanted: Mapping[tuple[str, str], Spec], parents: Mapping[tuple[str, str], str],
                          refused: list[Refusal], config: ConversionConfig) -> RollbackPlan:
    """Undo ``migrate apply --all-at-once``: back to the original spec and parent, gate off."""
    infos = {key: quota_from_object(obj) for key, obj in live.items()}

    def original_parent(key: tuple[str, str]) -> str:
        return parents.get(key) or recorded_parent(live[key]) or infos[key].parent

    # The world before apply, so its states (original, canonical) are recomputed exactly.
    before_world = [_with_parent(_with_spec(o, wanted[_key(o)]), original_parent(_key(o)))
                    if _key(o) in wanted else o for o in objects]
    forward = [s for s in _plan_all_at_once(before_world, config).steps if (s.namespace, s.quota) in wanted]
    states: dict[tuple[str, str], list[Spec]] = {key: [spec] for key, spec in wanted.items()}
    for step in forward:
        if not _same(step.after, states[(step.namespace, step.quota)][-1]):
            states[(step.namespace, step.quota)].append(step.after)
    position, unchanged = _locate(states, live, refused, "gpuquota migrate apply --all-at-once",
                                  lambda key: infos[key].parent == original_parent(key))
    settled = {key: _with_parent(obj, original_parent(key)) if key in position else obj for key, obj in live.items()}
    refused.extend(_key_relation_refusals(settled, {key: states[key][0] for key in position}))
    by_name = {info.name: key for key, info in infos.items()}
    current_places = {info.name: Placed(_spec_of(live[key]), info.parent) for key, info in infos.items()}
    target_places = dict(current_places)
    for key in position:
        target_places[infos[key].name] = Placed(states[key][0], original_parent(key))
    steps = sequence_all_at_once({n: k[0] for n, k in by_name.items()}, current_places, target_places,
                                 ROLLBACK_PHASES)
    written = {(s.namespace, s.quota) for s in steps}
    for key in sorted(position):
        if key not in written and has_migration_annotations(live[key]):
            # Back at its original spec and parent but still marked: one update that only drops the annotations.
            steps.append(Step(key[1], key[0], "restore", states[key][0], states[key][0]))
    refused.sort(key=lambda r: (r.namespace, r.quota))
    return RollbackPlan(steps, refused, sorted(unchanged))


def changed_only_by_koordinator_bookkeeping(read: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether ``now`` differs from ``read`` (one ElasticQuota, as read and as stored) only in what
    Koordinator's quota controller keeps up to date on it: its status, its summary annotations, and
    the bookkeeping metadata every write changes. Spec, labels, every other annotation and the
    object's identity must be as read."""
    def planned_from(quota: Mapping[str, Any]) -> tuple[object, ...]:
        metadata = quota.get("metadata") or {}
        annotations = {key: value for key, value in (metadata.get("annotations") or {}).items()
                       if key not in KOORDINATOR_SUMMARY_ANNOTATIONS}
        return (quota.get("spec"), metadata.get("uid"), metadata.get("labels") or {}, annotations,
                metadata.get("finalizers") or [], metadata.get("deletionTimestamp"))

    return planned_from(read) == planned_from(now)
