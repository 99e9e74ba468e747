"""``gpuquota serve`` and ``gpuquota certs`` refuse bad setups with one line and exit 2."""

from __future__ import annotations

import base64
import importlib.metadata
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtensionOID

from cli.main import cli


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_serve_without_certificates_says_how_to_make_them(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["serve", "--cert-dir", str(tmp_path), "--state", "examples/cluster"])

    assert result.exit_code == 2
    suggested = f"gpuquota certs generate --out {tmp_path} --dns localhost --ip 127.0.0.1"
    assert result.output == (f"Error: {tmp_path}/tls.crt not found: create certificates with `{suggested}` "
                             "(or with --service NAME --namespace NS for a Service)\n")
    # The command runs as printed, and makes what serve asked for.
    made = runner.invoke(cli, shlex.split(suggested)[1:])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "tls.crt").is_file() and (tmp_path / "tls.key").is_file()


def test_serve_outside_a_cluster_without_a_source_is_refused(runner: CliRunner, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert runner.invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost"]).exit_code == 0

    result = runner.invoke(cli, ["serve", "--cert-dir", str(tmp_path)])

    assert result.exit_code == 2
    assert result.output == ("Error: not running in a cluster: give --kubeconfig for a live cluster "
                             "or --state for manifests\n")


def test_serve_on_a_kubernetes_client_unlike_the_tested_one_does_not_start(runner: CliRunner, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Checked first, even in offline mode: before the certificates, before gunicorn is imported.
    from kubernetes.config.kube_config import KubeConfigLoader

    monkeypatch.delattr(KubeConfigLoader, "load_and_set")
    installed = importlib.metadata.version("kubernetes")

    result = runner.invoke(cli, ["serve", "--cert-dir", str(tmp_path), "--state", "examples/cluster"])

    assert result.exit_code == 2
    assert result.output == (f"Error: kubernetes {installed} is installed and in the tested range >=37.0.3,<37.1, "
                             "but its internals differ from the tested ones: "
                             "kubernetes.config.kube_config.KubeConfigLoader.load_and_set is missing\n")


def test_certs_generate_covers_the_service_names_and_prints_the_ca_bundle(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--service", "gpuquota-webhook",
                                      "--namespace", "gpuquota-system", "--ip", "10.0.0.7"])

    assert result.exit_code == 0
    bundle = result.stdout.strip()
    assert base64.b64decode(bundle) == (tmp_path / "ca.crt").read_bytes()
    leaf = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    assert set(names.get_values_for_type(x509.DNSName)) >= {
        "gpuquota-webhook.gpuquota-system.svc", "gpuquota-webhook.gpuquota-system.svc.cluster.local"}
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(("args", "message"), [
    (["--out", "x"], "Error: give --service/--namespace, --dns or --ip: a certificate needs a name to be valid for"),
    (["--out", "x", "--service", "s"],
     "Error: --service needs --namespace: the Service DNS names include the namespace"),
    (["--out", "x", "--ip", "not-an-ip"], "Error: not an IP address: 'not-an-ip'"),
])
def test_certs_generate_bad_flags_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["certs", "generate", *[str(tmp_path / a) if a == "x" else a for a in args]])

    assert result.exit_code == 2
    assert result.output == message + "\n"


def test_deeply_nested_manifest_is_one_line_and_exit_2(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")

    result = runner.invoke(cli, ["audit", "-f", str(tmp_path / "deep.yaml")])

    assert result.exit_code == 2
    assert result.output == f"Error: {tmp_path}/deep.yaml: nested too deeply to be a Kubernetes object\n"


def test_certs_generate_never_replaces_an_existing_ca_or_key(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost"]).exit_code == 0
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}

    result = runner.invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost"])

    assert result.exit_code == 2
    assert result.output == (f"Error: {tmp_path}: ca.crt, ca.key, tls.crt, tls.key already exist(s); webhook "
                             "configurations trust that CA through their caBundle, so it is kept: give --force "
                             "to replace it, or another --out\n")
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_certs_generate_refuses_when_only_the_key_is_there(tmp_path: Path) -> None:
    (tmp_path / "ca.key").write_text("a key someone keeps\n")

    result = CliRunner().invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost"])

    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {tmp_path}: ca.key already exist(s);")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ca.key"]
    assert (tmp_path / "ca.key").read_text() == "a key someone keeps\n"


def test_certs_generate_force_replaces_them(tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost"])
    old_key = (tmp_path / "ca.key").read_bytes()

    second = runner.invoke(cli, ["certs", "generate", "--out", str(tmp_path), "--dns", "localhost", "--force"])

    assert second.exit_code == 0
    assert second.stdout.strip() != first.stdout.strip()  # a new caBundle
    assert (tmp_path / "ca.key").read_bytes() != old_key
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600


def test_make_certs_creates_them_once_and_keeps_them(tmp_path: Path) -> None:
    """``make run`` depends on ``certs/tls.crt``: generated when missing, left alone when present."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    certs = tmp_path / "certs"
    make = ["make", "--no-print-directory", "-C", str(repo), "certs", f"CERT_DIR={certs}"]

    first = subprocess.run(make, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    before = {path.name: path.read_bytes() for path in certs.iterdir()}
    assert sorted(before) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]

    second = subprocess.run(make, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert {path.name: path.read_bytes() for path in certs.iterdir()} == before
