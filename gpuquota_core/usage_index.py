"""Usage per quota: the counted pods of a cluster, indexed so a decision reads its chain's totals."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from .pod_records import PodRecord
from .quantity import ZERO, Quantity
from .quota_tree import QuotaTree
from .resources import ResourceList, add_lists, subtract_lists


def _counts_alike(counted: PodRecord, record: PodRecord) -> bool:
    """Whether charging ``record`` instead of ``counted`` leaves every total as it is: the same
    quota, and the same requests to the format and the order of names (totals keep both)."""
    if (counted.namespace, counted.quota_label, counted.uid, counted.unknown_gpu_memory, counted.gang) != (
            record.namespace, record.quota_label, record.uid, record.unknown_gpu_memory, record.gang):
        return False
    if counted.requests is record.requests:
        return True
    if len(counted.requests) != len(record.requests):
        return False
    pairs = zip(counted.requests.items(), record.requests.items(), strict=True)
    return all(name == other_name and (quantity is other or (quantity == other and quantity.format is other.format))
               for (name, quantity), (other_name, other) in pairs)


class UsageIndex:
    """Canonical usage per quota, kept incrementally as pods and quotas come and go.

    Each pod is charged to its resolved quota and every ancestor, so an admission decision reads
    its numbers in O(depth) instead of summing all pods.
    """

    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree
        self._pods: dict[str, PodRecord] = {}
        self._charged: dict[str, tuple[str, ...]] = {}  # pod key -> quotas it is charged to
        self._used: dict[str, ResourceList] = {}
        # Per gang (namespace/name), its stored members: how many, and what they ask in total.
        self._gang_members: dict[str, tuple[int, ResourceList]] = {}
        # Which quotas a pod is charged to depends only on its place (namespace, quota label) and the
        # tree: after a change of the tree, each place is resolved once to learn whether any pod's
        # quotas changed (retree). Kept per place, not per pod, for the cache's memory target.
        self._place_chains: dict[tuple[str, str], tuple[str, ...]] = {}  # place -> its pods' quotas
        self._place_pods: dict[tuple[str, str], int] = {}  # place -> how many pods are there

    def __len__(self) -> int:
        return len(self._pods)

    def used(self, quota: str) -> ResourceList:
        return dict(self._used.get(quota, {}))

    def pods(self) -> Iterable[PodRecord]:
        return self._pods.values()

    def get(self, key: str) -> PodRecord | None:
        return self._pods.get(key)

    def gang_members(self, gang: str) -> tuple[int, ResourceList]:
        """How many pods of ``gang`` are stored and counted, and what they ask in total."""
        count, asked = self._gang_members.get(gang, (0, {}))
        return count, dict(asked)

    def _add_gang_member(self, record: PodRecord) -> None:
        count, asked = self._gang_members.get(record.gang, (0, {}))
        self._gang_members[record.gang] = (count + 1, add_lists(asked, record.requests))

    def charged_to(self, key: str) -> tuple[str, ...]:
        return self._charged.get(key, ())

    def upsert(self, record: PodRecord) -> None:
        # Most watch events of a pod change its status only: the record is the one counted, and
        # charging it again would rebuild totals to the same values.
        counted = self._pods.get(record.key)
        if counted is not None and _counts_alike(counted, record):
            # Moved to the end all the same, where a discard and a charge would put it: the
            # order of pods is the order of every later rebuild.
            self._pods[record.key] = self._pods.pop(record.key)
            self._charged[record.key] = self._charged.pop(record.key)
            return
        self.discard(record.key)
        self._pods[record.key] = record
        self._charge(record)
        if record.gang:
            self._add_gang_member(record)

    def discard(self, key: str) -> PodRecord | None:
        record = self._pods.pop(key, None)
        for quota in self._charged.pop(key, ()):
            self._used[quota] = subtract_lists(self._used.get(quota, {}), record.requests if record else {})
        if record is not None:
            self._leave_place(record)
        if record is not None and record.gang:
            count, asked = self._gang_members.pop(record.gang, (1, {}))
            if count > 1:
                self._gang_members[record.gang] = (count - 1, subtract_lists(asked, record.requests))
        return record

    # Charging adds the pod's few resources into each quota's totals in place: rebuilding the
    # whole totals map per pod and quota (add_lists) copies every resource the quota has seen, for
    # every pod, which made it a large part of an audit of a big snapshot.
    # Safe because ``used`` hands out copies: nothing outside holds these maps.

    def _charge(self, record: PodRecord) -> None:
        quotas = self._chain_at(record.namespace, record.quota_label)
        self._join_place(record, quotas)
        self._charged[record.key] = quotas
        for quota in quotas:
            used = self._used.setdefault(quota, {})
            for name, quantity in record.requests.items():
                used[name] = used[name] + quantity if name in used else ZERO + quantity

    def _join_place(self, record: PodRecord, quotas: tuple[str, ...]) -> None:
        place = (record.namespace, record.quota_label)
        self._place_pods[place] = self._place_pods.get(place, 0) + 1
        self._place_chains[place] = quotas

    def _leave_place(self, record: PodRecord) -> None:
        place = (record.namespace, record.quota_label)
        left = self._place_pods.get(place, 0) - 1
        if left > 0:
            self._place_pods[place] = left
        else:
            self._place_pods.pop(place, None)
            self._place_chains.pop(place, None)

    def load(self, records: Iterable[PodRecord]) -> None:
        """Upsert every record, in order: the same pods, charges and totals (values, formats, the
        order of quotas and names in each map) as calling :meth:`upsert` for each in turn, with one
        difference: a record that a later one of the same key replaces within this call is never
        charged, so it leaves behind none of the zero entries its discard would.

        Charging pod by pod adds each of a pod's resources into its leaf and every ancestor, one
        ``Quantity`` per add: at 100,000 pods that was most of an audit's usage check. Here pods
        are grouped, each group's totals summed as plain ints (exact Fractions for the rare
        fractional amount) and added into each quota once.
        """
        latest: dict[str, PodRecord] = {}
        for record in records:
            key = record.key
            latest.pop(key, None)  # a repeated key moves to the end, as upsert moves it
            latest[key] = record
        if self._pods:
            for key in latest:
                self.discard(key)
        chains: dict[tuple[str, str], tuple[str, ...]] = {}  # the tree does not change during the call
        # Pods alike are counted, not summed one by one: the replicas of a workload share one cached
        # requests map's Quantity objects (remembered_pod_requests hands out copies of the map, not
        # of its values), so a chain, the names and the identities of the values make a group whose
        # total is count x amount. The identities are unique here: every record, hence every value,
        # stays alive in ``latest`` for the whole call.
        groups: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]], list[Any]] = {}
        for key, record in latest.items():
            self._pods[key] = record
            if record.gang:
                self._add_gang_member(record)
            place = (record.namespace, record.quota_label)
            quotas = chains.get(place)
            if quotas is None:
                quotas = chains[place] = self._chain_at(*place)
            self._charged[key] = quotas
            self._join_place(record, quotas)
            if not quotas:
                continue
            requests = record.requests
            group = (quotas, tuple(requests), tuple(map(id, requests.values())))
            counted = groups.get(group)
            if counted is None:
                groups[group] = [requests, 1]
            else:
                counted[1] += 1
        # Per quota, the sum of each name, and the names in the order pods first charge them there
        # (groups are in the order of their first pod, so visiting them in order visits each
        # quota's names in upsert's order).
        totals: dict[str, dict[str, int | Fraction]] = {}
        for (quotas, _, _), (requests, count) in groups.items():
            for quota in quotas:
                sums = totals.setdefault(quota, {})
                for name, quantity in requests.items():
                    exact = quantity.amount
                    # int arithmetic where the amount is whole: Fraction's own is pure Python.
                    added: int | Fraction = exact.numerator * count if exact.denominator == 1 else exact * count
                    sums[name] = sums.get(name, 0) + added
        for quota, sums in totals.items():
            used = self._used.setdefault(quota, {})
            for name, amount in sums.items():
                # upsert's "ZERO + quantity" for a new name: the sum keeps ZERO's (decimal) format.
                total = Quantity(Fraction(amount))
                used[name] = used[name] + total if name in used else ZERO + total

    def _chain_at(self, namespace: str, quota_label: str) -> tuple[str, ...]:
        """The quotas a pod of that namespace and quota label is charged to, leaf first (none: no quota)."""
        resolution = self.tree.resolve(namespace, quota_label)
        if resolution.quota is None or resolution.rule == "label-not-found":
            return ()
        return tuple(q.name for q in self.tree.chain(resolution.quota))

    def retree(self) -> int:
        """Charge every pod again if the tree's change (a quota added, removed, moved to another
        parent or namespace, or binding other namespaces) changed the quotas any pod is charged to;
        how many pods were charged again.

        It runs under the quota service's lock on every ElasticQuota event that moves a quota, so
        its cost is a pause of every decision. Most such events are a new quota that no pod resolves
        to yet (quotas come before their pods): each place is resolved once to find that out, and
        nothing more is done. Otherwise every pod is charged again through :meth:`load`, which sums
        alike pods once, so the totals are those a fresh count gives (charging only the moved pods
        one by one was slower than that whenever most pods moved).
        """
        if all(self._chain_at(*place) == quotas for place, quotas in self._place_chains.items()):
            return 0
        records = list(self._pods.values())
        for index in (self._pods, self._used, self._charged, self._gang_members, self._place_chains,
                      self._place_pods):
            index.clear()
        self.load(records)
        return len(records)
