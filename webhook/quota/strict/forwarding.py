"""Who decides under a writer Lease (``--writer-lease``): the holder as the writer; every other
replica sends it each admission its workers ask about and each report of admissions they refused
without an answer, and answers with the holder's verdict; a replica that cannot ask it (none known,
not reachable, not this replica's certificate, no answer in time) decides here, degraded, and says
so in its log and in ``gpuquota_ledger_writer_role``. docs/design.md, "One writer while it can be
asked", has the why; the wire is ``peer``.

An admission the holder received but did not answer in time is decided here too. Should the holder
have admitted it meanwhile, its reservation counts twice until the watch confirms the pod or the
holder withdraws it as late: a refusal at worst, never one admission too many.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota import metrics
from webhook.quota.strict.accounting import Mode, StrictAccounting
from webhook.quota.strict.peer import LONGEST_FORWARD_SECONDS, PeerClient, PeerUnavailable
from webhook.quota.strict.writer_lease import WriterLease

log = logging.getLogger("gpuquota.quota")
# At most this share of an admission's time is spent waiting for the holder, so that a holder that
# hangs still leaves enough to decide here.
FORWARD_SHARE = 0.5
# After the holder could not be asked, it is not tried again for this long: each admission meanwhile
# would pay the failed attempt first. Shorter than the Lease's duration, so a holder that comes back
# is used again before another replica would take over.
AVOID_SECONDS = 1.0


class SingleWriter:
    """The quota service's decider with a writer Lease: the writer decides as the writer, a
    forwarder forwards, and a replica that cannot ask the writer decides here, degraded."""

    def __init__(self, local: StrictAccounting, lease: WriterLease, peers: PeerClient,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.local = local
        self.lease = lease
        self.peers = peers
        self.monotonic = monotonic
        self._avoid: dict[str, float] = {}  # address -> monotonic time until which it is not asked
        self._lock = threading.Lock()
        self._role = ""  # the last role reported (metrics.WRITER_ROLES), for the log line on a change

    def role(self) -> str:
        """One of metrics.WRITER_ROLES: ``writer``, ``forwarding``, or ``degraded`` (deciding here)."""
        if self.lease.holds():
            return "writer"
        address = self.lease.writer_elsewhere()
        return "forwarding" if address is not None and self._avoid.get(address, 0.0) <= self.monotonic() \
            else "degraded"

    def report_role(self, why: str = "") -> str:
        """Set the role gauge, log entering and leaving the degraded mode; the role."""
        role = self.role()
        with self._lock:
            before, self._role = self._role, role
        if role != before:
            for each in metrics.WRITER_ROLES:
                metrics.LEDGER_WRITER_ROLE.labels(each).set(1 if each == role else 0)
            if role == "degraded":
                log.warning("strict accounting: entering the degraded mode: deciding here, with fresh reads and no "
                            "escrow, because the ledger writer cannot be asked%s", f" ({why})" if why else "")
            elif before == "degraded":
                log.warning("strict accounting: leaving the degraded mode: %s", "this replica is the ledger writer"
                            if role == "writer" else "forwarding to the ledger writer")
        return role

    def admit_pod(self, admission: PodAdmission, answer_by: float = math.inf) -> Verdict:
        role = self.report_role()
        if role == "writer":
            return self.local.admit_pod(admission, answer_by, Mode.WRITER)
        address = self.lease.writer_elsewhere()
        if role == "degraded" or address is None:
            return self._decide_here(admission, answer_by)
        now = self.monotonic()
        seconds = min((answer_by - now) * FORWARD_SHARE, LONGEST_FORWARD_SECONDS)
        try:
            verdict = self.peers.admit_pod(address, admission, seconds)
        except PeerUnavailable as error:
            self._unavailable(address, error)
            return self._decide_here(admission, answer_by)
        metrics.FORWARDED_ADMISSIONS.labels("forwarded").inc()
        return verdict

    def _decide_here(self, admission: PodAdmission, answer_by: float) -> Verdict:
        metrics.FORWARDED_ADMISSIONS.labels("decided_here").inc()
        return self.local.admit_pod(admission, answer_by, Mode.DEGRADED)

    def _unavailable(self, address: str, error: PeerUnavailable) -> None:
        """Leave ``address`` alone for AVOID_SECONDS: each admission meanwhile would pay the failed try."""
        self._avoid[address] = self.monotonic() + AVOID_SECONDS
        self.report_role(f"{address}: {error}")

    def admit_forwarded(self, admission: PodAdmission, answer_by: float) -> Verdict:
        """A forwarder's admission: decided as the writer, unless this replica no longer holds the
        Lease (a forwarder that read it a moment ago is still answered, degraded)."""
        return self.local.admit_pod(admission, answer_by, Mode.WRITER if self.lease.holds() else Mode.DEGRADED)

    def withdraw_unanswered(self, admissions: list[PodAdmission]) -> bool:
        """The workers' report of admissions refused without an answer: for the writer to withdraw,
        like everything else it writes; written here only in the degraded mode."""
        address = self.lease.writer_elsewhere()
        if self.report_role() != "forwarding" or address is None:
            return self.local.withdraw_unanswered(admissions)
        try:
            return self.peers.withdraw_unanswered(address, admissions)
        except PeerUnavailable as error:
            self._unavailable(address, error)
            return self.local.withdraw_unanswered(admissions)
