"""A folder that holds more than Kubernetes objects (a Helm values.yaml, a half-edited file, a
document without kind): every command that judges manifests leaves the bad document out, names it
with file, line and column, judges every other object, and ends with exit status 3."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CLUSTER = REPO_ROOT / "examples" / "cluster"
GOOD_POD = """# the one pod of this file that can be read
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-nlp}
spec:
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: 1}   # one card
"""
# A syntax error in the first document, the good pod second, a document without kind third.
MIXED = "kind: Pod\nmetadata: {name: [broken\n---\n" + GOOD_POD + "---\nreplicas: 3\n"
VALUES = "# Helm values\nreplicaCount: 2\nimage:\n  tag: v1\n"
SKIPPED_LINES = [
    "skipped: {folder}/mixed.yaml:3:1: not valid YAML: did not find expected ',' or ']' (while parsing a flow "
    "sequence started at line 2, column 18)",
    "skipped: {folder}/mixed.yaml:14:1: not a Kubernetes object: it has no kind",
    "skipped: {folder}/values.yaml:2:1: not a Kubernetes object: it has no kind",
]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    gitops = tmp_path / "gitops"
    gitops.mkdir()
    (gitops / "mixed.yaml").write_text(MIXED)
    (gitops / "values.yaml").write_text(VALUES)
    return gitops


def run(*arguments: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(arguments))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def skipped(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("skipped: ")]


@pytest.mark.parametrize("command", [
    ["audit", "--fail-on", "none", "-o", "name"],
    ["convert", "-o", "json"],
    ["quota", "-o", "json"],
    ["migrate", "plan", "-o", "json"],
])
def test_every_other_object_is_judged_and_the_bad_ones_named(folder: Path, command: list[str]) -> None:
    status, stdout, stderr = run(*command, "-f", str(folder), "-f", str(EXAMPLE_CLUSTER))

    assert status == 3, stderr
    assert skipped(stderr) == [line.format(folder=folder) for line in SKIPPED_LINES]
    if command[0] == "convert":
        names = [item["metadata"]["name"] for item in yaml.safe_load(stdout)["items"]]
        assert "trainer" in names
    elif command[0] == "audit":
        assert "pod/trainer" in stdout.splitlines()
    else:
        assert stdout.strip()  # the answer about the rest


def test_explain_judges_the_pod_beside_the_bad_documents(folder: Path) -> None:
    status, stdout, stderr = run("explain", "-f", str(folder / "mixed.yaml"), "--state", str(EXAMPLE_CLUSTER))

    assert status == 3, stderr
    assert "team-nlp/trainer" in stdout
    assert skipped(stderr) == [line.format(folder=folder) for line in SKIPPED_LINES[:2]]


def test_explain_state_folder_with_a_values_file(folder: Path) -> None:
    state = folder.parent / "state"
    state.mkdir()
    for file in EXAMPLE_CLUSTER.iterdir():
        (state / file.name).write_text(file.read_text())
    (state / "values.yaml").write_text(VALUES)
    (folder / "pod.yaml").write_text(GOOD_POD)

    status, stdout, stderr = run("explain", "-f", str(folder / "pod.yaml"), "--state", str(state))

    assert status == 3, stderr
    assert skipped(stderr) == [f"skipped: {state}/values.yaml:2:1: not a Kubernetes object: it has no kind"]
    assert "ADMITTED" in stdout or "REFUSED" in stdout


def test_status_three_wins_over_findings_and_the_summary_says_why(folder: Path) -> None:
    status, stdout, _ = run("audit", "-f", str(folder), "-f", str(EXAMPLE_CLUSTER))

    assert status == 3
    assert stdout.rstrip().endswith("exit status 3 (input left out)")


def test_convert_writes_back_only_what_was_read_in_its_layout(folder: Path) -> None:
    status, stdout, stderr = run("convert", "-f", str(folder / "mixed.yaml"))

    assert status == 3, stderr
    assert "broken" not in stdout and "replicas" not in stdout
    assert stdout.startswith("---\n# the one pod of this file that can be read\n")
    assert "koordinator.sh/gpu-core" in stdout and "# one card" in stdout


def test_input_of_which_nothing_can_be_read_is_still_one_error_line(folder: Path) -> None:
    status, stdout, stderr = run("audit", "-f", str(folder / "values.yaml"))

    assert (status, stdout) == (2, "")
    assert stderr == f"Error: {folder}/values.yaml:2:1: not a Kubernetes object: it has no kind\n"


def test_a_command_that_writes_what_it_reads_refuses_the_whole_input(folder: Path) -> None:
    status, stdout, stderr = run("policyreport", "apply", "-f", str(folder))

    assert (status, stdout) == (2, "")
    assert stderr.startswith("Error: ") and len(stderr.splitlines()) == 1


def test_a_helm_template_is_named_by_its_yaml_problem_not_as_broken_json(folder: Path) -> None:
    """It opens with "{{", as JSON does; it is a YAML file of a chart, left out with its YAML problem."""
    (folder / "deployment.yaml").write_text("{{- if .Values.enabled }}\napiVersion: apps/v1\nkind: Deployment\n"
                                            "{{- end }}\n")

    status, _, stderr = run("audit", "--fail-on", "none", "-f", str(folder), "-f", str(EXAMPLE_CLUSTER))

    assert status == 3
    [line] = [line for line in skipped(stderr) if "deployment.yaml" in line]
    assert line.startswith(f"skipped: {folder}/deployment.yaml:1:") and "not valid YAML" in line, line
