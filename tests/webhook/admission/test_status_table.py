"""The one table from a refusal's reason to its HTTP status (webhook.admission.status).

Every reason keeps the status it was answered with before the table existed; a reason added to the
core without a row would be answered 403, so every reason constant of the core is listed here.
"""

from __future__ import annotations

import re

import orjson
import pytest
from reviews import pod, review

from gpuquota_core import enforcement
from gpuquota_core.enforcement import Mode
from webhook.admission import status
from webhook.admission.review import decode_review, denied, status_body
from webhook.admission.status import STATUS_BY_REASON, status_of

EXPECTED = {
    "QuotaExceeded": 403, "QuotaNotFound": 403, "ParentQuota": 403, "UnknownGpuMemory": 403,
    "Forbidden": 403, "Invalid": 422, "BadRequest": 400, "TooManyReservations": 429,
    "NotReady": 503, "QuotaServiceDown": 503, "LedgerUnavailable": 503, "AnswerTooLate": 503,
    "EscrowNotBackInTime": 503, "PodGroupNotSeen": 503, "RequestEntityTooLarge": 413, "InternalError": 500,
    "NotFound": 404,
    "MethodNotAllowed": 405,
}


def reason_constants() -> dict[str, str]:
    """Every upper-case string constant of the core's reasons and of the status module."""
    found: dict[str, str] = {}
    for module in (enforcement, status):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str) and value[:1].isupper() and " " not in value:
                found[name] = value
    return found


def test_every_reason_constant_maps_to_the_status_it_was_answered_with() -> None:
    constants = reason_constants()
    assert sorted(constants.values()) == sorted(EXPECTED)
    assert {reason: status_of(reason) for reason in constants.values()} == EXPECTED
    assert dict(STATUS_BY_REASON) == EXPECTED


def test_a_mode_name_is_not_mistaken_for_a_reason() -> None:
    assert all(mode.value not in STATUS_BY_REASON for mode in Mode)


@pytest.mark.parametrize("reason", ["", "SomethingNew"])
def test_a_denial_with_a_reason_the_table_lacks_is_forbidden(reason: str) -> None:
    assert status_of(reason) == 403


def test_a_denial_and_a_status_body_carry_the_status_of_their_reason() -> None:
    request = decode_review(orjson.dumps(review(pod(), uid="u-1")))
    refused = denied(request, "over quota", reason="TooManyReservations")
    assert refused.to_dict()["response"] == {
        "uid": "u-1", "allowed": False,
        "status": {"status": "Failure", "code": 429, "reason": "TooManyReservations", "message": "over quota"}}
    assert status_body("RequestEntityTooLarge", "too big") == (
        b'{"apiVersion":"v1","kind":"Status","status":"Failure","code":413,'
        b'"reason":"RequestEntityTooLarge","message":"too big"}')


def test_the_core_describes_its_checks_without_their_http_status() -> None:
    # The status that carries a reason is told here only; the core's words stay true if it changes.
    statuses = {str(code) for code in (*STATUS_BY_REASON.values(), status.DENIAL_STATUS)}
    assert {check: text for check, text in enforcement.CHECKS.items()
            if set(re.findall(r"\d+", text)) & statuses} == {}
