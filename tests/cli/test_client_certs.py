"""``gpuquota serve --client-ca`` refuses a file that is no CA, and ``gpuquota certs client`` signs callers."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cli.main import cli


@pytest.fixture
def cert_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "certs"
    result = CliRunner().invoke(cli, ["certs", "generate", "--out", str(directory), "--dns", "localhost"])
    assert result.exit_code == 0, result.output
    return directory


def serve_with_client_ca(cert_dir: Path, client_ca: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["serve", "--cert-dir", str(cert_dir), "--state", "examples/cluster",
                                      "--client-ca", str(client_ca)])
    return result.exit_code, result.output


def test_a_missing_client_ca_is_one_line(cert_dir: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"

    assert serve_with_client_ca(cert_dir, missing) == (
        2, f"Error: {missing}: cannot read the client CA: No such file or directory\n")


def test_a_client_ca_that_is_not_pem_is_one_line(cert_dir: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "ca.crt"
    garbage.write_text("not a certificate\n")

    assert serve_with_client_ca(cert_dir, garbage) == (
        2, f"Error: {garbage}: not a PEM CA certificate (expected -----BEGIN CERTIFICATE-----)\n")


def test_a_leaf_certificate_is_refused_as_client_ca(cert_dir: Path) -> None:
    leaf = cert_dir / "tls.crt"

    code, output = serve_with_client_ca(cert_dir, leaf)

    assert code == 2
    assert output == (f"Error: {leaf}: CN=localhost is not a CA certificate (no basicConstraints CA:TRUE); "
                      "give the CA that signs the client certificates\n")


def test_certs_client_signs_a_client_certificate_with_the_given_ca(cert_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "apiserver"

    result = CliRunner().invoke(cli, ["certs", "client", "--ca-dir", str(cert_dir), "--out", str(out),
                                      "--name", "kube-apiserver"])

    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    certificate = x509.load_pem_x509_certificate((out / "client.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((cert_dir / "ca.crt").read_bytes())
    certificate.verify_directly_issued_by(ca)
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver"
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert (out / "client.key").stat().st_mode & 0o777 == 0o600
    # The serving pair next to the CA is left alone.
    assert x509.load_pem_x509_certificate((cert_dir / "tls.crt").read_bytes()).subject.rfc4514_string() \
        == "CN=localhost"


def test_certs_client_without_a_ca_key_is_one_line(cert_dir: Path, tmp_path: Path) -> None:
    (cert_dir / "ca.key").unlink()

    result = CliRunner().invoke(cli, ["certs", "client", "--ca-dir", str(cert_dir), "--out", str(tmp_path / "o"),
                                      "--name", "kube-apiserver"])

    assert result.exit_code == 2
    assert result.output == f"Error: {cert_dir / 'ca.key'}: No such file or directory\n"


def test_certs_client_with_a_leaf_as_ca_is_one_line(cert_dir: Path, tmp_path: Path) -> None:
    (cert_dir / "ca.crt").write_bytes((cert_dir / "tls.crt").read_bytes())
    (cert_dir / "ca.key").write_bytes((cert_dir / "tls.key").read_bytes())

    result = CliRunner().invoke(cli, ["certs", "client", "--ca-dir", str(cert_dir), "--out", str(tmp_path / "o"),
                                      "--name", "kube-apiserver"])

    assert result.exit_code == 2
    assert result.output == f"Error: {cert_dir / 'ca.crt'}: not a CA certificate with a subject key identifier\n"


def test_certs_client_never_replaces_an_existing_key_unless_forced(cert_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "apiserver"
    args = ["certs", "client", "--ca-dir", str(cert_dir), "--out", str(out), "--name", "kube-apiserver"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    key = (out / "client.key").read_bytes()

    again = CliRunner().invoke(cli, args)

    assert (again.exit_code, again.output) == (
        2, f"Error: {out}: client.crt, client.key already exist(s); give --force to replace them, or another --out\n")
    assert (out / "client.key").read_bytes() == key

    forced = CliRunner().invoke(cli, [*args, "--force"])

    assert forced.exit_code == 0, forced.output
    assert (out / "client.key").read_bytes() != key
    assert (out / "client.key").stat().st_mode & 0o777 == 0o600
