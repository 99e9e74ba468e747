"""Whether ElasticQuotas form a tree: names used once, parents that exist, no parent cycles.

Quota names are a cluster-wide key in Koordinator: its webhook
(pkg/webhook/elasticquota/quota_topology.go) refuses a second quota of an existing name in any
namespace and a parent that does not exist; which of two copies its scheduler uses depends on the
order it reads them. Both the whole-set view (the audit, ``migrate plan``, loading
``serve --state``) and the one-object view (the validating webhook on a CREATE or UPDATE) are here,
with one wording, so the audit, the plan and the webhook name a broken tree alike. The webhook
refuses a taken name and a cycle, not a missing parent (see :func:`placement_problems`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .quota_objects import PARENT_LABEL, ROOT_QUOTA, QuotaInfo
from .quota_tree import keeps

# Stable ids: audit check ids (docs/audit-checks.md) and ``migrate plan`` blocked reasons.
DUPLICATE_NAME = "quota-duplicate-name"
PARENT_MISSING = "quota-parent-missing"
# The parent exists but cannot be read (itself reported ``quota-invalid``): not missing, and the fix
# is the parent object, not this quota's label.
PARENT_UNREADABLE = "quota-parent-unreadable"
PARENT_CYCLE = "quota-parent-cycle"


@dataclass(frozen=True, slots=True)
class TreeProblem:
    """One quota that does not fit in the tree, and why (``check`` is one of the ids above)."""

    check: str
    quota: QuotaInfo
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)  # the other quotas concerned


class QuotaTreeError(ValueError):
    """ElasticQuotas that do not form a tree; the message names every quota concerned."""

    def __init__(self, problems: Sequence[TreeProblem], source: str = "") -> None:
        self.problems = tuple(problems)
        # One line per distinct message: a cycle or a duplicate is reported once, not per member.
        lines = list(dict.fromkeys(problem.message for problem in problems))
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + "the ElasticQuotas do not form a tree: " + "; ".join(lines))


def duplicate_message(name: str, refs: Sequence[str]) -> str:
    return (f"ElasticQuota name {name} is used by {len(refs)} quotas ({', '.join(refs)}): quota names are "
            "cluster-wide in Koordinator, so only one of them can limit the pods bound to that name")


def taken_name_message(quota: QuotaInfo, existing: QuotaInfo) -> str:
    return (f"ElasticQuota name {quota.name} is already used by {existing.ref}: quota names are cluster-wide "
            "in Koordinator; choose another name")


def missing_parent_message(quota: QuotaInfo) -> str:
    return (f"ElasticQuota {quota.ref} names parent {quota.parent} (label {PARENT_LABEL}), which does not "
            f"exist: no ancestor limits its pods; create the parent first or fix the label")


def unreadable_parent_message(quota: QuotaInfo) -> str:
    return (f"ElasticQuota {quota.ref} names parent {quota.parent} (label {PARENT_LABEL}), which exists but "
            "cannot be read: which limits apply to its pods above its own is unknown; fix that ElasticQuota")


def cycle_message(names: Sequence[str]) -> str:
    return (f"the parent labels of ElasticQuotas {' -> '.join([*names, names[0]])} form a cycle: none of them "
            "reaches the root quota")


def tree_problems(quotas: Iterable[QuotaInfo], unreadable: Collection[str] = ()) -> list[TreeProblem]:
    """Every quota that breaks the tree: per copy of a repeated name, per quota whose parent is
    missing, and per member of a parent cycle (each member gets the same message).

    ``unreadable``: names of ElasticQuotas that exist but cannot be read (left out of ``quotas``);
    a quota below one of them is ``quota-parent-unreadable``, not a quota whose parent is missing.
    """
    quotas = list(quotas)
    by_name: dict[str, list[QuotaInfo]] = {}
    for quota in quotas:
        by_name.setdefault(quota.name, []).append(quota)
    problems: list[TreeProblem] = []
    for name, copies in by_name.items():
        if len(copies) > 1:
            message = duplicate_message(name, [q.ref for q in copies])
            refs = [q.ref for q in copies]
            problems.extend(TreeProblem(DUPLICATE_NAME, q, message, {"quotas": refs}) for q in copies)
    for quota in quotas:
        if _has_parent(quota) and quota.parent not in by_name:
            if quota.parent in unreadable:
                problems.append(TreeProblem(PARENT_UNREADABLE, quota, unreadable_parent_message(quota),
                                            {"parent": quota.parent}))
            else:
                problems.append(TreeProblem(PARENT_MISSING, quota, missing_parent_message(quota),
                                            {"parent": quota.parent}))
    # Cycles on the tree as QuotaTree.build keeps it (one copy of a repeated name: QuotaTree.keeps).
    kept: dict[str, QuotaInfo] = {}
    for quota in quotas:
        if keeps(kept.get(quota.name), quota):
            kept[quota.name] = quota
    for cycle in _cycles(kept):
        message = cycle_message(cycle)
        problems.extend(TreeProblem(PARENT_CYCLE, kept[name], message, {"cycle": cycle}) for name in cycle)
    return problems


def check_tree(quotas: Iterable[QuotaInfo], source: str = "") -> None:
    """Raise :class:`QuotaTreeError` for a repeated name or a parent cycle.

    For a fixed set of quotas (``serve --state``) both are mistakes in the files, better fixed
    before serving than enforced silently: one copy of a repeated name would be ignored, and a
    cycle has no root. A missing parent is left to the audit
    (its quota is still enforced, by its own limit), as the live webhook leaves it (see
    :func:`placement_problems`).
    """
    fatal = [p for p in tree_problems(quotas) if p.check in (DUPLICATE_NAME, PARENT_CYCLE)]
    if fatal:
        raise QuotaTreeError(fatal, source)


def placement_problems(quota: QuotaInfo, lookup: Callable[[str], QuotaInfo | None]) -> list[str]:
    """Why the webhook refuses to store ``quota`` among the quotas ``lookup`` finds by name: a name
    another namespace's quota uses, or a parent label that closes a cycle.

    A stored quota of the same name and namespace is this object's own current version (an
    UPDATE); when its parent stays the same nothing about its place changes and, as in
    Koordinator's webhook, the place is not judged again.

    A parent that does not exist is not refused here (the audit and ``migrate plan`` report it):
    the webhook knows the quotas through a watch, and a tree applied in one go (``kubectl apply``
    of a parent and its children) would see children refused whenever the watch had not yet
    delivered their parent. A stale view can only miss the two refusals above, never make one up
    (a quota deleted and at once re-created elsewhere is the exception: its retry passes).
    """
    existing = lookup(quota.name)
    if existing is not None and existing.namespace != quota.namespace:
        return [taken_name_message(quota, existing)]
    if existing is not None and existing.parent == quota.parent:
        return []
    path = [quota.name]
    current = quota.parent if _has_parent(quota) else ""
    while current and current != ROOT_QUOTA:
        if current == quota.name:
            return [cycle_message(path)]
        parent = lookup(current)
        if parent is None or current in path:
            return []  # not known (yet), or a cycle above that does not pass through this quota
        path.append(current)
        current = parent.parent
    return []


def _has_parent(quota: QuotaInfo) -> bool:
    return bool(quota.parent) and quota.parent != ROOT_QUOTA


def _cycles(by_name: dict[str, QuotaInfo]) -> list[list[str]]:
    """Each parent cycle once, as its members in parent order starting from the smallest name."""
    state: dict[str, int] = {}  # 1: on the current walk, 2: done
    cycles: list[list[str]] = []
    for start in sorted(by_name):
        walk: list[str] = []
        current: str | None = start
        while current is not None and current in by_name and state.get(current) is None:
            state[current] = 1
            walk.append(current)
            parent = by_name[current].parent
            current = parent if parent and parent != ROOT_QUOTA else None
        if current is not None and state.get(current) == 1:
            cycle = walk[walk.index(current):]
            first = cycle.index(min(cycle))
            cycles.append(cycle[first:] + cycle[:first])
        for name in walk:
            state[name] = 2
    return cycles


__all__ = ["DUPLICATE_NAME", "PARENT_CYCLE", "PARENT_MISSING", "PARENT_UNREADABLE", "QuotaTreeError", "TreeProblem",
           "check_tree", "placement_problems", "tree_problems", "unreadable_parent_message"]
