"""Audit findings as wgpolicyk8s.io/v1alpha2 reports: mapping, grouping, summaries, pruning keys."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core.audit import AuditReport, Finding, Severity
from gpuquota_core.policy_report import (
    REPORT_LABELS,
    policy_reports,
    report_problem,
    result_of,
    stale_reports,
)

NOW = 1_800_000_000


def finding(check: str, severity: Severity, kind: str, namespace: str, name: str, **details: Any) -> Finding:
    return Finding(check, severity, kind, namespace, name, f"{check} on {name}", details)


FINDINGS = [
    finding("node-mixed-gpu-resources", Severity.WARNING, "Node", "", "gpu-1"),
    finding("quota-over-limit", Severity.ERROR, "ElasticQuota", "ops", "team-a", resource="koordinator.sh/gpu-core"),
    finding("pod-legacy-gpu-request", Severity.WARNING, "Pod", "team-b", "train-0",
            rewrites=["nvidia.com/gpu -> koordinator.sh/gpu-core"]),
    finding("pod-invalid-gpu-request", Severity.ERROR, "Deployment", "team-b", "serve"),
    finding("resourcequota-gpu-bypassed", Severity.WARNING, "ResourceQuota", "team-a", "rq"),
]


def test_an_error_is_a_scored_high_failure_and_a_warning_an_unscored_medium_warn() -> None:
    error = result_of(FINDINGS[1], NOW)
    warning = result_of(FINDINGS[2], NOW)

    assert error == {
        "source": "koord-gpuquota", "policy": "quota-over-limit", "rule": "quota-over-limit",
        "category": "quotas", "severity": "high", "result": "fail", "scored": True,
        "timestamp": {"seconds": NOW, "nanos": 0}, "message": "quota-over-limit on team-a",
        "resources": [{"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                       "name": "team-a", "namespace": "ops"}],
        "properties": {"resource": "koordinator.sh/gpu-core"},
    }
    assert (warning["result"], warning["severity"], warning["scored"], warning["category"]) == \
        ("warn", "medium", False, "pods")
    assert warning["properties"] == {"rewrites": "nvidia.com/gpu -> koordinator.sh/gpu-core"}


def test_info_is_an_unscored_warn_of_severity_info() -> None:
    result = result_of(finding("x", Severity.INFO, "Pod", "ns", "p"), NOW)

    assert (result["result"], result["severity"], result["scored"]) == ("warn", "info", False)


def test_workloads_carry_their_group_version() -> None:
    assert result_of(FINDINGS[3], NOW)["resources"] == [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve", "namespace": "team-b"}]
    assert result_of(FINDINGS[0], NOW)["resources"] == [{"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}]


def test_nodes_and_quotas_go_to_the_cluster_report_the_rest_to_their_namespace() -> None:
    reports = policy_reports(AuditReport(findings=list(FINDINGS)), NOW)

    layout = [(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"],
               [res["policy"] for res in r["results"]]) for r in reports]
    assert layout == [
        ("ClusterPolicyReport", None, "gpuquota-audit", ["node-mixed-gpu-resources", "quota-over-limit"]),
        ("PolicyReport", "team-a", "gpuquota-audit", ["resourcequota-gpu-bypassed"]),
        ("PolicyReport", "team-b", "gpuquota-audit", ["pod-legacy-gpu-request", "pod-invalid-gpu-request"]),
    ]
    assert [r["summary"] for r in reports] == [
        {"pass": 0, "fail": 1, "warn": 1, "error": 0, "skip": 0},
        {"pass": 0, "fail": 0, "warn": 1, "error": 0, "skip": 0},
        {"pass": 0, "fail": 1, "warn": 1, "error": 0, "skip": 0},
    ]
    assert all(r["apiVersion"] == "wgpolicyk8s.io/v1alpha2" and r["metadata"]["labels"] == dict(REPORT_LABELS)
               for r in reports)


def test_a_clean_audit_still_writes_an_empty_cluster_report() -> None:
    [report] = policy_reports(AuditReport(), NOW)

    assert (report["kind"], report["results"]) == ("ClusterPolicyReport", [])
    assert report["summary"] == {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}


def test_a_large_namespace_is_split_over_numbered_reports() -> None:
    many = [finding("pod-legacy-gpu-request", Severity.WARNING, "Pod", "big", f"p{i}") for i in range(5)]

    reports = policy_reports(AuditReport(findings=many), NOW, max_results_per_report=2)

    assert [(r["metadata"]["name"], len(r["results"])) for r in reports if r["kind"] == "PolicyReport"] == [
        ("gpuquota-audit", 2), ("gpuquota-audit-2", 2), ("gpuquota-audit-3", 1)]
    with pytest.raises(ValueError, match="at least 1"):
        policy_reports(AuditReport(), NOW, max_results_per_report=0)


def test_report_problem_accepts_only_labelled_reports_of_the_right_scope() -> None:
    good = policy_reports(AuditReport(findings=list(FINDINGS)), NOW)
    assert [report_problem(r) for r in good] == [None, None, None]

    assert "is not a wgpolicyk8s.io/v1alpha2" in str(report_problem({"apiVersion": "v1", "kind": "ConfigMap"}))
    unlabelled = {**good[1], "metadata": {"name": "x", "namespace": "n"}}
    assert "lacks the labels" in str(report_problem(unlabelled))
    no_namespace = {**good[1], "metadata": {**good[1]["metadata"], "namespace": None}}
    assert "needs metadata.namespace" in str(report_problem(no_namespace))


def test_stale_reports_are_labelled_reports_this_run_did_not_write() -> None:
    written = policy_reports(AuditReport(findings=list(FINDINGS)), NOW)
    old = {"kind": "PolicyReport", "metadata": {"name": "gpuquota-audit", "namespace": "fixed",
                                                "labels": dict(REPORT_LABELS)}}
    foreign = {"kind": "PolicyReport", "metadata": {"name": "gpuquota-audit", "namespace": "other",
                                                    "labels": {"app.kubernetes.io/managed-by": "kyverno"}}}

    assert stale_reports([*written, old, foreign], written) == [("PolicyReport", "fixed", "gpuquota-audit")]
