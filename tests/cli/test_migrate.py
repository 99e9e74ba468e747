"""``gpuquota migrate plan`` on manifest files: ordering, canonical values, blocked trees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli.main import cli


def quota(name: str, parent: str | None, cards: str, is_parent: bool = False) -> dict[str, Any]:
    labels = {"quota.scheduling.koordinator.sh/is-parent": "true" if is_parent else "false"}
    if parent:
        labels["quota.scheduling.koordinator.sh/parent"] = parent
    return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": name, "labels": labels},
            "spec": {"min": {"nvidia.com/gpu": cards}, "max": {"nvidia.com/gpu": cards}}}


TREE = [quota("org", None, "4", is_parent=True), quota("team", "org", "2"),
        {"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "team"},
         "spec": {"hard": {"limits.nvidia.com/gpu": "2"}}}]


def plan(tmp_path: Path, *args: str) -> Any:
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump_all(TREE))
    result = CliRunner().invoke(cli, ["migrate", "plan", "-f", str(path), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_gate_on_adds_top_down_then_drops_bottom_up(tmp_path: Path) -> None:
    steps = json.loads(plan(tmp_path, "--update-resource-key-gate", "-o", "json"))["steps"]
    assert [(s["phase"], s["quota"]) for s in steps] == [
        ("add-canonical", "org"), ("add-canonical", "team"), ("drop-legacy", "team"), ("drop-legacy", "org")]
    assert steps[-1]["after"]["max"] == {"koordinator.sh/gpu-core": "400", "koordinator.sh/gpu-memory-ratio": "400"}
    # Every intermediate state keeps child max keys within the parent's.
    state = {"org": set(steps[0]["before"]["max"]), "team": set(steps[1]["before"]["max"])}
    for step in steps:
        state[step["quota"]] = set(step["after"]["max"])
        assert state["team"] <= state["org"]


def test_gate_off_reports_blocked_tree(tmp_path: Path) -> None:
    out = plan(tmp_path)
    assert "-  max.nvidia.com/gpu: 4" in out and "+  max.koordinator.sh/gpu-core: 400" in out
    assert "BLOCKED: quotas org, team are in a multi-level tree" in out
    assert "REVISIT: ResourceQuota team/rq: limits limits.nvidia.com/gpu" in out


def test_usage_over_new_limit_is_blocked(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "team",
                                       "labels": {"quota.scheduling.koordinator.sh/name": "team"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}}
    path.write_text(yaml.safe_dump_all([*TREE, pod]))
    result = CliRunner().invoke(cli, ["migrate", "plan", "-o", "json", "-f", str(path)])
    blocked = json.loads(result.stdout)["blocked"]
    assert any("quota team: canonical usage exceeds the limit: koordinator.sh/gpu-core 300 > 200" in b
               for b in blocked)
