"""One verdict in every view, as a property over generated clusters.

For a generated cluster (tests/clustergen.py) written as manifest files, every view the CLI gives
is run through click on those files: ``audit -o json`` and ``-o policyreport``, ``explain -o json``,
``convert -o json``, ``migrate plan -o json`` and ``quota -o json --pods``. Each is compared with
what the webhook itself decides for every object: its handlers (``AdmissionHandlers.mutate_pod``
and, on the patched pod, ``validate_pod``: the functions ``/mutate-pods`` and ``/validate-pods``
call) over its own ``QuotaState`` loaded from the same objects and the nodes among them. They must
agree, object by object, on:

* rewritten or left as written: the patch itself, and the reason when left;
* admitted or refused, with the code, reason, message and rules (quotas too: what
  ``/validate-elasticquotas`` says of each as written is the audit's ``quota-refused-by-webhook``);
* the quota charged and at which levels: the quota a pod resolves to, its chain, and every
  quota's usage.

And the webhook's own answer keeps the GPU vendor: a pod rewritten from ``nvidia.com/gpu`` or
``amd.com/gpu`` lands, as stored, only on that vendor's nodes (the generated clusters mix NVIDIA
and AMD nodes, labelled or not).

A pod the cluster already holds is judged as if created in its own place (the cluster without
it); a workload's template as the pod its controller would create now. Each cluster is explained
under one of several enforcement configs (``--config``: every check enforced, the quota check in
warn, everything in dry-run, ...), and the reference answers under the same one: for a workload, the
webhook's handlers admitting its pods one after another say how many are admitted, how many only
with a would-deny, and which; explain must say the same and end with the matching exit status.
The audit's pod verdict is the webhook's with the quotas otherwise empty, every check enforced
(how full a quota is, is its ``quota-over-limit``). With no Node in the input the views judge as
``rewrite: always`` would (they say so), and so does the reference here.

A difference is a bug in a view. ``GPUQUOTA_VIEWS_EXAMPLES`` sets the number of clusters (``make
property-long`` runs many more, randomized); tests/webhook/admission/test_one_verdict_served.py sends a few
of them through a real ``gpuquota serve --state``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import reviews
import yaml
from click.testing import CliRunner
from clustergen import Cluster, broken_quota_trees, clusters, template_pod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from statedecider import StateDecider

from cli.main import cli
from gpuquota_core.audit import TEMPLATE_PATHS, Severity, template_of
from gpuquota_core.conversion import DEFAULT_CONFIG, DEFAULT_VENDORS, ConversionConfig
from gpuquota_core.enforcement import INVALID, load_enforcement
from gpuquota_core.gang_view import pod_gang
from gpuquota_core.jsonpatch import apply
from gpuquota_core.placement import (
    NodeView,
    RewritePolicy,
    constraints_of,
    gpu_names,
    is_vendors_node,
    reachable_nodes,
    scheduled_names,
    spec_resources,
)
from gpuquota_core.pod_records import pod_is_counted, remembered_pod_requests
from gpuquota_core.policy_report import RESULT_FOR_SEVERITY
from gpuquota_core.quantity import ZERO
from gpuquota_core.quota_integrity import DUPLICATE_NAME, PARENT_CYCLE, PARENT_MISSING, PARENT_UNREADABLE
from gpuquota_core.quota_objects import POD_QUOTA_LABEL, UNCHECKED_QUOTAS
from gpuquota_core.quota_view import workload_replicas
from gpuquota_core.resources import is_gpu_name
from webhook.admission.decisions import AdmissionHandlers
from webhook.admission.review import decode_review
from webhook.quota.state import QuotaState

EXAMPLES = int(os.environ.get("GPUQUOTA_VIEWS_EXAMPLES", "2500"))
PROFILE = settings(max_examples=EXAMPLES, deadline=None,
                   derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1",
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
POD_CHECKS = {"pod-legacy-gpu-request", "workload-legacy-gpu-request", "pod-invalid-gpu-request", "pod-quota-refused"}
REVISIT_CHECKS = {"workload-legacy-gpu-request", "pod-invalid-gpu-request", "pod-quota-refused",
                  "gpu-request-unadvertised", "resourcequota-gpu-bypassed"}
# The enforcement sections explain is given with --config (None: no --config, every check enforced).
ENFORCEMENTS: list[str | None] = [
    None,
    "enforcement: {checks: {QuotaExceeded: warn}}\n",
    "enforcement: {default: dry-run}\n",
    "enforcement: {default: warn, checks: {Invalid: enforce, QuotaExceeded: dry-run}}\n",
]


# -- the reference: the webhook's own handlers over its own quota state ----------------------------

def quota_review(quota: dict[str, Any]) -> dict[str, Any]:
    """An UPDATE of a stored quota that writes it as it is: what the webhook says of it as written."""
    return reviews.review(quota, operation="UPDATE", old=quota, kind="ElasticQuota", group="scheduling.sigs.k8s.io",
                          version="v1alpha1", resource="elasticquotas")


def quota_verdicts(cluster: Cluster) -> dict[str, tuple[bool, str]]:
    """``/validate-elasticquotas`` on each quota as written, in the cluster: (allowed, message)."""
    state = QuotaState()
    state.load(cluster.objects)
    handlers = AdmissionHandlers(DEFAULT_CONFIG, StateDecider(state))
    verdicts = {}
    for quota in cluster.quotas:
        response = handlers.validate_elasticquota(decode_review(json.dumps(quota_review(quota)).encode())).response
        verdicts[quota["metadata"]["name"]] = (response.allowed, response.message or "")
    return verdicts


@dataclass
class Answer:
    """What the API server would get back for one pod's CREATE: mutation, then validation."""

    patch: list[dict[str, Any]]
    mutate_warnings: list[str]
    allowed: bool
    code: int
    reason: str
    message: str
    rules: list[str] = field(default_factory=list)  # 422 Invalid: the validation rules
    pod: dict[str, Any] = field(default_factory=dict)  # as stored (patched)
    used: dict[str, dict[str, str]] = field(default_factory=dict)  # quota -> resource -> what the state counts
    # The refusals warn or dry-run let through: check, mode, message.
    would_deny: list[dict[str, str]] = field(default_factory=list)


def answer(pod: dict[str, Any], state_objects: Iterable[dict[str, Any]], config: ConversionConfig,
           view: NodeView | None) -> Answer:
    state = QuotaState()
    state.load(state_objects)
    handlers = AdmissionHandlers(config, StateDecider(state), lambda: view)
    mutation = handlers.mutate_pod(decode_review(json.dumps(reviews.review(pod, dry_run=True)).encode()))
    mutated = mutation.response
    used = {quota.name: {name: str(amount) for name, amount in state.usage.used(quota.name).items()}
            for quota in state.tree}
    if not mutated.allowed:
        # Generated pods are readable: only a GPU request the mutating call refuses itself
        # (spellings that disagree), with /validate-pods' code, reason, message and rules.
        assert mutated.reason == "Invalid", mutated
        return Answer([], list(mutated.warnings), False, mutated.code, mutated.reason or "", mutated.message or "",
                      mutation.note.split(","), pod, used)
    patch = [dict(op) for op in mutated.patch or ()]
    stored = apply(pod, patch) if patch else pod
    outcome = handlers.validate_pod(decode_review(json.dumps(reviews.review(stored, dry_run=True)).encode()))
    verdict = outcome.response
    rules = outcome.note.split(",") if not verdict.allowed and verdict.reason == "Invalid" else []
    would_deny = [{"check": r.check, "mode": r.mode.value, "message": r.message} for r in outcome.relaxed]
    return Answer(patch, list(mutated.warnings), verdict.allowed, verdict.code, verdict.reason or "",
                  verdict.message or "", rules, stored, used, would_deny)




@dataclass
class Subject:
    kind: str
    namespace: str
    name: str
    pod: dict[str, Any]  # the pod the webhook is asked about
    now: Answer  # against the cluster (without the pod itself)
    empty: Answer  # against its quotas with nothing in them (the audit's question)
    existing: bool  # a pod the cluster holds and counts
    replicas: int | None = None  # a workload's pods at once
    # Of those, what the webhook does when they are created one after another.
    in_turn: InTurnServed | None = None

    @property
    def explain_source(self) -> str:
        where = f"{self.namespace}/{self.name}"
        return f"Pod {where}" if self.kind == "Pod" else f"{self.kind} {where} (pod template)"


@dataclass(frozen=True)
class InTurnServed:
    """A workload's pods through /validate-pods' handler one after another, each reserving."""

    fit: int  # admitted by the quota decision itself
    admitted: int  # admitted in the end, warn or dry-run letting some through
    would_be_refused: int  # of those admitted, the ones with a would-deny
    beyond_fit: dict[str, str] | None  # the quota decision's would-deny of the first pod beyond ``fit``


def admitted_in_turn(now: Answer, objects: list[dict[str, Any]], config: ConversionConfig,
                     replicas: int | None) -> InTurnServed | None:
    """The webhook's handlers admitting ``replicas`` pods as ``now`` stores them, one after another,
    each reserved (not dry runs), under ``config``'s enforcement. None where the quota decision is
    never reached (the pod is refused as invalid first)."""
    if replicas is None or now.rules:
        return None
    if not now.allowed:
        return InTurnServed(0, 0, 0, None)
    state = QuotaState()
    state.load(objects)
    handlers = AdmissionHandlers(config, StateDecider(state))
    fit = admitted = would_be_refused = 0
    beyond_fit: dict[str, str] | None = None
    for index in range(replicas):
        metadata = {**now.pod["metadata"], "name": f"{now.pod['metadata'].get('generateName', '')}{index}",
                    "uid": f"in-turn-{index}"}
        outcome = handlers.validate_pod(decode_review(json.dumps(reviews.review(
            {**now.pod, "metadata": metadata}, uid=f"review-{index}")).encode()))
        if not outcome.response.allowed:
            continue
        admitted += 1
        would_be_refused += bool(outcome.relaxed)
        # What the quota decision refused (validation's Invalid is judged before it, the same for every pod).
        by_quota = [r for r in outcome.relaxed if r.check != INVALID]
        if not by_quota:
            fit += 1
        elif beyond_fit is None:
            assert index == fit, (index, fit)  # the pods the quota admits come first, then none of them
            beyond_fit = {"check": by_quota[0].check, "mode": by_quota[0].mode.value, "message": by_quota[0].message}
    return InTurnServed(fit, admitted, would_be_refused, beyond_fit)


def reference(cluster: Cluster, enforcement: str | None = None) -> tuple[list[Subject], QuotaState, ConversionConfig]:
    """``enforcement``: the section explain is given (its answers, ``now``); the audit's and
    convert's (``empty``) are the webhook's without one."""
    view = NodeView.from_objects(cluster.nodes)
    # No Node to look at: every offline view judges as `rewrite: always` would (and says so).
    config = replace(DEFAULT_CONFIG, rewrite=RewritePolicy.ALWAYS) if view is None else DEFAULT_CONFIG
    explained = config if enforcement is None else replace(
        config, enforcement=load_enforcement(yaml.safe_load(enforcement)["enforcement"]))
    objects = cluster.objects
    # "Quotas otherwise empty": no pod counted; the PodGroups stay, as they say which pods form a gang.
    empty = [*cluster.quotas, *cluster.pod_groups]
    subjects: list[Subject] = []
    for pod in cluster.pods:
        others = [o for o in objects if o is not pod]
        metadata = pod["metadata"]
        subjects.append(Subject("Pod", metadata["namespace"], metadata["name"], pod,
                                answer(pod, others, explained, view), answer(pod, empty, config, view),
                                pod_is_counted(pod)))
    for workload in cluster.workloads:
        if workload["kind"] in TEMPLATE_PATHS:
            pod = template_pod(workload)
            metadata = workload["metadata"]
            now = answer(pod, objects, explained, view)
            replicas = workload_replicas(workload)
            subjects.append(Subject(workload["kind"], metadata["namespace"], metadata["name"], pod,
                                    now, answer(pod, empty, config, view), False,
                                    replicas, admitted_in_turn(now, objects, explained, replicas)))
    state = QuotaState()
    state.load(objects)
    return subjects, state, config


# -- the views, through click on the files ---------------------------------------------------------

def run(args: list[str], expect: Iterable[int] = (0,)) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in tuple(expect), (args, result.exit_code, result.output, result.exception)
    return result.stdout


def check_audit(findings: list[dict[str, Any]], subjects: list[Subject], state: QuotaState,
                quota_answers: dict[str, tuple[bool, str]]) -> None:
    on: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for finding in findings:
        on.setdefault((finding["kind"], finding["namespace"], finding["name"]), {})[finding["check"]] = finding
    for subject in subjects:
        found = {check: f for check, f in on.get((subject.kind, subject.namespace, subject.name), {}).items()
                 if check in POD_CHECKS}
        legacy = "pod-legacy-gpu-request" if subject.kind == "Pod" else "workload-legacy-gpu-request"
        context = (subject.kind, subject.name, subject.empty, found)
        # Rewritten or left as written: the webhook's own decision, nodes included.
        assert (legacy in found) == bool(subject.empty.patch), context
        # Refused by validation (the rules and the message), or by the quota decision.
        invalid = found.get("pod-invalid-gpu-request")
        if subject.empty.rules:
            assert invalid is not None, context
            assert sorted(set(invalid["details"]["rules"])) == subject.empty.rules, context
            assert "; ".join(f"{p} [rule: {r}]" for p, r in zip(invalid["details"]["problems"],
                                                                invalid["details"]["rules"], strict=True)) == \
                subject.empty.message, context
            assert "pod-quota-refused" not in found, context
            continue
        assert invalid is None, context
        refused = found.get("pod-quota-refused")
        judged = subject.kind != "Pod" or pod_is_counted(subject.pod)  # a finished pod is never admitted again
        if judged and not subject.empty.allowed:
            assert refused is not None, context
            assert (refused["details"]["code"], refused["details"]["reason"], refused["message"]) == (
                subject.empty.code, subject.empty.reason, subject.empty.message), context
        else:
            assert refused is None, context
    # Every quota as written: refused by /validate-elasticquotas exactly when the audit says so, in its words.
    for name, (allowed, message) in quota_answers.items():
        refused = [f for f in findings if (f["kind"], f["name"], f["check"]) == (
            "ElasticQuota", name, "quota-refused-by-webhook")]
        assert [f["message"] for f in refused] == ([] if allowed else [message]), (name, allowed, message)
    # Every quota's usage, charged as the webhook's state charges it; over its limit where checked.
    usage = {}
    for finding in findings:
        if finding["check"] == "quota-over-limit":
            usage[finding["name"]] = finding
    for quota in state.tree:
        if state.tree.get(quota.name) is not quota or quota.name in UNCHECKED_QUOTAS:
            continue
        limit, _ = state.tree.limit(quota.name)
        used = state.usage.used(quota.name)
        over = {k for k, v in used.items() if k in limit and v > limit[k]}
        assert (quota.name in usage) == bool(over), (quota.name, used, limit)


def check_usage_summary(summary: dict[str, Any], state: QuotaState) -> None:
    for name, resources in summary["quotaUsage"].items():
        used = state.usage.used(name)
        for resource, figures in resources.items():
            assert figures["used"] == str(used.get(resource, ZERO)), (name, resource)


def check_policy_reports(text: str, findings: list[dict[str, Any]]) -> None:
    results = sorted((r["policy"], r["rule"], r["result"], r["resources"][0]["kind"],
                      r["resources"][0].get("namespace", ""), r["resources"][0]["name"], r["message"])
                     for report in yaml.load_all(text, Loader=YAML_LOADER) if report for r in report["results"])
    expected = sorted((f["check"], f["check"], RESULT_FOR_SEVERITY[Severity[f["severity"].upper()]], f["kind"],
                       f["namespace"], f["name"], f["message"]) for f in findings)
    assert results == expected


def check_explain(explanations: list[dict[str, Any]], subjects: list[Subject], state: QuotaState) -> None:
    by_source = {e["subject"]: e for e in explanations}
    for subject in subjects:
        explained = by_source[subject.explain_source]
        now = subject.now
        context = (subject.explain_source, explained, now)
        assert explained["existing"] == subject.existing, context
        assert (explained["admitted"], explained["code"], explained["reason"], explained["message"]) == (
            now.allowed, now.code, now.reason, now.message), context
        assert explained["mutation"]["patch"] == now.patch, context
        assert bool(explained["mutation"]["rewrites"]) == bool(now.patch), context
        # Why a request was left as written, where the pod can land: the webhook's own warnings.
        notes = [w.removeprefix("gpuquota: ").removeprefix("gpuquota ") for w in now.mutate_warnings
                 if not w.startswith("gpuquota rewrote ")]
        assert explained["mutation"]["notes"] == notes, context
        assert explained["invalidRules"] == now.rules, context
        assert explained["wouldDeny"] == now.would_deny, context
        # How many of a workload's pods fit now, and how many are admitted (warn or dry-run letting
        # some through, and which refusal): what the webhook does one after another.
        turn = subject.in_turn
        if subject.replicas is not None:
            assert (explained["replicasThatFit"], explained["replicasAdmitted"], explained["replicasWouldBeRefused"],
                    explained["wouldDenyBeyondFit"]) == (
                (None, None, None, None) if turn is None else
                (turn.fit, turn.admitted, turn.would_be_refused, turn.beyond_fit)), context
        else:
            assert "replicasThatFit" not in explained, context
        if now.rules:
            assert explained["headroom"] == [], context
            continue
        # A gang member is told its gang (read as the webhook's state reads it).
        metadata = now.pod.get("metadata") or {}
        gang = pod_gang(subject.namespace, metadata, state.pod_groups)
        assert (explained["gang"] or {}).get("gang") == (gang.key if gang is not None and explained["quota"]
                                                         in state.tree.quotas else None), context
        # The quota charged, and at which levels.
        labels = now.pod.get("metadata", {}).get("labels") or {}
        resolution = state.tree.resolve(subject.namespace, str(labels.get(POD_QUOTA_LABEL) or ""))
        assert explained["quota"] == resolution.quota, context
        if resolution.quota in state.tree.quotas:
            assert explained["chain"] == [q.name for q in state.tree.chain(resolution.quota)], context
        # At every level: what the state counts (without the pod itself) and what the pod adds.
        requests = remembered_pod_requests(now.pod["spec"])
        for level in explained["headroom"]:
            assert level["quota"] in explained["chain"], context
            assert level["used"] == now.used.get(level["quota"], {}).get(level["resource"], "0"), context
            # A negative request (invalid, admitted only when Invalid is in warn or dry-run) adds nothing.
            assert level["charge"] == str(max(requests.get(level["resource"], ZERO), ZERO)), context


def stored_pod_of(item: dict[str, Any], kind: str) -> dict[str, Any]:
    if kind == "Pod":
        return item
    template = template_of(item)
    assert template is not None
    return {"metadata": template.get("metadata") or {}, "spec": template["spec"]}


def check_convert(items: list[dict[str, Any]], stderr: str, subjects: list[Subject]) -> None:
    by_key = {(i["kind"], i["metadata"].get("namespace", ""), i["metadata"]["name"]): i for i in items}
    refused = {line.split(": would be refused by /validate-pods: ", 1)[0]
               for line in stderr.splitlines() if ": would be refused by /validate-pods: " in line}
    for subject in subjects:
        converted = stored_pod_of(by_key[(subject.kind, subject.namespace, subject.name)], subject.kind)
        stored = subject.empty.pod
        context = (subject.kind, subject.name, converted, stored)
        assert converted["spec"] == stored["spec"], context
        assert (converted["metadata"].get("annotations") or {}) == (stored["metadata"].get("annotations") or {}), \
            context
        ref = f"{subject.kind}/{subject.namespace}/{subject.name}"
        assert (ref in refused) == bool(subject.empty.rules), (ref, refused, subject.empty)
        # Left as written, and why: the webhook's words.
        left = [w for w in subject.empty.mutate_warnings if w.startswith("gpuquota left ")]
        assert [line.removeprefix(f"{ref}: ") for line in stderr.splitlines()
                if line.startswith(f"{ref}: gpuquota left ")] == left, (ref, stderr, left)


def check_migrate(plan: dict[str, Any], findings: list[dict[str, Any]]) -> None:
    # A quota whose pods still store vendor names keeps those keys (a plan's own entry, from the
    # pods, not an audit check): only ever said of a quota the plan migrates.
    kept = {r["name"] for r in plan["revisit"] if r["check"] == "vendor-pods-running"}
    revisit = sorted((r["kind"], r["namespace"], r["name"], r["check"], r["message"]) for r in plan["revisit"]
                     if r["check"] != "vendor-pods-running")
    expected = sorted((f["kind"], f["namespace"], f["name"], f["check"], f["message"]) for f in findings
                      if f["kind"] not in ("Pod", "Node", "ElasticQuota") and f["check"] in REVISIT_CHECKS)
    assert revisit == expected
    legacy = {f["name"] for f in findings if f["check"] == "quota-legacy-gpu-key"}
    assert {s["quota"] for s in plan["steps"]} == legacy
    assert kept <= legacy
    over = {f["name"] for f in findings if f["check"] == "quota-over-limit"}
    assert {b["quota"] for b in plan["blocked"] if b["reason"] == "over-limit"} == over & legacy


def check_quota_view(view: dict[str, Any], state: QuotaState, cluster: Cluster) -> None:
    for quota in view["quotas"]:
        used = state.usage.used(quota["name"])
        for resource in quota["resources"]:
            assert resource["used"] == str(used.get(resource["name"], ZERO)), (quota["name"], resource)
        for pod in quota["pods"]:
            key = f"{pod['namespace']}/{pod['name']}"
            assert state.usage.charged_to(key)[0] == quota["name"] == pod["quota"], (key, quota["name"])
            record = state.usage.get(key)
            assert record is not None
            assert pod["requests"] == {n: str(q) for n, q in sorted(record.requests.items()) if is_gpu_name(n)}
    listed = {f"{p['namespace']}/{p['name']}" for q in view["quotas"] for p in q["pods"]}
    charged = {record.key for record in state.usage.pods() if state.usage.charged_to(record.key)}
    assert listed == charged
    # Every gang with a member charged to a quota, its members as the webhook's state counts them;
    # files hold no reservations, so what one holds is unknown.
    gangs: dict[str, str] = {}
    for pod in cluster.pods:
        record = state.usage.get(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        if record is None or not state.usage.charged_to(record.key):
            continue
        gang = pod_gang(record.namespace, pod["metadata"], state.pod_groups)
        if gang is not None and gang.key not in gangs:
            gangs[gang.key] = state.usage.charged_to(record.key)[0]
    shown = {row["gang"]: row for row in view["gangs"]}
    assert set(shown) == set(gangs), (shown, gangs)
    for key, row in shown.items():
        stored, asked = state.usage.gang_members(key)
        assert (row["stored"], row["reserved"]) == (stored, None), row
        assert row["asked"] == {n: str(q) for n, q in sorted(asked.items()) if is_gpu_name(n)}, row


def check_vendor_kept(subjects: list[Subject], view: NodeView | None) -> None:
    """A pod the webhook rewrote from one vendor's name lands, as stored, only on that vendor's
    nodes: of the nodes it can be scheduled on, only those advertise every GPU name it asks for."""
    if view is None:
        return
    for subject in subjects:
        asked = gpu_names(spec_resources(subject.pod["spec"])) & set(DEFAULT_VENDORS)
        for answer in (subject.now, subject.empty):
            stored = answer.pod["spec"]
            if not answer.patch or len(asked) != 1 or gpu_names(spec_resources(stored)) & set(DEFAULT_VENDORS):
                continue
            vendor = DEFAULT_VENDORS[next(iter(asked))]
            needs = scheduled_names(gpu_names(spec_resources(stored)))
            landing = [node for node in reachable_nodes(constraints_of(stored), view.nodes)
                       if needs <= node.resources]
            assert all(is_vendors_node(vendor, node) for node in landing), (subject.kind, subject.name, vendor,
                                                                            [n.name for n in landing], stored)


def check_views(cluster: Cluster, directory: Path, enforcement: str | None = None) -> None:
    if not cluster.objects:
        return  # every view refuses an input with nothing in it alike (tests/cli/test_empty_input.py)
    cluster.write(directory)
    subjects, state, _ = reference(cluster, enforcement)
    check_vendor_kept(subjects, NodeView.from_objects(cluster.nodes))
    files = str(directory)
    audit = json.loads(run(["audit", "-f", files, "-o", "json", "--fail-on", "none"]))
    check_audit(audit["findings"], subjects, state, quota_verdicts(cluster))
    check_usage_summary(audit["summary"], state)
    check_policy_reports(run(["audit", "-f", files, "-o", "policyreport", "--fail-on", "none"]), audit["findings"])
    if subjects:
        explain_files = [f for name in ("pods", "workloads") if (directory / f"{name}.json").exists()
                         for f in ("-f", str(directory / f"{name}.json"))]
        if enforcement is not None:
            (directory.parent / "config.yaml").write_text(enforcement)
            explain_files += ["--config", str(directory.parent / "config.yaml")]
        result = CliRunner().invoke(cli, ["explain", *explain_files, "--state", files, "-o", "json"])
        explained = json.loads(result.stdout)
        check_explain(explained["explanations"], subjects, state)
        # The exit status says it too: 1 when one is refused (none of a workload's pods is
        # admitted), else 4 when only some of a workload's pods are, else 0 (docs/cli.md); warn
        # and dry-run admit what they let through.
        admitted = [(s.now.allowed, s.replicas, None if s.in_turn is None else s.in_turn.admitted) for s in subjects]
        refused = any(not allowed or (replicas and count == 0) for allowed, replicas, count in admitted)
        some = any(replicas is not None and count is not None and 0 < count < replicas
                   for _, replicas, count in admitted)
        assert result.exit_code == (1 if refused else 4 if some else 0), (result.exit_code, admitted)
        result = CliRunner().invoke(cli, ["convert", "-f", files, "-o", "json"])
        assert result.exit_code == (1 if any(s.empty.rules for s in subjects) else 0), result.output
        document = json.loads(result.stdout)
        check_convert(document["items"] if document.get("kind") == "List" else [document], result.stderr, subjects)
    plan = json.loads(run(["migrate", "plan", "-f", files, "-o", "json"], expect=(0, 1)))
    check_migrate(plan, audit["findings"])
    if cluster.quotas:
        quota_view = CliRunner().invoke(cli, ["quota", "-f", files, "-o", "json", "--pods"])
        check_quota_view(json.loads(quota_view.stdout), state, cluster)
        check_broken_tree(json.loads(quota_view.stdout), quota_view.exit_code, audit["findings"])


TREE_CHECKS = {DUPLICATE_NAME, PARENT_MISSING, PARENT_UNREADABLE, PARENT_CYCLE}


def check_broken_tree(view: dict[str, Any], status: int, findings: list[dict[str, Any]]) -> None:
    """``quota`` shows the quotas the audit says do not form a tree as broken, in its words, and ends
    1 exactly when the audit has such an error."""
    audited = sorted((f["check"], f["namespace"], f["name"], f["message"]) for f in findings
                     if f["check"] in TREE_CHECKS)
    shown = sorted((p["check"], p["namespace"], p["name"], p["message"]) for p in view["treeProblems"])
    assert shown == audited
    assert status == (1 if audited else 0)
    # Each quota shown is marked with every problem of its name (one copy of a repeated name is shown).
    marked = [(b["check"], q["name"], b["message"]) for q in view["quotas"] for b in q.get("broken", [])]
    assert len(marked) == len(set(marked))
    assert set(marked) == {(check, name, message) for check, _, name, message in audited}


BROKEN_EXAMPLES = int(os.environ.get("GPUQUOTA_BROKEN_TREE_EXAMPLES", "150"))


@settings(PROFILE, max_examples=BROKEN_EXAMPLES)
@given(quotas=broken_quota_trees())
def test_quota_audit_and_explain_state_agree_on_a_broken_tree(quotas: list[dict[str, Any]]) -> None:
    """The same files, three views: the audit's tree errors, ``quota``'s broken trees and status, and
    ``explain --state`` (as ``serve --state``) refusing exactly a repeated name or a cycle."""
    with tempfile.TemporaryDirectory() as directory:
        files = Cluster(quotas=quotas).write(Path(directory) / "state")
        audit = json.loads(run(["audit", "-f", str(files), "-o", "json", "--fail-on", "none"]))
        quota_view = CliRunner().invoke(cli, ["quota", "-f", str(files), "-o", "json"])
        check_broken_tree(json.loads(quota_view.stdout), quota_view.exit_code, audit["findings"])
        pod = Path(directory) / "pod.yaml"
        pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                       "metadata": {"name": "p", "namespace": "team-a"}, "spec": {"containers": []}}))
        explained = CliRunner().invoke(cli, ["explain", "-f", str(pod), "--state", str(files)])
        # What serve --state refuses to load: a quota it cannot read, a repeated name, a cycle.
        fatal = {f["check"] for f in audit["findings"]} & {"quota-invalid", DUPLICATE_NAME, PARENT_CYCLE}
        assert (explained.exit_code == 2) == bool(fatal), (explained.output, fatal)


@PROFILE
@given(cluster=clusters(), enforcement=st.sampled_from(ENFORCEMENTS))
def test_every_view_gives_the_webhooks_verdict_on_every_object(cluster: Cluster, enforcement: str | None) -> None:
    with tempfile.TemporaryDirectory() as directory:
        check_views(cluster, Path(directory) / "cluster", enforcement)

