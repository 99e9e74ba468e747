"""``gpuquota serve --client-ca``: real gunicorn refuses clients without a certificate from that CA.

The refusals are asserted at the TLS layer (the alert the server sends), not as an HTTP status:
a caller without the right certificate must never reach the Flask app.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from clientpki import ClientPki, client_context, handshake_error, make_client_pki
from gunicorn.config import Config
from gunicorn.sock import ssl_context as gunicorn_ssl_context
from reviews import body, pod, review
from webhookproc import LOOPBACK, REPO_ROOT, WebhookProcess

from kubeaccess import pki
from webhook.serving.gunicorn_conf import TlsContextFactory

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
ROTATION_DEADLINE = 30.0
TLS_VERSIONS = [pytest.param(ssl.TLSVersion.TLSv1_2, id="tls1.2"), pytest.param(ssl.TLSVersion.TLSv1_3, id="tls1.3")]


@pytest.fixture(scope="module")
def client_pki(tmp_path_factory: pytest.TempPathFactory) -> ClientPki:
    return make_client_pki(tmp_path_factory.mktemp("client-pki"))


@pytest.fixture(scope="module")
def mtls_webhook(client_pki: ClientPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    server = WebhookProcess(tmp_path_factory.mktemp("mtls-webhook"),
                            serve_args=["--state", str(EXAMPLE_STATE), "--client-ca", str(client_pki.ca_file)],
                            client_cert=client_pki.cert)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("version", TLS_VERSIONS)
def test_a_client_without_a_certificate_is_refused_in_the_handshake(mtls_webhook: WebhookProcess,
                                                                   version: ssl.TLSVersion) -> None:
    error = handshake_error(client_context(mtls_webhook.ca_file, maximum=version), mtls_webhook.port)

    assert isinstance(error, ssl.SSLError)
    # TLS 1.2 has no dedicated alert for a missing certificate; 1.3 does.
    expected = "SSLV3_ALERT_HANDSHAKE_FAILURE" if version == ssl.TLSVersion.TLSv1_2 \
        else "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert error.reason == expected


@pytest.mark.parametrize("version", TLS_VERSIONS)
def test_a_certificate_from_another_ca_is_refused(mtls_webhook: WebhookProcess, client_pki: ClientPki,
                                                  version: ssl.TLSVersion) -> None:
    context = client_context(mtls_webhook.ca_file, client_pki.foreign_cert, maximum=version)

    error = handshake_error(context, mtls_webhook.port)

    assert isinstance(error, ssl.SSLError)
    assert error.reason == "TLSV1_ALERT_UNKNOWN_CA"


def test_the_servers_own_certificate_is_no_client_certificate(mtls_webhook: WebhookProcess) -> None:
    # The serving CA is not the client CA: holding the webhook's key does not make one a caller.
    own = (mtls_webhook.cert_dir / "tls.crt", mtls_webhook.cert_dir / "tls.key")

    error = handshake_error(client_context(mtls_webhook.ca_file, own), mtls_webhook.port)

    assert isinstance(error, ssl.SSLError)
    assert error.reason == "TLSV1_ALERT_UNKNOWN_CA"


@pytest.mark.parametrize("version", TLS_VERSIONS)
def test_a_client_with_the_right_certificate_is_admitted(mtls_webhook: WebhookProcess, client_pki: ClientPki,
                                                         version: ssl.TLSVersion) -> None:
    context = client_context(mtls_webhook.ca_file, client_pki.cert, maximum=version)

    assert handshake_error(context, mtls_webhook.port) is None


def test_admission_with_the_right_certificate_and_refusal_without_it_through_requests(
        mtls_webhook: WebhookProcess, client_pki: ClientPki) -> None:
    http = requests.Session()
    http.trust_env = False
    http.verify = str(mtls_webhook.ca_file)
    payload = body(review(pod(resources={"nvidia.com/gpu": "1"})))
    headers = {"Content-Type": "application/json"}

    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_REQUIRED"):
        http.post(mtls_webhook.url + "/mutate-pods", data=payload, headers=headers, timeout=10)

    http.cert = (str(client_pki.cert[0]), str(client_pki.cert[1]))
    answer = http.post(mtls_webhook.url + "/mutate-pods", data=payload, headers=headers, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is True
    assert "patch" in answer.json()["response"]
    assert http.get(mtls_webhook.url + "/readyz", timeout=10).status_code == 200


def test_a_rotated_client_ca_is_used_without_a_restart(client_pki: ClientPki, tmp_path: Path) -> None:
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(client_pki.ca_file.read_bytes())
    server = WebhookProcess(tmp_path / "server", serve_args=["--state", str(EXAMPLE_STATE), "--client-ca",
                                                             str(ca_file)], client_cert=client_pki.cert).start()
    try:
        foreign_ca = client_pki.foreign_cert[0].parent.parent / pki.CA_CERT_FILE
        staged = tmp_path / "client-ca.new"
        staged.write_bytes(foreign_ca.read_bytes())
        # Replaced the way a Secret volume swaps files: a new inode under the same name.
        staged.replace(ca_file)

        deadline = time.monotonic() + ROTATION_DEADLINE
        while handshake_error(client_context(server.ca_file, client_pki.foreign_cert), server.port) is not None:
            assert time.monotonic() < deadline, f"rotated client CA not used:\n{server.tail()}"
            assert server.alive()
        error = handshake_error(client_context(server.ca_file, client_pki.cert), server.port)
        assert isinstance(error, ssl.SSLError)
        assert error.reason == "TLSV1_ALERT_UNKNOWN_CA"
    finally:
        server.stop()


def test_the_context_trusts_the_client_ca_and_nothing_else(client_pki: ClientPki, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # SSL_CERT_FILE names the system roots Python would load if it ever loaded defaults; any
    # public CA in there must not become a client CA.
    monkeypatch.setenv("SSL_CERT_FILE", str(client_pki.foreign_cert[0].parent.parent / pki.CA_CERT_FILE))
    serving = pki.generate_webhook_certs(tmp_path, dns_names=["localhost"])
    conf = Config()
    conf.set("certfile", str(serving.tls_cert_path))
    conf.set("keyfile", str(serving.tls_key_path))
    conf.set("ssl_context", TlsContextFactory(client_pki.ca_file))

    context = gunicorn_ssl_context(conf)

    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    trusted = [dict(entry[0] for entry in ca["subject"])["commonName"] for ca in context.get_ca_certs()]
    assert trusted == ["webhook clients CA"]


# The exec readiness probe docs/security.md gives for --client-ca, with this test's paths.
EXEC_READINESS_PROBE = (
    'import ssl, urllib.request as r; c = ssl.create_default_context(cafile="{ca}"); c.check_hostname = False; '
    'c.load_cert_chain("{cert}", "{key}"); r.urlopen("https://127.0.0.1:{port}/readyz", context=c, timeout=3)')


def test_the_documented_exec_readiness_probe_needs_the_probe_certificate(mtls_webhook: WebhookProcess,
                                                                        client_pki: ClientPki) -> None:
    def probe(cert: tuple[Path, Path]) -> subprocess.CompletedProcess[str]:
        code = EXEC_READINESS_PROBE.format(ca=mtls_webhook.ca_file, cert=cert[0], key=cert[1], port=mtls_webhook.port)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)

    assert probe(client_pki.cert).returncode == 0
    refused = probe(client_pki.foreign_cert)
    assert refused.returncode != 0
    assert "UNKNOWN_CA" in refused.stderr


def test_a_tcp_socket_probe_connects_without_tls_and_leaves_the_server_serving(mtls_webhook: WebhookProcess,
                                                                               client_pki: ClientPki) -> None:
    # What a kubelet tcpSocket liveness probe does: connect, then close without a byte of TLS.
    for _ in range(3):
        socket.create_connection((LOOPBACK, mtls_webhook.port), timeout=5).close()

    assert handshake_error(client_context(mtls_webhook.ca_file, client_pki.cert), mtls_webhook.port) is None
