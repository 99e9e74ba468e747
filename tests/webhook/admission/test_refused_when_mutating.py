"""/mutate-pods' refusal of spellings that disagree follows the enforcement mode of its check.

The handlers directly (the served answer is tests/webhook/admission/test_tls_admission.py's):
enforced, the mutating call refuses with the validating call's code, reason and message; in
warn or dry-run mode it lets the pod pass as written, and the validating call then warns or
counts it as it does for every relaxed check.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from reviews import pod, review

from gpuquota_core.conversion import load_config
from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.admission.decisions import AdmissionHandlers
from webhook.admission.review import decode_review

DISAGREE = {"koordinator.sh/gpu": "2", "koordinator.sh/gpu-core": "1"}


class Admits:
    """A quota decision that admits everything: only the GPU rules are under test here."""

    def alive(self) -> tuple[bool, str]:
        return True, ""

    def ready(self) -> tuple[bool, str]:
        return True, ""

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        return Verdict(True)

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return Verdict(True)


def handlers(mode: str) -> AdmissionHandlers:
    return AdmissionHandlers(load_config({"enforcement": {"checks": {"Invalid": mode}}}), Admits())


def test_enforced_the_mutating_call_refuses_as_the_validating_call_does() -> None:
    answer = handlers("enforce")
    request = json.dumps(review(pod(resources=DISAGREE))).encode()

    mutated = answer.mutate_pod(decode_review(request))
    validated = answer.validate_pod(decode_review(request))

    assert not mutated.response.allowed and not validated.response.allowed
    assert (mutated.response.code, mutated.response.reason, mutated.response.message) == (
        validated.response.code, validated.response.reason, validated.response.message)
    assert mutated.response.reason == "Invalid" and "[rule: spellings-disagree]" in mutated.response.message
    assert mutated.note == validated.note == "spellings-disagree"


@pytest.mark.parametrize("mode", ["warn", "dry-run"])
def test_relaxed_the_mutating_call_lets_the_pod_pass_as_written(mode: str) -> None:
    answer = handlers(mode)
    request = json.dumps(review(pod(resources=DISAGREE))).encode()

    mutated = answer.mutate_pod(decode_review(request))
    validated = answer.validate_pod(decode_review(request))

    assert mutated.response.allowed and not mutated.response.patch
    assert validated.response.allowed
    assert [r.check for r in validated.relaxed] == ["Invalid"]
