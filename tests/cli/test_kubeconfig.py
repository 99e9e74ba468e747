"""Kubeconfig files as kubectl reads them: merged from $KUBECONFIG, refused in one line when broken.

Nothing listens on ports 1-3 of 127.0.0.1, so which server the CLI picked shows in the connection
error it ends with; a broken kubeconfig never gets that far.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from kubeaccess import pki
from kubeaccess.kube import context_namespace

KUBECTL_GPUQUOTA = Path(sys.executable).parent / "kubectl-gpuquota"

FIRST = """apiVersion: v1
kind: Config
current-context: ctx-b
clusters:
- name: shared
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
"""
# Sets current-context too, and a cluster of the same name: both lose to the first file.
SECOND = """apiVersion: v1
kind: Config
current-context: other
clusters:
- name: shared
  cluster: {server: "https://127.0.0.1:2", insecure-skip-tls-verify: true}
- name: own
  cluster: {server: "https://127.0.0.1:3", certificate-authority: ca/ca.crt}
contexts:
- name: ctx-b
  context: {cluster: shared, namespace: team-b}
- name: other
  context: {cluster: own, namespace: team-other}
"""


def audit(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["audit", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def refused_at_port(port: int) -> str:
    return f"Error: cannot reach the API server: HTTPSConnectionPool(host='127.0.0.1', port={port}):"


@pytest.fixture
def two_files(tmp_path: Path) -> str:
    (tmp_path / "one").mkdir()
    (tmp_path / "two" / "ca").mkdir(parents=True)
    (tmp_path / "one" / "config").write_text(FIRST)
    (tmp_path / "two" / "config").write_text(SECOND)
    (tmp_path / "two" / "ca" / "ca.crt").write_bytes(pki.create_ca("test").cert_pem)
    return f"{tmp_path / 'one' / 'config'}:{tmp_path / 'two' / 'config'}"


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(two_files: str) -> None:
    # current-context from the first file that sets it (ctx-b, defined only in the second file);
    # cluster "shared" from the first file that names it (port 1, not the second file's port 2).
    code, out, err = audit(env={"KUBECONFIG": two_files})

    assert (code, out) == (2, "")
    assert err.startswith(refused_at_port(1))
    assert err.count("\n") == 1


def test_context_namespace_comes_from_the_merged_context(two_files: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", two_files)

    assert context_namespace(None, None) == "team-b"
    assert context_namespace(None, "other") == "team-other"


def test_relative_certificate_paths_resolve_against_their_own_file(two_files: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # ca/ca.crt exists only beside the second file

    code, _, err = audit("--context", "other", env={"KUBECONFIG": two_files})

    assert code == 2
    assert err.startswith(refused_at_port(3))


def test_empty_entries_and_missing_files_in_kubeconfig_are_skipped(two_files: str, tmp_path: Path) -> None:
    listed = f"{tmp_path / 'missing'}::{two_files}"

    code, _, err = audit(env={"KUBECONFIG": listed})

    assert code == 2
    assert err.startswith(refused_at_port(1))


def test_kubeconfig_flag_reads_that_file_only(two_files: str) -> None:
    first = two_files.split(":")[0]

    assert audit("--kubeconfig", first, env={"KUBECONFIG": two_files}) == (
        2, "", f'Error: {first}: context "ctx-b" not found (contexts: none)\n')


BROKEN = [
    pytest.param("apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster: {server: x\n",
                 "{path}:6:1: not valid YAML: did not find expected ',' or '}}' (while parsing a flow mapping "
                 "started at line 5, column 12)", id="malformed-yaml"),
    pytest.param("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
                 "{path}: not a kubeconfig: kind is 'Pod', not 'Config'", id="a-pod"),
    pytest.param("just some text\n", "{path}: not a kubeconfig: a string, not a mapping", id="text"),
    pytest.param("settings: {colour: blue}\n",
                 "{path}: not a kubeconfig: no clusters, contexts, users or current-context", id="other-yaml"),
    pytest.param("kind: Config\nclusters: {a: b}\n", "{path}: not a kubeconfig: clusters is a mapping, not a list",
                 id="clusters-not-a-list"),
    pytest.param("kind: Config\ncontexts:\n- context: {cluster: a}\n",
                 "{path}: contexts entry 1: not a mapping with a name", id="unnamed-context"),
    pytest.param(b"\x7fELF\x02\x01\x01\x00\x00\xd0\xff", "{path}: not UTF-8 text (byte 0xd0 at offset 9): "
                 "a binary file?", id="binary"),
    pytest.param(None, "{path}: cannot read the kubeconfig: No such file or directory", id="missing"),
    pytest.param("kind: Config\ncontexts:\n- name: c\n  context: {cluster: nowhere}\ncurrent-context: c\n",
                 '{path}: context "c" names cluster "nowhere", which is not defined', id="missing-cluster"),
    pytest.param("kind: Config\nclusters: []\n", "{path}: no current-context is set: give --context",
                 id="no-context"),
    pytest.param("kind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: a}\n"
                 "clusters:\n- name: a\n  cluster: {server: 12}\n",
                 "{path}: context c: not a valid kubeconfig entry: 'int' object has no attribute 'rstrip'",
                 id="server-not-a-string"),
]


@pytest.mark.parametrize(("content", "message"), BROKEN)
@pytest.mark.parametrize("command", [["audit"], ["migrate", "plan"]])
def test_a_broken_kubeconfig_is_one_error_line_and_exit_2(tmp_path: Path, content: str | bytes | None,
                                                           message: str, command: list[str]) -> None:
    path = tmp_path / "kubeconfig"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)

    result = CliRunner().invoke(cli, [*command, "--kubeconfig", str(path)])

    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"Error: {message.format(path=path)}\n")


def test_a_missing_context_is_one_line(two_files: str) -> None:
    assert audit("--context", "nope", env={"KUBECONFIG": two_files}) == (
        2, "", f'Error: {two_files}: context "nope" not found (contexts: ctx-b, other)\n')


@pytest.mark.parametrize("command", [["audit"], ["migrate", "plan"]])
def test_a_kubernetes_client_unlike_the_tested_one_is_one_error_line_and_exit_2(
        two_files: str, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    # The kubeconfig is loaded through the client's non-exported KubeConfigLoader (kubeaccess/library_pins.py).
    from kubernetes.config.kube_config import KubeConfigLoader

    monkeypatch.delattr(KubeConfigLoader, "load_and_set")
    installed = importlib.metadata.version("kubernetes")

    result = CliRunner().invoke(cli, command, env={"KUBECONFIG": two_files})

    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"Error: {two_files}: cannot load the kubeconfig: kubernetes {installed} is installed and in the "
               "tested range >=37.0.3,<37.1, but its internals differ from the tested ones: "
               "kubernetes.config.kube_config.KubeConfigLoader.load_and_set is missing\n")


def test_kubeconfig_naming_no_file_that_exists(tmp_path: Path) -> None:
    listed = f"{tmp_path / 'a'}:{tmp_path / 'b'}"

    assert audit(env={"KUBECONFIG": listed}) == (2, "", f"Error: $KUBECONFIG names no file that exists: {listed}\n")


def test_the_kubectl_plugin_answers_a_malformed_kubeconfig_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster: [\n")

    result = subprocess.run([str(KUBECTL_GPUQUOTA), "audit", "--kubeconfig", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"Error: {path}:6:1: not valid YAML: did not find expected node content "
                             "(while parsing a flow node started at line 6, column 1)\n")
