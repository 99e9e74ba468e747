"""What an admission leaves behind for its operators: its metrics and its decision log line.

Every review answered on an admission path is counted and logged here, one structured JSON line
per review (the server configures no access log). The series are created here, where the
decisions are taken, so admission needs nothing of the server to count what it does; the
server's exposition (:func:`webhook.serving.metrics.render`) reads them from prometheus_client's
registry, or, under gunicorn, from the worker processes' multiprocess files. prometheus_client
picks its value storage when it is first imported, so this module must not be imported before
``PROMETHEUS_MULTIPROC_DIR`` is set: :mod:`webhook.serving.server` sets it up before the app, and
with it this module, is loaded in a worker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import orjson
from prometheus_client import Counter, Histogram

from gpuquota_core.enforcement import Relaxed
from webhook.admission.decisions import Outcome
from webhook.admission.review import AdmissionRequest

# The decision log's logger; ``serve`` writes it to stderr, one record a line.
LOGGER_NAME = "gpuquota.webhook"

REQUESTS = Counter(
    "gpuquota_admission_requests",
    "Admission requests handled, by endpoint, operation and result (allowed, patched, denied, bad_request, "
    "too_large, error).",
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
GANG_ADMISSIONS = Counter(
    "gpuquota_gang_admissions",
    "Quota decisions on gang members, by result: opened (the member reserved room for its gang's whole "
    "minimum), drew (it drew from its gang's reservation), refused (its gang's minimum did not fit).",
    ["result"],
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


def record_decision(log: logging.Logger, endpoint: str, req: AdmissionRequest, outcome: Outcome,
                    elapsed: float) -> None:
    """Count and log a review answered with a decision (allowed, patched or denied)."""
    response = outcome.response
    observe(endpoint, req.operation, response.decision, elapsed)
    if not response.allowed:
        DENIALS.labels(endpoint, response.reason).inc()
    if outcome.gang_result:
        GANG_ADMISSIONS.labels(outcome.gang_result).inc()
    for relaxed in outcome.relaxed:
        WOULD_DENY.labels(endpoint, relaxed.check, relaxed.mode.value).inc()
    for resource in outcome.rewritten:
        REWRITES.labels(resource).inc()
    for resource in outcome.left_as_written:
        LEFT_AS_WRITTEN.labels(resource).inc()
    _log_decision(log, endpoint=endpoint, uid=req.uid, namespace=req.namespace, name=req.name or _object_name(req),
                  operation=req.operation, decision=response.decision, reason=outcome.note, code=response.code,
                  dry_run=req.dry_run, elapsed=elapsed, would_deny=outcome.relaxed)


def record_rejected(log: logging.Logger, endpoint: str, code: int, message: str, elapsed: float) -> None:
    """Count and log a body that is no review to decide: 400 (unreadable) or 413 (over the cap)."""
    observe(endpoint, "", "bad_request" if code == 400 else "too_large", elapsed)
    _log_decision(log, endpoint=endpoint, uid="", namespace="", name="", operation="", decision="rejected",
                  reason=message, code=code, dry_run=False, elapsed=elapsed)


def record_failure(log: logging.Logger, endpoint: str, req: AdmissionRequest, elapsed: float) -> None:
    """Count and log a decision that raised; called while the exception is handled, for its traceback."""
    log.exception("admission handler failed: endpoint=%s uid=%s", endpoint, req.uid)
    observe(endpoint, req.operation, "error", elapsed)


def _object_name(req: AdmissionRequest) -> str:
    obj = req.object if req.object is not None else req.old_object
    metadata = obj.get("metadata") if obj is not None else None
    if not isinstance(metadata, Mapping):
        return ""
    return _text(metadata.get("name")) or _text(metadata.get("generateName"))


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _log_decision(log: logging.Logger, *, endpoint: str, uid: str, namespace: str, name: str, operation: str,
                  decision: str, reason: str, code: int, dry_run: bool, elapsed: float,
                  would_deny: tuple[Relaxed, ...] = ()) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    # would_deny: what warn / dry-run let pass, with the message the user would have seen.
    record = {"event": "admission", "endpoint": endpoint, "uid": uid, "namespace": namespace, "name": name,
              "operation": operation, "decision": decision, "code": code, "reason": reason,
              "dry_run": dry_run, "latency_ms": round(elapsed * 1000, 3),
              "would_deny": [{"check": r.check, "mode": r.mode.value, "message": r.message} for r in would_deny]}
    log.info("%s", orjson.dumps(record).decode())
