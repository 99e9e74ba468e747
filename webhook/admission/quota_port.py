"""The seams between the handlers and what they call outside admission: whatever decides quota,
and wherever refusals go as Kubernetes Events.

The handlers (any gunicorn worker, any thread) only ever see this interface. The implementation
that holds the cluster state and the reservation ledger lives in one place per server instance, so
that every worker gets the same answer for the same quota. What crosses it (``PodAdmission``,
``Verdict``, ``QuotaFigure``) is the core's (gpuquota_core.pod_admission), so the quota service
reads it without importing this package. The implementations (webhook.quota's client and event
forwarder) satisfy these protocols without importing them; the serving layer hands them in.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gpuquota_core.events import PodEvent
from gpuquota_core.pod_admission import ALLOW, PodAdmission, QuotaFigure, Verdict


class QuotaDecider(Protocol):
    def alive(self) -> tuple[bool, str]:
        """Whether whatever makes the decisions is running at all (ready or not), with a reason when not."""
        ...

    def ready(self) -> tuple[bool, str]:
        """Whether decisions can be made yet (first full sync done), with a reason when not."""
        ...

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        ...

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        ...


@runtime_checkable
class ReportsQuotaFigures(Protocol):
    """A decider that can say, at scrape time, what every quota holds (None: cannot be asked now)."""

    def quota_figures(self) -> list[QuotaFigure] | None:
        ...


class EventReporter(Protocol):
    """Takes a refusal or would-deny as an Event to write; must never block an admission."""

    def report(self, event: PodEvent) -> None:
        ...


class NoQuota:
    """A decider that allows everything: GPU validation without quota enforcement."""

    def alive(self) -> tuple[bool, str]:
        return True, "quota enforcement disabled"

    def ready(self) -> tuple[bool, str]:
        return True, "quota enforcement disabled"

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        return ALLOW

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return ALLOW
