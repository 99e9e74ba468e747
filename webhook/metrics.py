"""Prometheus metrics of the admission endpoints.

gunicorn runs several worker processes, and a scrape reaches only one of them, so under gunicorn
the metrics use prometheus_client's multiprocess mode: every worker writes its samples to files in
``PROMETHEUS_MULTIPROC_DIR`` and :func:`render` merges all of them. That variable must be set
before ``prometheus_client`` is first imported (it picks its value storage at import time), which
is why :mod:`webhook.server` sets it up before the app, and with it this module, is loaded.
Without the variable (tests with Flask's client, ``convert``), the ordinary in-process registry is used.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

REQUESTS = Counter(
    "gpuquota_admission_requests",
    "Admission requests handled, by endpoint, operation and result (allowed, patched, denied, bad_request).",
    ["endpoint", "operation", "result"],
)
DURATION = Histogram(
    "gpuquota_admission_duration_seconds",
    "Time from reading the request body to the encoded response, by endpoint.",
    ["endpoint"],
    # The API server's default webhook timeout is 10 s, but a healthy answer takes well under 1 ms:
    # most buckets sit where a regression would show.
    buckets=(0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
REWRITES = Counter(
    "gpuquota_rewrites",
    "Container resources rewritten into the canonical form, by the resource name the user asked for.",
    ["resource"],
)
LEFT_AS_WRITTEN = Counter(
    "gpuquota_left_as_written",
    "Pod GPU requests the rewrite would change but left as written, by the resource name the user asked for: "
    "rewrite: auto found no node the pod can reach that advertises the canonical names (or had not listed the "
    "nodes yet), or rewrite: never.",
    ["resource"],
)
DENIALS = Counter(
    "gpuquota_denials",
    "Admission requests denied, by endpoint and reason (Invalid, BadRequest, QuotaExceeded, ...).",
    ["endpoint", "reason"],
)

WOULD_DENY = Counter(
    "gpuquota_would_deny",
    "Pod denials that a check in warn or dry-run mode let pass, by endpoint, reason (the check) and mode.",
    ["endpoint", "reason", "mode"],
)
CONNECTIONS_SHED = Counter(
    "gpuquota_connections_shed",
    "Kept-alive connections a worker closed after an answer because it held more than its share "
    "(webhook.connection_balance); the client reconnects and the kernel hashes it afresh.",
)
CONFIG_RELOADS = Counter(
    "gpuquota_config_reloads",
    "Changes of the config file seen by a worker: loaded, or error (the previous config stays in force).",
    ["result"],
)


# labels() validates its arguments and takes the metric's lock on every call, about 1 µs each, three
# times per admission; the children for the few label values an endpoint ever uses are kept here.
_requests: dict[tuple[str, str, str], Counter] = {}
_durations: dict[str, Histogram] = {}


def observe(endpoint: str, operation: str, result: str, seconds: float) -> None:
    key = (endpoint, operation or "-", result)
    counter = _requests.get(key)
    if counter is None:
        counter = _requests.setdefault(key, REQUESTS.labels(*key))
    counter.inc()
    histogram = _durations.get(endpoint)
    if histogram is None:
        histogram = _durations.setdefault(endpoint, DURATION.labels(endpoint))
    histogram.observe(seconds)


def render() -> tuple[bytes, str]:
    """The exposition text and its content type, merged over all worker processes when needed."""
    if os.environ.get(MULTIPROC_ENV):
        # Imported here: the module refuses to work without the directory, and tests run without it.
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
