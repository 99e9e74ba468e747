"""Client certificates for mutual-TLS tests (not a test module).

One CA the webhook is told to trust (``--client-ca``), a client certificate it signed, and a client
certificate from a second, unrelated CA: the three cases a server requiring client certificates
has to tell apart.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from kubeaccess import pki

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClientPki:
    ca_file: Path
    cert: tuple[Path, Path]
    foreign_cert: tuple[Path, Path]


def make_client_pki(directory: Path, common_name: str = "kube-apiserver") -> ClientPki:
    # Written through the same library function `gpuquota certs client` uses.
    trusted = directory / "trusted"
    foreign = directory / "foreign"
    for ca_dir, label in ((trusted, "webhook clients"), (foreign, "someone else")):
        ca = pki.create_ca(f"{label} CA")
        pki.write_public_file(ca_dir / pki.CA_CERT_FILE, ca.cert_pem)
        pki.write_private_file(ca_dir / pki.CA_KEY_FILE, ca.key_pem)
    return ClientPki(
        ca_file=trusted / pki.CA_CERT_FILE,
        cert=pki.write_client_cert(trusted, trusted / "client", common_name),
        foreign_cert=pki.write_client_cert(foreign, foreign / "client", common_name),
    )


def client_context(server_ca: Path, cert: tuple[Path, Path] | None = None,
                   maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(server_ca))
    context.maximum_version = maximum
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def handshake_error(context: ssl.SSLContext, port: int) -> ssl.SSLError | OSError | None:
    """The error a bare TLS connection gets in the handshake or the first read; None if it was served."""
    with socket.create_connection((LOOPBACK, port), timeout=5) as raw:
        try:
            with context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = tls.recv(64)
        except (ssl.SSLError, OSError) as error:
            return error
    return None if answer.startswith(b"HTTP/1.1 200") else OSError(f"unexpected answer {answer!r}")
