"""The ElasticQuota tree: quotas by name, parents and children, and which quota a pod belongs to."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .conversion import DEFAULT_CONFIG, ConversionConfig
from .quota_objects import DEFAULT_QUOTA, ROOT_QUOTA, LimitNote, QuotaInfo, canonical_resource_list
from .resources import ResourceList


@dataclass(frozen=True, slots=True)
class Resolution:
    """Which quota a pod belongs to, and why (the rule that matched)."""

    quota: str | None
    rule: str  # "label", "namespace-name", "namespaces-annotation", "default", "label-not-found", "none"


@dataclass
class QuotaTree:
    """All ElasticQuotas of a cluster, by name (quota names are cluster-wide in Koordinator)."""

    quotas: dict[str, QuotaInfo] = field(default_factory=dict)
    config: ConversionConfig = DEFAULT_CONFIG
    _limits: dict[str, tuple[ResourceList, list[LimitNote]]] = field(default_factory=dict, repr=False)
    _by_namespace_annotation: dict[str, str] = field(default_factory=dict, repr=False)
    _children: dict[str, list[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, quotas: Iterable[QuotaInfo], config: ConversionConfig = DEFAULT_CONFIG) -> QuotaTree:
        tree = cls(config=config)
        for quota in quotas:
            if keeps(tree.quotas.get(quota.name), quota):
                tree.quotas[quota.name] = quota
        tree._reindex()
        return tree

    def _reindex(self) -> None:
        self._limits.clear()
        self._by_namespace_annotation.clear()
        self._children.clear()
        for quota in sorted(self.quotas.values(), key=lambda q: q.name):
            for namespace in quota.bound_namespaces:
                self._by_namespace_annotation.setdefault(namespace, quota.name)
            if quota.parent:
                self._children.setdefault(quota.parent, []).append(quota.name)

    def upsert(self, quota: QuotaInfo) -> bool:
        """Add or replace a quota; True when pods may now resolve or charge differently.

        Most quota updates only change min/max (the controllers rewrite status and annotations
        often); those need no re-index, which keeps a watch event O(1) instead of O(quotas + pods).
        """
        previous = self.quotas.get(quota.name)
        self.quotas[quota.name] = quota
        self._limits.pop(quota.name, None)
        if previous is not None and _same_place_in_tree(previous, quota):
            return False
        self._reindex()
        return True

    def remove(self, name: str) -> bool:
        if self.quotas.pop(name, None) is None:
            return False
        self._reindex()
        return True

    def get(self, name: str) -> QuotaInfo | None:
        return self.quotas.get(name)

    def children(self, name: str) -> list[str]:
        return list(self._children.get(name, ()))

    def resolve(self, namespace: str, quota_label: str) -> Resolution:
        """As Koordinator's GetQuotaName (pkg/scheduler/plugins/elasticquota/plugin_helper.go), with admission's
        strictness: a label naming no quota is an error."""
        if quota_label:
            if quota_label in self.quotas:
                return Resolution(quota_label, "label")
            return Resolution(quota_label, "label-not-found")
        same_name = self.quotas.get(namespace)
        if same_name is not None and same_name.namespace == namespace:
            return Resolution(namespace, "namespace-name")
        bound = self._by_namespace_annotation.get(namespace)
        if bound is not None:
            return Resolution(bound, "namespaces-annotation")
        if DEFAULT_QUOTA in self.quotas:
            return Resolution(DEFAULT_QUOTA, "default")
        return Resolution(None, "none")

    def chain(self, name: str) -> list[QuotaInfo]:
        """The quota and its ancestors up to (not including) the root, leaf first; stops on cycles."""
        chain: list[QuotaInfo] = []
        seen: set[str] = set()
        current = self.quotas.get(name)
        while current is not None and current.name not in seen and current.name != ROOT_QUOTA:
            chain.append(current)
            seen.add(current.name)
            current = self.quotas.get(current.parent) if current.parent else None
        return chain

    def limit(self, name: str) -> tuple[ResourceList, list[LimitNote]]:
        """The canonical limit of a quota (admission annotation, else max) and notes about it."""
        cached = self._limits.get(name)
        if cached is None:
            quota = self.quotas[name]
            cached = canonical_resource_list(quota.raw_limit, self.config, quota.name)
            self._limits[name] = cached
        return cached

    def __iter__(self) -> Iterator[QuotaInfo]:
        return iter(self.quotas.values())


def keeps(kept: QuotaInfo | None, other: QuotaInfo) -> bool:
    """Whether the tree holds ``other`` rather than ``kept``, a quota of the same name.

    Koordinator's webhook refuses a second quota of a name, but two can predate it (and ``gpuquota
    audit`` reports them as quota-duplicate-name). The one in the namespace that sorts first is
    kept, whatever order they are read or watched in, so the limit enforced never depends on it;
    a newer version in the same namespace replaces the old one.
    """
    return kept is None or other.namespace <= kept.namespace


def _same_place_in_tree(a: QuotaInfo, b: QuotaInfo) -> bool:
    # Exactly the fields QuotaTree.resolve and QuotaTree.chain read.
    return (a.namespace, a.parent, a.bound_namespaces) == (b.namespace, b.parent, b.bound_namespaces)
