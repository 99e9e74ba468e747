"""``gpuquota serve``: run the admission webhook under gunicorn over TLS."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from webhook.quota.options import Accounting, QuotaServiceOptions
from webhook.serving.settings import DEFAULT_CERT_DIR, DEFAULT_HOST, DEFAULT_PORT, Settings

from .errors import CommandError

LOG_LEVELS = ("debug", "info", "warning", "error")
# The flags' defaults are the server's own, so `gpuquota serve` and Settings() cannot drift apart.
DEFAULTS = Settings()
QUOTA_DEFAULTS = DEFAULTS.quota


@click.command()
@click.option("--state", "state_path", type=click.Path(exists=True, path_type=Path),
              help="Manifests (file or directory) that stand in for the cluster: offline mode.")
@click.option("--kubeconfig", "kubeconfig_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Live mode: watch the cluster of this kubeconfig (default: in-cluster config).")
@click.option("--context", help="Kubeconfig context to use.")
@click.option("--cert-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_CERT_DIR,
              show_default=True, help="Directory holding tls.crt and tls.key (reloaded when they change).")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML conversion table; the built-in defaults without it.")
@click.option("--workers", type=click.IntRange(min=1), default=DEFAULTS.workers, show_default=True,
              help="gunicorn worker processes.")
@click.option("--threads", type=click.IntRange(min=1), default=DEFAULTS.threads, show_default=True,
              help="Threads per worker (gthread).")
@click.option("--keepalive", type=click.IntRange(min=1), default=DEFAULTS.keepalive, show_default=True,
              help="Seconds an idle keep-alive connection stays open; keep it above the API server's 90.")
@click.option("--graceful-timeout", type=click.IntRange(min=1), default=DEFAULTS.graceful_timeout, show_default=True,
              help="Seconds a stopping server gives its workers to finish the requests in flight; any still "
                   "running then is killed. Keep it below the pod's terminationGracePeriodSeconds.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default=DEFAULTS.log_level, show_default=True)
# No exists=True: the server's own check says in one line whether the file is missing or not a CA.
@click.option("--client-ca", "client_ca_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Mutual TLS: refuse clients without a certificate signed by this PEM CA "
                   "(reloaded when it changes). Probes must then be tcpSocket or exec, see docs/security.md.")
@click.option("--accounting", type=click.Choice([mode.value for mode in Accounting]),
              default=QUOTA_DEFAULTS.accounting.value,
              show_default=True, callback=lambda _context, _parameter, value: Accounting(value),
              help="Quota reservations per server instance (local), or shared by all replicas through a "
                   "ConfigMap written before each admission (strict; see docs/accounting.md).")
@click.option("--ledger-namespace", default=QUOTA_DEFAULTS.ledger_namespace,
              help="Namespace of strict accounting's ledger ConfigMaps (default: the pod's own namespace).")
@click.option("--stale-after", "stale_after_seconds", type=click.FloatRange(min=1),
              default=QUOTA_DEFAULTS.stale_after_seconds,
              show_default=True, help="Seconds a failing list/watch may last before /readyz reports the quota "
                                      "view stale (decisions continue from the last state meanwhile).")
@click.option("--reservation-ttl", "reservation_ttl_seconds", type=click.FloatRange(min=1),
              default=QUOTA_DEFAULTS.reservation_ttl_seconds,
              show_default=True, help="Seconds an admitted pod holds quota room until the watch shows it.")
@click.option("--max-reservations-per-caller", type=click.IntRange(min=1),
              default=QUOTA_DEFAULTS.max_reservations_per_caller, show_default=True,
              help="Quota reservations one caller (TLS peer) may hold before its pods are confirmed; bounds what "
                   "forged AdmissionReviews can take (docs/security.md).")
@click.option("--writer-lease", default=QUOTA_DEFAULTS.writer_lease,
              help="Strict accounting: the Lease (in the ledger namespace) whose holder writes every ledger; the "
                   "other replicas forward their admissions to it and decide themselves whenever it cannot be "
                   "asked (docs/accounting.md). Empty: every replica writes.")
@click.option("--peer-address", default=QUOTA_DEFAULTS.peer_address,
              help="With --writer-lease: the address the other replicas reach this one at (default: $POD_IP, "
                   "else this host's address); the listener binds it when given, else every interface.")
@click.option("--peer-port", type=click.IntRange(0, 65535), default=QUOTA_DEFAULTS.peer_port, show_default=True,
              help="With --writer-lease: the port of that listener (0: any free port).")
def serve(**flags: Any) -> None:
    """Serve /mutate-pods, /validate-pods and /validate-elasticquotas over HTTPS."""
    # Imported here, not at module level: every gpuquota command imports every command module, and
    # the server (gunicorn, Flask, the kubernetes client) would weigh on every command's start-up.
    # First, before the server's modules import gunicorn's worker: an untested gunicorn may not even import.
    from kubeaccess.library_pins import LibraryMismatch
    from webhook.serving.library_check import check_serving_libraries

    try:
        check_serving_libraries()
    except LibraryMismatch as error:
        raise CommandError(str(error)) from None
    from webhook.serving.server import ServeError, run

    try:
        run(settings_from_flags(flags))
    except ServeError as error:
        raise CommandError(str(error)) from None


def settings_from_flags(flags: Mapping[str, Any]) -> Settings:
    """The server's settings from ``serve``'s parsed options.

    Each option's parameter is named after the field it sets: a field of QuotaServiceOptions goes to
    ``Settings.quota``, any other to Settings itself. So a new quota service flag is the field and its
    option, with nothing in between to forget.
    """
    quota_fields = set(QuotaServiceOptions.field_names())
    quota = QuotaServiceOptions(**{name: value for name, value in flags.items() if name in quota_fields})
    return Settings(quota=quota, **{name: value for name, value in flags.items() if name not in quota_fields})
