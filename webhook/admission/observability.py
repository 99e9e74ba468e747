"""What an admission leaves behind for its operators: the admission metrics.

The series are created here, where the decisions are taken, so admission needs nothing of the
server to count what it does; the server's exposition (:func:`webhook.serving.metrics.render`)
reads them from prometheus_client's registry, or, under gunicorn, from the worker processes'
multiprocess files. prometheus_client picks its value storage when it is first imported, so this
module must not be imported before ``PROMETHEUS_MULTIPROC_DIR`` is set: :mod:`webhook.serving.server`
sets it up before the app, and with it this module, is loaded in a worker.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
CONFIG_RELOADS = Counter(
    "gpuquota_config_reloads",
    "Changes of the config file seen by a worker: loaded, or error (the previous config stays in force).",
    ["result"],
)


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
