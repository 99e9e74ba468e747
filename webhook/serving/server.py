"""Run the webhook under gunicorn, programmatically (``gpuquota serve`` calls :func:`serve`).

Process model: one gunicorn master forks ``workers`` processes, each with ``threads`` threads.
The app, and with it the quota decider, is built inside each worker after the fork
(:meth:`WebhookApplication.load`), never at import time, so nothing that holds sockets, threads or
file handles is shared by accident across a fork.

Extension points for the quota half (see ``webhook/admission/quota_port.py``):

- :func:`start_shared_services` runs once in the master (gunicorn ``on_starting``), before any
  worker exists: the place to start the one process that holds the cluster state and the
  reservation ledger for all workers.
- :func:`build_quota_decider` runs in every worker while the app loads and returns the
  :class:`~webhook.admission.quota_port.QuotaDecider` its handlers call (e.g. a client of that process).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from gunicorn.app.base import BaseApplication

from gpuquota_core.conversion import ConversionConfig
from kubeaccess.conversion_config import ConfigFileError, load_conversion_config
from webhook.admission.quota_port import NoQuota, QuotaDecider
from webhook.quota.options import Accounting, QuotaServiceOptions
from webhook.serving.gunicorn_conf import MetricsDirectory, gunicorn_options, require_client_certificates
from webhook.serving.settings import Settings
from webhook.serving.supervision import QuotaServiceSupervisor, SupervisingArbiter

if TYPE_CHECKING:
    from flask import Flask

    from gpuquota_core.placement import NodeView
    from webhook.admission.quota_port import EventReporter

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class ServeError(Exception):
    """A reason the server cannot start (missing certificate, bad config); the CLI prints it."""


QUOTA_SOCKET_ENV = "GPUQUOTA_QUOTA_SOCKET"


def start_shared_services(settings: Settings, supervisor: QuotaServiceSupervisor) -> None:
    """Start the quota service process in the gunicorn master, once, before workers are forked.

    Offline mode (``--state``) reads manifests; otherwise it lists and watches the cluster of
    ``--kubeconfig`` (in-cluster config without one). The socket path reaches the workers through
    the environment they inherit from the master. ``supervisor`` starts it again when it dies.
    """
    from webhook.quota.service import private_socket_path, start_service_process

    def start(path: Path) -> subprocess.Popen[bytes]:
        return start_service_process(path, quota_service_options(settings))

    path = private_socket_path()
    supervisor.start_with(start, path)
    os.environ[QUOTA_SOCKET_ENV] = str(path)


def remove_shared_services_files() -> None:
    """In the master at exit: the quota service removes its files itself, unless it was killed."""
    socket_path = os.environ.get(QUOTA_SOCKET_ENV)
    if socket_path:
        from webhook.quota.service import remove_private_files

        remove_private_files(Path(socket_path))


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def ledger_namespace(settings: Settings) -> str:
    """Where strict accounting keeps its ledger: the flag, else the namespace this pod runs in."""
    if settings.quota.ledger_namespace:
        return settings.quota.ledger_namespace
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


# A Lease's name: a DNS subdomain (RFC 1123).
LEASE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def quota_service_options(settings: Settings) -> QuotaServiceOptions:
    """What the quota service process is started with: the server's quota options as given, with
    the ledger namespace resolved here, where the pod's own namespace can be read."""
    return dataclasses.replace(settings.quota, ledger_namespace=ledger_namespace(settings), tls_dir=settings.cert_dir)


def _check_accounting(settings: Settings) -> None:
    accounting = settings.quota.accounting
    if accounting not in {mode.value for mode in Accounting}:
        raise ServeError(f"--accounting must be {Accounting.spelled()}, not {str(accounting)!r}")
    if accounting == Accounting.STRICT and settings.quota.state_path is not None:
        raise ServeError("--accounting strict records reservations in the cluster; it cannot run with --state")
    if accounting == Accounting.STRICT and not ledger_namespace(settings):
        raise ServeError("--accounting strict needs --ledger-namespace (outside a pod there is no own namespace)")
    if settings.quota.writer_lease:
        _check_writer_lease(settings)


def _check_writer_lease(settings: Settings) -> None:
    quota = settings.quota
    if quota.accounting != Accounting.STRICT:
        raise ServeError("--writer-lease chooses the replica that writes strict accounting's ledgers; "
                         "it needs --accounting strict")
    if len(quota.writer_lease) > 253 or not LEASE_NAME.fullmatch(quota.writer_lease):
        raise ServeError(f"--writer-lease {quota.writer_lease!r} is not a Lease name: lower-case letters, digits, "
                         "'-' and '.', starting and ending with a letter or digit")
    if quota.peer_port == settings.port:
        raise ServeError(f"--peer-port {quota.peer_port} is the port the webhook serves on; give the other "
                         "replicas' listener a port of its own")
    if quota.peer_port:
        _probe_tcp(quota.peer_address or "0.0.0.0", quota.peer_port)


def build_quota_decider() -> QuotaDecider:
    """The quota decider of one worker process: a client of the quota service when one runs
    (which decides every pod, against its own ledger or, strict, the one in the API server)."""
    socket_path = os.environ.get(QUOTA_SOCKET_ENV)
    if not socket_path:
        return NoQuota()
    from webhook.quota.client import QuotaClient

    return QuotaClient(Path(socket_path))


def build_node_view() -> Callable[[], NodeView | None]:
    """A worker's view of the nodes the quota service publishes (webhook.quota.node_view)."""
    socket_path = os.environ.get(QUOTA_SOCKET_ENV)
    if not socket_path:
        return lambda: None
    from webhook.quota.node_view import NodeViewReader, nodes_path

    return NodeViewReader(nodes_path(Path(socket_path))).current


def build_event_reporter() -> EventReporter | None:
    """A worker's events go to the quota service, which writes them (webhook.quota.events); none without it."""
    socket_path = os.environ.get(QUOTA_SOCKET_ENV)
    if not socket_path:
        return None
    from webhook.quota.client import QuotaClient
    from webhook.quota.events import EventForwarder

    return EventForwarder(QuotaClient(Path(socket_path)))


def conversion_config_or_stop(path: Path | None) -> ConversionConfig:
    """The conversion table and enforcement modes from a YAML file, or the built-in defaults without one.

    Read once at startup so a bad file stops the server with one line; workers then re-read the
    file when it changes (:class:`~webhook.admission.config_source.ConfigSource`).
    """
    try:
        return load_conversion_config(path)
    except ConfigFileError as error:
        raise ServeError(str(error)) from None


def configure_logging(level: str) -> None:
    """One line per record on stderr for our loggers; the decision log is already JSON."""
    logger = logging.getLogger("gpuquota")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.propagate = False


class WebhookApplication(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type hints
    def __init__(self, settings: Settings, config: ConversionConfig, options: dict[str, Any],
                 supervisor: QuotaServiceSupervisor) -> None:
        self.settings = settings
        self.config = config
        self.options = options
        self.supervisor = supervisor
        super().__init__()

    def run(self) -> None:
        # BaseApplication.run with gunicorn's arbiter replaced by one that keeps the quota service up.
        try:
            SupervisingArbiter(self, self.supervisor).run()
        except RuntimeError as error:
            print(f"Error: {error}", file=sys.stderr)
            sys.exit(1)

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        configure_logging(self.settings.log_level)
        quota = build_quota_decider()
        # Imported here, in the worker, after PROMETHEUS_MULTIPROC_DIR is set (see webhook.serving.metrics).
        from webhook.serving.app import create_app

        return create_app(config=self.config, quota=quota, max_body_bytes=self.settings.max_body_bytes,
                          config_path=self.settings.config_path, nodes=build_node_view(),
                          events=build_event_reporter())


def _check_tls_files(settings: Settings) -> None:
    for path in (settings.certfile, settings.keyfile):
        if not path.is_file():
            # A command line that runs as printed: a certificate needs a name (localhost and the
            # loopback address are what the default --host serves, as `make run` makes them).
            raise ServeError(f"{path} not found: create certificates with "
                             f"`gpuquota certs generate --out {settings.cert_dir} --dns localhost --ip 127.0.0.1` "
                             "(or with --service NAME --namespace NS for a Service)")
    # Fail once here with a readable message instead of on every connection in every worker.
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(settings.certfile, settings.keyfile)
    except (OSError, ssl.SSLError) as error:
        raise ServeError(f"cannot load {settings.certfile} with {settings.keyfile}: {error}") from None


def _check_client_ca(path: Path | None) -> None:
    """Refuse a ``--client-ca`` that would make every handshake fail, or trust a leaf, at startup."""
    if path is None:
        return
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ServeError(f"{path}: cannot read the client CA: {error.strerror or error}") from None
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ServeError(f"{path}: not a PEM CA certificate (expected -----BEGIN CERTIFICATE-----)") from None
    for certificate in certificates:
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise ServeError(f"{path}: {certificate.subject.rfc4514_string()} is not a CA certificate "
                             "(no basicConstraints CA:TRUE); give the CA that signs the client certificates")
    try:
        require_client_certificates(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), path)
    except (OSError, ssl.SSLError) as error:
        raise ServeError(f"{path}: cannot load the client CA: {error}") from None


def _metrics_directory(settings: Settings) -> MetricsDirectory:
    if settings.metrics_dir is not None:
        return MetricsDirectory(settings.metrics_dir, owned=False)
    inherited = os.environ.get(MULTIPROC_ENV)
    if inherited:
        return MetricsDirectory(Path(inherited), owned=False)
    return MetricsDirectory(Path(tempfile.mkdtemp(prefix="gpuquota-metrics-")), owned=True)


def _enable_multiprocess_metrics(directory: MetricsDirectory) -> None:
    os.environ[MULTIPROC_ENV] = str(directory.path)
    # The modules that define metrics: imported before this point, their values would live in this
    # process only and every worker's samples would be lost from /metrics.
    for module in ("webhook.serving.metrics", "webhook.admission.observability"):
        if module in sys.modules:
            raise ServeError(f"internal error: {module} was imported before the metrics directory was set")
    values = sys.modules.get("prometheus_client.values")
    if values is not None:
        # Imported by someone else already: it chose in-process storage at import; switch it.
        values.ValueClass = values.get_value_class()  # type: ignore[attr-defined]


def _check_cluster_source(settings: Settings) -> None:
    # Without this, the quota service would fail in its own process and the server would sit
    # unready forever; say at once what to pass instead.
    if settings.quota.state_path is None and settings.quota.kubeconfig_path is None \
            and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ServeError("not running in a cluster: give --kubeconfig for a live cluster or --state for manifests")


def _check_state_file(settings: Settings) -> None:
    """Load ``--state`` here, the way the quota service will, so a file it cannot use stops the
    server with one line before anything is served (else the service would die in its own
    process and leave a server that is alive but never ready)."""
    state_path = settings.quota.state_path
    if state_path is None:
        return
    # Before the metrics directory is set: the quota modules create their metrics at import,
    # and this process must not write them to the directory the workers report from.
    from webhook.quota.service import load_state_file
    from webhook.quota.state import QuotaState

    try:
        load_state_file(QuotaState(), state_path)
    except ValueError as error:  # every reader and tree check of the core raises a ValueError
        text = str(error)
        raise ServeError(text if text.startswith(str(state_path)) else f"{state_path}: {text}") from None


def _check_kubeconfig(settings: Settings) -> None:
    """A kubeconfig the quota service could not load stops the server here, in one line."""
    kubeconfig_path = settings.quota.kubeconfig_path
    if kubeconfig_path is None:
        return
    from kubeaccess.kube import KubeAccessError, connect

    try:
        connect(str(kubeconfig_path), settings.quota.context).close()  # type: ignore[no-untyped-call]
    except KubeAccessError as error:
        raise ServeError(str(error)) from None


class PortClaim:
    """This server's claim on its address, held by the master for as long as it runs.

    The workers listen with SO_REUSEPORT (see webhook.serving.gunicorn_conf), which lets any process of
    the same user join the same port: a second ``gpuquota serve`` on it would start, take half the
    connections and keep its own quota ledger, so a quota could be spent twice. Two checks
    prevent that:

    - an abstract Unix socket named after the address (Linux; scoped, like the TCP port, to the
      network namespace, and released by the kernel however the master dies): a second server
      finds it taken, even when both start at the same moment, and learns the first one's pid;
    - a bind of the TCP address without SO_REUSEPORT, closed at once: it fails while any other
      process (another server, or anything else) listens there, before workers would crash-loop
      on it.
    """

    def __init__(self, host: str, port: int) -> None:
        self.address = f"{host}:{port}"
        self._lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0gpuquota-serve:{self.address}"
        try:
            self._lock.bind(name)
            self._lock.listen(8)  # so a second server can ask who holds it (SO_PEERCRED)
        except OSError as error:
            self._lock.close()
            if error.errno != errno.EADDRINUSE:
                raise ServeError(f"cannot claim {self.address}: {error.strerror or error}") from None
            raise ServeError(f"{self.address} is already served by another gpuquota serve{_holder(name)}: "
                             "two servers on one port would keep two quota ledgers") from None
        try:
            _probe_tcp(host, port)
        except BaseException:
            self._lock.close()
            raise

    def release(self) -> None:
        self._lock.close()


def _holder(name: str) -> str:
    """" (pid N)" of the process holding the abstract socket ``name``, or "" if it cannot be told."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(1.0)
            peer.connect(name)
            pid, _uid, _gid = struct.unpack("3i", peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
    except OSError:
        return ""
    return f" (pid {pid})"


def _probe_tcp(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR, as gunicorn binds: connections of an earlier run in TIME_WAIT do not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ServeError(f"cannot listen on {host}:{port}: another process listens on that port") from None
            raise ServeError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def run(settings: Settings) -> None:
    """Start gunicorn in this process and return when it stops."""
    if settings.workers < 1 or settings.threads < 1:
        raise ServeError("--workers and --threads must be at least 1")
    config = conversion_config_or_stop(settings.config_path)
    _check_tls_files(settings)
    _check_client_ca(settings.client_ca_path)
    _check_cluster_source(settings)
    _check_accounting(settings)
    _check_kubeconfig(settings)
    _check_state_file(settings)
    claim = PortClaim(settings.host, settings.port)
    try:
        _serve(settings, config)
    finally:
        claim.release()


def _serve(settings: Settings, config: ConversionConfig) -> None:
    directory = _metrics_directory(settings)
    _enable_multiprocess_metrics(directory)
    configure_logging(settings.log_level)
    supervisor = QuotaServiceSupervisor()
    options = gunicorn_options(settings, directory, lambda started: start_shared_services(started, supervisor),
                               remove_shared_services_files)
    WebhookApplication(settings, config, options, supervisor).run()
