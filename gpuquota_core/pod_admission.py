"""One pod admission as the quota decision reads it, and the verdict it gets back.

The webhook's workers build a ``PodAdmission`` from an AdmissionReview and the quota service (another
process, webhook/quota) decides it: both read these types, and the request in it, through this
module alone, so the quota service never imports admission (HTTP) code and a worker answering an
UPDATE itself reads the request exactly as the service would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .quota_decision import PodQuotaRequest, quota_use_unchanged, requests_of
from .quota_objects import POD_QUOTA_LABEL


@dataclass(frozen=True, slots=True)
class PodAdmission:
    """What the quota decision needs to know about one pod admission request."""

    uid: str  # the AdmissionReview request uid (unique per call)
    operation: str  # CREATE or UPDATE
    namespace: str
    name: str
    pod_uid: str  # metadata.uid of the pod when the API server has set it, else ""
    labels: dict[str, str]
    canonical_requests: dict[str, str]  # pod-level canonical request, name -> quantity string
    old_labels: dict[str, str] | None = None  # UPDATE only
    old_canonical_requests: dict[str, str] | None = None  # UPDATE only
    dry_run: bool = False
    unknown_gpu_memory: bool = False  # gpu-memory bytes with no model mapping: footprint unknown
    # Who sent the AdmissionReview: the TLS peer's address (or client certificate subject).
    # Never the review's own userInfo, which a forged review would simply make up.
    caller: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    message: str = ""
    code: int = 200  # HTTP-style status code for a denial (403 quota, 422 invalid)
    reason: str = ""  # machine-readable reason, e.g. "QuotaExceeded", "QuotaNotFound"
    warnings: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


ALLOW = Verdict(True)


def quota_requests(admission: PodAdmission) -> tuple[PodQuotaRequest, PodQuotaRequest | None]:
    """The pod's new and old (UPDATE) request as the quota decision reads them.

    One function for the quota service and the workers, so that a worker answering an UPDATE
    itself (``quota_use_unchanged``) reads it exactly as the service would.
    """
    return _new_request(admission), _old_request(admission)


def needs_quota_service(admission: PodAdmission) -> bool:
    """False for an UPDATE that cannot change what any quota counts (see ``quota_use_unchanged``)."""
    old = _old_request(admission)  # None for every CREATE, which then reads nothing more here
    return old is None or not quota_use_unchanged(_new_request(admission), old)


def _new_request(admission: PodAdmission) -> PodQuotaRequest:
    return PodQuotaRequest(admission.namespace, admission.name, admission.labels.get(POD_QUOTA_LABEL, ""),
                           requests_of(admission.canonical_requests), admission.unknown_gpu_memory)


def _old_request(admission: PodAdmission) -> PodQuotaRequest | None:
    if admission.operation != "UPDATE" or admission.old_canonical_requests is None:
        return None
    return PodQuotaRequest(admission.namespace, admission.name, (admission.old_labels or {}).get(POD_QUOTA_LABEL, ""),
                           requests_of(admission.old_canonical_requests))


@dataclass(frozen=True, slots=True)
class QuotaFigure:
    """One quota and canonical GPU resource as the quota service counts them, for the per-quota gauges.

    Amounts are canonical units as plain numbers: the exact ``gpuquota_core.quota_view.QuotaFigures``
    become floats only on their way to Prometheus, whose samples are floats. None where the figure
    does not exist (no limit, no min) or is not known (reserved under strict accounting).
    """

    quota: str
    tree: str
    resource: str
    used: float
    limit: float | None
    min: float | None
    reserved: float | None
