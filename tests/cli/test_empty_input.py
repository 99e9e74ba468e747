"""Empty input is named on stderr; a plan with nothing to do says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

CANONICAL_QUOTA = """apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team-a}
spec:
  max: {koordinator.sh/gpu-core: "400", koordinator.sh/gpu-memory-ratio: "400"}
  min: {koordinator.sh/gpu-core: "200", koordinator.sh/gpu-memory-ratio: "200"}
"""
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: a}\n"


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("command", "verb"), [(["convert"], "convert"), (["audit"], "audit"),
                                               (["migrate", "plan"], "plan")])
@pytest.mark.parametrize("content", ["", "\n# only a comment\n", "---\n---\n", "[]\n",
                                     "apiVersion: v1\nkind: List\nitems: []\n"])
def test_an_empty_file_says_so_on_stderr(tmp_path: Path, command: list[str], verb: str, content: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(content)

    assert run(*command, "-f", str(path)) == (2, "", f"Error: no objects in {path}: nothing to {verb}\n")


def test_empty_stdin_says_so_on_stderr() -> None:
    assert run("convert", "-f", "-", stdin="") == (2, "", "Error: no objects in <stdin>: nothing to convert\n")


def test_plan_without_elasticquotas_says_there_is_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "cm.yaml").write_text(CONFIGMAP)

    assert run("migrate", "plan", "-f", str(tmp_path / "cm.yaml")) == (
        0, "nothing to migrate: no ElasticQuota in the input\n", "")


def test_plan_of_a_canonical_tree_says_there_is_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(CANONICAL_QUOTA)

    assert run("migrate", "plan", "-f", str(tmp_path / "q.yaml")) == (
        0, "nothing to migrate: every ElasticQuota already uses canonical GPU keys\n", "")


def test_plan_as_json_keeps_stdout_parseable_and_says_it_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(CANONICAL_QUOTA)

    code, out, err = run("migrate", "plan", "-f", str(tmp_path / "q.yaml"), "-o", "json")

    assert code == 0
    assert out == '{\n  "steps": [],\n  "blocked": [],\n  "revisit": []\n}\n'
    assert err == "nothing to migrate: every ElasticQuota already uses canonical GPU keys\n"
