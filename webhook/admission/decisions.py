"""The admission decisions: one method per endpoint, from a decoded review to a response.

All protocol rules are in the codec (:mod:`webhook.admission.review`), all GPU rules in
:mod:`gpuquota_core`, all quota rules behind :class:`~webhook.admission.quota_port.QuotaDecider`;
what is left here is mapping between them, and the enforcement modes (:mod:`gpuquota_core.enforcement`):
a pod check in ``warn`` or ``dry-run`` turns its denial into an allow here, after the quota service
refused (and so reserved nothing). Free of HTTP and of the per-review metrics and log line
(:mod:`webhook.admission.observability`, counted where a review is served), so the webhook's
routes (webhook.serving.routes) and ``gpuquota explain`` call the same methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuquota_core.conversion import ConversionConfig
from gpuquota_core.enforcement import BAD_REQUEST, FORBIDDEN, INVALID, Mode, Relaxed, relaxed_refusal
from gpuquota_core.events import pod_event
from gpuquota_core.gang import GANG_RESULT_DETAIL
from gpuquota_core.mutation import admission_mutation
from gpuquota_core.placement import NodeView
from gpuquota_core.pod_admission import ALLOW, Verdict, needs_quota_service, pod_labels, read_pod_admission
from gpuquota_core.podspec import PodShapeError, mapping_or_empty
from gpuquota_core.quota_objects import ELASTICQUOTA_GROUP, POD_QUOTA_LABEL, QuotaShapeError
from gpuquota_core.validation import GpuRequestProblem
from webhook.admission.config_source import ConfigSource
from webhook.admission.quota_port import EventReporter, QuotaDecider
from webhook.admission.review import AdmissionRequest, AdmissionResponse, allowed, denied, patched


@dataclass(frozen=True, slots=True)
class Outcome:
    """A response plus the one-line reason the decision log records (why allowed, why denied)."""

    response: AdmissionResponse
    note: str
    # Denials that a check in warn or dry-run mode let pass (logged and counted where it is served).
    relaxed: tuple[Relaxed, ...] = ()
    # The resource names (as the user asked for them) the rewrite changed, or would have changed but
    # left as written: counted where the outcome is served, so an in-process caller (explain) counts none.
    rewritten: tuple[str, ...] = ()
    left_as_written: tuple[str, ...] = ()
    # What the quota decision did for a gang member (gpuquota_core.gang: opened, drew, refused), "" for
    # any other pod: counted where the outcome is served.
    gang_result: str = ""


def _problem_text(problem: GpuRequestProblem) -> str:
    return f"{problem.message} [rule: {problem.rule}]"


class AdmissionHandlers:
    """The decisions, one method per endpoint, free of HTTP so tests can call them directly."""

    def __init__(self, config: ConversionConfig | ConfigSource, quota: QuotaDecider,
                 nodes: Callable[[], NodeView | None] = lambda: None,
                 events: EventReporter | None = None) -> None:
        self.source = config if isinstance(config, ConfigSource) else ConfigSource(config)
        self.quota = quota
        # The nodes the rewrite decision looks at (webhook.quota.node_view); None: not listed (yet).
        self.nodes = nodes
        self.events = events  # where refusals and would-denies go as Kubernetes Events (webhook.quota.events)

    @property
    def config(self) -> ConversionConfig:
        """The config for a new request (re-read when the file changed); take it once per request."""
        return self.source.current()

    # -- /mutate-pods ------------------------------------------------------------------------

    def mutate_pod(self, req: AdmissionRequest, caller: str = "") -> Outcome:
        if not (req.is_core("Pod") and req.operation == "CREATE"):
            return Outcome(allowed(req), "not a pod CREATE")
        if req.object is None:
            return Outcome(denied(req, "request.object is missing", reason=BAD_REQUEST), "no object")
        config = self.config
        try:
            mutation = admission_mutation(req.object, config, self.nodes())
        except PodShapeError as error:
            return self._unreadable(req, error)
        if mutation.refusal:
            # Refused here, in /validate-pods' words, because a mutator called between the two would
            # hide it (gpuquota_core.validation.REFUSED_WHEN_MUTATING). In warn or dry-run mode the
            # pod passes as written and /validate-pods reports it as it would.
            message = "; ".join(_problem_text(p) for p in mutation.refusal)
            if relaxed_refusal(config.enforcement, INVALID, message) is None:
                self._report_event(req, req.object, INVALID, Mode.ENFORCE, message)
                return Outcome(denied(req, message, reason=INVALID),
                               ",".join(sorted({p.rule for p in mutation.refusal})))
        notes = [f"gpuquota: {note}" for note in mutation.notes]
        if not mutation.changed:
            note = f"left as written: {mutation.left_reason}" if mutation.left_sources else "already canonical"
            return Outcome(allowed(req, warnings=[*mutation.warnings, *notes]), note,
                           left_as_written=tuple(mutation.left_sources))
        warnings = [f"gpuquota rewrote {line}" for line in mutation.summary] + list(mutation.warnings) + notes
        response = patched(req, mutation.operations(), warnings=warnings)
        return Outcome(response, f"rewrote {len(mutation.summary)} container resource(s)",
                       rewritten=tuple(mutation.rewritten_sources))

    # -- /validate-pods ----------------------------------------------------------------------

    def validate_pod(self, req: AdmissionRequest, caller: str = "") -> Outcome:
        if not (req.is_core("Pod") and req.operation in ("CREATE", "UPDATE")):
            return Outcome(allowed(req), "not a pod CREATE or UPDATE")
        pod = req.object
        if pod is None:
            return Outcome(denied(req, "request.object is missing", reason=BAD_REQUEST), "no object")
        config = self.config
        enforcement = config.enforcement
        relaxed: list[Relaxed] = []
        try:
            reading = read_pod_admission(pod, req.old_object, config, uid=req.uid, operation=req.operation,
                                         namespace=req.namespace, name=req.name, dry_run=req.dry_run, caller=caller)
        except PodShapeError as error:
            return self._unreadable(req, error)
        problems = reading.problems
        warnings: list[str] = []
        if problems and reading.grandfathered:
            # Stored with this request already: see PodReading.grandfathered; only warn.
            warnings = [f"gpuquota: existing pod has an unschedulable GPU request: {_problem_text(p)}"
                        for p in problems]
        elif problems:
            message = "; ".join(_problem_text(p) for p in problems)
            passes = relaxed_refusal(enforcement, INVALID, message)
            if passes is None:
                self._report_event(req, pod, INVALID, Mode.ENFORCE, message)
                return Outcome(denied(req, message, reason=INVALID),
                               ",".join(sorted({p.rule for p in problems})))
            # Relaxed: the quota check below still runs, and may still deny.
            relaxed.append(passes)
        admission = reading.admission
        if isinstance(admission, PodShapeError):
            return self._unreadable(req, admission)
        # An UPDATE that cannot change what a quota counts needs no decision (and so no quota
        # service: a finalizer removal passes during an outage too).
        verdict = self.quota.admit_pod(admission) if needs_quota_service(admission) else ALLOW
        gang_result = str(verdict.details.get(GANG_RESULT_DETAIL, "")) if verdict.details else ""
        # relaxed_refusal() keeps every reason that is not a check (NotReady, QuotaServiceDown,
        # LedgerUnavailable, ...) enforced: an unavailable quota view keeps denying.
        if not verdict.allowed and verdict.reason != INVALID:
            passes = relaxed_refusal(enforcement, verdict.reason, verdict.message)
            if passes is not None:
                # The quota service refused, so it reserved nothing: the pod is admitted without
                # holding room (it is over quota anyway) and counts once the watch shows it.
                # gpuquota_core.enforcement.in_turn counts a workload's pods on that.
                relaxed.append(passes)
                verdict = Verdict(True, warnings=verdict.warnings)
        warnings += [r.warning for r in relaxed if r.mode is Mode.WARN]
        if not verdict.allowed:
            self._report_event(req, pod, verdict.reason, Mode.ENFORCE, verdict.message)
        for r in relaxed:
            self._report_event(req, pod, r.check, r.mode, r.message)
        outcome = self._from_verdict(req, verdict, warnings)
        if not relaxed:
            return replace(outcome, gang_result=gang_result) if gang_result else outcome
        would = ", ".join(f"{r.check} ({r.mode.value})" for r in relaxed)
        note = f"would-deny {would}" if outcome.response.allowed else f"{outcome.note}; would-deny {would}"
        return Outcome(outcome.response, note, tuple(relaxed), gang_result=gang_result)

    def _report_event(self, req: AdmissionRequest, pod: Mapping[str, Any], check: str, mode: Mode,
                      message: str) -> None:
        """A refusal or would-deny as an Event on the pod's controller or quota; never blocks.

        Not for dry-run requests: the webhook declares sideEffects NoneOnDryRun.
        """
        if self.events is None or req.dry_run:
            return
        metadata = pod.get("metadata")
        metadata = mapping_or_empty(metadata)
        namespace = req.namespace or _text(metadata.get("namespace"))
        event = pod_event(check, mode, message, metadata, namespace, pod_labels(metadata).get(POD_QUOTA_LABEL, ""))
        if event is not None:
            self.events.report(event)

    # -- /validate-elasticquotas -------------------------------------------------------------

    def validate_elasticquota(self, req: AdmissionRequest, caller: str = "") -> Outcome:
        if not req.is_kind(ELASTICQUOTA_GROUP, "ElasticQuota"):
            return Outcome(allowed(req), "not an ElasticQuota")
        # The webhook is registered for CREATE and UPDATE only (manifests/webhooks/webhook-configurations.yaml);
        # anything else that reaches it is let through unreviewed.
        if req.operation not in ("CREATE", "UPDATE"):
            return Outcome(allowed(req), f"{req.operation} not reviewed")
        if req.object is None:
            return Outcome(denied(req, "request.object is missing", reason=BAD_REQUEST), "no object")
        try:
            verdict = self.quota.review_elasticquota(req.object)
        except (QuotaShapeError, PodShapeError) as error:
            return Outcome(denied(req, f"cannot read the ElasticQuota: {error}", reason=INVALID),
                           "unreadable quota")
        return self._from_verdict(req, verdict, [])

    # -- shared ------------------------------------------------------------------------------

    @staticmethod
    def _unreadable(req: AdmissionRequest, error: PodShapeError) -> Outcome:
        response = denied(req, f"cannot read the pod: {error}", reason=BAD_REQUEST)
        return Outcome(response, f"pod shape: {error.path}")

    @staticmethod
    def _from_verdict(req: AdmissionRequest, verdict: Verdict, warnings: list[str]) -> Outcome:
        all_warnings = warnings + [w for w in verdict.warnings if w not in warnings]
        if verdict.allowed:
            return Outcome(allowed(req, warnings=all_warnings), verdict.reason or "allowed")
        response = denied(req, verdict.message, reason=verdict.reason or FORBIDDEN,
                          warnings=all_warnings)
        return Outcome(response, verdict.reason or "denied")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
