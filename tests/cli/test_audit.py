"""``gpuquota audit`` on manifest files: every check id, exact numbers and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli.main import cli

OBJECTS: list[dict[str, Any]] = [
    {"kind": "Node", "metadata": {"name": "mixed", "labels": {"node.koordinator.sh/gpu-shared": "true"}},
     "status": {"capacity": {"nvidia.com/gpu": "2", "koordinator.sh/gpu-core": "100",
                             "koordinator.sh/gpu-memory-ratio": "200"}}},
    {"kind": "ElasticQuota", "metadata": {"name": "parent", "namespace": "ops",
                                          "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
     "spec": {"min": {"koordinator.sh/gpu-core": "100"},
              "max": {"koordinator.sh/gpu-core": "400", "koordinator.sh/gpu-memory-ratio": "400"}}},
    # Pods of namespace team belong to child through the namespaces annotation
    # (pkg/scheduler/plugins/elasticquota/plugin_helper.go).
    {"kind": "ElasticQuota", "metadata": {"name": "child", "namespace": "team",
                                          "labels": {"quota.scheduling.koordinator.sh/parent": "parent"},
                                          "annotations": {"quota.scheduling.koordinator.sh/namespaces": '["team"]'}},
     "spec": {"min": {"nvidia.com/gpu": "2"},
              "max": {"nvidia.com/gpu": "1", "amd.com/gpu": "1", "koordinator.sh/gpu-core": "100"}}},
    {"kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
     "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
    {"kind": "Pod", "metadata": {"name": "bad", "namespace": "team"},
     "spec": {"containers": [{"name": "c", "resources": {"limits": {"koordinator.sh/gpu-core": "150"}}}]}},
    {"kind": "CronJob", "metadata": {"name": "cj", "namespace": "team"},
     "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
         {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}}},
    {"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "team"},
     "spec": {"hard": {"requests.nvidia.com/gpu": "4", "pods": "10"}}},
]


def run(tmp_path: Path, *args: str, objects: list[dict[str, Any]] = OBJECTS) -> tuple[int, str, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    result = CliRunner().invoke(cli, ["audit", *args, "-f", str(path)])
    return result.exit_code, result.stdout, result.stderr


def test_every_check_fires(tmp_path: Path) -> None:
    code, out, _ = run(tmp_path, "-o", "json")
    assert code == 1
    report = json.loads(out)
    checks = {(f["check"], f["name"]) for f in report["findings"]}
    assert checks >= {
        ("node-mixed-gpu-resources", "mixed"), ("node-gpu-count-mismatch", "mixed"),
        ("node-gpu-mode-label-mismatch", "mixed"), ("quota-legacy-gpu-key", "child"),
        ("quota-mixed-gpu-keys", "child"), ("quota-tree-key-mismatch", "child"),
        ("quota-min-exceeds-parent", "parent"), ("quota-unadvertised-resource", "child"),
        ("quota-over-limit", "child"), ("pod-legacy-gpu-request", "p"), ("pod-invalid-gpu-request", "bad"),
        ("workload-legacy-gpu-request", "cj"), ("resourcequota-gpu-bypassed", "rq"),
    }
    mismatch = next(f for f in report["findings"] if f["check"] == "node-gpu-count-mismatch")
    assert mismatch["details"] == {"resource": "koordinator.sh/gpu-core", "value": "100", "expected": "200"}
    over_min = next(f for f in report["findings"] if f["check"] == "quota-min-exceeds-parent")
    assert over_min["details"]["koordinator.sh/gpu-core"] == {"children": "200", "min": "100"}
    # Pods p (2 cards -> 200) and bad (150) are charged to child, whose canonical core limit is 100.
    assert report["summary"]["quotaUsage"]["child"]["koordinator.sh/gpu-core"] == {"used": "350", "limit": "100"}
    assert report["summary"]["gpuCapacity"]["vendor"] == {"nvidia.com/gpu": "2"}


def test_fail_on_and_clean_input(tmp_path: Path) -> None:
    assert run(tmp_path, "resourcequotas")[0] == 0  # warnings only, default --fail-on error
    assert run(tmp_path, "resourcequotas", "--fail-on", "warning")[0] == 1
    code, out, _ = run(tmp_path, objects=[{"kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": []}}])
    assert (code, out.strip()) == (0, "No findings.")


def test_table_is_aligned(tmp_path: Path) -> None:
    _, out, _ = run(tmp_path, "resourcequotas")
    lines = out.splitlines()
    assert lines[0].split() == ["SEVERITY", "KIND", "NAMESPACE", "NAME", "CHECK", "MESSAGE"]
    assert lines[1].index("resourcequota-gpu-bypassed") == lines[0].index("CHECK")
    assert lines[1].index("limits requests.nvidia.com/gpu") == lines[0].index("MESSAGE")


def test_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", "-f", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"Error: {tmp_path / 'missing.yaml'}: no such file or directory"]
    result = CliRunner().invoke(cli, ["audit", "-o", "xml", "-f", "-"], input="")
    assert result.exit_code == 2


def test_stdin(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", "resourcequotas", "-o", "yaml", "-f", "-"],
                                input=yaml.safe_dump_all(OBJECTS))
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["findings"][0]["check"] == "resourcequota-gpu-bypassed"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cluster"


def test_a_quota_the_webhook_refuses_fails_the_audit(tmp_path: Path) -> None:
    # Before: exit 0, while /validate-elasticquotas answered 422 for the same object.
    bad = {"kind": "ElasticQuota", "metadata": {"name": "bad", "namespace": "t"},
           "spec": {"min": {"koordinator.sh/gpu-core": "100"}, "max": {"koordinator.sh/gpu-core": "-100"}}}
    code, out, _ = run(tmp_path, "-o", "json", objects=[bad])
    assert code == 1
    assert [(f["check"], f["name"]) for f in json.loads(out)["findings"]] == [("quota-refused-by-webhook", "bad")]


def test_namespace_shows_its_findings_judged_with_the_whole_tree() -> None:
    # Before: -n team-nlp dropped the parent (namespace koordinator-system) before judging, so
    # team-nlp's own key mismatch with it vanished and the audit exited 0.
    result = CliRunner().invoke(cli, ["audit", "-f", str(EXAMPLES), "-n", "team-nlp", "-o", "json"])
    assert result.exit_code == 1
    findings = json.loads(result.stdout)["findings"]
    assert ("quota-tree-key-mismatch", "team-nlp") in {(f["check"], f["name"]) for f in findings}
    assert {f["namespace"] for f in findings} == {"team-nlp", ""}
    assert "quota-parent-missing" not in {f["check"] for f in findings}
    assert set(json.loads(result.stdout)["summary"]["quotaUsage"]) == {"team-nlp"}
