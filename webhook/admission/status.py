"""Reason -> HTTP status: the one place a refusal's status code is chosen.

The core says what was refused and why (a reason constant of :mod:`gpuquota_core.enforcement`);
which HTTP status carries that to the API server is the webhook's business, so the table lives
here, above the core. The review codec, serving's HTTP-level answers and the CLI (which shows the
code an admission would get) all read it, so none of them can disagree on a status.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuquota_core.enforcement import (
    ANSWER_TOO_LATE,
    BAD_REQUEST,
    ESCROW_NOT_BACK,
    FORBIDDEN,
    INVALID,
    LEDGER_UNAVAILABLE,
    NOT_READY,
    PARENT_QUOTA,
    POD_GROUP_NOT_SEEN,
    QUOTA_EXCEEDED,
    QUOTA_NOT_FOUND,
    QUOTA_SERVICE_DOWN,
    TOO_MANY_RESERVATIONS,
    UNKNOWN_GPU_MEMORY,
)

# Reasons only HTTP has: the body or the request line is refused before any review is read, or
# the server itself failed.
REQUEST_ENTITY_TOO_LARGE = "RequestEntityTooLarge"
INTERNAL_ERROR = "InternalError"
NOT_FOUND = "NotFound"
METHOD_NOT_ALLOWED = "MethodNotAllowed"

# A denial's status when its reason is not in the table: the API server needs a 4xx/5xx code for
# every denial, and "forbidden" is what an unexplained refusal is.
DENIAL_STATUS = 403

STATUS_BY_REASON: Mapping[str, int] = {
    # The quota itself refuses: the request is understood and not allowed.
    QUOTA_EXCEEDED: 403,
    QUOTA_NOT_FOUND: 403,
    PARENT_QUOTA: 403,
    UNKNOWN_GPU_MEMORY: 403,
    FORBIDDEN: 403,
    # The object can never be admitted as written.
    INVALID: 422,
    BAD_REQUEST: 400,
    # One caller holds too many unconfirmed reservations: retry once they are confirmed.
    TOO_MANY_RESERVATIONS: 429,
    # Nothing was decided about the quota: the webhook could not decide in time; retry shortly.
    NOT_READY: 503,
    QUOTA_SERVICE_DOWN: 503,
    LEDGER_UNAVAILABLE: 503,
    ANSWER_TOO_LATE: 503,
    ESCROW_NOT_BACK: 503,
    POD_GROUP_NOT_SEEN: 503,
    REQUEST_ENTITY_TOO_LARGE: 413,
    INTERNAL_ERROR: 500,
    NOT_FOUND: 404,
    METHOD_NOT_ALLOWED: 405,
}


def status_of(reason: str) -> int:
    """The HTTP status that carries a refusal for ``reason`` (403 for a reason the table lacks)."""
    return STATUS_BY_REASON.get(reason, DENIAL_STATUS)
