"""What ``gpuquota quota`` and ``gpuquota explain`` read: quotas, pods and nodes, from manifest files
or a live cluster, plus (live) the strict-accounting ledgers the webhook replicas write."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuquota_core import shared_ledger
from gpuquota_core.conversion import DEFAULT_CONFIG, ConversionConfig
from gpuquota_core.podspec import PodShapeError
from gpuquota_core.quota_integrity import TreeProblem, tree_problems
from gpuquota_core.quota_objects import QuotaShapeError, quota_from_object
from gpuquota_core.quota_tree import QuotaTree
from gpuquota_core.unjudged import ADMISSION_REVIEW

from . import hints
from .errors import CommandError, cluster_error
from .inputs import readable_objects

STATE_KINDS = ("Node", "Pod", "ElasticQuota", "PodGroup")


@dataclass
class Snapshot:
    objects: list[dict[str, Any]]
    live: bool
    # Strict accounting's stored reservations and the trees whose ledger object was read; offline
    # both are empty and every tree counts as known (nothing is reserved in a set of files).
    reservations: dict[str, shared_ledger.StoredReservation] = field(default_factory=dict)
    ledger_trees: set[str] | None = None
    notes: list[str] = field(default_factory=list)
    # Set by readable_tree: the quotas that do not form a tree (repeated names, missing or unreadable
    # parents, cycles), as the audit reports them.
    tree_problems: list[TreeProblem] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj.get("kind") == kind]

    def tree(self, config: ConversionConfig = DEFAULT_CONFIG) -> QuotaTree:
        """The quota tree; an unreadable ElasticQuota ends the command (as `serve --state` refuses it)."""
        try:
            return QuotaTree.build((quota_from_object(obj) for obj in self.of_kind("ElasticQuota")), config)
        except (QuotaShapeError, PodShapeError) as error:
            raise CommandError(f"cannot read an ElasticQuota: {error}") from None

    def readable_tree(self, config: ConversionConfig = DEFAULT_CONFIG) -> QuotaTree:
        """The quota tree without the ElasticQuotas that cannot be read, as the audit judges with
        (gpuquota_core.audit.quota_tree); each one left out is a note: one bad quota never hides the others.
        Where the quotas do not form a tree, :attr:`tree_problems` says why."""
        readable = []
        unreadable: set[str] = set()
        for obj in self.of_kind("ElasticQuota"):
            try:
                readable.append(quota_from_object(obj))
            except (QuotaShapeError, PodShapeError) as error:
                self.notes.append(f"unreadable ElasticQuota left out: {error}")
                metadata = obj.get("metadata")
                if isinstance(metadata, Mapping) and metadata.get("name"):
                    unreadable.add(str(metadata["name"]))
        # A child of one left out is shown without it (as if at the top): a problem of the tree, as
        # the audit reports it, not a missing parent.
        self.tree_problems = tree_problems(readable, unreadable)
        return QuotaTree.build(readable, config)


def conversion_config(path: Path | None) -> ConversionConfig:
    from kubeaccess.conversion_config import ConfigFileError, load_conversion_config

    try:
        return load_conversion_config(path)
    except ConfigFileError as error:
        raise CommandError(str(error)) from None


def from_files(paths: Iterable[str], nothing_to: str) -> Snapshot:
    """The cluster the files hold; files that hold no object at all are refused (see cli/inputs.py).
    An AdmissionReview is no part of a cluster: left out with a note naming its file, never silently."""
    origins: dict[int, str] = {}
    objects = readable_objects(tuple(paths), nothing_to, origins=origins)
    notes = [f"{origins.get(id(o), '<input>')}: AdmissionReview left out: {ADMISSION_REVIEW}"
             for o in objects if o.get("kind") == "AdmissionReview"]
    return Snapshot([o for o in objects if o.get("kind") in STATE_KINDS], live=False, notes=notes)


def from_cluster(kubeconfig: str | None, context: str | None, *, with_ledgers: bool = True) -> Snapshot:
    """Every quota, pod and node of the cluster (pods of every namespace: a parent quota counts them
    all), and the ledger ConfigMaps strict accounting keeps, where they can be read."""
    from kubeaccess.kube import AUDIT_KINDS, KubeAccessError, connect, list_all

    try:
        api = connect(kubeconfig, context)
        try:
            objects = [obj for kind in AUDIT_KINDS if kind.kind in STATE_KINDS for obj in list_all(api, kind, None)]
            snapshot = Snapshot(objects, live=True, ledger_trees=set())
            if with_ledgers:
                _read_ledgers(api, snapshot)
        finally:
            api.close()  # type: ignore[no-untyped-call]
    except KubeAccessError as error:
        raise cluster_error(error) from None
    return snapshot


def _read_ledgers(api: Any, snapshot: Snapshot) -> None:
    """Reservations strict accounting holds, per tree; a tree without a readable ledger object stays
    unknown (local accounting keeps them in each webhook instance's memory, out of reach)."""
    import orjson
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpuquota_core.shared_ledger import MANAGED_SELECTOR
    from kubeaccess.kube import REQUEST_TIMEOUT_SECONDS, api_error_message

    try:
        response: Any = client.CoreV1Api(api).list_config_map_for_all_namespaces(
            label_selector=MANAGED_SELECTOR, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_SECONDS)
    except ApiException as error:
        snapshot.notes.append(f"reserved is unknown: cannot list the strict-accounting ledger ConfigMaps: "
                              f"{error.status} {api_error_message(error)}")
        return
    except HTTPError as error:
        snapshot.notes.append(f"reserved is unknown: cannot list the ledger ConfigMaps: {error}")
        return
    assert snapshot.ledger_trees is not None
    for item in orjson.loads(response.data or b"{}").get("items", []):
        metadata = item.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if not name.startswith(shared_ledger.LEDGER_NAME_PREFIX):
            continue
        try:
            stored = shared_ledger.decode(item.get("data"))
        except shared_ledger.LedgerFormatError as error:
            snapshot.notes.append(f"ConfigMap {metadata.get('namespace')}/{name}: {error}")
            continue
        snapshot.ledger_trees.add(name[len(shared_ledger.LEDGER_NAME_PREFIX):])
        snapshot.reservations.update(stored)


def load(paths: tuple[str, ...], kubeconfig: str | None, context: str | None, nothing_to: str) -> Snapshot:
    if paths and (kubeconfig or context):
        raise CommandError(hints.FILES_OR_CLUSTER())
    return from_files(paths, nothing_to) if paths else from_cluster(kubeconfig, context)
