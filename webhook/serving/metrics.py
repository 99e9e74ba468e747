"""The server's Prometheus metrics and the exposition of all of them.

The admission metrics (requests, duration, rewrites, denials, ...) are admission's
(:mod:`webhook.admission.observability`); what is the server's is here:
the serving certificate's expiry, the gauges asked of the quota decider at scrape time, and
:func:`render`, which exposes all of them.

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
    Gauge,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

# Imported for its series: whoever loads this module first, the exposition holds admission's metrics too.
from webhook.admission import observability as _admission_metrics  # noqa: F401
from webhook.admission.quota_port import QuotaDecider, ReportsQuotaFigures

log = logging.getLogger("gpuquota.server")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

SERVING_CERTIFICATE_EXPIRY = Gauge(
    "gpuquota_serving_certificate_expiry_timestamp_seconds",
    "Unix time at which the serving certificate expires (notAfter of the first certificate of the cert "
    "file), set when a worker loads it; a rotated certificate replaces the value once loaded.",
    # Each worker loads the file itself; the value loaded last is the one in force.
    multiprocess_mode="livemostrecent",
)

# The per-quota gauges: (name, QuotaFigure field, help). Amounts are canonical units (docs/webhook.md, Metrics).
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
