"""The libraries whose internals the server relies on are the versions it was tested with, or it does not start.

The server goes beyond the public API of three libraries:

- gunicorn: :class:`~webhook.serving.gunicorn_worker.StickyThreadWorker` subclasses gthread's
  ``ThreadWorker`` and overrides its connection handling, reading gthread's connection, request,
  body and parser attributes and the ``proxy_protocol`` setting, and calling ``util.http_date``;
  :class:`~webhook.serving.supervision.SupervisingArbiter` subclasses the ``Arbiter`` and its
  stop, child and worker management; ``gunicorn_conf`` sets settings by name (``http_parser``,
  ``http_protocols``, ``control_socket_disable``, which older releases do not know) and
  rewrites one of the arbiter's log lines.
- prometheus_client: the server switches its value storage to multiprocess mode after import
  (``values.ValueClass``) and uses the multiprocess collector, ``mark_process_dead`` and the
  ``livemostrecent`` and ``livemax`` gauge modes.
- kubernetes: the kubeconfig given with ``--kubeconfig`` is loaded through the client's
  non-exported ``ConfigNode`` and ``KubeConfigLoader`` (:mod:`kubeaccess.kube`; the pin and its
  probe are in :mod:`kubeaccess.library_pins`, since the CLI checks it too).

A release outside the tested range may rename any of these and the server would then fail in a
worker, mid-request, or quietly serve with the slower path. So ``gpuquota serve`` calls
:func:`check_serving_libraries` first, before it imports gunicorn's worker and binds anything:
the installed versions must be in the ranges pyproject.toml pins, and every attribute and method
relied on must still be there with the parameters it was tested with. Otherwise it exits with one
line naming the library, the version found and the range tested. The checking itself
(:class:`~kubeaccess.library_pins.PinnedLibrary`, the probes) is shared with kubeaccess.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator

from kubeaccess.library_pins import (
    KUBERNETES,
    PinnedLibrary,
    attributes_missing,
    check_libraries,
    not_assigned,
    parameters_differ,
)

# --- what the server relies on ---------------------------------------------------------------------


def _gunicorn_internals() -> Iterator[str]:
    gunicorn = importlib.import_module("gunicorn")
    util = importlib.import_module("gunicorn.util")
    body = importlib.import_module("gunicorn.http.body")
    message = importlib.import_module("gunicorn.http.message")
    parser = importlib.import_module("gunicorn.http.parser")
    unreader = importlib.import_module("gunicorn.http.unreader")
    gthread = importlib.import_module("gunicorn.workers.gthread")
    base = importlib.import_module("gunicorn.workers.base")
    arbiter = importlib.import_module("gunicorn.arbiter")
    errors = importlib.import_module("gunicorn.errors")
    app_base = importlib.import_module("gunicorn.app.base")
    config = importlib.import_module("gunicorn.config")

    # gunicorn_worker.StickyThreadWorker
    yield from attributes_missing(gunicorn, ("SERVER",), "gunicorn")
    yield from parameters_differ(util, {"http_date": ("timestamp",)}, "gunicorn.util")
    yield from attributes_missing(gthread, ("_DEFER", "TConn", "ThreadWorker"), "gunicorn.workers.gthread")
    if not (hasattr(gthread, "TConn") and hasattr(gthread, "ThreadWorker")):
        return  # the rest looks inside them
    worker, connection = gthread.ThreadWorker, gthread.TConn
    yield from parameters_differ(worker, {
        "init_process": (), "load_wsgi": (), "handle_request": ("req", "conn"),
        "accept": ("listener",), "enqueue_req": ("conn",), "handle_exit": ("sig", "frame"), "handle": ("conn",),
        "is_parent_alive": (), "on_pending_socket_readable": ("conn", "client"),
    }, "gthread.ThreadWorker")
    yield from not_assigned((worker.__init__, worker.init_process),
                            ("max_keepalived", "poller", "keepalived_conns", "pending_conns", "nr_conns"),
                            "gthread.ThreadWorker")
    yield from not_assigned((base.Worker.__init__,), ("ppid", "nr", "max_requests", "alive", "tmp"),
                            "gunicorn.workers.base.Worker.__init__")
    yield from parameters_differ(connection, {"__init__": ("cfg", "sock", "client", "server"), "init": ()},
                                 "gthread.TConn")
    yield from not_assigned((connection.__init__, connection.init),
                            ("sock", "client", "timeout", "parser", "initialized", "is_http2", "data_ready"),
                            "gthread.TConn")
    # conn.parser.unreader.buf: bytes already read tell a waiting request from an idle connection.
    yield from not_assigned((parser.Parser.__init__,), ("unreader",), "gunicorn.http.parser.Parser")
    yield from not_assigned((unreader.Unreader.__init__,), ("buf",), "gunicorn.http.unreader.Unreader")
    yield from attributes_missing(message.Request, ("_expected_100_continue", "should_close"),
                                  "gunicorn.http.message.Request")
    yield from not_assigned((message.Message.__init__,), ("version", "headers", "body"),
                            "gunicorn.http.message.Message")
    # req.body.reader: the direct path serves only bodies of a known length (a LengthReader).
    yield from not_assigned((body.Body.__init__,), ("reader",), "gunicorn.http.body.Body")
    yield from not_assigned((body.LengthReader.__init__,), ("length",), "gunicorn.http.body.LengthReader")
    # supervision.SupervisingArbiter
    yield from parameters_differ(arbiter.Arbiter, {
        "__init__": ("app",), "handle_chld": (), "manage_workers": (), "stop": ("graceful",), "run": (),
    }, "gunicorn.arbiter.Arbiter")
    yield from attributes_missing(arbiter.Arbiter, ("WORKERS",), "gunicorn.arbiter.Arbiter")
    if "Listening at: %s (%s)" not in arbiter.Arbiter.start.__code__.co_consts:
        yield "gunicorn.arbiter.Arbiter.start no longer logs 'Listening at: %s (%s)' (gunicorn_conf.ListeningAddress)"
    yield from parameters_differ(errors, {"HaltServer": ("reason", "exit_status")}, "gunicorn.errors")
    # server.WebhookApplication and the settings of gunicorn_conf
    yield from parameters_differ(app_base.BaseApplication, {"load_config": (), "load": (), "run": ()},
                                 "gunicorn.app.base.BaseApplication")
    known = set(config.Config().settings)
    for name in sorted((_settings_used() | SETTINGS_READ) - known):
        yield f"gunicorn has no setting {name!r}"


# Settings the worker reads from gunicorn's config (``self.cfg``) without gunicorn_conf setting them.
SETTINGS_READ = frozenset({"proxy_protocol"})


def _settings_used() -> set[str]:
    """The names of the settings gunicorn_conf gives gunicorn (read from the function itself)."""
    from pathlib import Path

    from webhook.serving.gunicorn_conf import MetricsDirectory, gunicorn_options
    from webhook.serving.settings import Settings

    return set(gunicorn_options(Settings(), MetricsDirectory(Path(), owned=False), lambda _settings: None))


def _prometheus_internals() -> Iterator[str]:
    values = importlib.import_module("prometheus_client.values")
    multiprocess = importlib.import_module("prometheus_client.multiprocess")
    metrics = importlib.import_module("prometheus_client.metrics")
    # server._enable_multiprocess_metrics switches storage after import.
    yield from attributes_missing(values, ("ValueClass",), "prometheus_client.values")
    yield from parameters_differ(values, {"get_value_class": ()}, "prometheus_client.values")
    yield from parameters_differ(multiprocess, {"mark_process_dead": ("pid", "path"),
                                                "MultiProcessCollector": ("registry", "path")},
                                 "prometheus_client.multiprocess")
    for mode in ("livemostrecent", "livemax"):
        if mode not in getattr(metrics.Gauge, "_MULTIPROC_MODES", ()):
            yield f"prometheus_client Gauge has no multiprocess_mode '{mode}'"


# The ranges pinned in pyproject.toml (tests/webhook/serving/test_library_check.py keeps the two equal).
SERVING_LIBRARIES = (
    PinnedLibrary("gunicorn", "27.0.1", "27.1", _gunicorn_internals),
    PinnedLibrary("prometheus_client", "0.26.0", "0.27", _prometheus_internals),
    KUBERNETES,
)


def check_serving_libraries(version_of: Callable[[str], str] = importlib.metadata.version) -> None:
    """LibraryMismatch unless every library the server reaches into is as tested (see the module's doc)."""
    check_libraries(SERVING_LIBRARIES, version_of)
