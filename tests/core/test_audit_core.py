"""``audit_objects`` directly: every check id of docs/audit-checks.md, positive and negative.

Each positive case asserts check, severity, kind, namespace/name and the exact numbers in the
message and details; each negative case is the nearest input that must not fire. The last tests
prove that quota usage is counted in the quota the webhook's own ``QuotaTree.resolve`` picks.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuquota_core.audit import AuditReport, Finding, Severity, audit_objects
from gpuquota_core.placement import RewritePolicy
from gpuquota_core.pod_records import pod_record
from gpuquota_core.quota_objects import quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from webhook.admission.status import status_of
from webhook.quota.state import QuotaState

PARENT = "quota.scheduling.koordinator.sh/parent"
IS_PARENT = "quota.scheduling.koordinator.sh/is-parent"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
NAMESPACES = "quota.scheduling.koordinator.sh/namespaces"
ADMISSION = "quota.scheduling.koordinator.sh/admission"
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
SHARED_LABEL = "node.koordinator.sh/gpu-shared"


def node(name: str, capacity: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels or {}}, "status": {"capacity": capacity}}


def eq(name: str, namespace: str, max_: dict[str, str], min_: dict[str, str] | None = None,
       parent: str | None = None, is_parent: bool = False, annotations: dict[str, str] | None = None
       ) -> dict[str, Any]:
    labels = {IS_PARENT: "true" if is_parent else "false"}
    if parent:
        labels[PARENT] = parent
    return {"kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations or {}},
            "spec": {"max": max_, "min": min_ or {}}}


def pod(name: str, namespace: str, limits: dict[str, str], label: str | None = None,
        phase: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUOTA_LABEL: label} if label else {}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def with_check(report: AuditReport, check: str) -> list[Finding]:
    return [f for f in report.findings if f.check == check]


def only(report: AuditReport, check: str) -> Finding:
    found = with_check(report, check)
    assert len(found) == 1, [f.as_dict() for f in report.findings]
    return found[0]


def test_every_documented_check_id_has_tests_here() -> None:
    table = (Path(__file__).resolve().parents[2] / "docs" / "audit-checks.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", table, re.MULTILINE))
    assert len(documented) == 25
    source = Path(__file__).read_text()
    for check in documented:
        assert f'"{check}"' in source, check


# -- nodes ---------------------------------------------------------------------------------------

def test_node_mixed_gpu_resources() -> None:
    report = audit_objects([node("mixed", {"nvidia.com/gpu": "2", CORE: "200", RATIO: "200"})])
    finding = only(report, "node-mixed-gpu-resources")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (Severity.WARNING, "Node", "", "mixed")
    assert finding.message.startswith("advertises both nvidia.com/gpu and koordinator.sh/gpu-*; ")
    assert finding.details == {"resources": {CORE: "200", RATIO: "200", "nvidia.com/gpu": "2"}}
    assert report.capacity == {"vendor": {"nvidia.com/gpu": "2"}, "koordinator": {CORE: "200", RATIO: "200"}}
    # 200 = 2 cards x 100: consistent numbers, so no count mismatch.
    assert with_check(report, "node-gpu-count-mismatch") == []


def test_node_with_one_family_is_not_mixed() -> None:
    report = audit_objects([node("whole", {"nvidia.com/gpu": "2"}), node("shared", {CORE: "400", RATIO: "400"}),
                            node("cpu", {"cpu": "8"}), node("zero", {"nvidia.com/gpu": "0", CORE: "100"})])
    assert report.findings == []
    assert report.capacity == {"vendor": {"nvidia.com/gpu": "2"}, "koordinator": {CORE: "500", RATIO: "400"}}


def test_node_gpu_count_mismatch() -> None:
    report = audit_objects([node("n1", {"nvidia.com/gpu": "2", CORE: "100", RATIO: "200"})])
    finding = only(report, "node-gpu-count-mismatch")
    assert (finding.severity, finding.kind, finding.name) == (Severity.ERROR, "Node", "n1")
    assert finding.message == f"{CORE}=100 but nvidia.com/gpu=2 cards (expected 200)"
    assert finding.details == {"resource": CORE, "value": "100", "expected": "200"}


def test_node_gpu_count_mismatch_sums_vendor_cards_and_is_not_checked_on_single_family() -> None:
    report = audit_objects([node("two-vendors", {"nvidia.com/gpu": "1", "amd.com/gpu": "2", RATIO: "300"}),
                            node("koord-only", {CORE: "150", RATIO: "100"})])
    assert with_check(report, "node-gpu-count-mismatch") == []
    mixed = only(report, "node-mixed-gpu-resources")
    assert mixed.name == "two-vendors"
    assert mixed.message.startswith("advertises both amd.com/gpu, nvidia.com/gpu and koordinator.sh/gpu-*")


def test_node_gpu_mode_label_mismatch_both_directions() -> None:
    report = audit_objects([node("says-shared", {"nvidia.com/gpu": "4"}, {SHARED_LABEL: "true"}),
                            node("says-whole", {CORE: "100", RATIO: "100"}, {SHARED_LABEL: "false"})])
    found = {f.name: f for f in with_check(report, "node-gpu-mode-label-mismatch")}
    assert set(found) == {"says-shared", "says-whole"}
    assert found["says-shared"].severity == Severity.WARNING
    assert found["says-shared"].message == f"{SHARED_LABEL}=true but the node reports nvidia.com/gpu"
    assert found["says-whole"].message == f"{SHARED_LABEL}=false but the node reports koordinator.sh/gpu-* resources"
    assert found["says-whole"].details == {"label": SHARED_LABEL}


def test_node_gpu_mode_label_consistent_or_absent_or_other_label() -> None:
    objects = [node("shared", {CORE: "100", RATIO: "100"}, {SHARED_LABEL: "true"}),
               node("whole", {"nvidia.com/gpu": "1"}, {SHARED_LABEL: "false"}),
               node("unlabelled", {"nvidia.com/gpu": "1"}),
               node("custom", {"nvidia.com/gpu": "1"}, {"example.com/shared": "true"})]
    assert audit_objects(objects).findings == []
    custom = only(audit_objects(objects, shared_label="example.com/shared"), "node-gpu-mode-label-mismatch")
    assert (custom.name, custom.message) == ("custom", "example.com/shared=true but the node reports nvidia.com/gpu")


def test_nodes_scope_off_drops_node_findings_but_keeps_what_they_advertise() -> None:
    objects = [node("mixed", {"nvidia.com/gpu": "1", CORE: "100"}), eq("q", "q", {RATIO: "100"})]
    report = audit_objects(objects, ("quotas",))
    assert [f.check for f in report.findings] == ["quota-unadvertised-resource"]
    assert report.findings[0].details == {"resource": RATIO}


# -- quotas --------------------------------------------------------------------------------------

def test_quota_legacy_gpu_key() -> None:
    report = audit_objects([eq("team", "team", {"nvidia.com/gpu": "4"}, {"amd.com/gpu": "1"})])
    finding = only(report, "quota-legacy-gpu-key")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (
        Severity.WARNING, "ElasticQuota", "team", "team")
    assert finding.message == ("min/max uses amd.com/gpu, nvidia.com/gpu; canonical pods are never charged "
                               "against it (run `gpuquota migrate plan`)")
    assert finding.details == {"keys": ["amd.com/gpu", "nvidia.com/gpu"]}


def test_canonical_quota_has_no_legacy_key() -> None:
    assert audit_objects([eq("team", "team", {CORE: "400", RATIO: "400", "cpu": "8"})]).findings == []


def test_quota_mixed_gpu_keys() -> None:
    report = audit_objects([eq("mix", "ns", {"nvidia.com/gpu": "1", CORE: "100"})])
    finding = only(report, "quota-mixed-gpu-keys")
    assert (finding.severity, finding.namespace, finding.name) == (Severity.ERROR, "ns", "mix")
    assert finding.message == "names both nvidia.com/gpu-style and koordinator.sh/gpu-* keys"
    assert finding.details == {"keys": [CORE, "nvidia.com/gpu"]}


def test_quota_with_one_family_is_not_mixed() -> None:
    report = audit_objects([eq("legacy", "ns", {"nvidia.com/gpu": "1", "cpu": "4"})])
    assert with_check(report, "quota-mixed-gpu-keys") == []


def test_quota_tree_key_mismatch() -> None:
    report = audit_objects([eq("org", "ops", {CORE: "400", RATIO: "400"}, is_parent=True),
                            eq("team", "team", {"nvidia.com/gpu": "2"}, parent="org")])
    finding = only(report, "quota-tree-key-mismatch")
    assert (finding.severity, finding.namespace, finding.name) == (Severity.ERROR, "team", "team")
    assert finding.message == f"max keys [nvidia.com/gpu] differ from parent org's [{CORE}, {RATIO}]"
    assert finding.details == {"parent": "org", "keys": ["nvidia.com/gpu"], "parentKeys": [CORE, RATIO]}


def test_quota_tree_with_equal_keys_or_unknown_parent_matches() -> None:
    report = audit_objects([eq("org", "ops", {CORE: "400", RATIO: "400"}, is_parent=True),
                            eq("team", "team", {CORE: "100", RATIO: "200"}, parent="org"),
                            eq("orphan", "x", {"nvidia.com/gpu": "1"}, parent="not-listed")])
    assert with_check(report, "quota-tree-key-mismatch") == []


def test_quota_min_exceeds_parent_in_canonical_units() -> None:
    # Child a: 1 card = 100 core + 100 ratio; child b: 50 core. Sum 150 core > the parent's 100;
    # the parent's min does not name ratio, so ratio is not compared.
    report = audit_objects([eq("org", "ops", {CORE: "400"}, {CORE: "100"}, is_parent=True),
                            eq("a", "a", {CORE: "400"}, {"nvidia.com/gpu": "1"}, parent="org"),
                            eq("b", "b", {CORE: "400"}, {CORE: "50"}, parent="org")])
    finding = only(report, "quota-min-exceeds-parent")
    assert (finding.severity, finding.namespace, finding.name) == (Severity.ERROR, "ops", "org")
    assert finding.message == f"children's min sum exceeds min: {CORE} 150 > 100"
    assert finding.details == {CORE: {"children": "150", "min": "100"}}


def test_quota_min_equal_to_parent_is_fine() -> None:
    report = audit_objects([eq("org", "ops", {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "2"}, is_parent=True),
                            eq("a", "a", {"nvidia.com/gpu": "4"}, {CORE: "100", RATIO: "100"}, parent="org"),
                            eq("b", "b", {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "1"}, parent="org")])
    assert with_check(report, "quota-min-exceeds-parent") == []


def test_quota_unadvertised_resource() -> None:
    report = audit_objects([node("shared", {CORE: "400", RATIO: "400"}),
                            eq("team", "team", {"nvidia.com/gpu": "2"})])
    finding = only(report, "quota-unadvertised-resource")
    assert (finding.severity, finding.namespace, finding.name) == (Severity.ERROR, "team", "team")
    assert finding.message == "limits nvidia.com/gpu, which no node advertises; pods asking for it are refused"
    assert finding.details == {"resource": "nvidia.com/gpu"}


def test_quota_unadvertised_resource_needs_nodes_and_ignores_advertised_and_non_gpu_names() -> None:
    quota = eq("team", "team", {CORE: "200", RATIO: "200", "cpu": "8"})
    assert with_check(audit_objects([quota]), "quota-unadvertised-resource") == []
    assert with_check(audit_objects([node("shared", {CORE: "400", RATIO: "400"}), quota]),
                      "quota-unadvertised-resource") == []


def test_quota_invalid() -> None:
    report = audit_objects([{"kind": "ElasticQuota", "metadata": {"name": "x", "namespace": "t"}, "spec": "bad"},
                            eq("y", "t", {"nvidia.com/gpu": "two"})])
    found = {f.name: f for f in with_check(report, "quota-invalid")}
    assert set(found) == {"x", "y"}
    assert (found["x"].severity, found["x"].namespace, found["x"].message) == (
        Severity.ERROR, "t", "x: spec: expected an object")
    assert found["y"].message.startswith("ElasticQuota y: spec.max[nvidia.com/gpu]: ")
    assert found["y"].message.endswith(": 'two'")
    # An unreadable quota is not checked further (no usage, no legacy-key finding).
    assert {f.check for f in report.findings} == {"quota-invalid"}
    assert report.quota_usage == {}


def test_readable_quota_is_not_invalid() -> None:
    report = audit_objects([eq("y", "t", {CORE: "100", RATIO: "100"})])
    assert with_check(report, "quota-invalid") == []
    assert report.quota_usage == {"y": {CORE: {"used": "0", "limit": "100"}, RATIO: {"used": "0", "limit": "100"}}}


def test_quota_over_limit_counts_legacy_and_canonical_pods_in_canonical_units() -> None:
    # Limit 2 cards = 200; pods: 2 cards (200) + a 100/100 share = 300 in each canonical name.
    report = audit_objects([eq("team", "team", {"nvidia.com/gpu": "2"}),
                            pod("legacy", "team", {"nvidia.com/gpu": "2"}),
                            pod("share", "team", {CORE: "100", RATIO: "100"})])
    finding = only(report, "quota-over-limit")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (
        Severity.ERROR, "ElasticQuota", "team", "team")
    assert finding.message == f"canonical usage exceeds the limit: {CORE} 300 > 200, {RATIO} 300 > 200"
    assert finding.details == {CORE: {"used": "300", "limit": "200"}, RATIO: {"used": "300", "limit": "200"}}
    assert report.quota_usage["team"] == {CORE: {"used": "300", "limit": "200"},
                                          RATIO: {"used": "300", "limit": "200"}}


def test_quota_over_limit_is_charged_up_to_the_parent_but_never_reported_for_the_root() -> None:
    report = audit_objects([
        eq("koordinator-root-quota", "koordinator-system", {CORE: "100", RATIO: "100"}, is_parent=True),
        eq("org", "ops", {CORE: "300", RATIO: "300"}, is_parent=True),
        eq("a", "a", {CORE: "200", RATIO: "200"}, parent="org"),
        eq("b", "b", {CORE: "200", RATIO: "200"}, parent="org"),
        pod("pa", "a", {"nvidia.com/gpu": "2"}), pod("pb", "b", {"nvidia.com/gpu": "2"})])
    finding = only(report, "quota-over-limit")
    assert (finding.namespace, finding.name) == ("ops", "org")
    assert finding.details == {CORE: {"used": "400", "limit": "300"}, RATIO: {"used": "400", "limit": "300"}}
    # The root is not on any chain the webhook checks or charges (QuotaTree.chain stops below it).
    assert report.quota_usage["koordinator-root-quota"][CORE] == {"used": "0", "limit": "100"}


def test_quota_at_limit_terminal_pods_unknown_label_and_admission_annotation_are_not_over() -> None:
    report = audit_objects([
        eq("team", "team", {"nvidia.com/gpu": "2"}),
        # max is 1 card, but the admission annotation (the webhook's limit) allows 3.
        eq("raised", "raised", {"nvidia.com/gpu": "1"},
           annotations={ADMISSION: json.dumps({CORE: "300", RATIO: "300"})}),
        pod("at-limit", "team", {"nvidia.com/gpu": "2"}),
        pod("done", "team", {"nvidia.com/gpu": "4"}, phase="Succeeded"),
        pod("failed", "team", {"nvidia.com/gpu": "4"}, phase="Failed"),
        pod("ghost", "team", {"nvidia.com/gpu": "4"}, label="no-such-quota"),
        pod("r", "raised", {CORE: "300", RATIO: "300"})])
    assert with_check(report, "quota-over-limit") == []
    assert report.quota_usage["team"][CORE] == {"used": "200", "limit": "200"}
    assert report.quota_usage["raised"][RATIO] == {"used": "300", "limit": "300"}


# -- pods and workloads ----------------------------------------------------------------------------

def test_pod_legacy_gpu_request() -> None:
    report = audit_objects([pod("p", "t", {"nvidia.com/gpu": "2"})])
    finding = only(report, "pod-legacy-gpu-request")
    rewrite = f'container "c" limits: nvidia.com/gpu: 2 -> {CORE}: 200, {RATIO}: 200'
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (Severity.WARNING, "Pod", "t", "p")
    assert finding.message == f"the webhook would rewrite: {rewrite}"
    assert finding.details == {"rewrites": [rewrite]}


def test_canonical_and_cpu_pods_have_no_findings() -> None:
    assert audit_objects([pod("share", "t", {CORE: "50", RATIO: "50"}), pod("cpu", "t", {"cpu": "2"})]).findings == []


def test_workload_legacy_gpu_request_for_deployment_and_cronjob() -> None:
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    report = audit_objects([
        {"kind": "Deployment", "metadata": {"name": "d", "namespace": "t"}, "spec": {"template": {"spec": spec}}},
        {"kind": "CronJob", "metadata": {"name": "cj", "namespace": "t"},
         "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}])
    found = {(f.kind, f.name): f for f in with_check(report, "workload-legacy-gpu-request")}
    assert set(found) == {("Deployment", "d"), ("CronJob", "cj")}
    assert found[("CronJob", "cj")].severity == Severity.WARNING
    assert found[("CronJob", "cj")].message == (
        f'the webhook would rewrite: container "c" limits: nvidia.com/gpu: 1 -> {CORE}: 100, {RATIO}: 100')


def test_canonical_templates_and_unknown_kinds_are_not_workload_findings() -> None:
    legacy = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    canonical = {"containers": [{"name": "c", "resources": {"limits": {CORE: "100", RATIO: "100"}}}]}
    report = audit_objects([
        {"kind": "StatefulSet", "metadata": {"name": "s", "namespace": "t"}, "spec": {"template": {"spec": canonical}}},
        {"kind": "Rollout", "metadata": {"name": "r", "namespace": "t"}, "spec": {"template": {"spec": legacy}}}])
    assert report.findings == []


def test_pod_invalid_gpu_request_for_a_pod_an_unparseable_quantity_and_a_template() -> None:
    report = audit_objects([
        node("shared", {CORE: "400", RATIO: "400"}),
        pod("bad", "t", {CORE: "150"}), pod("unparse", "t", {"nvidia.com/gpu": "abc"}),
        {"kind": "Job", "metadata": {"name": "j", "namespace": "t"}, "spec": {"template": {"spec": {
            "containers": [{"name": "w", "resources": {"limits": {"koordinator.sh/gpu": "101"}}}]}}}}])
    found = {(f.kind, f.name): f for f in with_check(report, "pod-invalid-gpu-request")}
    assert set(found) == {("Pod", "bad"), ("Pod", "unparse"), ("Job", "j")}
    bad = found[("Pod", "bad")]
    assert (bad.severity, bad.namespace) == (Severity.ERROR, "t")
    assert bad.message == (f"invalid resource device requests: [{CORE}]: add a memory request: {RATIO} (percent of a "
                           'card) or koordinator.sh/gpu-memory (bytes) (asked for by container "c")')
    assert bad.details == {"rules": ["combination"], "problems": [bad.message]}
    assert found[("Pod", "unparse")].message.startswith("spec.containers[0].resources.limits[nvidia.com/gpu]: ")
    # Judged after the rewrite (a node advertises the canonical names, so the webhook rewrites it),
    # as /validate-pods judges it: koordinator.sh/gpu 101 is gpu-core 101 by then.
    assert f"{CORE}: 101" in found[("Job", "j")].message


def test_valid_gpu_requests_are_not_invalid() -> None:
    report = audit_objects([pod("whole", "t", {CORE: "200", RATIO: "200"}), pod("part", "t", {CORE: "30", RATIO: "30"}),
                            pod("koord", "t", {"koordinator.sh/gpu": "100"})])
    assert with_check(report, "pod-invalid-gpu-request") == []


# -- ResourceQuotas ------------------------------------------------------------------------------

def test_resourcequota_gpu_bypassed() -> None:
    report = audit_objects([{"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "t"},
                             "spec": {"hard": {"requests.nvidia.com/gpu": "4", "limits.amd.com/gpu": "2",
                                               "pods": "10"}}}])
    finding = only(report, "resourcequota-gpu-bypassed")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (
        Severity.WARNING, "ResourceQuota", "t", "rq")
    assert finding.message == ("limits limits.amd.com/gpu, requests.nvidia.com/gpu; after the webhook's rewrite "
                               "GPU pods no longer request it")
    assert finding.details == {"keys": ["limits.amd.com/gpu", "requests.nvidia.com/gpu"],
                               "hard": {"limits.amd.com/gpu": "2", "requests.nvidia.com/gpu": "4"}}


def test_resourcequota_on_canonical_or_non_gpu_names_is_not_bypassed() -> None:
    report = audit_objects([{"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "t"},
                             "spec": {"hard": {f"requests.{CORE}": "400", "pods": "10", "requests.cpu": "4"}}}])
    assert report.findings == []


# -- the pod -> quota binding is the webhook's ---------------------------------------------------

BINDING_OBJECTS: list[dict[str, Any]] = [
    eq("org", "ops", {CORE: "2000", RATIO: "2000"}, is_parent=True),
    # Named like its namespace: binds every pod of ns-a, even though "bound" lists ns-a too.
    eq("ns-a", "ns-a", {"nvidia.com/gpu": "3"}, parent="org"),
    eq("bound", "ops", {CORE: "1000", RATIO: "1000"}, parent="org",
       annotations={NAMESPACES: json.dumps(["ns-b", "ns-a"])}),
    # Lives in team-home but is not named like it and no annotation lists team-home: binds nothing.
    eq("leaf-in-team-home", "team-home", {CORE: "1000", RATIO: "1000"}),
    eq("koordinator-default-quota", "koordinator-system", {CORE: "1000", RATIO: "1000"}),
    pod("a1", "ns-a", {"nvidia.com/gpu": "1"}),
    pod("b1", "ns-b", {CORE: "50", RATIO: "50"}),
    pod("d1", "ns-d", {"nvidia.com/gpu": "2"}),
    pod("h1", "team-home", {"nvidia.com/gpu": "1"}),
    pod("l1", "ns-d", {"nvidia.com/gpu": "3"}, label="ns-a"),
    pod("done", "ns-a", {"nvidia.com/gpu": "4"}, phase="Succeeded"),
    pod("ghost", "ns-a", {"nvidia.com/gpu": "1"}, label="missing"),
]


@pytest.mark.parametrize(("pod_name", "quota", "rule"), [
    ("a1", "ns-a", "namespace-name"), ("b1", "bound", "namespaces-annotation"),
    ("d1", "koordinator-default-quota", "default"), ("h1", "koordinator-default-quota", "default"),
    ("l1", "ns-a", "label"), ("ghost", "missing", "label-not-found")])
def test_the_fixture_exercises_each_resolve_rule(pod_name: str, quota: str, rule: str) -> None:
    tree = QuotaTree.build(quota_from_object(o) for o in BINDING_OBJECTS if o["kind"] == "ElasticQuota")
    record = pod_record(next(o for o in BINDING_OBJECTS if o["metadata"]["name"] == pod_name))
    resolution = tree.resolve(record.namespace, record.quota_label)
    assert (resolution.quota, resolution.rule) == (quota, rule)


def test_audit_usage_is_the_webhook_usage_for_namespace_name_and_namespaces_annotation() -> None:
    report = audit_objects(BINDING_OBJECTS, ("quotas",))
    used = {name: {key: value["used"] for key, value in usage.items()} for name, usage in report.quota_usage.items()}
    # ns-a: a1 (1 card) via its name + l1 (3 cards) via the label; bound: b1 via the annotation;
    # the default quota: d1 and h1; org: its two children.
    assert used == {
        "org": {CORE: "450", RATIO: "450"},
        "ns-a": {CORE: "400", RATIO: "400"},
        "bound": {CORE: "50", RATIO: "50"},
        "leaf-in-team-home": {CORE: "0", RATIO: "0"},
        "koordinator-default-quota": {CORE: "300", RATIO: "300"},
    }
    # The webhook's quota state, loaded from the same objects, holds the same numbers per quota.
    state = QuotaState()
    state.load(BINDING_OBJECTS)
    for name, usage in report.quota_usage.items():
        assert {key: value["used"] for key, value in usage.items()} == {
            key: str(state.usage.used(name).get(key, 0)) for key in usage}, name
    over = only(report, "quota-over-limit")
    assert (over.name, over.message) == (
        "ns-a", f"canonical usage exceeds the limit: {CORE} 400 > 300, {RATIO} 400 > 300")


def test_remembered_spec_verdicts_name_each_pods_own_containers() -> None:
    from gpuquota_core.audit import _judge_spec, _spec_verdict
    from gpuquota_core.conversion import DEFAULT_CONFIG

    def spec(container: str, cards: object) -> dict[str, object]:
        gpu = {"nvidia.com/gpu": cards}
        return {"containers": [{"name": container, "resources": {"requests": gpu, "limits": gpu}}]}

    always = replace(DEFAULT_CONFIG, rewrite=RewritePolicy.ALWAYS)
    for config, rewritten in ((DEFAULT_CONFIG, False), (always, True)):
        for container, cards in (("a", "2"), ("b", "2"), ("a", 2), ("a", "0.5"), ("a", 2.0)):
            remembered = _spec_verdict(spec(container, cards), config)
            again = _spec_verdict(spec(container, cards), config)
            # No Node known: `auto` leaves the request as written, and so it is judged.
            assert remembered == again == _judge_spec(spec(container, cards), config, rewritten=rewritten)
    # Left as written, nothing is described as rewritten.
    assert _spec_verdict(spec("b", "2"), DEFAULT_CONFIG).rewrites == ()
    # Same shape, other container name: the message quotes the right container, not the cached one.
    assert _spec_verdict(spec("b", "2"), always).rewrites[0].startswith('container "b" requests:')
    assert _spec_verdict(spec("a", "0.5"), DEFAULT_CONFIG).problems[0][1] == "not-integer"


# -- placement -----------------------------------------------------------------------------------

def test_gpu_request_unadvertised() -> None:
    pinned = pod("pinned", "ns", {"nvidia.com/gpu": "1"})
    pinned["spec"]["nodeSelector"] = {"pool": "shared"}
    report = audit_objects([node("shared", {CORE: "400", RATIO: "400"}, {"pool": "shared"}), pinned,
                            pod("free", "ns", {CORE: "100", RATIO: "100"})])

    finding = only(report, "gpu-request-unadvertised")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (Severity.ERROR, "Pod", "ns", "pinned")
    assert finding.message == ("asks for nvidia.com/gpu, but none of the 1 node(s) this pod can be scheduled on "
                               "(shared) advertises nvidia.com/gpu: it cannot be scheduled")
    assert finding.details == {"resources": ["nvidia.com/gpu"]}


# -- one truth with the webhook: its quota review, the tree, its pod quota decision --------------


def review_message(quota: dict[str, Any], *others: dict[str, Any]) -> str:
    """What /validate-elasticquotas answers for creating ``quota`` in a quota service holding ``others``."""
    state = QuotaState()
    state.replace_kind("ElasticQuota", list(others))
    state.replace_kind("Pod", [])
    verdict = state.review_elasticquota(quota)
    assert (verdict.allowed, status_of(verdict.reason)) == (False, 422)
    return verdict.message


def test_a_quota_the_webhook_refuses_is_a_finding_with_the_webhooks_message() -> None:
    # Before: max -100 and min above max passed the audit while the webhook refused it with 422.
    bad = eq("bad", "t", {CORE: "-100", RATIO: "-100"}, {CORE: "100", RATIO: "100"})
    finding = only(audit_objects([bad]), "quota-refused-by-webhook")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (Severity.ERROR, "ElasticQuota", "t",
                                                                                 "bad")
    assert finding.message == review_message(bad) == (
        f"spec.max of t/bad has negative values: {CORE}, {RATIO}; spec.min of t/bad is above spec.max in canonical "
        f"units for: {CORE} (100 > -100), {RATIO} (100 > -100)")
    assert finding.details == {"problems": finding.message.split("; ")}


def test_a_quota_marked_as_migrating_is_judged_as_the_webhook_judges_it() -> None:
    both = {"nvidia.com/gpu": "1", CORE: "100", RATIO: "100"}
    assert with_check(audit_objects([eq("m", "t", both)]), "quota-refused-by-webhook") != []
    marked = eq("m", "t", both, annotations={"gpuquota.koord-gpuquota.io/migration": "in-progress"})
    assert with_check(audit_objects([marked]), "quota-refused-by-webhook") == []


def test_a_missing_parent_is_a_finding() -> None:
    report = audit_objects([eq("team", "t", {CORE: "100"}, parent="org")])
    finding = only(report, "quota-parent-missing")
    assert (finding.severity, finding.namespace, finding.name, finding.details) == (Severity.ERROR, "t", "team",
                                                                                    {"parent": "org"})


def test_a_parent_that_cannot_be_read_is_not_called_missing() -> None:
    # Before: the child was told its parent "does not exist" while the parent was only unreadable.
    report = audit_objects([eq("org", "ops", {CORE: "lots"}, is_parent=True),
                            eq("team", "t", {CORE: "100"}, parent="org")])
    assert with_check(report, "quota-parent-missing") == []
    finding = only(report, "quota-parent-unreadable")
    assert (finding.severity, finding.namespace, finding.name, finding.details) == (Severity.ERROR, "t", "team",
                                                                                    {"parent": "org"})
    assert finding.message == (
        "ElasticQuota t/team names parent org (label quota.scheduling.koordinator.sh/parent), which exists but "
        "cannot be read: which limits apply to its pods above its own is unknown; fix that ElasticQuota")
    assert [f.name for f in with_check(report, "quota-invalid")] == ["org"]


def test_two_quotas_of_one_name_are_both_findings() -> None:
    # Before: the tree kept one of them and the other vanished from the audit.
    copies = [eq("team", "ns-a", {CORE: "100"}), eq("team", "ns-b", {CORE: "400"})]
    found = with_check(audit_objects(copies), "quota-duplicate-name")
    assert [(f.namespace, f.details) for f in found] == [("ns-a", {"quotas": ["ns-a/team", "ns-b/team"]}),
                                                         ("ns-b", {"quotas": ["ns-a/team", "ns-b/team"]})]
    assert found[0].message.startswith("ElasticQuota name team is used by 2 quotas (ns-a/team, ns-b/team)")
    # The webhook refuses to store the second one.
    assert review_message(copies[1], copies[0]).startswith("ElasticQuota name team is already used by ns-a/team")


def test_a_parent_cycle_is_a_finding_for_each_member() -> None:
    report = audit_objects([eq("a", "t", {CORE: "100"}, parent="b", is_parent=True),
                            eq("b", "t", {CORE: "100"}, parent="a", is_parent=True)])
    found = with_check(report, "quota-parent-cycle")
    assert [(f.name, f.details) for f in found] == [("a", {"cycle": ["a", "b"]}), ("b", {"cycle": ["a", "b"]})]
    assert found[0].message == ("the parent labels of ElasticQuotas a -> b -> a form a cycle: none of them reaches "
                                "the root quota")


def test_namespace_filters_what_is_shown_not_what_is_judged() -> None:
    objects = [eq("org", "ops", {CORE: "400", RATIO: "400"}, is_parent=True),
               eq("team", "t", {"nvidia.com/gpu": "2"}, parent="org"),
               pod("p", "t", {CORE: "300", RATIO: "300"}, label="team")]
    shown = audit_objects(objects, namespace="t")
    # The parent in namespace ops is read: team's keys differ from it, and it is not "missing".
    assert {f.check for f in shown.findings} == {"quota-legacy-gpu-key", "quota-tree-key-mismatch",
                                                 "quota-over-limit", "pod-quota-refused"}
    assert {f.namespace for f in shown.findings} == {"t"}
    assert set(shown.quota_usage) == {"team"}
    assert audit_objects(objects, namespace="elsewhere").findings == []


def test_pods_and_templates_the_webhooks_quota_decision_refuses() -> None:
    small = {"limits": {CORE: "10", RATIO: "10"}}
    objects = [eq("org", "ops", {CORE: "400", RATIO: "400"}, is_parent=True),
               eq("team", "t", {CORE: "200", RATIO: "200"}, parent="org"),
               pod("ghost", "t", {CORE: "10", RATIO: "10"}, label="missing"),
               pod("on-parent", "t", {CORE: "10", RATIO: "10"}, label="org"),
               pod("too-big", "t", {CORE: "300", RATIO: "300"}, label="team"),
               pod("bytes", "t", {CORE: "10", "koordinator.sh/gpu-memory": "1Gi"}, label="team"),
               pod("fits", "t", {CORE: "200", RATIO: "200"}, label="team"),
               pod("done", "t", {CORE: "10", RATIO: "10"}, label="missing", phase="Succeeded"),
               {"kind": "Deployment", "metadata": {"name": "web", "namespace": "t"},
                "spec": {"template": {"metadata": {"labels": {QUOTA_LABEL: "missing"}},
                                      "spec": {"containers": [{"name": "c", "resources": small}]}}}}]
    found = {f.name: f for f in with_check(audit_objects(objects), "pod-quota-refused")}
    assert sorted(found) == ["bytes", "ghost", "on-parent", "too-big", "web"]
    assert found["ghost"].message == ("elastic quota missing not found: pod t/ghost names ElasticQuota 'missing' in "
                                      "label quota.scheduling.koordinator.sh/name, but no such quota exists")
    assert found["ghost"].details == {"reason": "QuotaNotFound"}
    assert found["on-parent"].details["reason"] == "ParentQuota"
    assert found["bytes"].details["reason"] == "UnknownGpuMemory"
    assert found["too-big"].message.startswith(f"exceeded quota: t/team, requested: {CORE}=300,{RATIO}=300")
    assert (found["web"].kind, found["web"].details["reason"]) == ("Deployment", "QuotaNotFound")
    # A pod the GPU check refuses gets that finding only: the webhook answers 422 before its quota.
    report = audit_objects([pod("odd", "t", {CORE: "150"}, label="missing")])
    assert [f.check for f in report.findings] == ["pod-invalid-gpu-request"]


def test_a_pod_is_judged_after_the_mutating_webhooks_rewrite_as_validate_pods_judges_it() -> None:
    # One container asks a whole card the vendor way, another a share: /mutate-pods converts the
    # card to 100 + 100, and /validate-pods then refuses gpu-core 101 (a percentage), not the mix
    # of names the original carries. Found by tests/core/test_one_truth.py.
    mixed = {"kind": "Pod", "metadata": {"name": "mixed", "namespace": "t"},
             "spec": {"containers": [{"name": "a", "resources": {"limits": {CORE: "1"}}},
                                     {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    canonical_node = node("shared", {CORE: "400", RATIO: "400"})
    finding = only(audit_objects([canonical_node, mixed]), "pod-invalid-gpu-request")
    assert finding.details["rules"] == ["percentage"]
    assert finding.message.startswith(f"invalid resource unit {CORE}: 101: ")
    # With no node that advertises the canonical names the webhook leaves it as written, and
    # /validate-pods then refuses the mix of names.
    vendor_node = node("whole", {"nvidia.com/gpu": "8"})
    assert only(audit_objects([vendor_node, mixed]), "pod-invalid-gpu-request").details["rules"] == ["combination"]
    # With no Node at all, judged as it will be stored where nodes advertise the canonical names
    # (as `rewrite: always`, like convert and explain).
    assert only(audit_objects([mixed]), "pod-invalid-gpu-request").details["rules"] == ["percentage"]


# -- objects that cannot be judged ---------------------------------------------------------------

def test_object_not_judged_names_the_path_and_the_file() -> None:
    listed = {"kind": "Deployment", "metadata": {"name": "d", "namespace": "a"}, "spec": {"template": [1]}}
    bare = {"kind": "Pod", "metadata": {"name": "p", "namespace": "a"}}
    cron = {"kind": "CronJob", "metadata": {"name": "c", "namespace": "a"}, "spec": {"jobTemplate": {"spec": "x"}}}
    review = {"kind": "AdmissionReview", "request": {"object": {"kind": "Pod"}}}
    files = {id(listed): "d.yaml", id(bare): "p.yaml"}

    report = audit_objects([listed, bare, cron, review], origin=lambda obj: files.get(id(obj)))

    assert [(f.severity, f.kind, f.name, f.message, dict(f.details)) for f in with_check(report, "object-not-judged")] \
        == [(Severity.WARNING, "AdmissionReview", "", "request.object: an AdmissionReview is a request to the webhook, "
             "not an object of the cluster; `gpuquota explain -f FILE` answers it as the webhook would",
             {"path": "request.object"}),
            (Severity.ERROR, "CronJob", "c", "spec.jobTemplate.spec: is a string, not a mapping; the audit cannot "
             "judge this object", {"path": "spec.jobTemplate.spec"}),
            (Severity.ERROR, "Deployment", "d", "d.yaml: spec.template: is a list, not a mapping; the audit cannot "
             "judge this object", {"file": "d.yaml", "path": "spec.template"}),
            (Severity.ERROR, "Pod", "p", "p.yaml: spec: is missing; the audit cannot judge this object",
             {"file": "p.yaml", "path": "spec"})]


def test_object_not_judged_is_not_said_of_readable_objects_or_other_kinds() -> None:
    report = audit_objects([pod("fine", "a", {"cpu": "1"}),
                            {"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "a"}, "data": []},
                            {"kind": "Deployment", "metadata": {"name": "d", "namespace": "a"},
                             "spec": {"template": {"spec": {"containers": []}}}}])

    assert with_check(report, "object-not-judged") == []


def test_object_not_judged_follows_the_scopes() -> None:
    bare = {"kind": "Pod", "metadata": {"name": "p", "namespace": "a"}}
    listed = {"kind": "Job", "metadata": {"name": "j", "namespace": "a"}, "spec": {"template": "x"}}

    assert [f.kind for f in audit_objects([bare, listed], ["pods"]).findings] == ["Pod"]
    assert [f.kind for f in audit_objects([bare, listed], ["workloads"]).findings] == ["Job"]
    assert audit_objects([bare, listed], ["nodes"]).findings == []


# -- gangs ---------------------------------------------------------------------------------------

GANG_NAME, GANG_MIN = "gang.scheduling.koordinator.sh/name", "gang.scheduling.koordinator.sh/min-available"
ONE_CARD = {CORE: "100", RATIO: "100"}


def gang_pod(name: str, gang: str, minimum: int, limits: dict[str, str] | None = None) -> dict[str, Any]:
    obj = pod(name, "train", limits or ONE_CARD, "team")
    obj["metadata"]["annotations"] = {GANG_NAME: gang, GANG_MIN: str(minimum)}
    return obj


def gang_job(name: str, gang: str, minimum: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "train"},
            "spec": {"parallelism": minimum, "template": {
                "metadata": {"labels": {QUOTA_LABEL: "team", **(labels or {})},
                             "annotations": {GANG_NAME: gang, GANG_MIN: str(minimum)} if gang else {}},
                "spec": {"containers": [{"name": "w", "resources": {"limits": ONE_CARD}}]}}}}


TEAM = eq("team", "train", {CORE: "600", RATIO: "600"})


def test_gang_never_fits_names_the_gang_its_need_and_the_limit() -> None:
    report = audit_objects([TEAM, gang_job("big", "big", 8)])
    finding = only(report, "gang-never-fits")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (Severity.ERROR, "Job", "train", "big")
    assert finding.message == (
        f"gang train/big needs {CORE}=800,{RATIO}=800 (8 × {CORE}=100,{RATIO}=100), above the limit "
        f"{CORE}=600,{RATIO}=600 of quota train/team: no member is ever admitted (read from Job train/big)")
    assert finding.details == {"gang": "train/big", "quota": "train/team", "need": {CORE: "800", RATIO: "800"},
                               "limit": {CORE: "600", RATIO: "600"}, "member": "Job train/big"}
    # The webhook refuses each of its pods with quotas otherwise empty, in its own words.
    refused = only(report, "pod-quota-refused")
    assert refused.message.startswith(f"gang train/big needs {CORE}=800,{RATIO}=800 (8 × ")
    # Six fit under the limit: nothing to say.
    assert audit_objects([TEAM, gang_job("six", "six", 6)]).findings == []


def test_gang_never_fits_is_reported_on_the_pod_group_and_reads_its_min_resources() -> None:
    group = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "train"},
             "spec": {"minMember": 2, "minResources": {"nvidia.com/gpu": "7"}}}
    report = audit_objects([TEAM, group, gang_job("workers", "", 2, {"pod-group.scheduling.sigs.k8s.io": "pg"})])
    finding = only(report, "gang-never-fits")
    assert (finding.kind, finding.namespace, finding.name) == ("PodGroup", "train", "pg")
    assert finding.message.startswith(f"gang train/pg needs {CORE}=700,{RATIO}=700 (its PodGroup's minResources), ")
    # Without its PodGroup the label names no gang.
    assert with_check(audit_objects([TEAM, gang_job("workers", "", 2, {"pod-group.scheduling.sigs.k8s.io": "pg"})]),
                      "gang-never-fits") == []


def test_a_member_of_a_pod_group_not_seen_is_refused_after_a_pod_alike_that_is_not_one() -> None:
    # The same spec, namespace and quota: the first pod's answer must not be taken for the second's.
    plain = pod("plain", "train", ONE_CARD, "team")
    member = pod("member", "train", ONE_CARD, "team")
    member["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io"] = "pg"
    refused = only(audit_objects([TEAM, plain, member]), "pod-quota-refused")
    assert (refused.name, refused.details["reason"]) == ("member", "PodGroupNotSeen")


def test_gang_partly_admitted_stored_members_below_the_minimum() -> None:
    stored = [gang_pod(f"w-{index}", "w", 4) for index in range(3)]
    report = audit_objects([TEAM, *stored])
    finding = only(report, "gang-partly-admitted")
    assert (finding.severity, finding.kind, finding.namespace, finding.name) == (
        Severity.WARNING, "Pod", "train", "w-0")
    assert finding.message == (
        f"gang train/w has 3 of its minimum 4 members stored, holding {CORE}=300,{RATIO}=300: koord-scheduler binds "
        f"none of them until 1 more are admitted, which need {CORE}=100,{RATIO}=100 more; the webhook holds that room "
        "for them only until the gang's waiting time (600 s) after its first admission")
    assert finding.details == {"gang": "train/w", "members": 3, "minMembers": 4, "holding": {CORE: "300", RATIO: "300"},
                               "rest": {CORE: "100", RATIO: "100"},
                               "stored": ["Pod train/w-0", "Pod train/w-1", "Pod train/w-2"]}
    # The whole minimum stored, or finished members: not partly admitted.
    assert with_check(audit_objects([TEAM, *stored, gang_pod("w-3", "w", 4)]), "gang-partly-admitted") == []
    finished = [gang_pod(f"w-{index}", "w", 4) | {"status": {"phase": "Succeeded"}} for index in range(3)]
    assert audit_objects([TEAM, *finished]).findings == []


def test_gang_members_disagree_about_the_minimum_or_the_request() -> None:
    report = audit_objects([TEAM, gang_pod("a-0", "a", 2), gang_pod("a-1", "a", 3)])
    finding = only(report, "gang-members-disagree")
    assert (finding.severity, finding.kind, finding.name) == (Severity.WARNING, "Pod", "a-0")
    assert finding.message == ("members of gang train/a disagree about its minimum (Pod train/a-0: 2; Pod train/a-1: 3)"
                               ": koord-scheduler reads each pod's own, and the webhook's reservation is sized by the "
                               "member that opens it")
    assert finding.details == {"gang": "train/a", "minimums": {"Pod train/a-0": 2, "Pod train/a-1": 3}}
    report = audit_objects([TEAM, gang_pod("b-0", "b", 2), gang_pod("b-1", "b", 2, {CORE: "200", RATIO: "200"})])
    finding = only(report, "gang-members-disagree")
    assert finding.message == (
        f"members of gang train/b ask for different resources and no PodGroup minResources gives the total "
        f"(Pod train/b-0: {CORE}=100,{RATIO}=100; Pod train/b-1: {CORE}=200,{RATIO}=200): its need is judged from "
        "the member whose admission opens the reservation, so it depends on which comes first")
    # Alike: nothing to say.
    assert with_check(audit_objects([TEAM, gang_pod("c-0", "c", 2), gang_pod("c-1", "c", 2)]),
                      "gang-members-disagree") == []
