"""A fake of the few CoreV1Api calls strict accounting makes, and a replica built on it, without Go.

The fake keeps what the API server guarantees and nothing more: a resourceVersion precondition on
replace (409 on a stale one, 404 when the object is gone), 409 on creating an existing name, a new
``metadata.uid`` for every created object. The e2e tests (tests/e2e/test_strict_accounting.py,
tests/e2e/test_faults.py) run the same code against a real apiserver.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuquota_core import shared_ledger
from gpuquota_core.pod_admission import PodAdmission
from webhook.quota.state import QuotaState
from webhook.quota.strict.accounting import Mode, strict_parts

RATIO = "koordinator.sh/gpu-memory-ratio"
QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
NAMESPACE = "gpuquota-system"
TREE = "org"
LEDGER = shared_ledger.ledger_object_name(TREE)
TTL = 30.0

# The calls of a tree's first admission: the ledger missing, the registry not listing it, the ledger
# created empty, the tree listed, then the reservation written (store.LedgerStore.write).
FIRST_LEDGER_OF_A_TREE = ["read", "registry read", "create", "registry read", "registry create", "replace"]


@dataclass
class _Raw:
    data: bytes


class FakeCore:
    """The few CoreV1Api calls LedgerStore makes, with the API server's preconditions."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, str] = {}  # namespace/name -> uid
        self.pod_versions: dict[str, str] = {}  # namespace/name -> resourceVersion
        self._versions = itertools.count(1)
        self.calls: list[str] = []
        self.namespace_missing = False
        self.before_registry_read: Callable[[], None] | None = None  # runs once, at the next registry read

    def _stamp(self, body: dict[str, Any], uid: str) -> _Raw:
        stored = json.loads(json.dumps(body))
        stored["metadata"].update(resourceVersion=str(next(self._versions)), uid=uid)
        self.config_maps[stored["metadata"]["name"]] = stored
        return _Raw(json.dumps(stored).encode())

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> _Raw:
        self.calls.append("read" if name != shared_ledger.REGISTRY_OBJECT_NAME else "registry read")
        if name == shared_ledger.REGISTRY_OBJECT_NAME and self.before_registry_read is not None:
            hook, self.before_registry_read = self.before_registry_read, None
            hook()
        if name not in self.config_maps:
            raise ApiException(status=404, reason="Not Found")
        return _Raw(json.dumps(self.config_maps[name]).encode())

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any], dry_run: str = "", **_: Any) -> _Raw:
        if self.namespace_missing:
            raise ApiException(status=404, reason="Not Found")
        if body["metadata"]["name"] in self.config_maps:
            raise ApiException(status=409, reason="AlreadyExists")
        if dry_run:
            return _Raw(json.dumps(body).encode())
        self.calls.append("create" if body["metadata"]["name"] != shared_ledger.REGISTRY_OBJECT_NAME
                          else "registry create")
        body = {**body, "metadata": {**body["metadata"], "creationTimestamp": datetime.fromtimestamp(
            self.clock[0], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        return self._stamp(body, uid=f"uid-{next(self._versions)}")

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> _Raw:
        self.calls.append("replace" if name != shared_ledger.REGISTRY_OBJECT_NAME else "registry replace")
        current = self.config_maps.get(name)
        if current is None:
            raise ApiException(status=404, reason="Not Found")
        if current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        body = {**body, "metadata": {**body["metadata"],
                                     "creationTimestamp": current["metadata"]["creationTimestamp"]}}
        if "deletionTimestamp" in current["metadata"]:  # set by the delete; an update cannot clear it
            body["metadata"]["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
        raw = self._stamp(body, uid=current["metadata"]["uid"])
        if "deletionTimestamp" in body["metadata"] and not body["metadata"].get("finalizers"):
            del self.config_maps[name]  # the last finalizer gone: the apiserver removes it
        return raw

    def delete(self, name: str) -> None:
        """DELETE as the apiserver does it: an object with finalizers only gets its deletionTimestamp."""
        current = self.config_maps[name]
        if not current["metadata"].get("finalizers"):
            del self.config_maps[name]
            return
        stamped = json.loads(json.dumps(current))
        stamped["metadata"]["deletionTimestamp"] = datetime.fromtimestamp(self.clock[0], UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
        self._stamp(stamped, uid=current["metadata"]["uid"])

    def list_namespaced_config_map(self, namespace: str, **_: Any) -> _Raw:
        return _Raw(json.dumps({"items": list(self.config_maps.values())}).encode())

    def list_pod_for_all_namespaces(self, limit: int, _continue: str | None = None, **_: Any) -> _Raw:
        """Pages of ``limit`` pods, each at the resourceVersion in ``pod_versions`` ("1" if unset)."""
        keys = sorted(self.pods)
        start = int(_continue or 0)
        items = [{"metadata": {"namespace": key.partition("/")[0], "name": key.partition("/")[2],
                               "uid": self.pods[key], "resourceVersion": self.pod_versions.get(key, "1")}}
                 for key in keys[start:start + limit]]
        more = str(start + limit) if start + limit < len(keys) else ""
        return _Raw(json.dumps({"metadata": {"continue": more}, "items": items}).encode())

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> _Raw:
        uid = self.pods.get(f"{namespace}/{name}")
        if uid is None:
            raise ApiException(status=404, reason="Not Found")
        return _Raw(json.dumps({"metadata": {"name": name, "namespace": namespace, "uid": uid}}).encode())

    def overwrite(self, name: str, data: dict[str, str]) -> None:
        """An update by someone else (a person with kubectl edit): new data, a new resourceVersion."""
        current = json.loads(json.dumps(self.config_maps[name]))
        current["data"] = data
        self._stamp(current, uid=current["metadata"]["uid"])

    def stored(self) -> set[str]:
        return set(shared_ledger.decode(self.config_maps[LEDGER]["data"]))


class Replica:
    """One replica's state and strict accounting. Escrow is off unless asked for: most tests here look
    at the reservation each admitted pod leaves in the object; the escrow tests below turn it on."""

    def __init__(self, core: FakeCore, name: str, clock: list[float], room: int = 300,
                 create_deadline: float = 60.0, escrow: int = 0, leaf_room: int = 1000,
                 monotonic: list[float] | None = None, journal: Path | None = None) -> None:
        self.state = QuotaState(ttl_seconds=TTL)
        self.state.load([
            {"kind": "ElasticQuota", "metadata": {"name": TREE, "namespace": "team"},
             "spec": {"max": {RATIO: str(room)}}},
            {"kind": "ElasticQuota", "metadata": {"name": "team-a", "namespace": "team",
                                                  "labels": {"quota.scheduling.koordinator.sh/parent": TREE}},
             "spec": {"max": {RATIO: str(leaf_room)}}},
        ])
        self.parts = strict_parts(self.state, core, NAMESPACE, replica=name, clock=lambda: clock[0],
                                  create_deadline_seconds=create_deadline, escrow_most_pods=escrow,
                                  monotonic=(lambda: monotonic[0]) if monotonic else time.monotonic,
                                  journal=journal)
        self.store, self.accounting = self.parts.store, self.parts.accounting

    def admit(self, pod: str, ratio: str = "100", answer_by: float = float("inf"), mode: Mode = Mode.WRITER) -> Any:
        return self.accounting.admit_pod(PodAdmission(
            uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
            labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: ratio}), answer_by, mode)

    def settle(self) -> None:
        """The escrow settler's round: writes what is owed (settled escrows, withdrawals) without an admission."""
        self.parts.committer.settle_due()

    def reconcile(self) -> int:
        return self.parts.reconciler.reconcile_once()


def watch_shows(replica: Replica, pod: str, version: str, ratio: str = "100") -> None:
    """The replica's pod watch delivers the stored pod, at that resourceVersion."""
    replica.state.apply_event("Pod", "ADDED", {
        "kind": "Pod",
        "metadata": {"name": pod, "namespace": "team", "uid": "uid-" + pod, "resourceVersion": version,
                     "labels": {QUOTA_LABEL: "team-a"}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {RATIO: ratio}, "limits": {RATIO: ratio}}}]},
    })


def escrow_entries(core: FakeCore) -> dict[str, shared_ledger.StoredReservation]:
    stored = shared_ledger.decode(core.config_maps[LEDGER]["data"])
    return {key: item for key, item in stored.items() if shared_ledger.is_escrow(key)}


def slow_writes(core: FakeCore, monotonic: list[float], seconds: float) -> None:
    """Every ledger write of ``core`` takes ``seconds`` of the workers' clock (etcd stalled, say)."""
    for name in ("create_namespaced_config_map", "replace_namespaced_config_map"):
        write = getattr(core, name)

        def slow(*args: Any, _write: Any = write, **kwargs: Any) -> Any:
            monotonic[0] += seconds
            return _write(*args, **kwargs)

        setattr(core, name, slow)


def admission_of(pod: str, ratio: str = "100") -> PodAdmission:
    return PodAdmission(uid="adm-" + pod, operation="CREATE", namespace="team", name=pod, pod_uid="uid-" + pod,
                        labels={QUOTA_LABEL: "team-a"}, canonical_requests={RATIO: ratio})
