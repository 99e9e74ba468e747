"""``gpuquota preflight``: check an install before its fail-closed webhooks go in, and only then write them.

Step 2 of an install (docs/deploy.md): ``kubectl kustomize manifests/webhooks | gpuquota preflight
--install -f -``. Every check is printed, passed or not; the configurations are written only when
all passed. Exit 0 all passed (and installed, with --install), 1 a check failed (nothing written),
2 usage, input or connection errors.
"""

from __future__ import annotations

import sys

import click

from gpuquota_core.preflight import (
    Check,
    PreflightInputError,
    default_target,
    probe_target,
    read_configurations,
)

from .errors import CommandError, cluster_error
from .inputs import objects_or_fail

CHECKS = ("image", "pods", "service", "certificate", "networkpolicy", "webhook")
FAILED_EXIT = 1


@click.command()
@click.option("-n", "--namespace", default="gpuquota-system", show_default=True,
              help="Namespace of the webhook's Deployment, Service and TLS Secret.")
@click.option("-f", "--filename", "paths", multiple=True,
              help="The webhook configurations to install (file, directory or -), e.g. the output of "
                   "`kubectl kustomize manifests/webhooks`; the probe calls what they call.")
@click.option("--install", is_flag=True,
              help="Write the configurations of -f (server-side apply) when every check passed; their "
                   "webhooks without a caBundle get the CA of the TLS Secret.")
@click.option("--apiserver-address", "apiserver_addresses", multiple=True, metavar="IP",
              help="An address the apiserver calls webhooks from, for the NetworkPolicy check (repeatable; "
                   "default: the endpoints of Service default/kubernetes).")
@click.option("--probe-namespace", default="default", show_default=True,
              help="Namespace of the probe's dry-run pods (nothing is stored).")
@click.option("--skip", "skipped", multiple=True, type=click.Choice(CHECKS),
              help="Do not let this check's failure stop the install (repeatable); it is still run and printed.")
@click.option("--kubeconfig", default=None, help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
def preflight(namespace: str, paths: tuple[str, ...], install: bool, apiserver_addresses: tuple[str, ...],
              probe_namespace: str, skipped: tuple[str, ...], kubeconfig: str | None, context: str | None) -> None:
    """Check that the webhook answers before its webhook configurations exist; with --install, then write them.

    Checks: the image is not the placeholder and no pod fails to pull it; a replica is ready; the
    Service the configurations call has ready endpoints; the serving CA exists; the NetworkPolicy
    admits the apiserver's addresses; and the apiserver itself calls the webhook (a probe through a
    temporary configuration that selects only preflight's own dry-run pods).
    """
    if install and not paths:
        raise click.UsageError("--install writes the configurations of -f: give -f (e.g. "
                               "`kubectl kustomize manifests/webhooks | gpuquota preflight --install -f -`)")
    configurations = None
    if paths:
        try:
            configurations = read_configurations(objects_or_fail(paths, nothing_to="install",
                                                                 what="webhook configurations"))
        except PreflightInputError as error:
            raise CommandError(str(error)) from None
    target = probe_target(configurations) if configurations else default_target(namespace)

    from kubernetes.client.exceptions import ApiException

    from kubeaccess.kube import KubeAccessError, api_error_message, connect
    from kubeaccess.preflight import inspect, probe
    from kubeaccess.preflight import install as write_configurations

    try:
        api = connect(kubeconfig, context)
    except KubeAccessError as error:
        raise cluster_error(error) from None
    try:
        findings = inspect(api, namespace, target, apiserver_addresses)
        checks = [*findings.checks, probe(api, target, findings.ca_bundle, probe_namespace)]
        for check in checks:
            _print(check, skipped)
        blocking = [c for c in checks if not c.passed and c.name not in skipped]
        if blocking:
            what = "nothing installed" if install else "do not install the webhook configurations yet"
            click.echo(f"preflight failed: {', '.join(c.name for c in blocking)}; {what}", err=True)
            sys.exit(FAILED_EXIT)
        if install and configurations and findings.ca_bundle:
            for written in write_configurations(api, configurations, findings.ca_bundle):
                click.echo(f"{written} serverside-applied")
        click.echo("preflight passed" + ("" if install else ": the webhook configurations may go in"), err=True)
    except ApiException as error:
        raise CommandError(f"{api_error_message(error)} (HTTP {error.status})") from None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _print(check: Check, skipped: tuple[str, ...]) -> None:
    status = "ok" if check.passed else ("skipped" if check.name in skipped else "FAIL")
    click.echo(f"{status:<8}{check.name:<15}{check.message}")
