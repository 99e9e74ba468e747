"""Prometheus metrics of the admission endpoints.

gunicorn runs several worker processes, and a scrape reaches only one of them, so under gunicorn
the metrics use prometheus_client's multiprocess mode: every worker writes its samples to files in
``PROMETHEUS_MULTIPROC_DIR`` and :func:`render` merges all of them. That variable must be set
before ``prometheus_client`` is first imported (it picks its value storage at import time), which
is why :mod:`webhook.serving.server` sets it up before the app, and with it this module, is loaded.
Without the variable (tests with Flask's client, ``convert``), the ordinary in-process registry is used.

The per-quota gauges and ``gpuquota_ready`` are not stored: each scrape asks the quota decider for
them (:class:`ScrapeTimeCollector`). A quota's series then ends the moment the quota is deleted,
which stored multiprocess gauges cannot do (prometheus_client cannot remove a label set there),
and the figures are the ones the next decision reads, not a copy that may lag behind.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from webhook.admission.quota_port import QuotaDecider, ReportsQuotaFigures

log = logging.getLogger("gpuquota.server")

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
    # The API server's default webhook timeout is 10 s, but a healthy answer takes far less:
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
    "(webhook.serving.connection_balance); the client reconnects and the kernel hashes it afresh.",
)
CONFIG_RELOADS = Counter(
    "gpuquota_config_reloads",
    "Changes of the config file seen by a worker: loaded, or error (the previous config stays in force).",
    ["result"],
)
SERVING_CERTIFICATE_EXPIRY = Gauge(
    "gpuquota_serving_certificate_expiry_timestamp_seconds",
    "Unix time at which the serving certificate expires (notAfter of the first certificate of the cert "
    "file), set when a worker loads it; a rotated certificate replaces the value once loaded.",
    # Each worker loads the file itself; the value loaded last is the one in force.
    multiprocess_mode="livemostrecent",
)

# The per-quota gauges: (name, QuotaFigure field, help). Amounts are canonical units (README, Metrics).
QUOTA_GAUGES = (
    ("gpuquota_quota_used", "used",
     "GPU resources charged to the quota by the counted pods the watch shows, in canonical units."),
    ("gpuquota_quota_limit", "limit",
     "The quota's limit (its admission annotation, else max) in canonical units; only for resources it limits itself."),
    ("gpuquota_quota_min", "min", "The quota's min in canonical units; only for resources it sets a min for."),
    ("gpuquota_quota_reserved", "reserved",
     "Admitted pods not yet seen by the watch, holding room, in canonical units (local accounting only)."),
)
QUOTA_LABELS = ("quota", "tree", "resource")


class ScrapeTimeCollector:
    """``gpuquota_ready`` and the per-quota gauges, asked of ``quota`` at each scrape."""

    def __init__(self, quota: QuotaDecider) -> None:
        self.quota = quota

    def collect(self) -> Iterator[Metric]:
        ready, _reason = self.quota.ready()
        yield GaugeMetricFamily("gpuquota_ready", "1 when this replica's /readyz answers 200 (quota state synced, "
                                "not stale, quota service reachable), else 0.", value=1 if ready else 0)
        figures = self.quota.quota_figures() if isinstance(self.quota, ReportsQuotaFigures) else None
        if figures is None:
            return
        for name, field, documentation in QUOTA_GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=QUOTA_LABELS)
            for figure in figures:
                value: float | None = getattr(figure, field)
                if value is not None:
                    family.add_metric((figure.quota, figure.tree, figure.resource), value)
            yield family


def record_serving_certificate(certfile: str) -> None:
    """Export the expiry of the certificate just loaded for serving; a file it cannot read is logged."""
    from cryptography import x509

    try:
        first = x509.load_pem_x509_certificates(Path(certfile).read_bytes())[0]
    except (OSError, ValueError, IndexError) as error:
        log.warning("cannot read the expiry of %s for gpuquota_serving_certificate_expiry_timestamp_seconds: %s",
                    certfile, error)
        return
    SERVING_CERTIFICATE_EXPIRY.set(first.not_valid_after_utc.timestamp())


# labels() validates its arguments and takes the metric's lock on every call, three times per
# admission; the children for the few label values an endpoint ever uses are kept here.
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


def render(quota: QuotaDecider | None = None) -> tuple[bytes, str]:
    """The exposition text and its content type, merged over all worker processes when needed;
    with ``quota``, the scrape-time gauges too."""
    scrape_time = CollectorRegistry()
    if quota is not None:
        scrape_time.register(ScrapeTimeCollector(quota))
    if os.environ.get(MULTIPROC_ENV):
        # Imported here: the module refuses to work without the directory, and tests run without it.
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(scrape_time)  # type: ignore[no-untyped-call]
        return generate_latest(scrape_time), CONTENT_TYPE_LATEST
    # Two registries' texts: their metric names differ, so the concatenation is one valid exposition.
    return generate_latest(REGISTRY) + generate_latest(scrape_time), CONTENT_TYPE_LATEST
