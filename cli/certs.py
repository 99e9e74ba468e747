"""``gpuquota certs``: certificates for the webhook's TLS endpoint."""

from __future__ import annotations

from pathlib import Path

import click

from . import hints
from .errors import CommandError


@click.group()
def certs() -> None:
    """Create the webhook's serving certificates and client certificates for its callers."""


@certs.command("generate")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("certs"),
              show_default=True, help="Directory for ca.crt, ca.key, tls.crt and tls.key.")
@click.option("--service", help="Service name; the certificate then covers <service>.<namespace>.svc[.cluster.local].")
@click.option("--namespace", help="Namespace of --service.")
@click.option("--dns", "dns_names", multiple=True, help="Extra DNS name (repeatable).")
@click.option("--ip", "ip_addresses", multiple=True, help="Extra IP address (repeatable).")
@click.option("--force", is_flag=True, help="Replace an existing CA, certificate and keys in --out (the webhook "
              "configurations' caBundle must then be updated).")
def generate(out_dir: Path, service: str | None, namespace: str | None, dns_names: tuple[str, ...],
             ip_addresses: tuple[str, ...], force: bool) -> None:
    """Write a new CA and serving certificate; print the caBundle for the webhook configurations.

    Files already in --out are never replaced without --force.
    """
    if not service and not dns_names and not ip_addresses:
        raise CommandError(hints.CERT_NEEDS_A_NAME())
    # Imported here: cryptography would weigh on every gpuquota command's start-up, and only certs needs it.
    from kubeaccess.pki import ExistingCertsError, generate_webhook_certs

    try:
        written = generate_webhook_certs(out_dir, service=service, namespace=namespace,
                                         dns_names=dns_names, ip_addresses=ip_addresses, replace=force)
    except ExistingCertsError as error:
        raise CommandError(f"{error}; {hints.CA_KEPT()}") from None
    except FileExistsError as error:
        raise CommandError(f"{error.filename}: appeared while writing; nothing was replaced") from None
    except ValueError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"{out_dir}: {error.strerror or error}") from None
    click.echo(f"wrote {written.ca_cert_path}, {written.tls_cert_path} and their keys "
               f"for {', '.join([*written.dns_names, *written.ip_addresses])}", err=True)
    # stdout carries only the caBundle, so scripts can capture it: CA=$(gpuquota certs generate ...)
    click.echo(written.ca_bundle)


@certs.command("client")
@click.option("--ca-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="Directory holding ca.crt and ca.key (e.g. the --out of 'certs generate').")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for client.crt and client.key.")
@click.option("--name", "common_name", required=True, help="Common name of the client (e.g. kube-apiserver).")
@click.option("--force", is_flag=True, help="Replace an existing client.crt and client.key in --out.")
def client(ca_dir: Path, out_dir: Path, common_name: str, force: bool) -> None:
    """Sign a client certificate for a caller of a webhook served with --client-ca CA_DIR/ca.crt.

    An existing client certificate or key in --out is never replaced without --force.
    """
    if not common_name.strip():
        raise CommandError("--name must not be empty")
    from kubeaccess.pki import ExistingCertsError, write_client_cert  # see generate

    try:
        cert_path, key_path = write_client_cert(ca_dir, out_dir, common_name.strip(), replace=force)
    except ExistingCertsError as error:
        raise CommandError(f"{error}; {hints.CLIENT_CERT_KEPT()}") from None
    except FileExistsError as error:
        raise CommandError(f"{error.filename}: appeared while writing; nothing was replaced") from None
    except ValueError as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"{error.filename or out_dir}: {error.strerror or error}") from None
    click.echo(f"wrote {cert_path} and {key_path} for {common_name.strip()}, signed by {ca_dir / 'ca.crt'}", err=True)
