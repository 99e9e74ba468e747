"""The one consistent quota view of a server instance: tree, watched usage, reservations, a lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuquota_core.ledger import ReservationLedger
from gpuquota_core.migration import IN_PROGRESS, MIGRATION_IN_PROGRESS_ANNOTATION
from gpuquota_core.quota import (
    POD_QUOTA_LABEL,
    QuotaTree,
    UsageIndex,
    pod_is_counted,
    pod_record,
    quota_from_object,
)
from gpuquota_core.quota_decision import PodQuotaRequest, decide, needs_check, requests_of
from gpuquota_core.quota_review import review_quota
from gpuquota_core.resources import add_lists

from .quota_port import ALLOW, PodAdmission, Verdict


class QuotaState:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl_seconds: float = 30.0) -> None:
        self._lock = threading.Lock()  # every decision and every state change is serialised
        self._clock = clock
        self.tree = QuotaTree()
        self.usage = UsageIndex(self.tree)
        self.ledger = ReservationLedger(ttl_seconds)
        self.synced = False
        self._listed_kinds: set[str] = set()

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace the whole state (offline manifests, or a full re-list)."""
        objects = list(objects)
        with self._lock:
            tree = QuotaTree.build(quota_from_object(o) for o in objects if o.get("kind") == "ElasticQuota")
            usage = UsageIndex(tree)
            for obj in objects:
                if obj.get("kind") == "Pod" and pod_is_counted(obj):
                    record = pod_record(obj)
                    usage.upsert(record)
                    self.ledger.release(record.key)
            self.tree, self.usage, self.synced = tree, usage, True

    def replace_kind(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full re-list of one kind (live mode); ready once both kinds have been listed."""
        objects = list(objects)
        with self._lock:
            if kind == "Pod":
                self.usage = UsageIndex(self.tree)
                for obj in objects:
                    self._upsert_pod(obj)
            else:
                records = list(self.usage.pods())
                self.tree = QuotaTree.build(quota_from_object(o) for o in objects)
                self.usage = UsageIndex(self.tree)
                for record in records:
                    self.usage.upsert(record)
            self._listed_kinds.add(kind)
            self.synced = {"Pod", "ElasticQuota"} <= self._listed_kinds

    def apply_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event, applied incrementally (cheap: only the fields the decision needs)."""
        with self._lock:
            if kind == "Pod":
                metadata = obj.get("metadata") or {}
                key = f"{metadata.get('namespace')}/{metadata.get('name')}"
                if event_type == "DELETED" or not pod_is_counted(obj):
                    self.usage.discard(key)
                else:
                    self._upsert_pod(obj)
                return
            quota = quota_from_object(obj)
            if event_type == "DELETED":
                self.tree.remove(quota.name)
            else:
                self.tree.upsert(quota)
            self.usage.rebuild()

    def _upsert_pod(self, obj: Mapping[str, Any]) -> None:
        if not pod_is_counted(obj):
            return
        try:
            record = pod_record(obj)
        except ValueError:
            return  # an unreadable pod cannot be charged; the webhook refused it at admission anyway
        self.usage.upsert(record)
        self.ledger.release(record.key)  # the watched pod now counts instead of its reservation

    def ready(self) -> tuple[bool, str]:
        return (True, "quota state synced") if self.synced else (False, "quota state not synced yet")

    def review_elasticquota(self, quota: Mapping[str, Any]) -> Verdict:
        """Refuse invalid quotas; warn on legacy names and on a max below current usage."""
        info = quota_from_object(quota)
        with self._lock:
            used = add_lists(self.usage.used(info.name), self.ledger.used(info.name))
            review = review_quota(info, self.tree, used, migrating=_migrating(quota))
        if review.problems:
            return Verdict(False, "; ".join(review.problems), 422, "Invalid", warnings=review.warnings)
        return Verdict(True, warnings=review.warnings)

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        new = PodQuotaRequest(admission.namespace, admission.name, admission.labels.get(POD_QUOTA_LABEL, ""),
                              requests_of(admission.canonical_requests), admission.unknown_gpu_memory)
        old = None
        if admission.operation == "UPDATE" and admission.old_canonical_requests is not None:
            old = PodQuotaRequest(admission.namespace, admission.name,
                                  (admission.old_labels or {}).get(POD_QUOTA_LABEL, ""),
                                  requests_of(admission.old_canonical_requests))
        with self._lock:
            if not self.synced:
                return Verdict(False, "quota state is not synced yet; retry shortly", 503, "NotReady")
            if old is not None and not needs_check(new, old, self.tree):
                return ALLOW
            self.ledger.expire(self._clock())
            decision = decide(self.tree, self.usage, self.ledger, new, old)
            if not decision.allowed:
                return Verdict(False, decision.message, decision.code, decision.reason, details=decision.details)
            if not admission.dry_run and admission.operation == "CREATE":
                self.ledger.reserve(f"{admission.namespace}/{admission.name}", admission.uid, decision.quotas,
                                    new.requests, self._clock())
            return ALLOW


def _migrating(quota: Mapping[str, Any]) -> bool:
    metadata = quota.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(MIGRATION_IN_PROGRESS_ANNOTATION) == IN_PROGRESS
