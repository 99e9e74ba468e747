"""``gpuquota explain`` against the example cluster: its verdict and message are the webhook's own.

The refusal is compared with what a real ``gpuquota serve --state examples/cluster`` answers over
HTTPS for the same pod, mutated first and then validated, as the API server calls them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from reviews import review
from webhookproc import REPO_ROOT, WebhookProcess, post_review

from cli.main import cli
from gpuquota_core.jsonpatch import apply

EXAMPLE = str(REPO_ROOT / "examples" / "cluster")
OVER_QUOTA = REPO_ROOT / "examples" / "requests" / "validate-pod-over-quota.json"
MUTATE = REPO_ROOT / "examples" / "requests" / "mutate-pod.json"


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["explain", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path_factory.mktemp("explain-webhook"),
                            serve_args=["--state", EXAMPLE, "--workers", "1"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def webhook_answer(server: WebhookProcess, pod: dict[str, Any]) -> dict[str, Any]:
    """What the API server would get: /mutate-pods, its patch applied, then /validate-pods."""
    mutated = post_review(server, "/mutate-pods", review(pod))
    if mutated.get("patch"):
        pod = apply(pod, json.loads(base64.b64decode(mutated["patch"])))
    return post_review(server, "/validate-pods", review(pod))


def test_spellings_that_disagree_are_refused_by_the_mutating_call(served: WebhookProcess, tmp_path: Path) -> None:
    disagree = {"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "disagree", "namespace": "team-nlp"},
           "spec": {"containers": [{"name": "main", "image": "x",
                                    "resources": {"requests": disagree, "limits": disagree}}]}}
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod), encoding="utf-8")

    code, out, err = run("-f", str(manifest), "--state", EXAMPLE, "-o", "json")

    assert (code, err) == (1, "")
    explanation = json.loads(out)["explanations"][0]
    mutated = post_review(served, "/mutate-pods", review(pod))
    assert mutated["allowed"] is False
    assert (explanation["admitted"], explanation["code"], explanation["reason"], explanation["message"]) == (
        False, mutated["status"]["code"], mutated["status"]["reason"], mutated["status"]["message"])
    assert explanation["invalidRules"] == ["spellings-disagree"]
    assert explanation["mutation"]["summary"] == (
        "refused here, before another mutating webhook can change it (rule: spellings-disagree)")


def test_over_quota_pod_is_refused_with_the_webhooks_message(served: WebhookProcess) -> None:
    code, out, err = run("-f", str(OVER_QUOTA), "--state", EXAMPLE, "-o", "json")
    assert (code, err) == (1, "")
    explanation = json.loads(out)["explanations"][0]
    pod = json.loads(OVER_QUOTA.read_text())["request"]["object"]
    answer = webhook_answer(served, pod)
    assert answer["allowed"] is False
    assert (explanation["admitted"], explanation["code"], explanation["reason"], explanation["message"]) == (
        False, answer["status"]["code"], answer["status"]["reason"], answer["status"]["message"])
    assert explanation["message"].startswith("exceeded quota: team-nlp/team-nlp, requested: "
                                             "koordinator.sh/gpu-core=900")
    assert (explanation["quota"], explanation["rule"], explanation["chain"]) == (
        "team-nlp", "namespace-name", ["team-nlp", "ml-platform"])
    first = explanation["headroom"][0]
    assert (first["quota"], first["resource"], first["limit"], first["used"], first["charge"], first["freeBefore"],
            first["freeAfter"], first["fits"]) == ("team-nlp", "koordinator.sh/gpu-core", "400", "200", "900", "200",
                                                   "-700", False)


def test_text_output_of_a_refusal() -> None:
    code, out, _ = run("-f", str(OVER_QUOTA), "--state", EXAMPLE)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "Pod team-nlp/llm-finetune: REFUSED (403 QuotaExceeded)"
    assert lines[1].startswith("  exceeded quota: team-nlp/team-nlp")
    assert "Quota: team-nlp, by rule namespace-name: it is the quota named after the pod's namespace, " \
           "in that namespace" in lines
    assert "  chain: team-nlp -> ml-platform" in lines
    row = next(line for line in lines if line.strip().startswith("ml-platform") and "gpu-core" in line)
    assert "750 (7.5 cards)   -150 (-1.5 cards)" in row and row.endswith("over")


def test_admitted_legacy_pod_shows_the_rewrite(served: WebhookProcess) -> None:
    code, out, _ = run("-f", str(MUTATE), "--state", EXAMPLE, "-o", "json")
    assert code == 0
    explanation = json.loads(out)["explanations"][0]
    pod = json.loads(MUTATE.read_text())["request"]["object"]
    mutated = post_review(served, "/mutate-pods", review(pod))
    # The patch shown is the one /mutate-pods sends.
    assert explanation["mutation"]["patch"] == json.loads(base64.b64decode(mutated["patch"]))
    assert explanation["mutation"]["rewrites"] == [
        'container "trainer" nvidia.com/gpu: 2 -> koordinator.sh/gpu-core: 200, koordinator.sh/gpu-memory-ratio: 200']
    assert webhook_answer(served, pod)["allowed"] is True
    assert explanation["admitted"] is True
    team = [(h["quota"], h["freeBefore"], h["freeAfter"]) for h in explanation["headroom"]
            if h["resource"] == "koordinator.sh/gpu-core"]
    assert team == [("team-vision", "550", "350"), ("ml-platform", "750", "550")]


def test_deployment_template_with_replicas(tmp_path: Path) -> None:
    code, out, _ = run("-f", str(REPO_ROOT / "examples" / "cluster" / "workloads.yaml"), "--state", EXAMPLE)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Deployment team-nlp/inference (pod template): ADMITTED"
    assert '  rewrote container "server" nvidia.com/gpu: 1 -> koordinator.sh/gpu-core: 100, ' \
           'koordinator.sh/gpu-memory-ratio: 100' in lines
    assert "  replicas: 2; pods alike that fit now: 2" in lines
    # Five replicas of two cards each: team-nlp has room for one.
    deployment = next(yaml.safe_load_all((REPO_ROOT / "examples" / "cluster" / "workloads.yaml").read_text()))
    deployment["spec"]["replicas"] = 5
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "2"}
    code, out, _ = run("-f", "-", "--state", EXAMPLE, "-o", "json", stdin=yaml.safe_dump(deployment))
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"], explanation["replicas"], explanation["replicasThatFit"],
            explanation["fit"]) == (4, True, 5, 1, "some")


def test_namespace_annotation_and_label_rules(tmp_path: Path) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-nlp",
                                                           "labels": {"quota.scheduling.koordinator.sh/name": "gone"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    code, out, _ = run("-f", "-", "--state", EXAMPLE, "-o", "json", stdin=json.dumps(pod))
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["reason"], explanation["rule"]) == (1, "QuotaNotFound", "label-not-found")
    pod["metadata"]["labels"]["quota.scheduling.koordinator.sh/name"] = "team-vision"
    code, out, _ = run("-f", "-", "--state", EXAMPLE, "-o", "json", stdin=json.dumps(pod))
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["quota"], explanation["rule"]) == (0, "team-vision", "label")
    pod["metadata"] = {"name": "p"}  # no namespace: -n, else "default", where no quota applies
    code, out, _ = run("-f", "-", "--state", EXAMPLE, stdin=json.dumps(pod))
    assert code == 0 and "Quota: none (no label, namespace or annotation matched and there is no default quota: " \
                          "not quota-checked)" in out.splitlines()
    code, out, _ = run("-f", "-", "-n", "team-nlp", "--state", EXAMPLE, "-o", "json", stdin=json.dumps(pod))
    assert json.loads(out)["explanations"][0]["quota"] == "team-nlp"


def test_invalid_gpu_request_is_refused_with_the_validation_message(served: WebhookProcess) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "odd", "namespace": "team-vision"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"koordinator.sh/gpu-core": "150"}}}]}}
    code, out, _ = run("-f", "-", "--state", EXAMPLE, "-o", "json", stdin=json.dumps(pod))
    explanation = json.loads(out)["explanations"][0]
    answer = webhook_answer(served, pod)
    assert code == 1
    assert (explanation["code"], explanation["message"]) == (answer["status"]["code"], answer["status"]["message"])


def test_warn_mode_admits_and_says_what_would_be_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("enforcement: {default: enforce, checks: {QuotaExceeded: warn}}\n")
    code, out, _ = run("-f", str(OVER_QUOTA), "--state", EXAMPLE, "--config", str(config), "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"]) == (0, True)
    assert explanation["wouldDeny"][0]["check"] == "QuotaExceeded"
    assert explanation["wouldDeny"][0]["mode"] == "warn"
    assert explanation["wouldDeny"][0]["message"].startswith("exceeded quota: team-nlp/team-nlp")


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["-f", "/nonexistent.yaml", "--state", EXAMPLE], None, "Error: /nonexistent.yaml: no such file or directory"),
    (["-f", "-", "--state", EXAMPLE], "kind: ConfigMap\nmetadata: {name: x}\n",
     "Error: -: no Pod, workload with a pod template, or AdmissionReview"),
    (["-f", "-", "--state", EXAMPLE], "{not yaml", None),
    (["-f", str(OVER_QUOTA), "--state", EXAMPLE, "--kubeconfig", "k"], None,
     "Error: --state reads manifests; --kubeconfig/--context are for a live cluster: give one or the other"),
    (["--state", EXAMPLE], None, None),
])
def test_usage_and_file_errors_exit_2(args: list[str], stdin: str | None, message: str | None) -> None:
    code, _, err = run(*args, stdin=stdin)
    assert code == 2
    lines = err.strip().splitlines()
    if message is not None:
        assert lines == [message]
    elif "-f" in args:
        assert len(lines) == 1 and lines[0].startswith("Error: ")


def test_odd_input_never_crashes(tmp_path: Path) -> None:
    # A snapshot from `kubectl get -o yaml`: YAML timestamps are read as datetimes.
    stamped = "kind: Pod\nmetadata: {name: ts, namespace: team-nlp, creationTimestamp: 2024-01-01T00:00:00Z}\n" \
              "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]}\n"
    code, out, _ = run("-f", "-", "--state", EXAMPLE, stdin=stamped)
    assert (code, out.splitlines()[0]) == (0, "Pod team-nlp/ts: ADMITTED")
    # A pod the webhook cannot read is refused by it (exit 1), with its message.
    code, out, _ = run("-f", "-", "--state", EXAMPLE, stdin="kind: Pod\nmetadata: {name: s, namespace: x}\nspec: 3\n")
    assert code == 1
    assert out.splitlines()[:2] == ["Pod x/s: REFUSED (400 BadRequest)",
                                    "  cannot read the pod: spec: expected an object, got int"]
    assert not any(line.startswith("Quota:") for line in out.splitlines())
    code, _, err = run("-f", "-", "--state", EXAMPLE, stdin="kind: Pod\nmetadata: []\n")
    assert (code, err.strip()) == (2, "Error: Pod (unnamed): metadata is not an object")
    state = tmp_path / "bad.yaml"
    state.write_text("kind: ElasticQuota\nmetadata: {name: q}\nspec: {max: []}\n")
    code, _, err = run("-f", str(OVER_QUOTA), "--state", str(state))
    assert (code, err.strip()) == (2, "Error: cannot read an ElasticQuota: ElasticQuota q: spec.max: expected an "
                                      "object, got list")


def test_a_state_whose_quotas_do_not_form_a_tree_is_one_error_line(tmp_path: Path) -> None:
    # As `serve --state` refuses to load it: the limit enforced would depend on the file order.
    copies = [{"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
               "metadata": {"name": "team", "namespace": namespace}, "spec": {"max": {"nvidia.com/gpu": "1"}}}
              for namespace in ("a", "b")]
    (tmp_path / "state.yaml").write_text(yaml.safe_dump_all(copies))
    code, out, err = run("-f", str(OVER_QUOTA), "--state", str(tmp_path / "state.yaml"))
    assert (code, out) == (2, "")
    assert err.splitlines() == ["Error: the ElasticQuotas do not form a tree: ElasticQuota name team is used by 2 "
                                "quotas (a/team, b/team): quota names are cluster-wide in Koordinator, so only one of "
                                "them can limit the pods bound to that name"]


def test_a_cronjob_gives_the_replicas_and_fit_now_line_a_job_gives(tmp_path: Path) -> None:
    """Each run of a CronJob is a Job of its jobTemplate: as many pods at once as its parallelism."""
    job_spec = {"parallelism": 2, "template": {"spec": {"containers": [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "team-nlp"},
           "spec": job_spec}
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "team-nlp"},
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": job_spec}}}

    code, out, _ = run("-f", "-", "--state", EXAMPLE, stdin=yaml.safe_dump_all([job, cron]))

    assert code == 0
    job_text, cron_text = out.split("CronJob team-nlp/c (pod template)", 1)
    for text in (job_text, cron_text):
        assert "  replicas: 2; pods alike that fit now: 2" in text.splitlines(), out
    code, out, _ = run("-f", "-", "--state", EXAMPLE, "-o", "json", stdin=yaml.safe_dump_all([job, cron]))
    assert [(e["replicas"], e["replicasThatFit"]) for e in json.loads(out)["explanations"]] == [(2, 2), (2, 2)]
