"""What a refused (or would-be refused) pod reports as a Kubernetes Event: pure, no I/O, no clock.

A refused pod is never stored, so nothing can show an event *on the pod*. The event goes where the
person who made the pod looks instead:

- on the pod's controller (``metadata.ownerReferences`` entry with ``controller: true``): the
  ReplicaSet, Job, StatefulSet... whose ``kubectl describe`` already shows its FailedCreate;
- else on the ElasticQuota the pod resolves to (its label, its namespace's quota, the default);
- else on the pod's namespace.

Reasons are stable CamelCase names, one per check (``REFUSED_REASONS``) and one per check for a
denial that ``warn`` or ``dry-run`` let pass (``WOULD_DENY_REASONS``), so users can select them with
``--field-selector reason=...``. The message is the webhook's own refusal message, with a
generated pod name written as its ``generateName`` prefix: the replicas of one workload are then
reported as one event whose count grows, instead of one event per random pod name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .enforcement import CHECKS, INVALID, PARENT_QUOTA, QUOTA_EXCEEDED, QUOTA_NOT_FOUND, UNKNOWN_GPU_MEMORY, Mode
from .quota_objects import ELASTICQUOTA_API_VERSION

# check (the admission response's reason) -> the Event reason of an enforced refusal.
REFUSED_REASONS: Mapping[str, str] = {
    INVALID: "GPURequestInvalid",
    QUOTA_EXCEEDED: "GPUQuotaExceeded",
    QUOTA_NOT_FOUND: "GPUQuotaNotFound",
    PARENT_QUOTA: "GPUQuotaIsParent",
    UNKNOWN_GPU_MEMORY: "GPUMemoryUnconvertible",
}
# check -> the Event reason when warn or dry-run admitted the pod that the check would refuse.
WOULD_DENY_REASONS: Mapping[str, str] = {check: f"WouldDeny{reason}" for check, reason in REFUSED_REASONS.items()}

EVENT_TYPE = "Warning"
# A gang whose reservation ended (its waiting time over) with fewer members stored than its minimum:
# koord-scheduler will not place them, and they hold quota room until they are deleted.
GANG_PARTLY_ADMITTED = "GangPartlyAdmitted"
REPORTING_COMPONENT = "koord-gpuquota"
# core/v1 Event messages are not limited by validation, but a note of the events.k8s.io API is
# (1 KiB); keep to it so the same text fits either view of the object.
MAX_MESSAGE_BYTES = 1024



@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The involvedObject of an event: enough for ``kubectl describe`` to find it."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""

    def as_involved_object(self) -> dict[str, str]:
        fields = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name,
                  "namespace": self.namespace, "uid": self.uid}
        return {key: value for key, value in fields.items() if value}


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One refusal or would-deny of one pod, before its target is resolved against the quota tree."""

    reason: str
    message: str
    namespace: str  # the pod's
    quota_label: str  # the pod's quota label ("" when none): resolves the quota target
    owner: ObjectRef | None  # the pod's controller, when it names one


def controller_of(metadata: Mapping[str, Any], namespace: str) -> ObjectRef | None:
    """The owner reference marked ``controller: true`` (at most one is allowed), as an event target.

    Owners of a namespaced object are in its namespace (the garbage collector's rule).
    """
    references = metadata.get("ownerReferences")
    if not isinstance(references, list):
        return None
    for reference in references:
        if not isinstance(reference, Mapping) or reference.get("controller") is not True:
            continue
        fields = [reference.get(key) for key in ("apiVersion", "kind", "name", "uid")]
        if all(isinstance(value, str) and value for value in fields):
            api_version, kind, name, uid = (str(value) for value in fields)
            return ObjectRef(api_version, kind, name, namespace, uid)
    return None


def stable_message(message: str, name: str, generate_name: str) -> str:
    """``message`` with a generated pod name shown as its prefix (``train-7d9f-*``), cut to the limit.

    Only a name the API server generated is rewritten: a pod its author named keeps its name.
    """
    if generate_name and name.startswith(generate_name) and name != generate_name:
        message = message.replace(f"/{name}", f"/{generate_name}*")
    encoded = message.encode()
    if len(encoded) > MAX_MESSAGE_BYTES:
        message = encoded[:MAX_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."
    return message


def pod_event(check: str, mode: Mode, message: str, metadata: Mapping[str, Any], namespace: str,
              quota_label: str) -> PodEvent | None:
    """The event for a pod that ``check`` refused (``mode`` enforce) or would refuse; None for a
    reason that is not a policy check (an outage, an unreadable request: no event)."""
    if check not in CHECKS:
        return None
    name, generate_name = metadata.get("name"), metadata.get("generateName")
    text = stable_message(message, name if isinstance(name, str) else "",
                          generate_name if isinstance(generate_name, str) else "")
    if mode is Mode.ENFORCE:
        reason, text = REFUSED_REASONS[check], f"pod refused: {text}"
    else:
        reason, text = WOULD_DENY_REASONS[check], f"pod admitted, enforcement {mode.value} (would deny): {text}"
    return PodEvent(reason, text, namespace, quota_label, controller_of(metadata, namespace))


def gang_partly_admitted(gang: str, stored: int, min_members: int, namespace: str, quota_label: str) -> PodEvent:
    """The event of a gang that stayed below its minimum once its reservation ended (its waiting time)."""
    message = (f"gang {gang} has {stored} of its minimum {min_members} members stored and its waiting time is over: "
               f"its reservation for the rest was given up, and koord-scheduler places the stored members only "
               f"together with the rest; they keep holding quota room until they are deleted or the rest is "
               f"created and admitted")
    return PodEvent(GANG_PARTLY_ADMITTED, message, namespace, quota_label, None)


def quota_target(name: str, namespace: str, uid: str = "") -> ObjectRef:
    return ObjectRef(ELASTICQUOTA_API_VERSION, "ElasticQuota", name, namespace, uid)


def namespace_target(namespace: str) -> ObjectRef:
    """A Namespace as target. Its event is stored in that namespace (involvedObject.namespace set
    to it, which the API accepts), not in ``default``: the namespace's users can read it there."""
    return ObjectRef("v1", "Namespace", namespace, namespace)
