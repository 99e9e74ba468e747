"""Certificates and keys for the webhook, ``gpuquota certs generate`` and the test control plane.

Everything is generated locally with ``cryptography``; nothing here talks to a cluster. Certificate
and leaf keys are ECDSA P-256 (fast to make, accepted by Go's TLS stack and by OpenSSL); only the
service-account signer is RSA, because that is what kube-apiserver's token signer is usually given.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=365)
# Backdating tolerates a verifier whose clock is a little behind the machine that signed.
CLOCK_SKEW = datetime.timedelta(minutes=5)
RSA_KEY_BITS = 2048

# File names of a kubernetes.io/tls Secret, plus the CA next to them.
CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
TLS_CERT_FILE = "tls.crt"
TLS_KEY_FILE = "tls.key"
# A client certificate gets its own names, so writing it next to the serving pair never replaces it.
CLIENT_CERT_FILE = "client.crt"
CLIENT_KEY_FILE = "client.key"


@dataclass(frozen=True)
class KeyedCertificate:
    """A certificate together with its private key."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return certificate_pem(self.certificate)

    @property
    def key_pem(self) -> bytes:
        return private_key_pem(self.private_key)


class CertificateAuthority(KeyedCertificate):
    """A self-signed CA that can sign leaves."""


class IssuedCertificate(KeyedCertificate):
    """A leaf certificate signed by a :class:`CertificateAuthority`."""


@dataclass(frozen=True)
class RSAKeyPair:
    """The service-account token signer: the private half signs, the public half verifies."""

    private_key: rsa.RSAPrivateKey

    @property
    def private_pem(self) -> bytes:
        return private_key_pem(self.private_key)

    @property
    def public_pem(self) -> bytes:
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


class ExistingCertsError(FileExistsError):
    """Certificate or key files that ``generate_webhook_certs`` would replace."""

    def __init__(self, directory: Path, names: Sequence[str]) -> None:
        super().__init__(f"{directory}: {', '.join(names)} already exist(s)")
        self.directory = directory
        self.names = tuple(names)


@dataclass(frozen=True)
class WebhookCerts:
    """What ``generate_webhook_certs`` wrote, and the caBundle to put into a webhook configuration."""

    ca_cert_path: Path
    ca_key_path: Path
    tls_cert_path: Path
    tls_key_path: Path
    ca_bundle: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    # PKCS#8 unencrypted: the one format that Go (crypto/tls, keyutil), OpenSSL and Python's ssl
    # all read for both EC and RSA keys.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def ca_bundle(ca_cert_pem: bytes) -> str:
    """The base64 text that webhook ``clientConfig.caBundle`` and kubeconfig ``*-data`` fields expect."""
    return base64.b64encode(ca_cert_pem).decode("ascii")


def parse_ip_addresses(values: Iterable[str]) -> list[IPAddress]:
    addresses: list[IPAddress] = []
    for value in values:
        try:
            addresses.append(ipaddress.ip_address(value.strip()))
        except ValueError:
            raise ValueError(f"not an IP address: {value!r}") from None
    return addresses


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names under which the apiserver (and in-cluster clients) may reach a Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def create_ca(common_name: str, validity: datetime.timedelta = CA_VALIDITY) -> CertificateAuthority:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before = _now() - CLOCK_SKEW
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + validity)
        # path_length=0: this CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(certificate=certificate, private_key=key)


def issue_serving_cert(
    ca: CertificateAuthority,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    validity: datetime.timedelta = LEAF_VALIDITY,
) -> IssuedCertificate:
    """A TLS server certificate; clients match only the SANs (Go ignores the CN), so one is required."""
    dns = _unique(dns_names)
    ips = _unique_ips(parse_ip_addresses(ip_addresses))
    if not dns and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    sans.extend(x509.IPAddress(ip) for ip in ips)
    common_name = dns[0] if dns else str(ips[0])
    return _issue(
        ca,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        validity,
        x509.SubjectAlternativeName(sans),
    )


def issue_client_cert(
    ca: CertificateAuthority,
    common_name: str,
    organizations: Sequence[str] = (),
    validity: datetime.timedelta = LEAF_VALIDITY,
) -> IssuedCertificate:
    """A client certificate; kube-apiserver reads CN as the user name and each O as a group."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attributes.extend(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations)
    return _issue(ca, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH, validity, None)


def create_rsa_key_pair(bits: int = RSA_KEY_BITS) -> RSAKeyPair:
    return RSAKeyPair(private_key=rsa.generate_private_key(public_exponent=65537, key_size=bits))


def write_public_file(path: Path, data: bytes, *, replace: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb" if replace else "xb") as file:
        file.write(data)
    return path


def write_private_file(path: Path, data: bytes, *, replace: bool = True) -> Path:
    """Write key material readable by the owner only, including when the file already existed.

    ``replace=False``: an existing file is a FileExistsError and stays as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created with 0600 from the start, so the key is never briefly world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), 0o600)
    try:
        # O_CREAT's mode does not apply to a file that already exists.
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def generate_webhook_certs(
    out_dir: str | Path,
    service: str | None = None,
    namespace: str | None = None,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    *,
    replace: bool = False,
) -> WebhookCerts:
    """A fresh CA and a serving certificate for the webhook, written as ca.crt/ca.key/tls.crt/tls.key.

    With ``service`` (which then needs ``namespace``) the certificate covers every name the
    apiserver may use for that Service; ``dns_names`` and ``ip_addresses`` are added to those.

    Without ``replace``, any of the four files already there is a :class:`ExistingCertsError` and
    nothing is written: webhook configurations trust the old CA through their caBundle, and a
    running server reloads a replaced certificate, which the apiserver would then refuse.
    """
    if service is not None and not namespace:
        raise ValueError("--service needs --namespace: the Service DNS names include the namespace")
    names = [*service_dns_names(service, namespace), *dns_names] if service and namespace else list(dns_names)
    directory = Path(out_dir)
    if not replace:
        existing = [name for name in (CA_CERT_FILE, CA_KEY_FILE, TLS_CERT_FILE, TLS_KEY_FILE)
                    if (directory / name).exists()]
        if existing:
            raise ExistingCertsError(directory, existing)
    ca = create_ca(f"{service or 'gpuquota-webhook'} CA")
    leaf = issue_serving_cert(ca, names, ip_addresses)
    certs = WebhookCerts(
        # Exclusive creation without ``replace``: a file that appeared since the check is not replaced either.
        ca_cert_path=write_public_file(directory / CA_CERT_FILE, ca.cert_pem, replace=replace),
        ca_key_path=write_private_file(directory / CA_KEY_FILE, ca.key_pem, replace=replace),
        # The chain a TLS server presents is leaf first; clients already trust the CA via caBundle.
        tls_cert_path=write_public_file(directory / TLS_CERT_FILE, leaf.cert_pem, replace=replace),
        tls_key_path=write_private_file(directory / TLS_KEY_FILE, leaf.key_pem, replace=replace),
        ca_bundle=ca_bundle(ca.cert_pem),
        dns_names=tuple(_unique(names)),
        ip_addresses=tuple(str(ip) for ip in _unique_ips(parse_ip_addresses(ip_addresses))),
    )
    return certs


def load_ca(cert_path: Path, key_path: Path) -> CertificateAuthority:
    """A CA from PEM files (e.g. the ca.crt/ca.key that :func:`generate_webhook_certs` wrote).

    Raises ``ValueError`` with a one-line reason when the files are not a matching CA pair.
    """
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError:
        raise ValueError(f"{cert_path}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{key_path}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: expected an ECDSA key, as gpuquota certs generate writes")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != certificate.public_key().public_bytes(*spki):
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    try:
        is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{cert_path}: not a CA certificate with a subject key identifier")
    return CertificateAuthority(certificate=certificate, private_key=key)


def write_client_cert(ca_dir: str | Path, out_dir: str | Path, common_name: str,
                      organizations: Sequence[str] = (), *, replace: bool = False) -> tuple[Path, Path]:
    """Sign a client certificate with the CA in ``ca_dir`` (ca.crt, ca.key); returns (cert, key) paths.

    This is what the API server presents to a webhook served with ``--client-ca``. Without
    ``replace``, an existing client.crt or client.key is an :class:`ExistingCertsError` and nothing
    is written (a kubeconfig may name them).
    """
    ca_directory, directory = Path(ca_dir), Path(out_dir)
    if not replace:
        existing = [name for name in (CLIENT_CERT_FILE, CLIENT_KEY_FILE) if (directory / name).exists()]
        if existing:
            raise ExistingCertsError(directory, existing)
    ca = load_ca(ca_directory / CA_CERT_FILE, ca_directory / CA_KEY_FILE)
    leaf = issue_client_cert(ca, common_name, organizations)
    return (write_public_file(directory / CLIENT_CERT_FILE, leaf.cert_pem, replace=replace),
            write_private_file(directory / CLIENT_KEY_FILE, leaf.key_pem, replace=replace))


def _issue(
    ca: CertificateAuthority,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    validity: datetime.timedelta,
    sans: x509.SubjectAlternativeName | None,
) -> IssuedCertificate:
    key = ec.generate_private_key(ec.SECP256R1())
    not_before = _now() - CLOCK_SKEW
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        # A leaf must not outlive its CA, or verifiers reject it once the CA expires anyway.
        .not_valid_after(min(not_before + validity, ca.certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        # Python 3.13's default strict verification insists on the authority key identifier.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    certificate = builder.sign(ca.private_key, hashes.SHA256())
    return IssuedCertificate(certificate=certificate, private_key=key)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    # ECDSA keys only sign; key_encipherment would be meaningless for them.
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        stripped = value.strip()
        if stripped:
            seen.setdefault(stripped, None)
    return list(seen)


def _unique_ips(values: Iterable[IPAddress]) -> list[IPAddress]:
    return list(dict.fromkeys(values))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
