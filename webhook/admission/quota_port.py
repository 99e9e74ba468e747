"""The seam between the HTTP handlers and whatever decides quota.

The handlers (any gunicorn worker, any thread) only ever see this interface. The implementation
that holds the cluster state and the reservation ledger lives in one place per server instance, so
that every worker gets the same answer for the same quota. What crosses it (``PodAdmission``,
``Verdict``, ``QuotaFigure``) is the core's (gpuquota_core.pod_admission), so the quota service
reads it without importing this package.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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
