"""kubectl's flag forms (``-o=json``, ``-f=FILE``, ``--flag=value``) and two-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli, split_short_equals

POD = """apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-a}
spec:
  containers:
  - name: main
    resources: {limits: {nvidia.com/gpu: "1"}}
"""


@pytest.fixture
def pod_file(tmp_path: Path) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(POD)
    return path


@pytest.mark.parametrize("form", [
    ["-f={pod}", "-o=json"],
    ["--filename={pod}", "--output=json"],
    ["-f", "{pod}", "-o", "json"],
    ["-f{pod}", "-ojson"],
])
def test_every_flag_form_kubectl_accepts_works(pod_file: Path, form: list[str]) -> None:
    result = CliRunner().invoke(cli, ["convert", *[arg.format(pod=pod_file) for arg in form]])

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["containers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}


def test_short_flag_with_equals_in_a_subgroup(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text("apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\n"
                                     "metadata: {name: q, namespace: a}\nspec: {max: {cpu: '1'}}\n")

    result = CliRunner().invoke(cli, ["migrate", "plan", f"-f={tmp_path / 'q.yaml'}", "-o=json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == []


def test_arguments_after_double_dash_are_not_split() -> None:
    assert split_short_equals(["-o=json", "--", "-f=x"]) == ["-o", "json", "--", "-f=x"]


@pytest.mark.parametrize(("args", "first_line", "command"), [
    (["convert", "-f", "x.yaml", "-x"], "Error: No such option '-x'.", "gpuquota convert"),
    (["convert", "-f", "x.yaml", "-o", "xml"],
     "Error: Invalid value for '-o' / '--output': 'xml' is not one of 'yaml', 'json', 'patch'.", "gpuquota convert"),
    (["convert"], "Error: Missing option '-f' / '--filename'.", "gpuquota convert"),
    (["convrt"], "Error: No such command 'convrt'. Did you mean 'convert'?", "gpuquota"),
    (["migrate", "plan", "--outpt", "json"],
     "Error: No such option '--outpt'. (Did you mean one of: '--context', '--output'?)", "gpuquota migrate plan"),
    (["audit", "-o=xml", "-f", "x"],
     "Error: Invalid value for '-o' / '--output': 'xml' is not one of 'table', 'wide', 'name', 'json', 'yaml', "
     "'policyreport'.",
     "gpuquota audit"),
])
def test_a_usage_error_is_two_lines_and_exit_2(args: list[str], first_line: str, command: str) -> None:
    result = CliRunner().invoke(cli, args, prog_name="gpuquota")

    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"{first_line}\nSee '{command} --help' for usage.\n"


@pytest.mark.parametrize("args", [[], ["certs"], ["migrate"]])
def test_a_group_without_a_command_still_shows_its_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args, prog_name="gpuquota")

    assert "Commands:" in result.output
    assert not result.output.startswith("Error:")


def test_the_kubectl_plugin_names_itself_as_kubectl_does(tmp_path: Path) -> None:
    import subprocess
    import sys

    plugin = Path(sys.executable).parent / "kubectl-gpuquota"

    result = subprocess.run([str(plugin), "convert", "-f=x.yaml", "-o=xml"], capture_output=True, text=True,
                            timeout=60, check=False)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("Error: Invalid value for '-o' / '--output': 'xml' is not one of 'yaml', 'json', "
                             "'patch'.\nSee 'kubectl gpuquota convert --help' for usage.\n")
