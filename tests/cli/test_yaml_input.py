"""Unreadable manifests: one ``Error:`` line with file, line and column; alias bombs refused at once."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

GPUQUOTA = Path(sys.executable).parent / "gpuquota"

POD_HEAD = """apiVersion: v1
kind: Pod
metadata: {name: lol, namespace: team-a}
spec:
  containers: [{name: c, resources: {limits: {nvidia.com/gpu: "1"}}}]
"""
# Nine levels of nine aliases: about 400 bytes that expand to 387 million list items.
BOMB = POD_HEAD + 'x: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{level}: &{level} [{','.join([f'*{previous}'] * 9)}]\n"
    for previous, level in zip("abcdefgh", "bcdefghi", strict=True))


def run(*args: str, stdin: str | bytes | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: x\nspec: {}\n",
     "4:5: not valid YAML: did not find expected ',' or '}' (while parsing a flow mapping started at line 3, "
     "column 11)"),
    ("kind: Pod\nmetadata:\n  name: a\n   labels: b\n",
     "4:10: not valid YAML: mapping values are not allowed in this context"),
    ("kind: Pod\nspec: *nowhere\n", "2:7: not valid YAML: found undefined alias"),
    ("kind: Pod\nmetadata:\n\tname: a\n",
     "3:1: not valid YAML: found character that cannot start any token (while scanning for the next token "
     "started at line 3, column 1)"),
])
@pytest.mark.parametrize("command", ["convert", "audit"])
def test_yaml_error_names_file_line_column_and_problem(tmp_path: Path, text: str, message: str,
                                                       command: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(text)

    assert run(command, "-f", str(path)) == (2, "", f"Error: {path}:{message}\n")


def test_json_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "pod.json"
    path.write_text('{"kind": "Pod",\n "metadata": }\n')

    assert run("convert", "-f", str(path)) == (2, "", f"Error: {path}:2:14: not valid JSON: Expecting value\n")


def test_a_binary_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_bytes(b"kind: Pod\n\xd0\x00\xff\x7fELF")

    assert run("convert", "-f", str(path)) == (
        2, "", f"Error: {path}: not UTF-8 text (byte 0xd0 at offset 10): a binary file?\n")


def test_binary_stdin_is_one_line() -> None:
    assert run("audit", "-f", "-", stdin=b"\x7fELF\x02\x01\x01\x00\xd0\xff") == (
        2, "", "Error: <stdin>: not UTF-8 text (byte 0xd0 at offset 8): a binary file?\n")


def test_control_characters_are_refused_with_their_position(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("kind: Pod\nmetadata: {name: \x01}\n")

    assert run("convert", "-f", str(path)) == (
        2, "", f"Error: {path}:2:18: not YAML text: control characters are not allowed (character 0x01)\n")


def _limit_memory() -> None:
    # Without the refusal the bomb would take every byte the machine has; 1 GiB makes that a quick failure.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("command", [["convert"], ["audit"], ["migrate", "plan"]])
def test_an_alias_bomb_is_refused(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 500

    result = subprocess.run([str(GPUQUOTA), *command, "-f", str(path)], capture_output=True, text=True,
                            timeout=30, preexec_fn=_limit_memory, check=False)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"Error: {path} (document 1): YAML aliases expand 118 written nodes to 490329067; "
                             "refused (an alias bomb?)\n")


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: &m {name: x, labels: {self: *m}}\n")

    assert run("convert", "-f", str(path)) == (
        2, "", f"Error: {path} (document 1): a YAML alias makes the document contain itself; refused\n")


def test_anchors_that_share_a_block_are_read(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                    "  - {name: a, resources: &gpu {limits: {nvidia.com/gpu: '1'}}}\n"
                    "  - {name: b, resources: *gpu}\n")

    code, out, _ = run("convert", "-f", str(path), "-o", "json")

    assert code == 0
    assert out.count('"koordinator.sh/gpu-core": "100"') == 2


@pytest.mark.parametrize(("content", "message"), [
    (b"enforcement: [\n", "{path}:2:1: not valid YAML: did not find expected node content (while parsing a flow "
                          "node started at line 2, column 1)"),
    (b"\x7fELF\x02\x01\x01\x00\xd0", "{path}: not UTF-8 text (byte 0xd0 at offset 8): a binary file?"),
])
def test_a_broken_conversion_config_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "pod.yaml").write_text(POD_HEAD)
    config = tmp_path / "config.yaml"
    config.write_bytes(content)

    assert run("convert", "-f", str(tmp_path / "pod.yaml"), "--config", str(config)) == (
        2, "", f"Error: {message.format(path=config)}\n")


@pytest.mark.parametrize("metadata", [
    "metadata: &m {name: x, labels: {self: *m}}",
    "metadata: &m\n  name: x\n  self: *m",
    'metadata: &m {"name": x, "self":*m}',
    "metadata: &m [x,*m]",
    "metadata: &m\n- x\n- *m",
])
def test_aliases_are_found_wherever_yaml_allows_them(tmp_path: Path, metadata: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(f"apiVersion: v1\nkind: Pod\n{metadata}\n")

    code, _, err = run("audit", "-f", str(path))

    assert (code, err) == (
        2, f"Error: {path} (document 1): a YAML alias makes the document contain itself; refused\n")
