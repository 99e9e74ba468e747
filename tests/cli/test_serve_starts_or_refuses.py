"""``gpuquota serve`` starts completely or not at all.

Each bad setup here runs the real console script. It must exit non-zero before gunicorn starts:
its whole output is one ``Error:`` line naming the file or port and the cause (so no traceback,
no worker booted, nothing served). Without the checks each of these servers ran on: half alive,
crash-looping, or sharing its port with another server's ledger.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from controlplane import LOOPBACK, free_ports
from webhookproc import GPUQUOTA, REPO_ROOT, WebhookProcess, generate_certs

# A server that does start runs until stopped; this bounds how long a test waits to see it exit.
EXIT_DEADLINE_SECONDS = 60.0

QUOTA_WITH_A_BAD_QUANTITY = """\
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team-a}
spec:
  max: {nvidia.com/gpu: "four"}
"""


@pytest.fixture(scope="module")
def cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    generate_certs(directory)
    return directory


def serve_until_exit(args: Sequence[str], cert_dir: Path, port: int) -> tuple[int, str]:
    """Run ``gpuquota serve``; its exit code and output, or a failed test if it keeps running."""
    command = [str(GPUQUOTA), "serve", "--cert-dir", str(cert_dir), "--host", LOOPBACK, "--port", str(port),
               "--workers", "1", *args]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=EXIT_DEADLINE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        still = f"gpuquota serve still running after {EXIT_DEADLINE_SECONDS:.0f}s"
        raise AssertionError(f"{still}:\n{output[-3000:]}") from None
    return process.returncode, output


def assert_refused(args: Sequence[str], cert_dir: Path, expected_start: str, port: int = 0) -> str:
    code, output = serve_until_exit(args, cert_dir, port or free_ports(1)[0])
    assert code != 0, output
    assert "Traceback" not in output
    lines = output.splitlines()
    assert len(lines) == 1, output  # nothing else: gunicorn never started
    assert lines[0].startswith(expected_start), lines[0]
    return lines[0]


def test_state_that_is_not_yaml_is_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text("apiVersion: v1\nkind: [Pod\n", encoding="utf-8")

    assert_refused(["--state", str(state)], cert_dir, f"Error: {state}:3:1: not valid YAML: ")


def test_state_the_quota_tree_cannot_load_is_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "quotas.yaml"
    state.write_text(QUOTA_WITH_A_BAD_QUANTITY, encoding="utf-8")

    line = assert_refused(["--state", str(state)], cert_dir, f"Error: {state}: ElasticQuota team-a: ")
    assert "'four'" in line


@pytest.mark.parametrize(("content", "cause"), [
    (b"apiVersion: v1\nclusters: [\n", ":3:1: not valid YAML: "),
    (b"- just\n- a list\n", ": not a kubeconfig: a list, not a mapping"),
    (b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe" * 20, ": not UTF-8 text (byte 0xd0 at offset 8): a binary file?"),
    (b"clusters: 5\ncontexts: [1]\ncurrent-context: x\n", ": not a kubeconfig: clusters is a int, not a list"),
], ids=["malformed", "not-a-kubeconfig", "binary", "wrong-shape"])
def test_kubeconfig_that_cannot_load_is_refused_before_serving(cert_dir: Path, tmp_path: Path, content: bytes,
                                                               cause: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)

    assert_refused(["--kubeconfig", str(kubeconfig)], cert_dir, f"Error: {kubeconfig}{cause}")


def test_port_another_process_listens_on_is_refused_before_serving(cert_dir: Path) -> None:
    with socket.socket() as other:
        other.bind((LOOPBACK, 0))
        other.listen()
        port = other.getsockname()[1]

        assert_refused(["--state", str(REPO_ROOT / "examples" / "cluster")], cert_dir,
                       f"Error: cannot listen on {LOOPBACK}:{port}: another process listens on that port", port)


@pytest.fixture
def first_server(tmp_path: Path) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path / "first", serve_args=["--state", str(REPO_ROOT / "examples" / "cluster")])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_port_another_gpuquota_serve_listens_on_is_refused(first_server: WebhookProcess) -> None:
    line = assert_refused(["--state", str(REPO_ROOT / "examples" / "cluster")], first_server.cert_dir,
                          f"Error: {LOOPBACK}:{first_server.port} is already served by another gpuquota serve "
                          f"(pid {first_server.pid}): ", first_server.port)

    assert line.endswith("two servers on one port would keep two quota ledgers")
    assert first_server.get("/readyz")[0] == 200  # the first one is untouched


def test_the_start_up_log_names_the_address(first_server: WebhookProcess) -> None:
    listening = [line for line in first_server.log_text().splitlines() if "Listening at:" in line]

    assert listening and listening[0].endswith(
        f"Listening at: https://{LOOPBACK}:{first_server.port} ({first_server.pid})")


def test_missing_certificates_are_refused_before_serving(tmp_path: Path) -> None:
    assert_refused(["--state", str(REPO_ROOT / "examples" / "cluster")], tmp_path,
                   f"Error: {tmp_path}/tls.crt not found: create certificates with ")


def test_unreadable_certificates_are_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tls.crt").write_bytes((cert_dir / "tls.crt").read_bytes())
    (broken / "tls.key").write_bytes(base64.b64encode(os.urandom(300)))

    assert_refused(["--state", str(REPO_ROOT / "examples" / "cluster")], broken,
                   f"Error: cannot load {broken}/tls.crt with {broken}/tls.key: ")



def quota_document(name: str, namespace: str, parent: str = "", is_parent: bool = False) -> str:
    labels = {"quota.scheduling.koordinator.sh/parent": parent} if parent else {}
    if is_parent:
        labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
    return yaml.safe_dump({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                           "metadata": {"name": name, "namespace": namespace, "labels": labels},
                           "spec": {"max": {"koordinator.sh/gpu-core": "400",
                                            "koordinator.sh/gpu-memory-ratio": "400"}}})


def test_state_with_two_quotas_of_one_name_is_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    # Before: one copy was dropped, and the enforced limit depended on the order of the files.
    state = tmp_path / "quotas.yaml"
    state.write_text(quota_document("team", "ns-a") + "---\n" + quota_document("team", "ns-b"), encoding="utf-8")

    line = assert_refused(["--state", str(state)], cert_dir, "Error: ")
    assert str(state) in line and "ns-a/team" in line and "ns-b/team" in line


def test_state_whose_parent_labels_form_a_cycle_is_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "quotas.yaml"
    state.write_text(quota_document("a", "t", parent="b", is_parent=True) + "---\n"
                     + quota_document("b", "t", parent="a", is_parent=True), encoding="utf-8")

    line = assert_refused(["--state", str(state)], cert_dir, "Error: ")
    assert str(state) in line and "cycle" in line


@pytest.mark.parametrize(("args", "expected"), [
    (["--state", str(REPO_ROOT / "examples" / "cluster"), "--writer-lease", "ledger-writer"],
     "Error: --writer-lease chooses the replica that writes strict accounting's ledgers; it needs --accounting strict"),
    (["--accounting", "strict", "--ledger-namespace", "ledgers", "--writer-lease", "Ledger_Writer"],
     "Error: --writer-lease 'Ledger_Writer' is not a Lease name: "),
    (["--accounting", "strict", "--ledger-namespace", "ledgers", "--writer-lease", "ledger-writer",
      "--peer-port", "PORT"],
     "Error: --peer-port PORT is the port the webhook serves on; give the other replicas' listener a port of its own"),
])
def test_a_writer_lease_it_cannot_use_is_refused_before_serving(cert_dir: Path, tmp_path: Path, args: list[str],
                                                                 expected: str) -> None:
    # Checked before the kubeconfig is read: any file stands in for it.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("", encoding="utf-8")
    live = [] if "--state" in args else ["--kubeconfig", str(kubeconfig)]
    port = free_ports(1)[0]
    assert_refused([*live, *(str(port) if arg == "PORT" else arg for arg in args)], cert_dir,
                   expected.replace("PORT", str(port)), port)


def test_a_peer_port_another_process_listens_on_is_refused_before_serving(cert_dir: Path, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("", encoding="utf-8")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((LOOPBACK, 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        assert_refused(["--kubeconfig", str(kubeconfig), "--accounting", "strict", "--ledger-namespace", "ledgers",
                        "--writer-lease", "ledger-writer",
                        "--peer-address", LOOPBACK, "--peer-port", str(port)], cert_dir,
                       f"Error: cannot listen on {LOOPBACK}:{port}: another process listens on that port")
