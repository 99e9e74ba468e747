"""``gpuquota certs``: certificates for the webhook's TLS endpoint."""

from __future__ import annotations

from pathlib import Path

import click

from kubeaccess.pki import generate_webhook_certs

from .errors import CommandError


@click.group()
def certs() -> None:
    """Create the webhook's serving certificates."""


@certs.command("generate")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("certs"),
              show_default=True, help="Directory for ca.crt, ca.key, tls.crt and tls.key.")
@click.option("--service", help="Service name; the certificate then covers <service>.<namespace>.svc[.cluster.local].")
@click.option("--namespace", help="Namespace of --service.")
@click.option("--dns", "dns_names", multiple=True, help="Extra DNS name (repeatable).")
@click.option("--ip", "ip_addresses", multiple=True, help="Extra IP address (repeatable).")
def generate(out_dir: Path, service: str | None, namespace: str | None, dns_names: tuple[str, ...],
             ip_addresses: tuple[str, ...]) -> None:
    """Write a new CA and serving certificate; print the caBundle for the webhook configurations."""
    if not service and not dns_names and not ip_addresses:
        raise CommandError("give --service/--namespace, --dns or --ip: a certificate needs a name to be valid for")
    try:
        written = generate_webhook_certs(out_dir, service=service, namespace=namespace,
                                         dns_names=dns_names, ip_addresses=ip_addresses)
    except ValueError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"{out_dir}: {error.strerror or error}") from None
    click.echo(f"wrote {written.ca_cert_path}, {written.tls_cert_path} and their keys "
               f"for {', '.join([*written.dns_names, *written.ip_addresses])}", err=True)
    # stdout carries only the caBundle, so scripts can capture it: CA=$(gpuquota certs generate ...)
    click.echo(written.ca_bundle)
