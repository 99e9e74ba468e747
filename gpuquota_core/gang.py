"""Gangs as koord-scheduler reads them, and the room a gang needs before any member is admitted.

A gang (Koordinator's coscheduling) is a set of pods that are useless until ``min-available`` of
them run together: koord-scheduler holds its members at Permit until the minimum can be placed at
once. Charging a quota pod by pod while the pods are stored, as every admission webhook does,
admits two gangs under one quota each in part, and neither ever reaches its minimum. So a gang's
first member reserves the room the whole minimum takes, or is refused; the others draw from that
reservation (``gpuquota_core.ledger``, ``quota_decision``).

Which pods form a gang, in koord-scheduler's order (Koordinator v1.8.0,
``pkg/scheduler/plugins/coscheduling/util/gang_helper.go:44-68``, ``GetGangNameByPod`` and
``GetGangMinNumFromPod``; the names in ``apis/extension/coscheduling.go:28-73`` and, for the PodGroup
label, ``apis/thirdparty/scheduler-plugins/pkg/apis/scheduling/v1alpha1/types.go:115``):

1. the label ``pod-group.scheduling.sigs.k8s.io`` naming a PodGroup in the pod's namespace, whose
   ``spec.minMember``, ``spec.minResources`` and ``spec.scheduleTimeoutSeconds`` say the rest;
2. the label ``pod-group.scheduling.sigs.k8s.io/name`` (its minimum in the label
   ``pod-group.scheduling.sigs.k8s.io/min-available``);
3. the annotation ``gang.scheduling.koordinator.sh/name`` (its minimum in the annotation
   ``gang.scheduling.koordinator.sh/min-available``, its Permit wait in ``waiting-time``).

A gang takes its minimum from the first of its pods koord-scheduler sees
(``pkg/scheduler/plugins/coscheduling/core/gang.go:102-140``, ``tryInitByPodConfig``), so a gang's
reservation keeps the minimum of the member that opened it. Where a pod names a gang but no
minimum of at least one, koord-scheduler keeps no minimum for it either, and it is charged like any
other pod.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from .quantity import Quantity, QuantityError
from .resources import ResourceList

POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"
LIGHTWEIGHT_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
LIGHTWEIGHT_MIN_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
GANG_ANNOTATION_PREFIX = "gang.scheduling.koordinator.sh/"
GANG_NAME_ANNOTATION = GANG_ANNOTATION_PREFIX + "name"
GANG_MIN_ANNOTATION = GANG_ANNOTATION_PREFIX + "min-available"
GANG_WAITING_TIME_ANNOTATION = GANG_ANNOTATION_PREFIX + "waiting-time"
GANG_TOTAL_ANNOTATION = GANG_ANNOTATION_PREFIX + "total-number"
GANG_GROUPS_ANNOTATION = GANG_ANNOTATION_PREFIX + "groups"

POD_GROUP_API_VERSION = "scheduling.sigs.k8s.io/v1alpha1"
POD_GROUP_KIND = "PodGroup"
POD_GROUP_PLURAL = "podgroups"

# koord-scheduler's default gang waiting time (pkg/scheduler/apis/config/v1/defaults.go:84,
# defaultTimeout of CoschedulingArgs): a gang whose members do not all come within it is given up by the scheduler,
# and so is its reservation here.
DEFAULT_WAITING_SECONDS = 600

# A verdict on a gang member says so in its details: which gang, and what its admission did there
# (the workers count them: gpuquota_gang_admissions_total).
GANG_DETAIL = "gang"
GANG_RESULT_DETAIL = "gangResult"
OPENED, DREW, REFUSED = "opened", "drew", "refused"
GANG_RESULTS = (OPENED, DREW, REFUSED)

# Where a gang comes from, for messages and the audit.
FROM_POD_GROUP = "PodGroup"
FROM_LABELS = "labels"
FROM_ANNOTATIONS = "annotations"


@dataclass(frozen=True, slots=True)
class PodGroupInfo:
    """What a decision reads of a PodGroup object."""

    namespace: str
    name: str
    min_member: int
    # Canonical, when the PodGroup gives it: then it is the gang's need, whatever its members ask.
    min_resources: ResourceList | None = None
    schedule_timeout_seconds: int | None = None
    # Its gang.scheduling.koordinator.sh/groups annotation: the gangs (namespace/name) placed with it.
    groups: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Gang:
    """The gang one pod belongs to, as koord-scheduler reads it."""

    namespace: str
    name: str
    min_members: int
    waiting_seconds: int
    source: str  # FROM_POD_GROUP, FROM_LABELS or FROM_ANNOTATIONS
    # Canonical minResources of its PodGroup, when set: the gang's need.
    min_resources: ResourceList | None = None
    # The other gangs of its gang group (the groups annotation), which koord-scheduler places only
    # together with it: their minimums are reserved with its own (gpuquota_core.quota_decision).
    group: tuple[Gang, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def gang_metadata(annotations: Mapping[str, Any] | None) -> dict[str, str]:
    """The gang annotations of a pod, the only annotations a quota decision reads."""
    if not isinstance(annotations, Mapping):
        return {}
    return {key: value for key, value in annotations.items()
            if isinstance(key, str) and key.startswith(GANG_ANNOTATION_PREFIX) and isinstance(value, str)}


def names_gang(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str:
    """The gang name a pod's metadata gives, "" for none (``GetGangNameByPod``'s order)."""
    return (labels.get(POD_GROUP_LABEL) or labels.get(LIGHTWEIGHT_NAME_LABEL)
            or annotations.get(GANG_NAME_ANNOTATION) or "")


def gang_of(namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str],
            pod_groups: Mapping[str, PodGroupInfo]) -> Gang | None:
    """The gang of a pod of ``namespace`` with these labels and gang annotations; None: not a gang.

    ``pod_groups``: the PodGroups known, by ``namespace/name``.
    """
    pod_group = labels.get(POD_GROUP_LABEL)
    if pod_group:
        info = pod_groups.get(f"{namespace}/{pod_group}")
        if info is None or info.min_member < 1:
            return None
        gang = _pod_group_gang(info)
        return replace(gang, group=_group(gang, info.groups, pod_groups))
    name = names_gang(labels, annotations)
    if not name:
        return None
    minimum = _positive_int(labels.get(LIGHTWEIGHT_MIN_LABEL) or annotations.get(GANG_MIN_ANNOTATION))
    if minimum is None:
        return None
    source = FROM_LABELS if labels.get(LIGHTWEIGHT_NAME_LABEL) else FROM_ANNOTATIONS
    waiting = go_duration_seconds(annotations.get(GANG_WAITING_TIME_ANNOTATION, ""))
    gang = Gang(namespace, name, minimum,
                waiting if waiting is not None and waiting > 0 else DEFAULT_WAITING_SECONDS, source)
    return replace(gang, group=_group(gang, gang_group_names(annotations.get(GANG_GROUPS_ANNOTATION, "")),
                                      pod_groups))


def gang_group_names(text: str) -> tuple[str, ...]:
    """The gangs (namespace/name) a groups annotation lists; () when it lists none or cannot be read,
    as koord-scheduler then places the gang alone (``util.StringToGangGroupSlice``, gang.go:167-176)."""
    try:
        names = json.loads(text) if text else []
    except ValueError:
        return ()
    if not isinstance(names, list):
        return ()
    return tuple(dict.fromkeys(name for name in names if isinstance(name, str) and "/" in name))


def _pod_group_gang(info: PodGroupInfo) -> Gang:
    waiting = info.schedule_timeout_seconds
    return Gang(info.namespace, info.name, info.min_member,
                waiting if waiting is not None and waiting > 0 else DEFAULT_WAITING_SECONDS,
                FROM_POD_GROUP, info.min_resources)


def _group(gang: Gang, names: tuple[str, ...], pod_groups: Mapping[str, PodGroupInfo]) -> tuple[Gang, ...]:
    """The other gangs of ``gang``'s group, as well as they can be known when one of its members is
    admitted: a PodGroup's own minimum and resources when the watch has it, else assumed alike to
    ``gang`` (the same minimum and waiting time, each member asking what this one asks)."""
    others: list[Gang] = []
    for name in names:
        if name == gang.key:
            continue
        namespace, _, short = name.partition("/")
        info = pod_groups.get(name)
        others.append(_pod_group_gang(info) if info is not None and info.min_member >= 1 else
                      replace(gang, namespace=namespace, name=short, min_resources=None, group=()))
    return tuple(others)


def unseen_pod_group(namespace: str, labels: Mapping[str, str], pod_groups: Mapping[str, PodGroupInfo]) -> str:
    """The PodGroup (namespace/name) a pod's label names that ``pod_groups`` lacks, "" for none.

    koord-scheduler does not schedule such a pod either until its PodGroup exists (its gang is not
    initialised: ``pkg/scheduler/plugins/coscheduling/core/gang_cache.go``, ``onPodAddInternal``
    leaves a PodGroup gang to ``onPodGroupAdd``), so refusing it for now loses nothing.
    """
    name = labels.get(POD_GROUP_LABEL)
    return f"{namespace}/{name}" if name and f"{namespace}/{name}" not in pod_groups else ""


def pod_group_not_seen(namespace: str, name: str, pod_group: str) -> str:
    """Why a member of ``pod_group`` (namespace/name), which is not known, is refused for now."""
    return (f"pod {namespace}/{name} is a member of PodGroup {pod_group} (label {POD_GROUP_LABEL}), which this "
            f"webhook has not seen: koord-scheduler does not schedule a gang whose PodGroup does not exist "
            f"either; create the PodGroup first, or retry shortly if it was just created")


def pod_group_info(obj: Mapping[str, Any], canonical: Any) -> PodGroupInfo | None:
    """A PodGroup object read for decisions; None when it is not one that can be read.

    ``canonical``: turns its ``minResources`` (any GPU spelling) into canonical requests, the same
    conversion every pod gets (``pod_records.canonical_resource_list``), passed in so this module
    stays below the conversion code.
    """
    metadata = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace") or ""
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return None
    minimum = spec.get("minMember")
    if not isinstance(minimum, int) or isinstance(minimum, bool):
        return None
    raw = spec.get("minResources")
    min_resources: ResourceList | None = None
    if isinstance(raw, Mapping) and raw:
        try:
            min_resources = canonical(raw) or None
        except (QuantityError, ValueError):
            min_resources = None
    timeout = spec.get("scheduleTimeoutSeconds")
    annotations = metadata.get("annotations")
    groups = annotations.get(GANG_GROUPS_ANNOTATION) if isinstance(annotations, Mapping) else None
    return PodGroupInfo(namespace, name, minimum, min_resources,
                        timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else None,
                        gang_group_names(groups) if isinstance(groups, str) else ())


def gang_need(gang: Gang, member_requests: Mapping[str, Quantity]) -> ResourceList:
    """The room a gang's minimum takes: its PodGroup's minResources when given, else the minimum
    number of members times one member's request.

    Members of one gang nearly always ask alike (the replicas of one template). Where they do not
    and nothing gives the total, the need is judged from the member that opens the reservation:
    every member still draws what it asks itself, so a larger one is charged the difference like
    any pod, and the audit warns about the gang (docs/audit-checks.md).
    """
    if gang.min_resources is not None:
        return dict(gang.min_resources)
    return {name: quantity.scaled(gang.min_members) for name, quantity in member_requests.items()
            if not quantity.is_zero()}


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": Fraction(1, 10**9), "us": Fraction(1, 10**6), "µs": Fraction(1, 10**6),
                 "μs": Fraction(1, 10**6), "ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60),
                 "h": Fraction(3600)}


def go_duration_seconds(text: str) -> int | None:
    """Whole seconds (rounded up) of a Go duration string such as ``30s`` or ``1m30s``, as
    koord-scheduler parses ``waiting-time`` (``time.ParseDuration``); None when it cannot be read."""
    text = text.strip()
    if not text or text.startswith("-"):
        return None
    text = text.removeprefix("+")
    if text == "0":
        return 0
    position, total = 0, Fraction(0)
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        if match is None:
            return None
        total += Fraction(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return -(-total.numerator // total.denominator)


def _positive_int(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value >= 1 else None
