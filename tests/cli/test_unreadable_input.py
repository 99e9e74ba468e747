"""Input a command cannot read gets the same answer from every command: one ``Error:`` line naming
the input, exit status 2, nothing on stdout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CLUSTER = str(REPO_ROOT / "examples" / "cluster")
GPUQUOTA = Path(sys.executable).parent / "gpuquota"
POD = """apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-a}
spec:
  containers:
  - {name: main, image: trainer, resources: {limits: {nvidia.com/gpu: 1}}}
"""

# Each command line that reads manifests, with INPUT where the unreadable input goes.
READERS = {
    "audit": ["audit", "-f", "INPUT"],
    "convert": ["convert", "-f", "INPUT"],
    "quota": ["quota", "-f", "INPUT"],
    "explain -f": ["explain", "-f", "INPUT", "--state", EXAMPLE_CLUSTER],
    "explain --state": ["explain", "-f", "POD", "--state", "INPUT"],
    "migrate plan": ["migrate", "plan", "-f", "INPUT"],
    "migrate rollback": ["migrate", "rollback", "-f", "INPUT"],
    "policyreport apply": ["policyreport", "apply", "-f", "INPUT"],
}


def _write(name: str, content: bytes) -> Callable[[Path], str]:
    def make(directory: Path) -> str:
        path = directory / name
        path.write_bytes(content)
        return str(path)
    return make


def _empty_directory(directory: Path) -> str:
    (directory / "empty").mkdir()
    (directory / "empty" / "README.txt").write_text("no manifests here\n")
    return str(directory / "empty")


# What cannot be read, made in a directory; the path the message must name.
UNREADABLE: dict[str, Callable[[Path], str]] = {
    "missing": lambda directory: str(directory / "missing.yaml"),
    "/dev/null": lambda directory: "/dev/null",
    "empty file": _write("empty.yaml", b""),
    "only comments": _write("comments.yaml", b"# nothing yet\n---\n"),
    "directory without manifests": _empty_directory,
    "binary": _write("binary.yaml", b"\x7fELF\x02\x01\x01\x00\xd0\xcf"),
    "invalid YAML": _write("broken.yaml", b"kind: Pod\nmetadata: {name: [x\n"),
    "invalid JSON": _write("broken.json", b'{"kind": "Pod",}'),
    "a scalar": _write("scalar.yaml", b"42\n"),
    "no kind": _write("nokind.yaml", b"apiVersion: v1\nmetadata: {name: x}\n"),
}


@pytest.mark.parametrize("case", UNREADABLE)
@pytest.mark.parametrize("command", READERS)
def test_every_command_answers_unreadable_input_with_one_error_line(tmp_path: Path, command: str,
                                                                    case: str) -> None:
    unreadable = UNREADABLE[case](tmp_path)
    (tmp_path / "pod.yaml").write_text(POD)
    arguments = [{"INPUT": unreadable, "POD": str(tmp_path / "pod.yaml")}.get(a, a) for a in READERS[command]]

    result = CliRunner().invoke(cli, arguments, env={"KUBECONFIG": str(tmp_path / "no-kubeconfig")})

    assert (result.exit_code, result.stdout) == (2, ""), result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert unreadable in lines[0]
    assert ("no such file" in lines[0]) == (case == "missing")  # /dev/null exists, and reads as empty


def test_a_pipe_is_read_as_a_file(tmp_path: Path) -> None:
    """``-f <(kubectl get pods -o yaml)``: the shell hands over /dev/fd/N, a pipe, not a regular file."""
    (tmp_path / "pod.yaml").write_text(POD)
    bash = shutil.which("bash")
    assert bash is not None

    result = subprocess.run([bash, "-c", f'"$0" audit -o name -f <(cat {tmp_path}/pod.yaml)', str(GPUQUOTA)],
                            capture_output=True, text=True, timeout=60)

    assert (result.returncode, result.stdout, result.stderr) == (0, "pod/trainer\n", "")
