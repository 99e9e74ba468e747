"""The audit and a real ``gpuquota serve`` (gunicorn, TLS) agree on a few objects, message for message.

tests/core/test_one_truth.py checks the same on generated input through the handlers in-process;
this is the served path for the cases the issue names: a quota with a negative max and min above
max, a pod naming no quota, a pod whose reason changes once the mutating webhook has rewritten it
(on a node advertising the canonical names); and the one deliberate difference: a quota whose
parent does not exist is an audit finding the webhook admits (its watch may not yet hold a parent
created just before).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml
from reviews import pod, review
from webhookproc import post_review, served_from_state

from gpuquota_core.audit import audit_objects
from gpuquota_core.jsonpatch import apply
from webhook.admission.status import status_of

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
STORED = [{"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
           "metadata": {"name": "team", "namespace": "team"}, "spec": {"max": {CORE: "400", RATIO: "400"}}},
          # A node advertising the canonical names: the webhook rewrites where a pod can land on it.
          {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "shared-0"},
           "status": {"allocatable": {CORE: "400", RATIO: "400"}}}]


def quota(name: str, spec: dict[str, Any], parent: str = "") -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": name, "namespace": "team", "labels": labels}, "spec": spec}


def quota_review(obj: dict[str, Any]) -> dict[str, Any]:
    return review(obj, kind="ElasticQuota", group="scheduling.sigs.k8s.io", version="v1alpha1",
                  resource="elasticquotas")


def test_served_webhook_and_audit_give_the_same_verdicts(tmp_path: Path) -> None:
    negative = quota("negative", {"min": {CORE: "100"}, "max": {CORE: "-100"}})
    orphan = quota("orphan", {"max": {CORE: "100", RATIO: "100"}}, parent="gone")
    ghost = pod("ghost", "team", labels={"quota.scheduling.koordinator.sh/name": "missing"},
                resources={CORE: "10", RATIO: "10"})
    mixed = pod("mixed", "team", containers=[
        {"name": "a", "image": "x", "resources": {"limits": {CORE: "1"}}},
        {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    report = audit_objects([*STORED, negative, orphan, ghost, mixed])
    findings = {(f.name, f.check): f for f in report.findings}

    with served_from_state(tmp_path, yaml.safe_dump_all(STORED)) as server:
        refused = post_review(server, "/validate-elasticquotas", quota_review(negative))
        assert refused["status"]["code"] == 422
        assert refused["status"]["message"] == findings[("negative", "quota-refused-by-webhook")].message

        assert post_review(server, "/validate-elasticquotas", quota_review(orphan))["allowed"]
        assert ("orphan", "quota-parent-missing") in findings

        refused = post_review(server, "/validate-pods", review(ghost, dry_run=True))
        finding = findings[("ghost", "pod-quota-refused")]
        assert (refused["status"]["code"], refused["status"]["reason"], refused["status"]["message"]) == (
            status_of(finding.details["reason"]), finding.details["reason"], finding.message)

        mutated = post_review(server, "/mutate-pods", review(mixed))
        # shared-0 advertises the canonical names: the card is rewritten, and judged so by both.
        rewritten = apply(mixed, json.loads(base64.b64decode(mutated["patch"])))
        refused = post_review(server, "/validate-pods", review(rewritten, dry_run=True))
        finding = findings[("mixed", "pod-invalid-gpu-request")]
        assert finding.details["rules"] == ["percentage"]
        assert refused["status"]["message"] == "; ".join(
            f"{problem} [rule: {rule}]" for problem, rule in zip(finding.details["problems"], finding.details["rules"],
                                                                  strict=True))
