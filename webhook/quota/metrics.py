"""Prometheus metrics of the quota service process (cluster-state cache and reservation ledger).

The service runs in its own process next to the gunicorn workers and writes to the same
multiprocess directory (it inherits ``PROMETHEUS_MULTIPROC_DIR``), so one scrape of any worker's
``/metrics`` shows them. There is exactly one such process per server instance, so its gauges use
the ``max`` mode: the value of the one writer.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SYNCED = Gauge(
    "gpuquota_cluster_state_synced",
    "1 once pods and ElasticQuotas have both been listed (offline: loaded), else 0.",
    multiprocess_mode="max",
)
STALE = Gauge(
    "gpuquota_cluster_state_stale",
    "1 while the list/watch of some kind has been failing for longer than the staleness bound.",
    multiprocess_mode="max",
)
LAST_CONTACT = Gauge(
    "gpuquota_cluster_state_last_contact_timestamp_seconds",
    "Unix time of the last list, watch event or bookmark received, by kind; time() minus it is the age.",
    ["kind"],
    multiprocess_mode="max",
)
OBJECTS = Gauge(
    "gpuquota_cluster_state_objects",
    "Objects held in the cache, by kind (counted pods and ElasticQuotas).",
    ["kind"],
    multiprocess_mode="max",
)
RESERVATIONS = Gauge(
    "gpuquota_reservations",
    "Admitted pods not yet seen by the watch, holding room in the reservation ledger.",
    multiprocess_mode="max",
)
GANG_RESERVATIONS = Gauge(
    "gpuquota_gang_reservations",
    "Gang reservations held in this instance's ledger (local accounting): gangs whose first member was "
    "admitted with room for the whole minimum, until the minimum is stored or the gang's waiting time ends.",
    multiprocess_mode="max",
)
RESERVATIONS_EXPIRED = Counter(
    "gpuquota_reservations_expired",
    "Reservations released because no watched pod confirmed them before their TTL.",
)
WATCH_EVENTS = Counter(
    "gpuquota_watch_events",
    "Watch events applied to the cache, by kind and event type.",
    ["kind", "type"],
)
USAGE_RECHARGED = Counter(
    "gpuquota_usage_recharged_pods",
    "Pods charged again because an ElasticQuota event changed the quotas they are charged to (a quota added, "
    "removed or moved in the tree).",
)
RELISTS = Counter(
    "gpuquota_relists",
    "Full re-lists of a kind, by reason (initial, gone = 410 from the watch, error).",
    ["kind", "reason"],
)
LEDGER_WRITE_RESULTS = ("ok", "conflict", "error")
LEDGER_WRITES = Counter(
    "gpuquota_ledger_writes",
    "Writes of the shared reservation ledger (strict accounting), by result (ok, conflict, error).",
    ["result"],
)
ESCROW_ADMISSIONS = Counter(
    "gpuquota_ledger_escrow_admissions",
    "Pods admitted from room this replica holds in escrow in the shared ledger, without a write of their own.",
)
LEDGER_BATCH = Histogram(
    "gpuquota_ledger_batch_size",
    "Reservations carried by one successful ledger write (strict accounting's group commit).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
WRITER_ROLES = ("writer", "forwarding", "degraded")
LEDGER_WRITER_ROLE = Gauge(
    "gpuquota_ledger_writer_role",
    "With --writer-lease, 1 for this replica's role: writer (holds the Lease and decides what the others forward), "
    "forwarding (to another replica holding it), degraded (the holder cannot be asked: deciding here with fresh "
    "reads and no escrow); 0 for the other roles.",
    ["role"],
    # Only the live service's: a quota service killed while it was the writer must not stay one.
    multiprocess_mode="livemax",
)
FORWARDED_RESULTS = ("forwarded", "decided_here")
FORWARDED_ADMISSIONS = Counter(
    "gpuquota_ledger_forwarded_admissions",
    "Admissions a replica without the writer Lease sent to its holder (forwarded), or decided here in the "
    "degraded mode because the holder could not be asked (decided_here).",
    ["result"],
)
