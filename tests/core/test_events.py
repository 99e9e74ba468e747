"""What a refused pod reports as an Event: reason, stable message, target (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuquota_core.enforcement import CHECKS, QUOTA_EXCEEDED, QUOTA_NOT_FOUND, Mode
from gpuquota_core.events import (
    MAX_MESSAGE_BYTES,
    REFUSED_REASONS,
    WOULD_DENY_REASONS,
    ObjectRef,
    PodEvent,
    controller_of,
    pod_event,
    stable_message,
)

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f", "uid": "u-1", "controller": True}


def metadata(**extra: Any) -> dict[str, Any]:
    return {"name": "train-7d9f-x2k4q", "generateName": "train-7d9f-", "namespace": "team-a", **extra}


def test_every_check_has_a_refused_and_a_would_deny_reason() -> None:
    assert set(REFUSED_REASONS) == set(WOULD_DENY_REASONS) == set(CHECKS)
    reasons = [*REFUSED_REASONS.values(), *WOULD_DENY_REASONS.values()]
    assert len(set(reasons)) == len(reasons)
    assert all(reason.isalnum() and reason[0].isupper() for reason in reasons)


def test_the_controller_reference_is_the_target() -> None:
    other = {**OWNER, "kind": "Foo", "name": "not-controller", "controller": False}
    assert controller_of(metadata(ownerReferences=[other, OWNER]), "team-a") == ObjectRef(
        "apps/v1", "ReplicaSet", "train-7d9f", "team-a", "u-1")
    assert controller_of(metadata(ownerReferences=[other]), "team-a") is None
    assert controller_of(metadata(), "team-a") is None
    # Unreadable references are no target rather than an error.
    assert controller_of(metadata(ownerReferences="nonsense"), "team-a") is None
    assert controller_of(metadata(ownerReferences=[{**OWNER, "uid": 5}]), "team-a") is None


def test_a_generated_name_is_written_as_its_prefix_so_replicas_aggregate() -> None:
    message = "pod team-a/train-7d9f-x2k4q names ElasticQuota 'gone'"
    assert stable_message(message, "train-7d9f-x2k4q", "train-7d9f-") == (
        "pod team-a/train-7d9f-* names ElasticQuota 'gone'")
    # A name its author chose stays.
    assert stable_message("pod team-a/solo names", "solo", "") == "pod team-a/solo names"


def test_a_long_message_is_cut_to_the_event_limit() -> None:
    cut = stable_message("é" * 2000, "", "")
    assert len(cut.encode()) <= MAX_MESSAGE_BYTES
    assert cut.endswith("...")


def test_refusal_and_would_deny_events() -> None:
    refused = pod_event(QUOTA_EXCEEDED, Mode.ENFORCE, "exceeded quota: team-a/team-a, ...",
                        metadata(ownerReferences=[OWNER]), "team-a", "team-a")
    assert refused == PodEvent("GPUQuotaExceeded", "pod refused: exceeded quota: team-a/team-a, ...", "team-a",
                               "team-a", ObjectRef("apps/v1", "ReplicaSet", "train-7d9f", "team-a", "u-1"))
    warned = pod_event(QUOTA_NOT_FOUND, Mode.WARN, "pod team-a/train-7d9f-x2k4q names ElasticQuota 'gone'",
                       metadata(), "team-a", "gone")
    assert warned is not None
    assert (warned.reason, warned.owner) == ("WouldDenyGPUQuotaNotFound", None)
    assert warned.message == (
        "pod admitted, enforcement warn (would deny): pod team-a/train-7d9f-* names ElasticQuota 'gone'")


@pytest.mark.parametrize("reason", ["QuotaServiceDown", "NotReady", "LedgerUnavailable", "BadRequest", ""])
def test_outages_and_unreadable_requests_make_no_event(reason: str) -> None:
    assert pod_event(reason, Mode.ENFORCE, "down", metadata(), "team-a", "") is None

