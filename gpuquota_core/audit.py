"""Audit checks over a set of Kubernetes objects, with the webhook's own conversion and validation.

I/O-free: callers hand in already-loaded objects (from files or a live list). Every check reuses
the core the webhook runs, so an audit finding means the webhook would act on that object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from .canonical import canonicalize_pod_spec
from .conversion import DEFAULT_CONFIG, ConversionConfig
from .enforcement import POD_GROUP_NOT_SEEN
from .gang import POD_GROUP_KIND, Gang, PodGroupInfo, pod_group_info, pod_group_not_seen, unseen_pod_group
from .gang_view import GangMember, decide_member, gang_problems, pod_gang
from .jsonpatch import apply
from .ledger import ReservationLedger
from .memo import BoundedMemo
from .mutation import admission_mutation
from .placement import (
    GPU_VENDOR_LABEL,
    NodeView,
    RewritePolicy,
    constraints_of,
    gpu_names,
    scheduled_names,
    spec_resources,
    unadvertised,
)
from .pod_records import (
    PodRecord,
    gpu_memory_unknown,
    pod_is_counted,
    pod_record,
    remembered_pod_requests,
    spec_names_key,
    spec_shape_key,
)
from .pod_records import (
    canonical_resource_list as canonical_requests,
)
from .podspec import PodShapeError, mapping_or_empty, parse_resource_list, pod_requests, read_containers
from .quantity import ZERO, Quantity, QuantityError
from .quota_admission import review_quota_object
from .quota_decision import Decision, PodQuotaRequest, decide
from .quota_integrity import tree_problems
from .quota_objects import (
    POD_QUOTA_LABEL,
    UNCHECKED_QUOTAS,
    QuotaInfo,
    QuotaShapeError,
    canonical_resource_list,
    legacy_gpu_names,
    names_both_families,
    quota_from_object,
)
from .quota_tree import QuotaTree, keeps
from .resources import (
    GPU_CORE,
    GPU_MEMORY_RATIO,
    PERCENT_PER_CARD,
    RESOURCEQUOTA_PREFIXES,
    VENDOR_WHOLE_GPU_NAMES,
    GpuFamily,
    ResourceList,
    families_of,
    format_list,
    format_names,
    gpu_family,
    is_gpu_name,
)
from .selector import Selector
from .usage_index import UsageIndex
from .validation import validate_pod_gpu

DEFAULT_SHARED_LABEL = "node.koordinator.sh/gpu-shared"

# Where each workload kind keeps its pod template.
TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}


class Severity(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    severity: Severity
    kind: str
    namespace: str
    name: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": str(self.severity), "kind": self.kind,
                "namespace": self.namespace, "name": self.name, "message": self.message,
                "details": dict(self.details)}


@dataclass(slots=True)
class AuditReport:
    findings: list[Finding] = field(default_factory=list)
    capacity: dict[str, dict[str, str]] = field(default_factory=dict)  # family -> name -> total
    quota_usage: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        by_severity = {str(s): sum(1 for f in self.findings if f.severity == s) for s in Severity}
        by_check: dict[str, int] = {}
        for finding in self.findings:
            by_check[finding.check] = by_check.get(finding.check, 0) + 1
        return {"findings": len(self.findings), "bySeverity": by_severity, "byCheck": dict(sorted(by_check.items())),
                "gpuCapacity": self.capacity, "quotaUsage": self.quota_usage}

    def as_dict(self) -> dict[str, Any]:
        return {"findings": [f.as_dict() for f in self.findings], "summary": self.summary()}

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    metadata = obj.get("metadata")
    metadata = mapping_or_empty(metadata)
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or ""), metadata


def _node_resources(node: Mapping[str, Any]) -> dict[str, Quantity]:
    status = node.get("status")
    status = mapping_or_empty(status)
    merged: dict[str, Quantity] = {}
    # Capacity is what the device plugin advertises; allocatable may be reduced but names the same.
    for section in ("allocatable", "capacity"):
        try:
            merged.update(parse_resource_list(status.get(section), f"status.{section}"))
        except PodShapeError:
            continue
    return {name: q for name, q in merged.items() if is_gpu_name(name) and q.amount > 0}


def check_nodes(nodes: Iterable[Mapping[str, Any]], report: AuditReport,
                shared_label: str = DEFAULT_SHARED_LABEL) -> set[str]:
    """Node checks; returns every GPU resource name some node advertises."""
    advertised: set[str] = set()
    # Capacity totals are summed as quantities and written out once, at the end: formatting and
    # re-parsing the running total at every node cost more than the rest of the node checks. The
    # same text: a total keeps the format of what it starts from ("0", decimal), and parsed amounts
    # are whole nanos, so their sum formats exactly.
    totals: dict[tuple[str, str], Quantity] = {}
    for node in nodes:
        _, name, metadata = _meta(node)
        gpu = _node_resources(node)
        advertised.update(gpu)
        for resource, quantity in gpu.items():
            family = gpu_family(resource)
            place = (family.value if family else "other", resource)
            total = totals.get(place)
            if total is None:
                bucket = report.capacity.setdefault(place[0], {})
                total = Quantity.parse(bucket.get(resource, "0"))
            totals[place] = total + quantity
        families = families_of(gpu)
        vendor = sorted(set(gpu) & VENDOR_WHOLE_GPU_NAMES)
        if families == {GpuFamily.VENDOR, GpuFamily.KOORDINATOR}:
            report.findings.append(Finding(
                "node-mixed-gpu-resources", Severity.WARNING, "Node", "", name,
                f"advertises both {', '.join(vendor)} and koordinator.sh/gpu-*; a sharing node should report "
                "only koordinator names, a whole-card node only the vendor name",
                {"resources": {k: str(v) for k, v in sorted(gpu.items())}}))
            cards = sum((gpu[v] for v in vendor), ZERO)
            for percent_name in (GPU_MEMORY_RATIO, GPU_CORE):
                if percent_name in gpu and gpu[percent_name] != cards.scaled(PERCENT_PER_CARD):
                    report.findings.append(Finding(
                        "node-gpu-count-mismatch", Severity.ERROR, "Node", "", name,
                        f"{percent_name}={gpu[percent_name]} but {'+'.join(vendor)}={cards} cards "
                        f"(expected {cards.scaled(PERCENT_PER_CARD)})",
                        {"resource": percent_name, "value": str(gpu[percent_name]),
                         "expected": str(cards.scaled(PERCENT_PER_CARD))}))
        labels = metadata.get("labels")
        label = labels.get(shared_label) if isinstance(labels, Mapping) else None
        if label is not None:
            shared = str(label).lower() == "true"
            if shared and vendor:
                report.findings.append(Finding(
                    "node-gpu-mode-label-mismatch", Severity.WARNING, "Node", "", name,
                    f"{shared_label}=true but the node reports {', '.join(vendor)}", {"label": shared_label}))
            elif not shared and GpuFamily.KOORDINATOR in families:
                report.findings.append(Finding(
                    "node-gpu-mode-label-mismatch", Severity.WARNING, "Node", "", name,
                    f"{shared_label}={label} but the node reports koordinator.sh/gpu-* resources",
                    {"label": shared_label}))
    for (family_name, resource), total in totals.items():
        report.capacity[family_name][resource] = str(total)
    return advertised


def check_quotas(quotas: Iterable[Mapping[str, Any]], pods: list[Mapping[str, Any]], report: AuditReport,
                 advertised: set[str] | None, config: ConversionConfig = DEFAULT_CONFIG,
                 shapes: list[object] | None = None) -> None:
    """``shapes``: :func:`pod_shapes` of ``pods``, when the caller has them (audit_objects does)."""
    quotas = list(quotas)
    parsed = _parse_quotas(quotas, report)
    infos = [info for _, info in parsed]
    # A parent left out as unreadable (quota-invalid) exists: its children are not told it is missing.
    readable_ids = {id(obj) for obj, _ in parsed}
    unreadable = {name for obj in quotas if id(obj) not in readable_ids and (name := _meta(obj)[1])}
    # Whether the quotas form a tree at all (repeated names, missing parents, cycles): the same
    # checks and wording as the webhook's review of one quota and `serve --state`'s load.
    for problem in tree_problems(infos, unreadable):
        quota = problem.quota
        report.findings.append(Finding(problem.check, Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                                       problem.message, problem.details))
    by_name: dict[str, QuotaInfo] = {}
    for quota in infos:  # of a repeated name, the copy the webhook's tree keeps
        if keeps(by_name.get(quota.name), quota):
            by_name[quota.name] = quota
    for quota in infos:
        names = set(quota.min) | set(quota.max)
        legacy = legacy_gpu_names(names)
        if legacy:
            report.findings.append(Finding(
                "quota-legacy-gpu-key", Severity.WARNING, "ElasticQuota", quota.namespace, quota.name,
                f"min/max uses {', '.join(legacy)}; canonical pods are never charged against it "
                "(run `gpuquota migrate plan`)", {"keys": legacy}))
        if names_both_families(names):
            report.findings.append(Finding(
                "quota-mixed-gpu-keys", Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                "names both nvidia.com/gpu-style and koordinator.sh/gpu-* keys", {"keys": sorted(names)}))
        parent = by_name.get(quota.parent)
        if parent is not None and set(quota.max) != set(parent.max):
            report.findings.append(Finding(
                "quota-tree-key-mismatch", Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                f"max keys {format_names(quota.max)} differ from parent {parent.name}'s {format_names(parent.max)}",
                {"parent": parent.name, "keys": sorted(quota.max), "parentKeys": sorted(parent.max)}))
        if advertised is not None:
            for resource in sorted(n for n in names if is_gpu_name(n) and n not in advertised):
                report.findings.append(Finding(
                    "quota-unadvertised-resource", Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                    f"limits {resource}, which no node advertises; pods asking for it are refused",
                    {"resource": resource}))
    # Children by parent name in one pass (a scan of every quota per quota grows with their square).
    children_of: dict[str, list[QuotaInfo]] = {}
    for quota in infos:
        children_of.setdefault(quota.parent, []).append(quota)
    for parent in infos:
        children = children_of.get(parent.name, [])
        if not children:
            continue
        parent_min, _ = canonical_resource_list(parent.min, config, parent.name)
        total: dict[str, Quantity] = {}
        for child in children:
            child_min, _ = canonical_resource_list(child.min, config, child.name)
            for key, value in child_min.items():
                total[key] = total.get(key, ZERO) + value
        over = {k: v for k, v in total.items() if k in parent_min and v > parent_min[k]}
        if over:
            report.findings.append(Finding(
                "quota-min-exceeds-parent", Severity.ERROR, "ElasticQuota", parent.namespace, parent.name,
                "children's min sum exceeds min: " + ", ".join(
                    f"{k} {v} > {parent_min[k]}" for k, v in sorted(over.items())),
                {k: {"children": str(v), "min": str(parent_min[k])} for k, v in sorted(over.items())}))
    _check_usage(parsed, pods, report, config, shapes)


def _parse_quotas(quotas: Iterable[Mapping[str, Any]], report: AuditReport | None) -> list[tuple[Mapping[str, Any],
                                                                                              QuotaInfo]]:
    """Each readable quota with its object; with ``report``, a ``quota-invalid`` finding for the rest."""
    parsed: list[tuple[Mapping[str, Any], QuotaInfo]] = []
    for obj in quotas:
        try:
            parsed.append((obj, quota_from_object(obj)))
        except QuotaShapeError as error:
            if report is not None:
                namespace, name, _ = _meta(obj)
                report.findings.append(Finding("quota-invalid", Severity.ERROR, "ElasticQuota", namespace, name,
                                               str(error)))
    return parsed


def quota_tree(quotas: Iterable[Mapping[str, Any]], config: ConversionConfig = DEFAULT_CONFIG) -> QuotaTree:
    """The tree the webhook would hold for these ElasticQuota objects (unreadable ones left out)."""
    return QuotaTree.build((info for _, info in _parse_quotas(quotas, None)), config)


def _check_review(parsed: list[tuple[Mapping[str, Any], QuotaInfo]], tree: QuotaTree, usage: UsageIndex,
                  report: AuditReport) -> None:
    """The validating webhook's own review of every quota, as a CREATE or UPDATE of it as written.

    ``review_quota_object`` is what ``/validate-elasticquotas`` runs; its problems, joined as the
    webhook joins them, are the finding's message.
    """
    for obj, quota in parsed:
        review_tree = tree
        if tree.get(quota.name) is not quota:
            # A second quota of a name (reported as quota-duplicate-name): judged as the one stored,
            # as the webhook judges the copy its tree holds.
            review_tree = QuotaTree.build([*(q for q in tree if q.name != quota.name), quota], tree.config)
        review = review_quota_object(obj, review_tree, usage.used(quota.name))
        if review.problems:
            report.findings.append(Finding(
                "quota-refused-by-webhook", Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                "; ".join(review.problems), {"problems": list(review.problems)}))


def _check_usage(parsed: list[tuple[Mapping[str, Any], QuotaInfo]], pods: list[Mapping[str, Any]],
                 report: AuditReport, config: ConversionConfig, shapes: list[object] | None) -> None:
    """Canonical usage per quota, from the webhook's own tree and index (never a second resolver).

    ``QuotaTree.resolve`` binds each pod (label, namespace-named quota, ``namespaces`` annotation,
    default quota) and ``UsageIndex`` charges it to that quota and every ancestor below the root,
    exactly as the validating webhook counts ``used``. Over-limit is reported only for quotas the
    webhook checks (not the root or system quota).
    """
    infos = [info for _, info in parsed]
    tree = QuotaTree.build(infos, config)
    usage = UsageIndex(tree)
    records: list[PodRecord] = []
    for pod, shape in zip(pods, _shapes(pods, config, shapes), strict=True):
        if not pod_is_counted(pod):
            continue
        try:
            records.append(pod_record(pod, config, shape=shape))  # None: no plain shape, computed uncached
        except ValueError:
            continue  # an unreadable pod cannot be charged, as in the webhook's quota state
    usage.load(records)  # as upserting each in turn, with the sums done per quota chain
    _check_review(parsed, tree, usage, report)
    for quota in infos:
        if tree.get(quota.name) is not quota:
            continue  # a second quota of the same name: the tree (like Koordinator) keeps one
        limit, _ = tree.limit(quota.name)
        used = usage.used(quota.name)
        report.quota_usage[quota.name] = {
            key: {"used": str(used.get(key, ZERO)), "limit": str(value)}
            for key, value in sorted(limit.items()) if is_gpu_name(key)}
        if quota.name in UNCHECKED_QUOTAS:
            continue
        over = {k: v for k, v in used.items() if k in limit and v > limit[k]}
        if over:
            report.findings.append(Finding(
                "quota-over-limit", Severity.ERROR, "ElasticQuota", quota.namespace, quota.name,
                "canonical usage exceeds the limit: " + ", ".join(
                    f"{k} {v} > {limit[k]}" for k, v in sorted(over.items())),
                {k: {"used": str(v), "limit": str(limit[k])} for k, v in sorted(over.items())}))


@dataclass(frozen=True, slots=True)
class _SpecVerdict:
    """What the audit says of one pod spec, independent of which object carries it."""

    error: str | None  # the PodShapeError when the spec cannot be read
    rewrites: tuple[str, ...]
    problems: tuple[tuple[str, str], ...]  # (message, rule)
    # The GPU vendor whose nodes the webhook's node affinity keeps the rewritten pod on (None: none added).
    kept_on_vendor: str | None = None


# Replicas of a workload share one spec shape, so a 100k-pod audit judges a few hundred distinct
# specs; the verdict is remembered by everything it reads (the quota cache's shape key plus the
# container names the messages quote).
_spec_verdicts: BoundedMemo[_SpecVerdict] = BoundedMemo()


def pod_shapes(pods: Iterable[Mapping[str, Any]], config: ConversionConfig = DEFAULT_CONFIG) -> list[object]:
    """Each pod's ``spec_shape_key`` (None when its spec is not a plain dict or has no plain shape).

    The quota usage check and the pod check both key their caches by it; computing it once per pod
    for both is a sixth of a 100,000-pod audit.
    """
    shapes: list[object] = []
    for pod in pods:
        spec = pod.get("spec")
        shapes.append(spec_shape_key(spec, config) if type(spec) is dict else None)
    return shapes


def _shapes(pods: list[Mapping[str, Any]], config: ConversionConfig, shapes: list[object] | None) -> list[object]:
    return pod_shapes(pods, config) if shapes is None else shapes


def _rewritten_by_webhook(spec: Mapping[str, Any], config: ConversionConfig,
                          view: NodeView | None) -> tuple[bool, str | None]:
    """Whether /mutate-pods would rewrite a pod of this spec, and on which GPU vendor's nodes its
    node affinity would keep it (None: it adds none): the webhook's own decision, with the nodes it
    would look at (``view`` None: none known, and the webhook then leaves it as written)."""
    try:
        mutation = admission_mutation({"spec": spec}, config, view)
    except (PodShapeError, QuantityError):
        return False, None  # unreadable: _judge_spec reports why
    return mutation.changed, mutation.kept_on_vendor


def _spec_verdict(spec: Mapping[str, Any], config: ConversionConfig, shape: object = None,
                  view: NodeView | None = None) -> _SpecVerdict:
    if shape is None:
        shape = spec_shape_key(spec, config)
    rewritten, kept_on_vendor = _rewritten_by_webhook(spec, config, view)
    key = None
    if shape is not None:
        key = (spec_names_key(spec, shape), rewritten, kept_on_vendor)
        cached = _spec_verdicts.get(key)
        if cached is not None:
            return cached
    verdict = _judge_spec(spec, config, rewritten, kept_on_vendor)
    if key is not None:
        _spec_verdicts.remember(key, verdict)
    return verdict


def _judge_spec(spec: Mapping[str, Any], config: ConversionConfig, rewritten: bool,
                kept_on_vendor: str | None = None) -> _SpecVerdict:
    try:
        read_containers(spec)
        canonical, rewrites, _, _ = canonicalize_pod_spec(spec, config)
        # Judged as /validate-pods judges it: after /mutate-pods rewrote it, where the webhook
        # would (the API server calls the mutating webhook first). A pod mixing a vendor name and
        # koordinator names can get a different reason once the vendor name is converted.
        judged = canonical if rewritten else spec
        containers = read_containers(judged)
    except PodShapeError as error:
        return _SpecVerdict(str(error), (), ())
    problems = validate_pod_gpu(containers, pod_requests(judged, containers))
    # Only what /mutate-pods would write: a request it leaves as written for the nodes the pod can
    # reach (or by `rewrite: never`) is no rewrite, and no reason to warn.
    described = tuple(r.describe() for r in rewrites) if rewritten else ()
    return _SpecVerdict(None, described, tuple((p.message, p.rule) for p in problems), kept_on_vendor)


@dataclass(frozen=True, slots=True)
class QuotaPlace:
    """Where a pod (or a template's pods) would be admitted: the quota judge, and the pod's labels."""

    judge: PodQuotaJudge
    labels: Mapping[str, Any]
    # The name the webhook's messages give the pod ("": the object's own). A template's pods are
    # created with only generateName set ("<workload>-"), and that is what the webhook is sent.
    pod_name: str = ""
    gang: Gang | None = None


def _check_spec(spec: Mapping[str, Any], kind: str, namespace: str, name: str, legacy_check: str,
                report: AuditReport, config: ConversionConfig, shape: object = None,
                place: QuotaPlace | None = None, view: NodeView | None = None) -> None:
    verdict = _spec_verdict(spec, config, shape, view)
    if verdict.error is not None:
        report.findings.append(Finding("pod-invalid-gpu-request", Severity.ERROR, kind, namespace, name,
                                       verdict.error))
        return
    if verdict.rewrites:
        message = "the webhook would rewrite: " + "; ".join(verdict.rewrites)
        details: dict[str, Any] = {"rewrites": list(verdict.rewrites)}
        if verdict.kept_on_vendor is not None:
            message += (f", and keep the pod on {verdict.kept_on_vendor} nodes (required node affinity on "
                        f"{GPU_VENDOR_LABEL})")
            details["keptOnVendor"] = verdict.kept_on_vendor
        report.findings.append(Finding(legacy_check, Severity.WARNING, kind, namespace, name, message, details))
    if verdict.problems:
        report.findings.append(Finding(
            "pod-invalid-gpu-request", Severity.ERROR, kind, namespace, name,
            "; ".join(message for message, _ in verdict.problems),
            {"rules": [rule for _, rule in verdict.problems],
             "problems": [message for message, _ in verdict.problems]}))
        return  # the webhook refuses it here; the quota decision is never reached
    if place is not None:
        decision = place.judge.refusal(spec, namespace, place.pod_name or name, place.labels, config, shape,
                                       place.gang)
        if decision is not None:
            report.findings.append(Finding(
                "pod-quota-refused", Severity.ERROR, kind, namespace, name, decision.message,
                {"reason": decision.reason}))


class _NothingUsed:
    """Totals of quotas with nothing in them (see :class:`PodQuotaJudge`)."""

    def used(self, quota: str) -> ResourceList:
        return {}


_NOTHING_USED = _NothingUsed()


class PodQuotaJudge:
    """The validating webhook's quota decision on creating a pod, with its quotas otherwise empty.

    ``decide`` is the function the webhook's quota service runs: a label naming no quota, a parent
    quota, GPU memory in bytes against a ratio limit, or a request larger than a limit on its own
    are refused whatever else runs. How full the quotas are is the ``quota-over-limit`` check.
    """

    def __init__(self, tree: QuotaTree, pod_groups: Mapping[str, PodGroupInfo] | None = None) -> None:
        self.tree = tree
        # A gang member is judged as the webhook judges it (its gang's whole minimum must fit),
        # with its gang's PodGroup when there is one.
        self.pod_groups: Mapping[str, PodGroupInfo] = pod_groups or {}
        # What the decision reads of a pod -> allowed. Refusals are rare and decided again for
        # their message, which names the pod; replicas of a workload ask alike.
        self._allowed: set[object] = set()

    def refusal(self, spec: Mapping[str, Any], namespace: str, name: str, labels: Mapping[str, Any],
                config: ConversionConfig, shape: object, gang: Gang | None = None) -> Decision | None:
        """``shape``: the spec's ``spec_shape_key`` when known (it keys the canonical requests);
        ``gang``: the gang the pod is a member of (its answers are not remembered: few pods are)."""
        label = labels.get(POD_QUOTA_LABEL)
        label = label if isinstance(label, str) else ""
        unseen = unseen_pod_group(namespace, {k: value for k, value in labels.items() if isinstance(value, str)},
                                  self.pod_groups) if gang is None else ""
        # The remembered answers are keyed by what the quota decision reads, which says nothing of
        # a PodGroup label: a member of a PodGroup not seen is never answered from them.
        key = (namespace, label, shape) if shape is not None and gang is None and not unseen else None
        if key is not None and key in self._allowed:
            return None
        try:
            requests = remembered_pod_requests(spec, config) if shape is None else remembered_pod_requests(
                spec, config, shape=shape)
        except PodShapeError:
            return None  # reported by the spec check already
        request = PodQuotaRequest(namespace, name, label, requests, gpu_memory_unknown(requests))
        if unseen:
            # The webhook refuses it for now (503, retryable): its gang's minimum is not known.
            return Decision(False, message=pod_group_not_seen(namespace, name, unseen), reason=POD_GROUP_NOT_SEEN)
        if gang is not None:
            decision = decide_member(self.tree, _NOTHING_USED, ReservationLedger(), request, gang)
        else:
            decision = decide(self.tree, _NOTHING_USED, _NOTHING_USED, request)
        if decision.allowed:
            if key is not None:
                self._allowed.add(key)
            return None
        return decision


def template_pod_name(workload_name: str) -> str:
    """How the webhook names a pod created from a workload's template: by its generateName."""
    return f"{workload_name}-"


def template_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    path = TEMPLATE_PATHS.get(str(obj.get("kind")))
    if path is None:
        return None
    current: Any = obj
    for step in path:
        current = current.get(step) if isinstance(current, Mapping) else None
    return current if isinstance(current, Mapping) else None


def check_pods(pods: Iterable[Mapping[str, Any]], report: AuditReport,
               config: ConversionConfig = DEFAULT_CONFIG, shapes: list[object] | None = None,
               tree: QuotaTree | None = None, view: NodeView | None = None,
               pod_groups: Mapping[str, PodGroupInfo] | None = None) -> None:
    """``shapes``: :func:`pod_shapes` of ``pods``, when the caller has them (audit_objects does).
    ``tree``: the cluster's quotas (:func:`quota_tree`), to run the webhook's quota decision too.
    ``view``: the nodes, for the webhook's decision whether to rewrite (None: no Node known).
    ``pod_groups``: the PodGroups, by ``namespace/name`` (the gangs their members form)."""
    pods = list(pods)
    judge = PodQuotaJudge(tree, pod_groups) if tree is not None else None
    for pod, shape in zip(pods, _shapes(pods, config, shapes), strict=True):
        namespace, name, metadata = _meta(pod)
        spec = pod.get("spec")
        if type(spec) is dict or isinstance(spec, Mapping):  # type() first: see _meta
            place = None
            if judge is not None and pod_is_counted(pod):  # a finished pod is never admitted again
                place = QuotaPlace(judge, _labels_of(metadata), gang=pod_gang(namespace, metadata, judge.pod_groups))
            _check_spec(spec, "Pod", namespace, name, "pod-legacy-gpu-request", report, config, shape, place, view)


def _labels_of(metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = metadata.get("labels")
    return mapping_or_empty(labels)


def check_workloads(objects: Iterable[Mapping[str, Any]], report: AuditReport,
                    config: ConversionConfig = DEFAULT_CONFIG, tree: QuotaTree | None = None,
                    view: NodeView | None = None, pod_groups: Mapping[str, PodGroupInfo] | None = None) -> None:
    """``tree``, ``view``, ``pod_groups``: as for :func:`check_pods`; a template's pods are judged in
    the workload's namespace."""
    judge = PodQuotaJudge(tree, pod_groups) if tree is not None else None
    for obj in objects:
        template = template_of(obj)
        spec = template.get("spec") if template is not None else None
        if isinstance(spec, Mapping):
            namespace, name, _ = _meta(obj)
            place = None
            if judge is not None and template is not None:
                template_metadata = mapping_or_empty(template.get("metadata"))
                place = QuotaPlace(judge, _labels_of(template_metadata), template_pod_name(name),
                                   pod_gang(namespace, template_metadata, judge.pod_groups))
            _check_spec(spec, str(obj.get("kind")), namespace, name, "workload-legacy-gpu-request", report, config,
                        place=place, view=view)


def check_gangs(pods: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]], tree: QuotaTree,
                pod_groups: Mapping[str, PodGroupInfo], report: AuditReport,
                config: ConversionConfig = DEFAULT_CONFIG) -> None:
    """Gangs that can never fit, gangs partly admitted, members that disagree about their gang
    (gpuquota_core.gang_view): of the stored pods that count, and of the pods templates will create.
    Pods and templates are read as stored: requests in canonical units, a template's after the
    mutating webhook's rewrite (``config``: the rewrite the audit judges with)."""
    members: list[GangMember] = []
    for pod in pods:
        if not pod_is_counted(pod):
            continue
        namespace, name, metadata = _meta(pod)
        member = _gang_member("Pod", namespace, name, metadata, pod.get("spec"), pod_groups, tree, config, True)
        if member is not None:
            members.append(member)
    for obj in workloads:
        template = template_of(obj)
        if template is None:
            continue
        namespace, name, _ = _meta(obj)
        member = _gang_member(str(obj.get("kind")), namespace, name, mapping_or_empty(template.get("metadata")),
                              template.get("spec"), pod_groups, tree, config, False)
        if member is not None:
            members.append(member)
    for problem in gang_problems(tree, members, pod_groups):
        report.findings.append(Finding(problem.check, Severity.ERROR if problem.error else Severity.WARNING,
                                       problem.kind, problem.namespace, problem.name, problem.message,
                                       problem.details))


def _gang_member(kind: str, namespace: str, name: str, metadata: Mapping[str, Any], spec: Any,
                 pod_groups: Mapping[str, PodGroupInfo], tree: QuotaTree, config: ConversionConfig,
                 stored: bool) -> GangMember | None:
    gang = pod_gang(namespace, metadata, pod_groups)
    if gang is None or not isinstance(spec, Mapping):
        return None
    try:
        requests = remembered_pod_requests(spec, config)
    except (PodShapeError, QuantityError, ValueError):
        return None  # pod-invalid-gpu-request reports it
    label = _labels_of(metadata).get(POD_QUOTA_LABEL)
    leaf = tree.resolve(namespace, label if isinstance(label, str) else "").quota
    return GangMember(kind, namespace, name, gang, leaf, requests, stored)


def check_resourcequotas(objects: Iterable[Mapping[str, Any]], report: AuditReport) -> None:
    for obj in objects:
        namespace, name, _ = _meta(obj)
        spec = obj.get("spec")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        if not isinstance(hard, Mapping):
            continue
        keys = sorted(str(k) for k in hard if any(
            str(k) == prefix + vendor for prefix in RESOURCEQUOTA_PREFIXES for vendor in VENDOR_WHOLE_GPU_NAMES))
        if keys:
            report.findings.append(Finding(
                "resourcequota-gpu-bypassed", Severity.WARNING, "ResourceQuota", namespace, name,
                f"limits {', '.join(keys)}; after the webhook's rewrite GPU pods no longer request it",
                {"keys": keys, "hard": {k: str(hard[k]) for k in keys}}))


UNADVERTISED_CHECK = "gpu-request-unadvertised"


def check_gpu_placement(pods: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]],
                        nodes: NodeView, report: AuditReport, config: ConversionConfig = DEFAULT_CONFIG) -> None:
    """GPU requests that no node the pod can be scheduled on advertises: such a pod stays Pending.

    A pod is judged as stored (the webhook sees only creates); a workload's template as the webhook
    would store the pods it creates: rewritten where the config's ``rewrite`` policy and the nodes
    allow (gpuquota_core.placement, the webhook's own decision), else as written.
    """
    for pod in pods:
        status = pod.get("status")
        if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        spec = pod.get("spec")
        if isinstance(spec, Mapping):
            _check_placement(spec, gpu_names(spec_resources(spec)), "Pod", pod, nodes, report)
    for obj in workloads:
        template = template_of(obj)
        spec = template.get("spec") if template is not None else None
        if not isinstance(spec, Mapping):
            continue
        try:
            # The mutating webhook's own answer for a pod of this template, nodes included.
            mutation = admission_mutation({"spec": spec}, config, nodes)
        except (PodShapeError, QuantityError):
            continue  # pod-invalid-gpu-request reports it
        stored = apply({"spec": spec}, mutation.operations())["spec"] if mutation.changed else spec
        # As stored: the rewrite may add the node affinity that keeps the pod's GPU vendor.
        _check_placement(stored, gpu_names(spec_resources(stored)), str(obj.get("kind")), obj, nodes, report)


def _check_placement(spec: Mapping[str, Any], asked: frozenset[str], kind: str, obj: Mapping[str, Any],
                     nodes: NodeView, report: AuditReport) -> None:
    asked = scheduled_names(asked)
    if not asked:
        return
    reason = unadvertised(constraints_of(spec), asked, nodes)
    if reason is None:
        return
    namespace, name, _ = _meta(obj)
    report.findings.append(Finding(
        UNADVERTISED_CHECK, Severity.ERROR, kind, namespace, name,
        f"asks for {', '.join(sorted(asked))}, but {reason}: it cannot be scheduled",
        {"resources": sorted(asked)}))


SCOPES = ("nodes", "quotas", "pods", "workloads", "resourcequotas")


def audit_objects(objects: Iterable[Mapping[str, Any]], scopes: Iterable[str] = SCOPES,
                  config: ConversionConfig = DEFAULT_CONFIG, shared_label: str = DEFAULT_SHARED_LABEL,
                  namespace: str | None = None, selector: Selector | None = None,
                  origin: Callable[[Mapping[str, Any]], str | None] | None = None) -> AuditReport:
    """Every check over ``objects``.

    ``namespace`` filters what is reported, never what is judged: every object is checked with
    all the others (a quota's parents in other namespaces, the pods charged to it), then only
    findings on objects of that namespace and on cluster-scoped ones (nodes) are kept, and the
    usage summary of that namespace's quotas. ``selector`` (a label selector) likewise keeps the
    findings on objects whose labels it selects, of every kind, and the usage of those quotas.
    ``origin`` names the file an object was read from, for the findings on objects it cannot judge.
    """
    objects = objects if isinstance(objects, list) else list(objects)  # read twice with a namespace
    report = _audit(objects, scopes, config, shared_label, origin)
    if namespace is not None:
        report = _shown_in(report, namespace, objects)
    if selector is not None:
        report = _selected(report, selector, objects)
    return report


def _selected(report: AuditReport, selector: Selector, objects: Iterable[Mapping[str, Any]]) -> AuditReport:
    chosen = {(str(obj.get("kind")), namespace, name) for obj in objects if selector.matches_object(obj)
              for namespace, name, _ in [_meta(obj)]}
    quotas = {name for kind, _, name in chosen if kind == "ElasticQuota"}
    return AuditReport(findings=[f for f in report.findings if (f.kind, f.namespace, f.name) in chosen],
                       capacity=report.capacity,
                       quota_usage={name: usage for name, usage in report.quota_usage.items() if name in quotas})


def _shown_in(report: AuditReport, namespace: str, objects: Iterable[Mapping[str, Any]]) -> AuditReport:
    shown_quotas = {name for obj in objects if obj.get("kind") == "ElasticQuota"
                    for quota_namespace, name, _ in [_meta(obj)] if quota_namespace == namespace}
    return AuditReport(findings=[f for f in report.findings if f.namespace in (namespace, "")],
                       capacity=report.capacity,
                       quota_usage={name: usage for name, usage in report.quota_usage.items() if name in shown_quotas})


def audit_rewrite_config(config: ConversionConfig, view: NodeView | None) -> ConversionConfig:
    """The config the offline views decide the rewrite with: as given, except that with no Node
    in their input ``rewrite: auto`` (which then leaves every request as written: "not listed
    yet") rewrites as ``always`` would, so the manifests are judged as they will be stored in a
    cluster whose nodes advertise the canonical names. ``convert`` and ``explain`` say so."""
    global _last_always
    if view is None and config.rewrite is RewritePolicy.AUTO:
        # One copy per config: the memos key their answers by the config's identity.
        if _last_always is None or _last_always[0] is not config:
            _last_always = (config, replace(config, rewrite=RewritePolicy.ALWAYS))
        return _last_always[1]
    return config


_last_always: tuple[ConversionConfig, ConversionConfig] | None = None


def _audit(objects: Iterable[Mapping[str, Any]], scopes: Iterable[str], config: ConversionConfig,
           shared_label: str, origin: Callable[[Mapping[str, Any]], str | None] | None = None) -> AuditReport:
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind")), []).append(obj)
    wanted = set(scopes)
    report = AuditReport()
    nodes = by_kind.get("Node", [])
    advertised = check_nodes(nodes, report, shared_label) if nodes or "nodes" in wanted else set()
    if "nodes" not in wanted:
        report.findings = [f for f in report.findings if f.kind != "Node"]
    pods = by_kind.get("Pod", [])
    shapes = pod_shapes(pods, config) if "quotas" in wanted or "pods" in wanted else []
    if "quotas" in wanted:
        # Without any Node object we cannot tell what is advertised; skip that check then.
        check_quotas(by_kind.get("ElasticQuota", []), pods, report, advertised if nodes else None, config, shapes)
    # The webhook's quota decision on pods and templates needs the tree, whatever scopes are shown.
    tree = quota_tree(by_kind.get("ElasticQuota", []), config) if wanted & {"pods", "workloads"} else None
    view = NodeView.from_objects(nodes)
    # With no Node to look at, the rewrite is judged as `rewrite: always` would make it, as
    # `gpuquota convert` and `explain` do (audit_rewrite_config); the verdict on validation follows it.
    judged_config = audit_rewrite_config(config, view)
    pod_groups = {info.key: info for obj in by_kind.get(POD_GROUP_KIND, [])
                  if (info := pod_group_info(obj, canonical_requests)) is not None}
    workloads = [o for kind, objs in by_kind.items() if kind in TEMPLATE_PATHS for o in objs]
    if "pods" in wanted:
        check_pods(pods, report, judged_config, shapes, tree, view, pod_groups)
    if "workloads" in wanted:
        check_workloads(workloads, report, judged_config, tree, view, pod_groups)
    if tree is not None:
        check_gangs(pods if "pods" in wanted else [], workloads if "workloads" in wanted else [], tree, pod_groups,
                    report, judged_config)
    if "resourcequotas" in wanted:
        check_resourcequotas(by_kind.get("ResourceQuota", []), report)
    # Objects no check above could read as far as a pod spec: a finding each, not silence.
    from .unjudged import unjudged_findings  # it builds on this module's TEMPLATE_PATHS and Finding

    unjudged_kinds = ({"Pod", "AdmissionReview"} if "pods" in wanted else set()) | (
        set(TEMPLATE_PATHS) if "workloads" in wanted else set())
    report.findings += unjudged_findings((o for kind in unjudged_kinds for o in by_kind.get(kind, [])), origin)
    if view is not None:  # without any Node object nothing can be said about placement
        check_gpu_placement(pods if "pods" in wanted else [],
                            [o for kind, objs in by_kind.items() if kind in TEMPLATE_PATHS for o in objs]
                            if "workloads" in wanted else [], view, report, config)
    report.findings.sort(key=lambda f: (f.kind, f.namespace, f.name, f.check))
    return report


__all__ = ["AuditReport", "Finding", "Severity", "audit_objects", "format_list", "template_of"]
