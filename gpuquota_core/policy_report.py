"""Audit findings as ``wgpolicyk8s.io/v1alpha2`` PolicyReport and ClusterPolicyReport objects.

Policy-reporter, Kyverno's report tooling and most policy dashboards read these two kinds, so an
audit written in them shows up where a platform team already looks. I/O-free: the caller passes the
audit report and the time the results were found; nothing here reads a clock or the cluster.

Mapping (docs/audit-checks.md, "As policy reports"):
- one result per finding; ``policy`` and ``rule`` are the finding's check id, ``source`` is
  ``koord-gpuquota``, ``category`` names the audit scope, ``resources`` references the object;
- severity ``error`` -> result ``fail``, report severity ``high``, scored;
  ``warning`` -> ``warn``/``medium`` and ``info`` -> ``warn``/``info``, not scored (the schema's
  meaning of ``warn``: requirements not met, not scored);
- namespaced objects other than ElasticQuotas go into a PolicyReport in their namespace; Nodes,
  ElasticQuotas and anything without a namespace go into the ClusterPolicyReport, because a quota
  tree spans namespaces and its findings concern whoever runs the tree, not the namespace that
  happens to hold the object;
- only findings are reported (no ``pass`` results: the audit does not enumerate what passed), so a
  report's summary counts ``fail`` and ``warn``. The ClusterPolicyReport is always written, empty
  when nothing cluster-wide was found, so applying the reports clears an earlier run's findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .audit import AuditReport, Finding, Severity
from .gang import POD_GROUP_API_VERSION
from .quota_objects import ELASTICQUOTA_API_VERSION

API_VERSION = "wgpolicyk8s.io/v1alpha2"
SOURCE = "koord-gpuquota"
REPORT_NAME = "gpuquota-audit"
# Every report carries it, so an applier can prune the reports of an earlier run
# (`kubectl apply --prune -l ...`, manifests/audit-cronjob/).
REPORT_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/managed-by": SOURCE,
    "app.kubernetes.io/name": SOURCE,
    "app.kubernetes.io/component": "audit",
}
# An object is stored in etcd whole, and the apiserver refuses requests over about 3 MiB. A result
# is a few hundred bytes, so a namespace with thousands of findings is split over several reports
# (gpuquota-audit, gpuquota-audit-2, ...) well below that.
DEFAULT_MAX_RESULTS_PER_REPORT = 1000

RESULT_FOR_SEVERITY: Mapping[Severity, str] = {
    Severity.ERROR: "fail",
    Severity.WARNING: "warn",
    Severity.INFO: "warn",
}
REPORT_SEVERITY: Mapping[Severity, str] = {
    Severity.ERROR: "high",
    Severity.WARNING: "medium",
    Severity.INFO: "info",
}
SUMMARY_KEYS = ("pass", "fail", "warn", "error", "skip")

# apiVersion of each kind the audit reports on, for the ObjectReference in ``resources``.
API_VERSION_OF_KIND: Mapping[str, str] = {
    "Node": "v1",
    "Pod": "v1",
    "ResourceQuota": "v1",
    "ReplicationController": "v1",
    "PodTemplate": "v1",
    "ElasticQuota": ELASTICQUOTA_API_VERSION,
    "PodGroup": POD_GROUP_API_VERSION,
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}
CATEGORY_OF_KIND: Mapping[str, str] = {
    "Node": "nodes",
    "ElasticQuota": "quotas",
    "Pod": "pods",
    "ResourceQuota": "resourcequotas",
}
CLUSTER_REPORT_KINDS = frozenset({"Node", "ElasticQuota"})


def in_cluster_report(finding: Finding) -> bool:
    return finding.kind in CLUSTER_REPORT_KINDS or not finding.namespace


def _property_text(value: Any) -> str:
    """Report properties are strings: lists become comma-separated, mappings ``key=value`` pairs."""
    if isinstance(value, Mapping):
        return ", ".join(f"{key}={_property_text(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_property_text(item) for item in value)
    return str(value)


def result_of(finding: Finding, found_at_seconds: int) -> dict[str, Any]:
    """One ``results[]`` entry of a (Cluster)PolicyReport for one finding."""
    reference: dict[str, Any] = {"apiVersion": API_VERSION_OF_KIND.get(finding.kind, "v1"),
                                 "kind": finding.kind, "name": finding.name}
    if finding.namespace:
        reference["namespace"] = finding.namespace
    result: dict[str, Any] = {
        "source": SOURCE,
        "policy": finding.check,
        "rule": finding.check,
        "category": CATEGORY_OF_KIND.get(finding.kind, "workloads"),
        "severity": REPORT_SEVERITY[finding.severity],
        "result": RESULT_FOR_SEVERITY[finding.severity],
        "scored": finding.severity >= Severity.ERROR,
        "timestamp": {"seconds": found_at_seconds, "nanos": 0},
        "message": finding.message,
        "resources": [reference],
    }
    if finding.details:
        result["properties"] = {str(key): _property_text(value) for key, value in finding.details.items()}
    return result


def summary_of(results: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts = dict.fromkeys(SUMMARY_KEYS, 0)
    for result in results:
        counts[result["result"]] += 1
    return counts


def _report(kind: str, name: str, namespace: str | None, results: list[dict[str, Any]]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(REPORT_LABELS)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata,
            "summary": summary_of(results), "results": results}


def _chunked(kind: str, namespace: str | None, results: list[dict[str, Any]],
             limit: int) -> list[dict[str, Any]]:
    chunks = [results[start:start + limit] for start in range(0, len(results), limit)] or [[]]
    return [_report(kind, REPORT_NAME if index == 0 else f"{REPORT_NAME}-{index + 1}", namespace, chunk)
            for index, chunk in enumerate(chunks)]


def policy_reports(report: AuditReport, found_at_seconds: int,
                   max_results_per_report: int = DEFAULT_MAX_RESULTS_PER_REPORT) -> list[dict[str, Any]]:
    """The ClusterPolicyReport(s) first, then one PolicyReport (or more) per namespace with findings.

    Results keep the audit's order within a report; namespaces are sorted, so two runs over the same
    cluster produce the same documents apart from the timestamp.
    """
    if max_results_per_report < 1:
        raise ValueError(f"max_results_per_report must be at least 1, got {max_results_per_report}")
    cluster: list[dict[str, Any]] = []
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for finding in report.findings:
        result = result_of(finding, found_at_seconds)
        if in_cluster_report(finding):
            cluster.append(result)
        else:
            by_namespace.setdefault(finding.namespace, []).append(result)
    reports = _chunked("ClusterPolicyReport", None, cluster, max_results_per_report)
    for namespace in sorted(by_namespace):
        reports.extend(_chunked("PolicyReport", namespace, by_namespace[namespace], max_results_per_report))
    return reports


ReportKey = tuple[str, str, str]  # (kind, namespace or "", name)


def report_key(report: Mapping[str, Any]) -> ReportKey:
    metadata = report.get("metadata") or {}
    return (str(report.get("kind") or ""), str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def report_problem(document: Mapping[str, Any]) -> str | None:
    """Why ``document`` is not a report this tool may write, or None: the applier touches nothing else."""
    kind = document.get("kind")
    if document.get("apiVersion") != API_VERSION or kind not in ("PolicyReport", "ClusterPolicyReport"):
        return f"{document.get('apiVersion')}/{kind} is not a {API_VERSION} PolicyReport or ClusterPolicyReport"
    _, namespace, name = report_key(document)
    if not name:
        return f"a {kind} has no metadata.name"
    if (kind == "PolicyReport") != bool(namespace):
        return f"{kind} {name}: " + ("a PolicyReport needs metadata.namespace" if kind == "PolicyReport"
                                     else "a ClusterPolicyReport has no namespace")
    labels = (document.get("metadata") or {}).get("labels") or {}
    if any(labels.get(key) != value for key, value in REPORT_LABELS.items()):
        return f"{kind} {name} lacks the labels {dict(REPORT_LABELS)}, so a later run could not prune it"
    return None


def stale_reports(stored: Iterable[Mapping[str, Any]], written: Iterable[Mapping[str, Any]]) -> list[ReportKey]:
    """Stored reports of an earlier run that this run did not write: their findings are gone.

    Only reports carrying every one of REPORT_LABELS count, so reports of other tools are never
    touched, whatever the selector that listed them.
    """
    keep = {report_key(report) for report in written}
    return sorted(key for key, report in ((report_key(r), r) for r in stored)
                  if key not in keep and all(((report.get("metadata") or {}).get("labels") or {}).get(label) == value
                                             for label, value in REPORT_LABELS.items()))
