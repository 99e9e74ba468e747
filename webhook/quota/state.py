"""The one consistent quota view of a server instance: tree, watched usage and a lock, with local
accounting's reservations (``QuotaState.admit_pod``). Every decision reads it through a
:class:`QuotaView` taken under the lock; strict accounting (``webhook.quota.strict``) takes one
per commit attempt with :meth:`QuotaState.snapshot`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpuquota_core.enforcement import INVALID, NOT_READY, POD_GROUP_NOT_SEEN, TOO_MANY_RESERVATIONS
from gpuquota_core.events import PodEvent, gang_partly_admitted
from gpuquota_core.gang import (
    DREW,
    GANG_DETAIL,
    GANG_RESULT_DETAIL,
    OPENED,
    POD_GROUP_KIND,
    PodGroupInfo,
    gang_of,
    pod_group_info,
    pod_group_not_seen,
    unseen_pod_group,
)
from gpuquota_core.ledger import DEFAULT_TTL_SECONDS, Reservation, ReservationLedger
from gpuquota_core.pod_admission import ALLOW, PodAdmission, QuotaFigure, Verdict, quota_requests
from gpuquota_core.pod_records import PodRecord, canonical_resource_list, pod_is_counted, pod_record
from gpuquota_core.quota_admission import review_quota_object
from gpuquota_core.quota_decision import PodQuotaRequest, decide, hold_admitted, needs_check
from gpuquota_core.quota_integrity import check_tree
from gpuquota_core.quota_objects import QuotaInfo, quota_from_object
from gpuquota_core.quota_tree import QuotaTree, keeps
from gpuquota_core.quota_view import quota_figures
from gpuquota_core.resources import ResourceList, add_lists
from gpuquota_core.usage_index import UsageIndex
from webhook.quota import metrics
from webhook.quota.options import (
    DEFAULT_MAX_RESERVATIONS_PER_CALLER,
    DEFAULT_STALE_AFTER_SECONDS,
    Accounting,
    QuotaServiceOptions,
)
from webhook.quota.pod_versions import PodVersions

KINDS = ("Pod", "ElasticQuota")
# Watched as well, but never waited for: a cluster without the PodGroup CRD has gangs of labels and
# annotations only, and is as ready as one with it.
OPTIONAL_KINDS = (POD_GROUP_KIND,)


@dataclass(frozen=True, slots=True)
class QuotaView:
    """The quota state as one decision reads it, from :meth:`QuotaState.snapshot`.

    Not a copy: the tree and usage are the state's own, unchanging only while the snapshot's lock
    is held, so a view is read inside its ``with`` block and never kept past it.
    """

    tree: QuotaTree
    usage: UsageIndex
    # Bumped on every change of the quotas that decisions read (QuotaState.tree_version).
    tree_version: int
    synced: bool
    pod_versions: PodVersions
    ttl_seconds: float
    max_reservations_per_caller: int
    pod_groups: Mapping[str, PodGroupInfo]
    # Whether pod_groups holds every PodGroup (listed from the API or loaded from files); not where
    # the cluster has no PodGroup CRD, or the webhook may not read it.
    pod_groups_listed: bool
    # Where the gang reservations this instance opens are noted, to tell of gangs left partly admitted.
    gang_openings: GangOpenings

    def judge(self, admission: PodAdmission, ledger: ReservationLedger, now: float,
              requests: tuple[PodQuotaRequest, PodQuotaRequest | None] | None = None,
              ) -> tuple[Verdict, Reservation | None]:
        """Decide one admission against ``ledger`` and reserve in it when admitted.

        ``requests``: the admission's ``quota_requests``, when the caller has read them already.
        """
        new, old = requests if requests is not None else quota_requests(admission)
        if not self.synced:
            return Verdict(False, "quota state is not synced yet; retry shortly", reason=NOT_READY), None
        if old is not None and not needs_check(new, old, self.tree):
            return ALLOW, None
        pod_key = f"{admission.namespace}/{admission.name}"
        replay_of = ledger.made_by(pod_key, admission.uid)
        gang = None
        if old is None:  # only a CREATE joins a gang
            gang = gang_of(admission.namespace, admission.labels, admission.gang_annotations, self.pod_groups)
            unseen = unseen_pod_group(admission.namespace, admission.labels, self.pod_groups)
            if unseen and self.pod_groups_listed:
                return Verdict(False, pod_group_not_seen(admission.namespace, admission.name, unseen),
                               reason=POD_GROUP_NOT_SEEN), None
        decision = decide(self.tree, self.usage, ledger, new, old if self._watched(admission) else None,
                          replay_of=replay_of, gang=(gang, ledger) if gang is not None else None)
        if not decision.allowed:
            return Verdict(False, decision.message, reason=decision.reason, details=decision.details), None
        if admission.dry_run or not decision.quotas:
            return ALLOW, None
        held = ledger.held_by(admission.caller)
        if replay_of is not None and replay_of.caller == admission.caller:
            held -= 1  # a retry replaces its own reservation, it does not add one
        if admission.caller and held >= self.max_reservations_per_caller:
            return Verdict(False, f"pod {admission.namespace}/{admission.name} not admitted: caller {admission.caller} "
                           f"already holds {held} quota reservations no created pod has confirmed (limit "
                           f"{self.max_reservations_per_caller}); retry once they are confirmed or expire",
                           reason=TOO_MANY_RESERVATIONS), None
        # CREATE and UPDATE alike: until the watch shows this version of the pod, what it adds (a
        # relabel's new leaf, a resize's growth) is held in the ledger.
        for opening in decision.opens_gangs:
            self.gang_openings.note(opening.gang, new.quota_label, opening.min_members, opening.waiting_seconds)
        reservation = hold_admitted(ledger, decision, pod_key, admission.uid, new.requests, now,
                                    pod_uid=admission.pod_uid, caller=admission.caller)
        if decision.gang:
            return Verdict(True, details={GANG_DETAIL: decision.gang,
                                          GANG_RESULT_DETAIL: OPENED if decision.opens_gangs else DREW}), reservation
        return ALLOW, reservation

    def _watched(self, admission: PodAdmission) -> bool:
        """Whether the pod being updated already counts in the usage (so only growth is new).

        Not yet, when its create is still only a reservation: then the update is charged in full
        and replaces that reservation, never less than what the pod will end up taking.
        """
        record = self.usage.get(f"{admission.namespace}/{admission.name}")
        return record is not None and (not admission.pod_uid or record.uid in ("", admission.pod_uid))


@dataclass(frozen=True, slots=True)
class _Opened:
    quota_label: str
    min_members: int
    until: float  # monotonic


class GangOpenings:
    """The gang reservations this instance opened, until their waiting time is over: then a gang with
    some but fewer members stored than its minimum is told of with an Event (events.gang_partly_admitted).

    Read from the watch, not from a ledger, so local and strict accounting alike (under strict
    accounting the replica that judged the opening notes it; a judgement whose write then failed
    notes a gang that never stores a member, and is dropped without an event).
    """

    # At most this many gangs are followed; more at once is a flood of gangs, and an event is a courtesy.
    MOST = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._opened: dict[str, _Opened] = {}

    def note(self, gang: str, quota_label: str, min_members: int, waiting_seconds: int) -> None:
        """``gang``: namespace/name; ``quota_label``: the opening member's (the Event's quota)."""
        with self._lock:
            if gang in self._opened or len(self._opened) < self.MOST:
                self._opened[gang] = _Opened(quota_label, min_members, self._clock() + waiting_seconds)

    def ended(self) -> list[tuple[str, _Opened]]:
        """The gangs whose waiting time is over, each returned once."""
        now = self._clock()
        with self._lock:
            over = [(gang, opened) for gang, opened in self._opened.items() if opened.until <= now]
            for gang, _ in over:
                del self._opened[gang]
        return over


class QuotaState:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl_seconds: float = DEFAULT_TTL_SECONDS,
                 stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS,
                 max_reservations_per_caller: int = DEFAULT_MAX_RESERVATIONS_PER_CALLER) -> None:
        self._lock = threading.Lock()  # every decision and every state change is serialised
        self._clock = clock
        self.tree = QuotaTree()
        # Bumped on every change of the quotas that decisions read: room escrowed under one version
        # of the tree is not admitted from under another (a lowered limit applies at once).
        self.tree_version = 0
        self.usage = UsageIndex(self.tree)
        self.ledger = ReservationLedger(ttl_seconds, members_stored=self._gang_members_stored)
        self.pod_groups: dict[str, PodGroupInfo] = {}
        self.pod_groups_listed = False
        self.gang_openings = GangOpenings(clock)
        self.synced = False
        self.stale_after_seconds = stale_after_seconds
        self.max_reservations_per_caller = max_reservations_per_caller
        self._listed_kinds: set[str] = set()
        self._failing_since: dict[str, float] = {}  # kind -> clock time of the first failure in a row
        self._published: tuple[int, ...] = ()  # the gauges' last values (see _publish)
        # Quotas another quota of their name keeps out of the tree (QuotaTree.keeps), by (name,
        # namespace): when the kept one is deleted, the next takes its place.
        self._shadowed: dict[tuple[str, str], QuotaInfo] = {}
        # Whether self.ledger holds every reservation of this instance: not under strict accounting,
        # whose reservations live in the ledger objects in the API server.
        self.reservations_known = True
        # How far the pod list and watch have got; strict accounting waits on it (pod_versions.py).
        self.pod_versions = PodVersions()
        self._pods_advanced = threading.Condition(self._lock)
        # What else must work for this instance to decide, as a problem ("" when none): strict
        # accounting's ledger namespace (StrictAccounting.ledger_problem). Called without the lock.
        self.decider_problem: Callable[[], str] | None = None

    @contextmanager
    def snapshot(self) -> Iterator[QuotaView]:
        """The state, locked for the ``with`` block: one consistent view for a whole decision, its
        lock taken once (strict accounting judges a batch, its escrow and what to prune on one)."""
        with self._lock:
            yield self._view()

    @contextmanager
    def snapshot_once_pods_through(self, version: int, timeout: float) -> Iterator[QuotaView | None]:
        """:meth:`snapshot`, once the pod list and watch have reached resourceVersion ``version``
        (pod_versions.py), waiting at most ``timeout`` seconds; the view is None when they have not."""
        with self._pods_advanced:
            if self._pods_advanced.wait_for(lambda: self.pod_versions.seen_through >= version, max(timeout, 0.0)):
                yield self._view()
            else:
                yield None

    def _view(self) -> QuotaView:
        return QuotaView(self.tree, self.usage, self.tree_version, self.synced, self.pod_versions,
                         self.ledger.ttl_seconds, self.max_reservations_per_caller, self.pod_groups,
                         self.pod_groups_listed, self.gang_openings)

    def partly_admitted_gangs(self) -> list[PodEvent]:
        """Events for the gangs this instance opened a reservation for whose waiting time is over with
        some but fewer members stored than their minimum (polled by the event writer)."""
        ended = self.gang_openings.ended()
        if not ended:
            return []
        with self._lock:
            stored = {gang: self.usage.gang_members(gang)[0] for gang, _ in ended}
        return [gang_partly_admitted(gang, stored[gang], opened.min_members, gang.partition("/")[0],
                                     opened.quota_label)
                for gang, opened in ended if 0 < stored[gang] < opened.min_members]

    def _gang_members_stored(self, gang: str) -> tuple[int, ResourceList]:
        # Looked up on every call, not bound once: every re-list of pods replaces self.usage.
        return self.usage.gang_members(gang)

    @classmethod
    def for_options(cls, options: QuotaServiceOptions) -> QuotaState:
        """The state of a quota service started with ``options``."""
        state = cls(ttl_seconds=options.reservation_ttl_seconds, stale_after_seconds=options.stale_after_seconds,
                    max_reservations_per_caller=options.max_reservations_per_caller)
        state.reservations_known = options.accounting is Accounting.LOCAL
        return state

    def compact(self, kind: str, obj: Mapping[str, Any]) -> PodRecord | QuotaInfo | PodGroupInfo | None:
        """What the list loop keeps of each listed object (webhook.quota.cluster_state.SyncTarget)."""
        return compact(kind, obj)

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Replace the whole state from manifests (offline mode): quotas first, then the pods."""
        objects = list(objects)
        # Two quotas of one name or a parent cycle raise QuotaTreeError (a ValueError naming the
        # quotas) and nothing is replaced: in files they are mistakes to fix before serving (one
        # copy would be ignored; a cycle has no root), not something a later event settles.
        quotas = [compact("ElasticQuota", o) for o in objects if o.get("kind") == "ElasticQuota"]
        check_tree(q for q in quotas if isinstance(q, QuotaInfo))
        self.replace_compact("ElasticQuota", quotas)
        self.replace_kind(POD_GROUP_KIND, (o for o in objects if o.get("kind") == POD_GROUP_KIND))
        self.replace_kind("Pod", (o for o in objects if o.get("kind") == "Pod"))

    def replace_kind(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full re-list of one kind (live mode); ready once both kinds have been listed."""
        self.replace_compact(kind, [compact(kind, obj) for obj in objects])

    def replace_compact(self, kind: str, items: Iterable[PodRecord | QuotaInfo | PodGroupInfo | None],
                        version: str = "") -> None:
        """Like replace_kind, from what :func:`compact` kept of each object (None: not counted);
        ``version``: the list's resourceVersion, when it came from the API server."""
        with self._lock:
            if kind == POD_GROUP_KIND:
                self.pod_groups = {group.key: group for group in items if isinstance(group, PodGroupInfo)}
                self.pod_groups_listed = True
                for gone in [g.gang for g in self.ledger.gangs() if g.pod_group and g.gang not in self.pod_groups]:
                    self.ledger.close_gang(gone)
                self._contact(kind)
                return
            if kind == "Pod":
                self.pod_versions.listed(version)
                self._pods_advanced.notify_all()
                self.usage = UsageIndex(self.tree)
                for record in items:
                    if isinstance(record, PodRecord):
                        self._count(record)
            else:
                self.tree_version += 1
                records = list(self.usage.pods())
                quotas = [q for q in items if isinstance(q, QuotaInfo)]
                self.tree = QuotaTree.build(quotas)
                self._shadowed = {(q.name, q.namespace): q for q in quotas if self.tree.get(q.name) is not q}
                self.usage = UsageIndex(self.tree)
                for record in records:
                    self.usage.upsert(record)
            self._listed_kinds.add(kind)
            self.synced = set(KINDS) <= self._listed_kinds
            self._contact(kind)
            self._publish()

    def apply_event(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event, applied incrementally (cheap: only the fields the decision needs)."""
        with self._lock:
            self._contact(kind)
            metrics.WATCH_EVENTS.labels(kind, event_type).inc()
            if kind == "Pod":
                self.pod_versions.delivered(event_type, obj)
                self._pods_advanced.notify_all()
            if event_type == "BOOKMARK":
                return
            if kind == POD_GROUP_KIND:
                self._pod_group_event(event_type, obj)
                self._publish()
                return
            if kind == "Pod":
                metadata = obj.get("metadata") or {}
                key = f"{metadata.get('namespace')}/{metadata.get('name')}"
                if event_type == "DELETED" or not pod_is_counted(obj):
                    current = self.usage.get(key)
                    # Only the pod that is there: a delete of an older pod of the same name must
                    # not drop a newer one that the watch has already shown.
                    if current is None or not current.uid or current.uid == str(metadata.get("uid") or ""):
                        self.usage.discard(key)
                else:
                    self._upsert_pod(obj)
            else:
                before, after = self._quota_event(quota_from_object(obj), event_type == "DELETED")
                if not _decides_alike(before, after):
                    self.tree_version += 1
                moved = False
                if after is None:
                    moved = before is not None and self.tree.remove(before.name)
                elif after is not before:
                    moved = self.tree.upsert(after)
                if moved:
                    metrics.USAGE_RECHARGED.inc(self.usage.retree())
            self._publish()

    def _pod_group_event(self, event_type: str, obj: Mapping[str, Any]) -> None:
        group = compact(POD_GROUP_KIND, obj)
        if not isinstance(group, PodGroupInfo):
            return
        # The pod_groups map is replaced, never changed in place: a view taken earlier keeps its own.
        groups = dict(self.pod_groups)
        if event_type == "DELETED":
            groups.pop(group.key, None)
            held = self.ledger.gang(group.key)
            if held is not None and held.pod_group:
                self.ledger.close_gang(group.key)  # its members are no gang any more
        else:
            groups[group.key] = group
        self.pod_groups = groups

    def _quota_event(self, quota: QuotaInfo, deleted: bool) -> tuple[QuotaInfo | None, QuotaInfo | None]:
        """The tree's quota of this name before and after a watch event of ``quota`` (lock held).

        Two quotas of one name (they can predate Koordinator's webhook): the tree keeps the one
        ``QuotaTree.keeps`` picks whatever order events come in, so a delete or change of the other
        leaves it alone, and deleting the kept one brings the next in.
        """
        kept = self.tree.get(quota.name)
        key = (quota.name, quota.namespace)
        if kept is not None and kept.namespace != quota.namespace:
            if deleted:
                self._shadowed.pop(key, None)
                return kept, kept
            if not keeps(kept, quota):
                self._shadowed[key] = quota
                return kept, kept
            self._shadowed[(kept.name, kept.namespace)] = kept
            return kept, quota
        if not deleted:
            return kept, quota
        others = sorted((q for (name, _), q in self._shadowed.items() if name == quota.name),
                        key=lambda q: q.namespace)
        if not others:
            return kept, None
        del self._shadowed[(others[0].name, others[0].namespace)]
        return kept, others[0]

    def sync_failed(self, kind: str) -> None:
        """The list or watch of ``kind`` broke; decisions go on from the last state until it is stale."""
        if kind in OPTIONAL_KINDS:
            return  # no PodGroup CRD, or no right to read it: gangs of labels and annotations still work
        with self._lock:
            self._failing_since.setdefault(kind, self._clock())
            self._publish()

    def _contact(self, kind: str) -> None:
        self._failing_since.pop(kind, None)
        metrics.LAST_CONTACT.labels(kind).set(time.time())

    def _stale_kinds(self) -> list[str]:
        now = self._clock()
        return sorted(kind for kind, since in self._failing_since.items() if now - since > self.stale_after_seconds)

    def _upsert_pod(self, obj: Mapping[str, Any]) -> None:
        record = compact("Pod", obj)
        if isinstance(record, PodRecord):
            self._count(record)

    def _count(self, record: PodRecord) -> None:
        self.usage.upsert(record)
        # The watched pod now counts instead of its reservation, if it is the admitted one.
        self.ledger.confirm(record.key, record.uid, self.usage.charged_to(record.key), record.requests)

    def _publish(self) -> None:
        snapshot = (1 if self.synced else 0, 1 if self._stale_kinds() else 0, len(self.usage),
                    len(self.tree.quotas), len(self.ledger), self.ledger.gang_count())
        # Most watch events (a pod MODIFIED) change none of these, and writing five multiprocess gauges
        # anyway was a large share of such an event's cost (docs/benchmarks.md, "Mechanisms kept").
        if snapshot == self._published:
            return
        self._published = snapshot
        synced, stale, pods, quotas, reservations, gangs = snapshot
        metrics.SYNCED.set(synced)
        metrics.STALE.set(stale)
        metrics.OBJECTS.labels("Pod").set(pods)
        metrics.OBJECTS.labels("ElasticQuota").set(quotas)
        metrics.RESERVATIONS.set(reservations)
        metrics.GANG_RESERVATIONS.set(gangs)

    def ready(self) -> tuple[bool, str]:
        problem = self.decider_problem() if self.decider_problem is not None else ""
        with self._lock:
            if not self.synced:
                return False, "quota state not synced yet"
            stale = self._stale_kinds()
            self._publish()  # staleness grows with time alone: a readiness probe is when it shows
            if stale:
                return False, (f"quota state is stale: the list/watch of {', '.join(stale)} has been failing "
                               f"for more than {self.stale_after_seconds:g}s")
            if problem:
                return False, problem
            return True, "quota state synced"

    def quota_figures(self) -> list[QuotaFigure]:
        """Per quota and limited GPU resource: used, limit, min and reserved (the per-quota gauges).

        Computed when asked (a scrape), so a deleted quota has no figures from then on, and an
        expired reservation no longer counts even when no admission came since.
        """
        with self._lock:
            if self._expire(self._clock()):
                self._publish()
            figures = quota_figures(self.tree, self.usage,
                                    self.ledger.used if self.reservations_known else lambda _quota: None)
        return [QuotaFigure(f.quota, f.tree, f.resource, float(f.used.amount),
                            None if f.limit is None else float(f.limit.amount),
                            None if f.min is None else float(f.min.amount),
                            None if f.reserved is None else float(f.reserved.amount)) for f in figures]

    def review_elasticquota(self, quota: Mapping[str, Any]) -> Verdict:
        """Refuse invalid quotas; warn on legacy names and on a max below current usage."""
        info = quota_from_object(quota)
        with self._lock:
            used = add_lists(self.usage.used(info.name), self.ledger.used(info.name))
            review = review_quota_object(quota, self.tree, used)
        if review.problems:
            return Verdict(False, "; ".join(review.problems), reason=INVALID, warnings=review.warnings)
        return Verdict(True, warnings=review.warnings)

    def admit_pod(self, admission: PodAdmission,
                  requests: tuple[PodQuotaRequest, PodQuotaRequest | None] | None = None) -> Verdict:
        """Local accounting: decide and reserve in this instance's own ledger (``requests``: the
        admission's ``quota_requests``, when the caller has read them already)."""
        with self._lock:
            now = self._clock()
            expired = self._expire(now)
            verdict, _ = self._view().judge(admission, self.ledger, now, requests)
            if expired or verdict.allowed:  # what changes the counts here
                self._publish()
            return verdict

    def _expire(self, now: float) -> int:
        """Release what expired by ``now``: how many reservations and gang reservations that was."""
        gangs = self.ledger.gang_count()
        expired = self.ledger.expire(now)
        if expired:
            metrics.RESERVATIONS_EXPIRED.inc(len(expired))
        return len(expired) + gangs - self.ledger.gang_count()

    def quota_of(self, namespace: str, quota_label: str) -> QuotaInfo | None:
        """The ElasticQuota a pod of ``namespace`` with ``quota_label`` resolves to (events' target)."""
        with self._lock:
            resolution = self.tree.resolve(namespace, quota_label)
            return self.tree.quotas.get(resolution.quota) if resolution.quota is not None else None


def _decides_alike(before: QuotaInfo | None, after: QuotaInfo | None) -> bool:
    """Whether a quota event leaves every decision as it was: the same quota, apart from the
    fields no decision reads (Koordinator writes ElasticQuotas' status and annotations often, and
    each write would otherwise spend every escrow of strict accounting)."""
    if before is None or after is None:
        return before is after
    return (dataclasses.replace(before, resource_version="", uid="")
            == dataclasses.replace(after, resource_version="", uid=""))


def compact(kind: str, obj: Mapping[str, Any]) -> PodRecord | QuotaInfo | PodGroupInfo | None:
    """The few fields a decision needs of one listed object, so a page can be dropped at once.

    Pods: their record, or None when they do not count (finished, unreadable). Quotas: QuotaInfo.
    PodGroups: what a gang's need and waiting time are read from.
    """
    if kind == POD_GROUP_KIND:
        return pod_group_info(obj, canonical_resource_list)
    if kind != "Pod":
        return quota_from_object(obj)
    if not pod_is_counted(obj):
        return None
    try:
        return pod_record(obj)
    except ValueError:
        return None  # an unreadable pod cannot be charged; the webhook refused it at admission anyway

