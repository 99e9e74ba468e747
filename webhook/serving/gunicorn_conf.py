"""gunicorn settings and server hooks for the webhook (used by :mod:`webhook.serving.server`).

Every value here has a measured or operational reason (figures in docs/benchmarks.md, "Mechanisms kept"):

- ``gthread`` workers, not ``sync``: the sync worker closes the connection after every response,
  so each admission call would pay a full TLS handshake and throughput would be bound by them.
  The class is :class:`~webhook.serving.gunicorn_worker.StickyThreadWorker`, gthread with one change: a
  thread waits on its kept-alive connection for the next request while no other request needs
  it, which spares an idle server two thread wake-ups per call.
- ``reuse_port``: a SO_REUSEPORT socket per worker lets the kernel spread the API server's few
  long-lived connections over the workers; without it they often all land on one worker. The
  kernel hashes, it does not balance: hence twice as many workers as cores by default
  (:attr:`~webhook.serving.settings.Settings.workers`).
- ``keepalive`` above the API server's 90 s idle timeout (see :class:`~webhook.serving.settings.Settings`).
- HTTP/1.1 only (gunicorn's default): over h2 one connection is served by one thread, one
  request at a time, and connections beyond the thread count starve.
- ``http_parser = "python"``: gunicorn's pure-Python parser, whatever else is installed.
- No control socket: it lives in one fixed per-user path, so two servers (tests, ``make run``)
  would fight over it, and nothing here uses ``gunicornc``.
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubeaccess.file_signature import FileSignature, file_signature
from webhook.serving.gunicorn_worker import DeadlineSSLSocket
from webhook.serving.settings import Settings

log = logging.getLogger("gpuquota.server")


class TlsContextFactory:
    """gunicorn's ``ssl_context`` hook: TLS 1.2+, a context built for every accepted connection.

    gunicorn 27 asks for a new SSLContext for every accepted connection and rereads the key and
    certificate each time: that is what makes a rotated certificate take effect without a restart.
    If a build fails (the cert and key are being replaced one after the other), the previous
    context keeps serving and the next connection tries again. The files are ``stat``-ed on every
    connection so the serving certificate's metric is recorded only when they change.

    With ``client_ca`` (mutual TLS) every connection must present a certificate that chains to
    that file's CAs, or the handshake fails; the CA file is watched like the cert and key, so a
    rotated client CA is picked up the same way.
    """

    def __init__(self, client_ca: Path | None = None) -> None:
        self._client_ca = client_ca
        self._lock = threading.Lock()
        self._key: tuple[FileSignature | None, ...] | None = None
        self._context: ssl.SSLContext | None = None

    def __call__(self, conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        key = (file_signature(conf.certfile), file_signature(conf.keyfile),
               file_signature(str(self._client_ca)) if self._client_ca is not None else None)
        with self._lock:
            try:
                context = default_ssl_context_factory()
                if self._client_ca is not None:
                    require_client_certificates(context, self._client_ca)
            except (OSError, ssl.SSLError) as error:
                if self._context is None:
                    raise
                log.warning("could not load the rotated TLS files, still serving with the previous ones: %s", error)
                return self._context
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.sslsocket_class = DeadlineSSLSocket  # reads with a deadline (see there)
            changed, self._key, self._context = key != self._key, key, context
            if changed:
                _record_serving_certificate(conf.certfile)
            return context


def _record_serving_certificate(certfile: str) -> None:
    # Imported here, in the worker: webhook.serving.metrics must not be imported before the metrics
    # directory is set (see webhook.serving.server).
    from webhook.serving.metrics import record_serving_certificate

    record_serving_certificate(certfile)


def require_client_certificates(context: ssl.SSLContext, client_ca: Path) -> None:
    """Make a server context refuse every client without a certificate signed by ``client_ca``.

    The trust store must hold ``client_ca`` and nothing else. gunicorn's default factory creates a
    server-side context, which starts out with an empty store (Python loads the system roots only
    for contexts that verify at creation); the check below keeps it that way should that change,
    because a store with the system roots would let any publicly issued certificate in.
    """
    if context.verify_mode != ssl.CERT_NONE or context.get_ca_certs():
        raise ssl.SSLError("the server context already trusts CAs; refusing to add the client CA to them")
    context.load_verify_locations(cafile=str(client_ca))
    context.verify_mode = ssl.CERT_REQUIRED


class ListeningAddress(logging.Filter):
    """Fills in the address of gunicorn's "Listening at: %s (%s)" start-up line.

    With ``reuse_port`` the workers open their own sockets, so the master has none to name and
    gunicorn logs ``Listening at:  (pid)``; the address every worker binds is the configured one.
    """

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.msg == "Listening at: %s (%s)" and isinstance(record.args, tuple) and len(record.args) == 2
                and not record.args[0]):
            record.args = (self.url, record.args[1])
        return True


class MetricsDirectory:
    """prometheus_client's multiprocess directory for one server run.

    It is emptied when the master starts: files left by an earlier run would be added to this
    run's counters. It is removed at exit when this run created it.
    """

    def __init__(self, path: Path, *, owned: bool) -> None:
        self.path = path
        self.owned = owned

    def reset(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in self.path.glob("*.db"):
            stale.unlink(missing_ok=True)

    def remove(self) -> None:
        if self.owned:
            shutil.rmtree(self.path, ignore_errors=True)


def _worker_tmp_dir() -> str | None:
    # The worker heartbeat file is touched constantly; in containers /tmp may be disk-backed.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def gunicorn_options(settings: Settings, metrics_dir: MetricsDirectory,
                     on_master_start: Callable[[Settings], None],
                     on_master_exit: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """The gunicorn configuration as ``{setting: value}`` for ``BaseApplication.load_config``.

    Both callbacks run in the master only (not atexit: forked workers would inherit that).
    """

    def on_starting(_arbiter: Any) -> None:
        # gunicorn has set up its loggers by now, and logs the address right after this hook.
        logging.getLogger("gunicorn.error").addFilter(ListeningAddress(f"https://{settings.bind}"))
        metrics_dir.reset()
        on_master_start(settings)

    def child_exit(_arbiter: Any, worker: Any) -> None:
        # Runs in the master: drop the dead worker's live-gauge files so they are not reported
        # (counters and histograms keep its samples, as Prometheus expects of a counter).
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid, str(metrics_dir.path))  # type: ignore[no-untyped-call]

    def on_exit(_arbiter: Any) -> None:
        metrics_dir.remove()
        on_master_exit()

    return {
        "bind": [settings.bind],
        "worker_class": "webhook.serving.gunicorn_worker.StickyThreadWorker",
        "workers": settings.workers,
        "threads": settings.threads,
        "keepalive": settings.keepalive,
        "timeout": settings.timeout,
        "graceful_timeout": settings.graceful_timeout,
        "reuse_port": True,
        "certfile": str(settings.certfile),
        "keyfile": str(settings.keyfile),
        "ssl_context": TlsContextFactory(settings.client_ca_path),
        "http_protocols": "h1",
        "http_parser": "python",
        "control_socket_disable": True,
        "worker_tmp_dir": _worker_tmp_dir(),
        "loglevel": settings.log_level,
        # Access log stays off: the app writes one structured line per admission decision (and the
        # worker answers admission reviews without gunicorn's access log, see webhook.serving.gunicorn_worker).
        "accesslog": None,
        "errorlog": "-",
        "preload_app": False,
        "proc_name": "gpuquota-webhook",
        "on_starting": on_starting,
        "child_exit": child_exit,
        "on_exit": on_exit,
    }
