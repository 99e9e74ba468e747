"""The quota service's decision in-process, for tests that run the webhook's own handlers over a
quota state without serving them: ``QuotaState.admit_pod`` (every review a dry run)."""

from __future__ import annotations

from typing import Any

from gpuquota_core.pod_admission import PodAdmission, Verdict
from webhook.quota.state import QuotaState


class StateDecider:
    def __init__(self, state: QuotaState) -> None:
        self.state = state

    def alive(self) -> tuple[bool, str]:
        return True, ""

    def ready(self) -> tuple[bool, str]:
        return self.state.ready()

    def admit_pod(self, admission: PodAdmission) -> Verdict:
        return self.state.admit_pod(admission)

    def review_elasticquota(self, quota: dict[str, Any]) -> Verdict:
        return self.state.review_elasticquota(quota)
