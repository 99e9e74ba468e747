"""Metrics, dashboard and alert rules (manifests/monitoring) against a real ``gpuquota serve``.

The server runs gunicorn over TLS on the offline example cluster and has admitted and refused pods
before it is scraped; the dashboard and the rules may use only metric names that scrape shows.
The rule file is checked and unit-tested with promtool (hack/install-test-tools.sh installs it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from reviews import pod, review
from webhookproc import REPO_ROOT, WebhookProcess, post_review

from gpuquota_core.pod_admission import PodAdmission, QuotaFigure
from webhook.admission.quota_port import NoQuota
from webhook.quota.state import QuotaState
from webhook.serving.metrics import render

MONITORING = REPO_ROOT / "manifests" / "monitoring"
RULE_FILE = MONITORING / "prometheus-rules.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def share_pod(name: str, namespace: str, percent: int) -> dict[str, Any]:
    return pod(name, namespace, resources={CORE: str(percent), RATIO: str(percent)})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    # Its own server: the numbers below must not see other modules' admissions. A long TTL, so the
    # reservation of the admitted pod (offline: no watch ever confirms it) is still held when scraped.
    process = WebhookProcess(tmp_path_factory.mktemp("monitoring"),
                             serve_args=["--state", str(EXAMPLE_STATE), "--reservation-ttl", "3600"])
    process.start()
    try:
        admitted = post_review(process, "/validate-pods", review(share_pod("admitted", "team-vision", 100)))
        assert admitted["allowed"] is True, admitted
        # team-vision holds 250 of 800 (+100 just admitted): 600 more does not fit.
        refused = post_review(process, "/validate-pods", review(share_pod("too-big", "team-vision", 600)))
        assert refused["status"]["reason"] == "QuotaExceeded", refused
        invalid = post_review(process, "/validate-pods",
                              review(pod("odd", "team-nlp", resources={"nvidia.com/gpu": "1", CORE: "50"})))
        assert invalid["allowed"] is False, invalid
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def scraped(server: WebhookProcess) -> list[Sample]:
    status, body = server.get("/metrics")
    assert status == 200, body
    return [sample for family in text_string_to_metric_families(body.decode()) for sample in family.samples]


def by_labels(samples: list[Sample], name: str) -> dict[tuple[str, str], float]:
    """(quota, resource) -> value of the per-quota gauge ``name``; every series names the tree."""
    found = [s for s in samples if s.name == name]
    assert all(s.labels["tree"] == "ml-platform" and set(s.labels) == {"quota", "tree", "resource"} for s in found)
    return {(s.labels["quota"], s.labels["resource"]): s.value for s in found}


def both(values: dict[str, float]) -> dict[tuple[str, str], float]:
    return {(quota, resource): value for quota, value in values.items() for resource in (CORE, RATIO)}


# -- the per-quota gauges -------------------------------------------------------------------------

def test_per_quota_gauges_after_admissions(scraped: list[Sample]) -> None:
    # examples/cluster: team-vision runs a 2-card pod (200) and a 50 % notebook, team-nlp a 200 %
    # share pod; team-nlp's limit and min are written as nvidia.com/gpu 4 and 2 (cards: 400, 200).
    # The admitted pod's 100 is reserved on its quota and the parent; refused pods count nowhere.
    assert by_labels(scraped, "gpuquota_quota_used") == both({"ml-platform": 450, "team-vision": 250, "team-nlp": 200})
    assert by_labels(scraped, "gpuquota_quota_reserved") == both({"ml-platform": 100, "team-vision": 100,
                                                                  "team-nlp": 0})
    assert by_labels(scraped, "gpuquota_quota_limit") == both({"ml-platform": 1200, "team-vision": 800,
                                                               "team-nlp": 400})
    assert by_labels(scraped, "gpuquota_quota_min") == both({"ml-platform": 800, "team-vision": 400, "team-nlp": 200})
    assert [s.value for s in scraped if s.name == "gpuquota_ready"] == [1.0]


def test_a_quota_limited_only_by_its_parent_has_used_but_no_limit() -> None:
    state = QuotaState()
    state.load([elastic_quota("root", {CORE: "1000"}), elastic_quota("child", None, parent="root")])

    figures = {(f.quota, f.resource): f for f in state.quota_figures()}

    assert set(figures) == {("root", CORE), ("child", CORE)}
    assert figures["child", CORE].limit is None and figures["child", CORE].used == 0
    assert figures["child", CORE].tree == "root" and figures["root", CORE].limit == 1000


def test_a_deleted_quota_has_no_series_from_then_on() -> None:
    state = QuotaState()
    state.load([elastic_quota("root", {CORE: "1000"}), elastic_quota("child", {CORE: "400"}, parent="root")])
    assert {f.quota for f in state.quota_figures()} == {"root", "child"}

    state.apply_event("ElasticQuota", "DELETED", elastic_quota("child", {CORE: "400"}, parent="root"))

    assert {f.quota for f in state.quota_figures()} == {"root"}


def test_an_expired_reservation_leaves_the_reserved_figure_without_another_admission() -> None:
    now = [1000.0]
    state = QuotaState(clock=lambda: now[0], ttl_seconds=30)
    state.load([elastic_quota("root", {CORE: "1000"}), elastic_quota("child", {CORE: "400"}, parent="root")])
    admitted = state.admit_pod(PodAdmission(uid="adm-p", operation="CREATE", namespace="child", name="p", pod_uid="u-p",
                                            labels={"quota.scheduling.koordinator.sh/name": "child"},
                                            canonical_requests={CORE: "100"}))
    assert admitted.allowed
    assert {f.quota: f.reserved for f in state.quota_figures()} == {"root": 100, "child": 100}

    now[0] += 31  # past the TTL; no admission since, only the scrape

    assert {f.quota: f.reserved for f in state.quota_figures()} == {"root": 0, "child": 0}


def test_strict_accounting_exports_no_reserved_figure() -> None:
    # Its reservations live in the ledger objects in the API server, not in this process's ledger:
    # a 0 here would be a claim nobody checked.
    state = QuotaState()
    state.reservations_known = False
    state.load([elastic_quota("root", {CORE: "1000"})])

    [figure] = state.quota_figures()
    assert figure.reserved is None and figure.used == 0 and figure.limit == 1000

    text = render(StubDecider(state.quota_figures()))[0].decode()
    assert 'gpuquota_quota_used{quota="root",resource="koordinator.sh/gpu-core",tree="root"} 0.0' in text
    assert "gpuquota_quota_reserved{" not in text


class StubDecider(NoQuota):
    def __init__(self, figures: list[QuotaFigure]) -> None:
        self.figures = figures

    def quota_figures(self) -> list[QuotaFigure]:
        return self.figures


def elastic_quota(name: str, limit: dict[str, str] | None, parent: str = "") -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else \
        {"quota.scheduling.koordinator.sh/is-parent": "true"}
    spec = {"max": limit} if limit else {}
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": name, "labels": labels}, "spec": spec}


def test_serving_certificate_expiry_is_the_served_certificates(server: WebhookProcess,
                                                               scraped: list[Sample]) -> None:
    certificate = x509.load_pem_x509_certificate((server.cert_dir / "tls.crt").read_bytes())
    [expiry] = [s.value for s in scraped if s.name == "gpuquota_serving_certificate_expiry_timestamp_seconds"]
    assert datetime.fromtimestamp(expiry, UTC) == certificate.not_valid_after_utc


# -- names the dashboard and the rules use --------------------------------------------------------

# Words of PromQL that are not metric names where they stand bare (functions are told apart by the
# parenthesis that follows them).
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
# The label lists of grouping and matching clauses, e.g. `sum by (quota, tree)`, `on (quota)`.
CLAUSE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
IDENTIFIER = re.compile(r"(?<![\w:$.])[A-Za-z_:][\w:]*")
# Grafana's variable query: label_values(metric, label) names a label after the comma.
LABEL_VALUES = re.compile(r"\blabel_values\s*\(([^,()]*(?:\{[^}]*\})?)\s*,\s*\w+\s*\)")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers that are neither functions, keywords nor labels."""
    text = STRING.sub('""', expr)
    text = LABEL_VALUES.sub(r"\1", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range selectors and subqueries
    text = CLAUSE.sub(" ", text)
    names = set()
    for match in IDENTIFIER.finditer(text):
        if text[match.end():].lstrip().startswith("(") or match.group() in PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (reason) (rate(gpuquota_denials_total{endpoint="/x", a=~"$b"}[5m])) * 60 > 5', {"gpuquota_denials_total"}),
    ("max by (tree, quota) (a_used) / on (tree, quota) group_left (x) (max without (pod) (b_limit) > 0) > 0.9",
     {"a_used", "b_limit"}),
    ("histogram_quantile(0.99, sum by (le) (rate(lat_bucket[$__rate_interval])))", {"lat_bucket"}),
    ("time() - max by (kind) (last_contact) > 1e3 unless bool c offset 5m", {"last_contact", "c"}),
    ('label_values(gpuquota_quota_used{tree=~"$tree"}, resource)', {"gpuquota_quota_used"}),
    ("min(cert_expiry) - time() < 14 * 86400", {"cert_expiry"}),
])
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def dashboard_queries(node: Any) -> Iterator[str]:
    """Every PromQL text of the dashboard: panel targets and the variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str) and value:
                yield value
            else:
                yield from dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_queries(item)


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_dashboard_and_rules_use_only_metrics_the_server_exports(scraped: list[Sample]) -> None:
    exported = {sample.name for sample in scraped}
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    # "prometheus" is the datasource variable's plugin type, not a query.
    dashboard_names = {name for q in dashboard_queries(dashboard) if q != "prometheus" for name in metric_names(q)}
    rule_names = {name for expr in rule_exprs() for name in metric_names(expr)}

    assert dashboard_names - exported == set()
    assert rule_names - exported == set()
    # What the issue asks the dashboard and the rules to show is there.
    for name in ("gpuquota_quota_used", "gpuquota_quota_limit", "gpuquota_denials_total",
                 "gpuquota_admission_duration_seconds_bucket", "gpuquota_cluster_state_last_contact_timestamp_seconds",
                 "gpuquota_ledger_writes_total", "gpuquota_serving_certificate_expiry_timestamp_seconds",
                 "gpuquota_ready"):
        assert name in dashboard_names, name
    for name in ("gpuquota_quota_used", "gpuquota_denials_total", "gpuquota_cluster_state_stale",
                 "gpuquota_ledger_writes_total", "gpuquota_serving_certificate_expiry_timestamp_seconds",
                 "gpuquota_ready"):
        assert name in rule_names, name


def test_dashboard_panels_have_unique_ids_and_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert {"datasource", "tree", "resource", "instance"} <= variables
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


# -- the rules ------------------------------------------------------------------------------------

def test_prometheus_rule_carries_the_rule_files_groups() -> None:
    plain = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))
    operator = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))

    assert operator["apiVersion"] == "monitoring.coreos.com/v1" and operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == plain["groups"]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path is not None, "promtool is missing: run hack/install-test-tools.sh"
    return path


def test_rule_file_passes_promtool_check(promtool: str) -> None:
    result = subprocess.run([promtool, "check", "rules", str(RULE_FILE)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    matchers = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{matchers}}}", "values": values}


def alert(name: str, eval_time: str, *expected: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in expected]}


QUOTA = {"tree": "ml", "quota": "team-a", "resource": CORE}
OTHER = {"tree": "ml", "quota": "team-b", "resource": CORE}
DAY = 86400

# promtool's clock starts at the Unix epoch: time() is the evaluation time in seconds.
RULE_CASES: list[dict[str, Any]] = [{
    "interval": "1m",
    "input_series": [
        # Two replicas report the same quota: one alert. team-b at half its limit: none.
        series("gpuquota_quota_used", {"instance": "a", **QUOTA}, "950x40"),
        series("gpuquota_quota_used", {"instance": "b", **QUOTA}, "950x40"),
        series("gpuquota_quota_limit", {"instance": "a", **QUOTA}, "1000x40"),
        series("gpuquota_quota_limit", {"instance": "b", **QUOTA}, "1000x40"),
        series("gpuquota_quota_used", {"instance": "a", **OTHER}, "500x40"),
        series("gpuquota_quota_limit", {"instance": "a", **OTHER}, "1000x40"),
        # 10 QuotaExceeded a minute, over two replicas; 1 Invalid a minute.
        series("gpuquota_denials_total", {"instance": "a", "endpoint": "/validate-pods", "reason": "QuotaExceeded"},
               "0+5x40"),
        series("gpuquota_denials_total", {"instance": "b", "endpoint": "/validate-pods", "reason": "QuotaExceeded"},
               "0+5x40"),
        series("gpuquota_denials_total", {"instance": "a", "endpoint": "/validate-pods", "reason": "Invalid"},
               "0+1x40"),
        series("gpuquota_ready", {"instance": "a"}, "1x40"),
        series("gpuquota_ready", {"instance": "b"}, "1 1 0x38"),
        series("gpuquota_cluster_state_stale", {"instance": "a"}, "0x40"),
        series("gpuquota_cluster_state_stale", {"instance": "b"}, "0 0 0 1x37"),
        # a hears from the API server every minute; b's pod watch went silent at the start.
        series("gpuquota_cluster_state_last_contact_timestamp_seconds", {"instance": "a", "kind": "Pod"}, "0+60x40"),
        series("gpuquota_cluster_state_last_contact_timestamp_seconds", {"instance": "b", "kind": "Pod"}, "0x40"),
        series("gpuquota_ledger_writes_total", {"instance": "a", "result": "conflict"}, "0+30x40"),
        series("gpuquota_ledger_writes_total", {"instance": "a", "result": "error"}, "0x40"),
        series("gpuquota_ledger_writes_total", {"instance": "b", "result": "error"}, "0x5 1+1x34"),
        # a's certificate expires 10 days after the epoch, b's after 2 days, c's after a year.
        series("gpuquota_serving_certificate_expiry_timestamp_seconds", {"instance": "a"}, f"{10 * DAY}x40"),
        series("gpuquota_serving_certificate_expiry_timestamp_seconds", {"instance": "b"}, f"{2 * DAY}x40"),
        series("gpuquota_serving_certificate_expiry_timestamp_seconds", {"instance": "c"}, f"{365 * DAY}x40"),
    ],
    "alert_rule_test": [
        alert("GpuQuotaNearFull", "10m"),  # 95 % but not yet for 15 minutes
        alert("GpuQuotaNearFull", "20m", {"severity": "warning", **QUOTA}),
        alert("GpuQuotaDenialsSpiking", "5m"),
        alert("GpuQuotaDenialsSpiking", "20m", {"severity": "warning", "reason": "QuotaExceeded"}),
        alert("GpuQuotaReplicaNotReady", "4m"),
        alert("GpuQuotaReplicaNotReady", "10m", {"severity": "warning", "instance": "b"}),
        alert("GpuQuotaWatchStale", "2m"),
        alert("GpuQuotaWatchStale", "6m", {"severity": "critical", "instance": "b"}),
        alert("GpuQuotaWatchSilent", "10m"),
        alert("GpuQuotaWatchSilent", "25m", {"severity": "warning", "instance": "b", "kind": "Pod"}),
        alert("GpuQuotaLedgerWritesFailing", "4m"),
        alert("GpuQuotaLedgerWritesFailing", "20m", {"severity": "critical", "instance": "b"}),
        alert("GpuQuotaServingCertificateExpiresSoon", "10m", {"severity": "warning", "instance": "a"},
              {"severity": "warning", "instance": "b"}, {"severity": "critical", "instance": "b"}),
    ],
}]


def run_promtool_tests(promtool: str, work: Path, rule_file: Path, cases: list[dict[str, Any]]) -> None:
    test_file = work / "rules-test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [str(rule_file)], "evaluation_interval": "1m",
                                         "tests": cases}), encoding="utf-8")
    result = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_fire_when_and_only_when_they_should(promtool: str, tmp_path: Path) -> None:
    # promtool compares annotations too; they are checked in the next test, here the conditions are.
    groups = yaml.safe_load(RULE_FILE.read_text(encoding="utf-8"))["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    stripped = tmp_path / "rules.yaml"
    stripped.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")

    run_promtool_tests(promtool, tmp_path, stripped, RULE_CASES)


def test_alert_annotations_name_the_quota_and_the_numbers(promtool: str, tmp_path: Path) -> None:
    case = {"interval": "1m", "input_series": [series("gpuquota_quota_used", {"instance": "a", **QUOTA}, "950x30"),
                                               series("gpuquota_quota_limit", {"instance": "a", **QUOTA}, "1000x30")],
            "alert_rule_test": [{"eval_time": "20m", "alertname": "GpuQuotaNearFull", "exp_alerts": [{
                "exp_labels": {"severity": "warning", **QUOTA},
                "exp_annotations": {
                    "summary": "ElasticQuota team-a is 95% full",
                    "description": "Pods charged to ElasticQuota team-a (tree ml) use 95% of its "
                                   "koordinator.sh/gpu-core limit. New GPU pods there are refused once it is full; "
                                   "raise the limit or free GPUs (`gpuquota quota team-a`).",
                }}]}]}

    run_promtool_tests(promtool, tmp_path, RULE_FILE, [case])
