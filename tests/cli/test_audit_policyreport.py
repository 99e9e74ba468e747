"""``gpuquota audit -o policyreport`` on manifest files, and ``policyreport apply``'s refusals."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def test_example_cluster_as_policy_reports() -> None:
    result = CliRunner().invoke(cli, ["audit", "-f", str(EXAMPLES), "-o", "policyreport", "--fail-on", "none"])
    assert result.exit_code == 0, result.output
    reports = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    json_result = CliRunner().invoke(cli, ["audit", "-f", str(EXAMPLES), "-o", "json", "--fail-on", "none"])
    findings = yaml.safe_load(json_result.stdout)["findings"]

    assert reports[0]["kind"] == "ClusterPolicyReport"
    assert {r["kind"] for r in reports[1:]} <= {"PolicyReport"}
    results = [(res["policy"], res["resources"][0]["kind"], res["resources"][0]["name"], res["message"])
               for r in reports for res in r["results"]]
    assert sorted(results) == sorted((f["check"], f["kind"], f["name"], f["message"]) for f in findings)
    assert sum(r["summary"]["fail"] + r["summary"]["warn"] for r in reports) == len(findings)


def test_policyreport_output_keeps_the_exit_code_of_fail_on() -> None:
    result = CliRunner().invoke(cli, ["audit", "-f", str(EXAMPLES), "-o", "policyreport"])

    assert result.exit_code == 1
    assert result.stdout.startswith("apiVersion: wgpolicyk8s.io/v1alpha2\nkind: ClusterPolicyReport\n")


def test_apply_refuses_anything_but_the_audits_reports(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: y}\n")

    result = CliRunner().invoke(cli, ["policyreport", "apply", "-f", str(path)])

    assert result.exit_code == 2
    assert result.stderr == "Error: v1/ConfigMap is not a wgpolicyk8s.io/v1alpha2 PolicyReport or ClusterPolicyReport\n"


def test_apply_refuses_an_empty_file_rather_than_pruning_everything(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")

    result = CliRunner().invoke(cli, ["policyreport", "apply", "-f", str(path)])

    assert result.exit_code == 2
    assert result.stderr == f"Error: no reports in {path}\n"
