"""Issue 36's disagreements between views, each on the input the issue names.

tests/cli/test_one_verdict_property.py checks the same agreement on generated clusters; these are
the cases as a user met them: the example cluster, and a pod with an invalid GPU request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_legacy_pod_that_can_reach_only_a_vendor_node_is_left_as_written_by_every_view() -> None:
    # team-vision/resnet-train-0 asks nvidia.com/gpu: 2 and is bound to gpu-whole-0, which
    # advertises only nvidia.com/gpu: the webhook leaves it as written, and so must every view.
    _, out, _ = run("audit", "-f", str(EXAMPLES), "-o", "json", "--fail-on", "none")
    on_resnet = [f for f in json.loads(out)["findings"] if f["name"] == "resnet-train-0"]
    assert on_resnet == []
    _, out, _ = run("audit", "-f", str(EXAMPLES), "-o", "policyreport", "--fail-on", "none")
    results = [result for report in yaml.safe_load_all(out) if report for result in report["results"]]
    assert [r for r in results if r["resources"][0]["name"] == "resnet-train-0"] == []
    # The one workload the webhook does rewrite is still reported, in both forms.
    assert {r["policy"] for r in results if r["resources"][0]["name"] == "inference"} == {
        "workload-legacy-gpu-request"}

    _, out, _ = run("convert", "-f", str(EXAMPLES), "-o", "json")
    stored = {item["metadata"]["name"]: item for item in json.loads(out)["items"]}
    assert stored["resnet-train-0"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    _, out, _ = run("explain", "-f", str(EXAMPLES / "pods.yaml"), "--state", str(EXAMPLES), "-o", "json")
    [resnet] = [e for e in json.loads(out)["explanations"] if e["subject"] == "Pod team-vision/resnet-train-0"]
    assert resnet["mutation"]["rewrites"] == [] and resnet["mutation"]["patch"] == []
    _, out, _ = run("migrate", "plan", "-f", str(EXAMPLES), "-o", "json")
    assert [item["name"] for item in json.loads(out)["revisit"] if item["kind"] == "Pod"] == []


def test_explaining_a_pod_that_already_exists_does_not_count_it_twice() -> None:
    _, out, _ = run("explain", "-f", str(EXAMPLES / "pods.yaml"), "--state", str(EXAMPLES), "-o", "json")
    explanations = {e["subject"]: e for e in json.loads(out)["explanations"]}
    resnet = explanations["Pod team-vision/resnet-train-0"]
    assert resnet["existing"] is True
    # team-vision holds resnet (200) and notebook-alice (50): judged in its own place, resnet finds
    # the 50 of the notebook in USED and adds its own 200, leaving what is free today.
    rows = {(level["quota"], level["resource"]): level for level in resnet["headroom"]}
    core = rows[("team-vision", "koordinator.sh/gpu-core")]
    assert (core["used"], core["charge"], core["freeAfter"]) == ("50", "200", "550")
    _, quota_out, _ = run("quota", "-f", str(EXAMPLES), "-o", "json")
    [team_vision] = [q for q in json.loads(quota_out)["quotas"] if q["name"] == "team-vision"]
    [free] = [r["free"] for r in team_vision["resources"] if r["name"] == "koordinator.sh/gpu-core"]
    assert core["freeAfter"] == free
    # The text says so, and shows the same numbers.
    _, text, _ = run("explain", "-f", str(EXAMPLES / "pods.yaml"), "--state", str(EXAMPLES))
    assert "The pod already exists in the cluster: judged as if created in its place" in text
    assert "team-vision   gpu-core           800 (8 cards)     50 (0.5 cards)    200 (2 cards)" in text
    # A pod of a new name is not "existing".
    new = dict(yaml.safe_load((EXAMPLES / "pods.yaml").read_text().split("---")[0]))
    new["metadata"] = {**new["metadata"], "name": "resnet-train-1"}
    assert all(not e["existing"] for e in _explain_objects([new]))


def _explain_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result = CliRunner().invoke(cli, ["explain", "-f", "-", "--state", str(EXAMPLES), "-o", "json"],
                                input=yaml.safe_dump_all(objects))
    explanations: list[dict[str, Any]] = json.loads(result.stdout)["explanations"]
    return explanations


def _odd_pod(amount: str) -> str:
    return (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: odd, namespace: team-nlp}}\nspec:\n  containers:\n"
            f"  - name: c\n    image: x\n    resources:\n      limits: {{nvidia.com/gpu: {amount}}}\n")


@pytest.mark.parametrize(("amount", "rule", "shown"), [
    ("-1", "negative", "-1"),
    ("0.5", "not-integer", "0.5"),  # as written, not the canonical 500m
    ('"1.5"', "not-integer", "1.5"),
    ("99999999999999999999", "out-of-range", "99999999999999999999"),
    ('"99999999999999999999"', "out-of-range", "99999999999999999999"),
])
def test_explain_says_what_it_did_with_an_invalid_request_in_the_users_own_number(
        amount: str, rule: str, shown: str, tmp_path: Path) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(_odd_pod(amount))
    status, text, _ = run("explain", "-f", str(path), "--state", str(EXAMPLES))
    assert status == 1
    assert "already canonical" not in text
    assert f"  no rewrite (the request is invalid; /validate-pods refuses it, rule: {rule})" in text
    assert f"[rule: {rule}]" in text
    # Refused before the quota decision: no quota charged, no headroom table.
    assert "POD ADDS" not in text
    # The number as the user wrote it, as the audit and convert quote it.
    _, audit_out, _ = run("audit", "pods", "-f", str(path), "-o", "json")
    [finding] = json.loads(audit_out)["findings"]
    assert finding["check"] == "pod-invalid-gpu-request" and finding["details"]["rules"] == [rule]
    assert f"[nvidia.com/gpu]: {shown} " in finding["message"]
    assert f"[nvidia.com/gpu]: {shown} " in text
    assert "100e18" not in text and "10000E" not in text
    _, explained, _ = run("explain", "-f", str(path), "--state", str(EXAMPLES), "-o", "json")
    [explanation] = json.loads(explained)["explanations"]
    assert explanation["message"] == f"{finding['message']} [rule: {rule}]"
    assert explanation["invalidRules"] == [rule] and explanation["headroom"] == []


def test_a_templates_pod_is_named_alike_by_the_audit_and_explain(tmp_path: Path) -> None:
    # Found by the property test: the audit named a template's pod by the workload's name, while the
    # webhook (and explain, which sends it the review) sees only its generateName.
    workload = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "team-nlp"},
                "spec": {"template": {"metadata": {"labels": {"quota.scheduling.koordinator.sh/name": "gone"}},
                                      "spec": {"containers": [{"name": "c", "resources": {
                                          "limits": {"koordinator.sh/gpu-core": "50",
                                                     "koordinator.sh/gpu-memory-ratio": "50"}}}]}}}}
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump(workload))
    _, audit_out, _ = run("audit", "workloads", "-f", str(path), "-f", str(EXAMPLES), "-o", "json")
    [finding] = [f for f in json.loads(audit_out)["findings"] if f["name"] == "web"]
    _, explained, _ = run("explain", "-f", str(path), "--state", str(EXAMPLES), "-o", "json")
    [explanation] = json.loads(explained)["explanations"]
    assert finding["check"] == "pod-quota-refused"
    assert finding["message"] == explanation["message"]
    assert "pod team-nlp/web- names ElasticQuota 'gone'" in finding["message"]
