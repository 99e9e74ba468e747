"""One pod admission as the quota decision reads it, and the verdict it gets back.

The webhook's workers build a ``PodAdmission`` from an AdmissionReview and the quota service (another
process, webhook/quota) decides it: both read these types, and the request in it, through this
module alone, so the quota service never imports admission (HTTP) code and a worker answering an
UPDATE itself reads the request exactly as the service would. :func:`read_pod_admission` is the
one call with which a worker reads a reviewed pod into all that its decision needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .conversion import ConversionConfig
from .gang import gang_metadata
from .pod_records import gpu_memory_unknown, remembered_gpu_problems, remembered_request_texts, spec_shape_key
from .podspec import PodShapeError, as_mapping
from .quota_decision import PodQuotaRequest, quota_use_unchanged, requests_of
from .quota_objects import POD_QUOTA_LABEL
from .validation import GpuRequestProblem


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
    # The pod's gang annotations (gpuquota_core.gang): with its labels, which gang it is a member of.
    gang_annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    message: str = ""
    # Machine-readable reason, a constant of gpuquota_core.enforcement ("QuotaExceeded", ...); the
    # webhook derives a denial's HTTP status from it.
    reason: str = ""
    warnings: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


ALLOW = Verdict(True)


@dataclass(frozen=True, slots=True)
class PodReading:
    """A reviewed pod read once into what its admission decision needs.

    The GPU problems come first and stand on their own: a pod the checks refuse is refused even
    when the rest of it cannot be read, so a reading of the rest that failed is kept as a value
    (``admission`` is then the PodShapeError) for the caller to answer once the problems are judged.
    """

    # What the core's GPU checks find in the new pod's requests.
    problems: tuple[GpuRequestProblem, ...]
    # Every problem is in the stored pod of an UPDATE already: it was stored with that request (before
    # the webhook, or past it), and refusing every later update would also refuse the finalizer and
    # status changes needed to delete it.
    grandfathered: bool
    # What the quota decision reads, or why the pod's metadata or requests cannot be read.
    admission: PodAdmission | PodShapeError
    # The spec's memo key (pod_records.spec_shape_key), computed once for every remembered answer above;
    # None when the spec has no plain shape and each answer was computed afresh.
    shape: object | None


def read_pod_admission(pod: Mapping[str, Any], old_pod: Mapping[str, Any] | None, config: ConversionConfig, *,
                       uid: str, operation: str, namespace: str = "", name: str = "", dry_run: bool = False,
                       caller: str = "") -> PodReading:
    """Read a pod under review (and the stored pod an UPDATE replaces) with ``config``.

    ``namespace`` and ``name`` are the review's; where it leaves them empty (a CREATE with
    generateName), the pod's own metadata says them. A spec that is not an object raises
    PodShapeError: nothing of the pod can be judged then.
    """
    spec = as_mapping(pod.get("spec"), "spec")
    shape = spec_shape_key(spec, config)
    problems = tuple(remembered_gpu_problems(spec, config, shape=shape))
    old_is_stored = operation == "UPDATE" and old_pod is not None
    grandfathered = bool(problems) and old_is_stored and _grandfathered(problems, old_pod, config)
    try:
        admission = _pod_admission(pod, spec, shape, old_pod if old_is_stored else None, config, uid=uid,
                                   operation=operation, namespace=namespace, name=name, dry_run=dry_run,
                                   caller=caller)
    except PodShapeError as error:
        return PodReading(problems, grandfathered, error, shape)
    return PodReading(problems, grandfathered, admission, shape)


def pod_labels(metadata: Mapping[str, Any]) -> dict[str, str]:
    """A pod's labels; a stored object's label values are strings, and nothing else can select a quota."""
    raw = metadata.get("labels")
    if not isinstance(raw, Mapping):
        return {}
    return {key: value for key, value in raw.items() if isinstance(key, str) and isinstance(value, str)}


def _grandfathered(problems: tuple[GpuRequestProblem, ...], old_pod: Mapping[str, Any] | None,
                   config: ConversionConfig) -> bool:
    if old_pod is None:
        return False
    try:
        old_problems = remembered_gpu_problems(as_mapping(old_pod.get("spec"), "spec"), config)
    except PodShapeError:
        return False
    return {p.message for p in problems} <= {p.message for p in old_problems}


def _pod_admission(pod: Mapping[str, Any], spec: Mapping[str, Any], shape: object | None,
                   old_pod: Mapping[str, Any] | None, config: ConversionConfig, *, uid: str, operation: str,
                   namespace: str, name: str, dry_run: bool, caller: str) -> PodAdmission:
    metadata = as_mapping(pod.get("metadata"), "metadata")
    # The cluster-state cache charges stored pods with this same function (remembered by spec
    # shape: the replicas of a workload ask alike), so an admission and the later watch event
    # of the same pod count the same amounts.
    requests = remembered_request_texts(spec, config, shape=shape)
    old_labels: dict[str, str] | None = None
    old_requests: dict[str, str] | None = None
    if old_pod is not None:
        old_labels = pod_labels(as_mapping(old_pod.get("metadata"), "oldObject.metadata"))
        try:
            old_requests = remembered_request_texts(as_mapping(old_pod.get("spec"), "spec"), config)
        except PodShapeError:
            # The stored object is the API server's own; if even it cannot be read, say
            # "unknown" rather than refusing an update of something we cannot interpret.
            old_requests = None
    pod_uid = metadata.get("uid")
    return PodAdmission(
        uid=uid,
        operation=operation,
        namespace=namespace or _text(metadata.get("namespace")),
        name=name or _text(metadata.get("name")) or _text(metadata.get("generateName")),
        pod_uid=pod_uid if isinstance(pod_uid, str) else "",
        labels=pod_labels(metadata),
        canonical_requests=requests,
        old_labels=old_labels,
        old_canonical_requests=old_requests,
        dry_run=dry_run,
        unknown_gpu_memory=gpu_memory_unknown(requests),
        caller=caller,
        gang_annotations=gang_metadata(metadata.get("annotations")),
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


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
