"""One verdict, served: generated clusters through a real ``gpuquota serve --state`` over HTTPS.

tests/cli/test_one_verdict_property.py compares every CLI view with the webhook's handlers
in-process on thousands of generated clusters; this sends a few of them (``GPUQUOTA_SERVED_EXAMPLES``)
through the real server (gunicorn, TLS, its quota service and published node view) and compares
its answers with the CLI's verdicts (``gpuquota explain -o json --state`` on the same files): for
every pod not yet created and every workload's template, the patch ``/mutate-pods`` sends and why
it leaves a request as written, and whether ``/validate-pods`` admits the patched pod, with its
code, reason and message; and for every quota, whether ``/validate-elasticquotas`` refuses it as
written, against the audit's ``quota-refused-by-webhook``.

Each cluster has at least one Node: with none listed the served webhook leaves every request as
written ("not listed yet") while the offline views judge as ``rewrite: always`` would, on purpose
(docs/cli.md).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
import reviews
from click.testing import CliRunner
from clustergen import Cluster, clusters, template_pod
from hypothesis import HealthCheck, given, settings
from webhookproc import WebhookProcess, generate_certs, post_review

from cli.main import cli
from gpuquota_core.audit import TEMPLATE_PATHS
from gpuquota_core.jsonpatch import apply

EXAMPLES = int(os.environ.get("GPUQUOTA_SERVED_EXAMPLES", "5"))


def served_subjects(cluster: Cluster) -> bool:
    return bool(cluster.nodes) and bool(cluster.new_pods or any(w["kind"] in TEMPLATE_PATHS
                                                                for w in cluster.workloads))


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    directory = tmp_path_factory.mktemp("certs")
    return directory, generate_certs(directory)




def served_answer(server: WebhookProcess, pod: dict[str, Any]) -> dict[str, Any]:
    """The API server's path for a CREATE (a dry run: nothing reserved): mutate, patch, validate."""
    mutated = post_review(server, "/mutate-pods", reviews.review(pod, dry_run=True))
    assert mutated["allowed"], mutated
    patch = json.loads(base64.b64decode(mutated["patch"])) if "patch" in mutated else []
    validated = post_review(server, "/validate-pods", reviews.review(apply(pod, patch) if patch else pod,
                                                                      dry_run=True))
    status = validated.get("status") or {}
    return {"patch": patch, "warnings": mutated.get("warnings") or [], "allowed": validated["allowed"],
            "code": status.get("code", 200), "reason": status.get("reason", ""), "message": status.get("message", "")}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("GPUQUOTA_PROPERTY_RANDOM") != "1",
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(cluster=clusters().filter(served_subjects))
def test_the_served_webhook_answers_as_the_cli_explains(cluster: Cluster, cert_dir: tuple[Path, str],
                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    work = tmp_path_factory.mktemp("served")
    state = cluster.write(work / "state")
    subjects = [(f"Pod {p['metadata']['namespace']}/{p['metadata']['name']}", p) for p in cluster.new_pods]
    subjects += [(f"{w['kind']} {w['metadata']['namespace']}/{w['metadata']['name']} (pod template)", template_pod(w))
                 for w in cluster.workloads if w["kind"] in TEMPLATE_PATHS]
    path = cluster.write_yaml(work / "subjects.yaml", [*cluster.new_pods, *(w for w in cluster.workloads
                                                                            if w["kind"] in TEMPLATE_PATHS)])
    result = CliRunner().invoke(cli, ["explain", "-f", str(path), "--state", str(state), "-o", "json"])
    assert result.exit_code in (0, 1, 4), result.output  # 4: some of a workload's pods fit now, not all
    explained = {e["subject"]: e for e in json.loads(result.stdout)["explanations"]}
    audit = CliRunner().invoke(cli, ["audit", "-f", str(state), "-o", "json", "--fail-on", "none"])
    findings = json.loads(audit.stdout)["findings"]

    server = WebhookProcess(work / "server", serve_args=["--state", str(state)])
    server.cert_dir, server.ca_bundle = cert_dir
    server.start()
    try:
        for source, pod in subjects:
            served = served_answer(server, pod)
            explanation = explained[source]
            context = (source, served, explanation)
            assert (served["allowed"], served["code"], served["reason"], served["message"]) == (
                explanation["admitted"], explanation["code"], explanation["reason"], explanation["message"]), context
            assert served["patch"] == explanation["mutation"]["patch"], context
            notes = [w.removeprefix("gpuquota: ").removeprefix("gpuquota ") for w in served["warnings"]
                     if not w.startswith("gpuquota rewrote ")]
            assert explanation["mutation"]["notes"] == notes, context
        # Each quota as written (an UPDATE that writes it as stored): refused exactly when the audit
        # reports quota-refused-by-webhook, with its message.
        for quota in cluster.quotas:
            review = reviews.review(quota, operation="UPDATE", old=quota, kind="ElasticQuota",
                                    group="scheduling.sigs.k8s.io", version="v1alpha1", resource="elasticquotas")
            served_quota = post_review(server, "/validate-elasticquotas", review)
            refused = [f["message"] for f in findings if (f["kind"], f["name"], f["check"]) == (
                "ElasticQuota", quota["metadata"]["name"], "quota-refused-by-webhook")]
            expected = [] if served_quota["allowed"] else [served_quota["status"]["message"]]
            assert refused == expected, (quota, served_quota, refused)
    finally:
        server.stop()
