"""Enforcement modes per check, like Gatekeeper's enforcement actions: pure, no I/O.

A *check* is one of the denial reasons the validating webhook produces for a pod
(:data:`CHECKS`). Each check has a mode:

- ``enforce``: deny (the behaviour without an ``enforcement`` section);
- ``warn``: allow, and put the denial message into ``response.warnings`` (kubectl prints it);
- ``dry-run``: allow silently; the would-be denial goes into the decision log and a counter.

Some refusals are never relaxed (:data:`ALWAYS_ENFORCED`): a request the webhook cannot read is
not a policy decision, and an unavailable quota view (not synced, service down, shared ledger
unreachable) follows the ``failurePolicy: Fail`` reasoning: admitting because the webhook could
not decide would let any outage bypass quota. Naming one of them in the config is an error rather
than something silently ignored.

The YAML form is a section of the conversion config file::

    enforcement:
      default: enforce          # for every check not listed
      checks:
        QuotaExceeded: warn
        UnknownGpuMemory: dry-run
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# The refusal reasons, defined once: a GPU request Koordinator can never schedule, the refusals of
# quota_decision (which imports them from here), and those of the quota service and the webhook.
# Which HTTP status carries each is the webhook's choice (webhook.admission.status), not the core's.
INVALID = "Invalid"
QUOTA_EXCEEDED = "QuotaExceeded"
QUOTA_NOT_FOUND = "QuotaNotFound"
PARENT_QUOTA = "ParentQuota"
UNKNOWN_GPU_MEMORY = "UnknownGpuMemory"
# A denial that names no reason of its own.
FORBIDDEN = "Forbidden"
# An AdmissionReview or object the webhook cannot read at all.
BAD_REQUEST = "BadRequest"
# Refusals that decide nothing about the quota: the webhook could not decide now; retry shortly.
NOT_READY = "NotReady"  # the quota state has not synced yet
QUOTA_SERVICE_DOWN = "QuotaServiceDown"  # the worker cannot reach the quota service
LEDGER_UNAVAILABLE = "LedgerUnavailable"  # strict accounting cannot read or write its ledger
# The service could not decide an admission by its deadline: asked again once, as a timeout is (the
# second attempt has a deadline of its own).
ANSWER_TOO_LATE = "AnswerTooLate"
# The room was lent to another replica's escrow, due back but not back by the deadline: not a
# refusal for the quota, so asked again once too.
ESCROW_NOT_BACK = "EscrowNotBackInTime"
# A gang member names a PodGroup that the quota state has not seen: its gang's minimum is unknown (a
# PodGroup created just before its pods may not have reached the watch yet), so retry shortly.
POD_GROUP_NOT_SEEN = "PodGroupNotSeen"
# One caller already holds as many unconfirmed reservations as it may.
TOO_MANY_RESERVATIONS = "TooManyReservations"

# check name -> what it refuses (for the docs and the error message of an unknown name).
CHECKS: Mapping[str, str] = {
    INVALID: "a GPU request Koordinator can never schedule (every validation rule)",
    QUOTA_EXCEEDED: "the pod would push its ElasticQuota or an ancestor past its limit",
    QUOTA_NOT_FOUND: "the pod's quota label names an ElasticQuota that does not exist",
    PARENT_QUOTA: "the pod's quota label names a parent quota (is-parent=true)",
    UNKNOWN_GPU_MEMORY: "gpu-memory in bytes with no model mapping, under a quota limiting gpu-memory-ratio",
}

# Reasons that always deny, whatever the config says (see the module docstring).
ALWAYS_ENFORCED: Mapping[str, str] = {
    "BadRequest": "a request the webhook cannot read",
    "NotReady": "the quota view has not synced yet",
    "QuotaServiceDown": "the quota service is unreachable",
    "LedgerUnavailable": "the shared reservation ledger cannot be written",
}

SECTION_KEYS: tuple[str, ...] = ("default", "checks")


class EnforcementError(ValueError):
    """An enforcement section that cannot be used; the message is one line naming the entry."""


class Mode(Enum):
    ENFORCE = "enforce"
    WARN = "warn"
    DRY_RUN = "dry-run"


MODE_NAMES = ", ".join(mode.value for mode in Mode)


@dataclass(frozen=True, slots=True)
class EnforcementConfig:
    default: Mode = Mode.ENFORCE
    checks: Mapping[str, Mode] = field(default_factory=dict)

    def mode_for(self, reason: str) -> Mode:
        """The mode of the check behind a denial ``reason``; unknown reasons are always enforced."""
        if reason not in CHECKS:
            return Mode.ENFORCE
        return self.checks.get(reason, self.default)

    def describe(self) -> str:
        """``default=enforce QuotaExceeded=warn``: for the log line of a reload."""
        overrides = " ".join(f"{name}={mode.value}" for name, mode in sorted(self.checks.items()))
        return f"default={self.default.value}" + (f" {overrides}" if overrides else "")


DEFAULT_ENFORCEMENT = EnforcementConfig()


@dataclass(frozen=True, slots=True)
class Relaxed:
    """A denial that warn or dry-run turned into an allow."""

    check: str
    mode: Mode
    message: str

    @property
    def warning(self) -> str:
        return warning_text(self.check, self.message)


def relaxed_refusal(config: EnforcementConfig, reason: str, message: str) -> Relaxed | None:
    """The one rule of what enforcement does with a refusal, for the webhook and every view that
    replays it: the would-deny that lets it pass when its check is in ``warn`` or ``dry-run``, None
    when it is enforced (reasons that are no check, such as an unavailable quota view, always are:
    :meth:`EnforcementConfig.mode_for`)."""
    mode = config.mode_for(reason)
    return None if mode is Mode.ENFORCE else Relaxed(reason, mode, message)


@dataclass(frozen=True, slots=True)
class InTurn:
    """What enforcement does with ``replicas`` pods alike (a workload's), created one after another."""

    replicas: int
    fit: int  # admitted by the checks themselves, before the first one a check refuses
    admitted: int  # admitted in the end: ``fit``, or every pod when warn or dry-run lets the refusal pass
    would_be_refused: int  # of ``admitted``, those that pass only by a check in warn or dry-run
    # The would-deny of the first pod beyond ``fit`` (None: every pod fits, or the refusal is enforced).
    beyond_fit: Relaxed | None = None


def in_turn(config: EnforcementConfig, replicas: int, fit: int, refusal: tuple[str, str] | None,
            each: tuple[Relaxed, ...] = ()) -> InTurn:
    """``replicas`` pods alike of which the first ``fit`` are admitted and the next is refused for
    ``refusal`` (reason, message; None: nothing refuses it). ``each``: the would-denies the first pod
    carries, which every pod alike carries too.

    A pod that warn or dry-run lets through holds no room (the quota service refused it, so it
    reserved nothing), so every pod after it meets the same refusal: either all the pods beyond
    ``fit`` pass, each a would-deny, or none of them does.
    """
    fit = min(fit, replicas)
    relaxed = relaxed_refusal(config, *refusal) if fit < replicas and refusal is not None else None
    admitted = replicas if relaxed is not None else fit
    return InTurn(replicas, fit, admitted, admitted if each else admitted - fit, relaxed)


def warning_text(check: str, message: str) -> str:
    """What ``warn`` puts into ``response.warnings`` (kubectl prints it after ``Warning:``)."""
    return f"gpuquota would deny ({check}, enforcement: warn): {message}"


def _mode(value: object, where: str) -> Mode:
    if isinstance(value, str):
        for mode in Mode:
            if mode.value == value:
                return mode
    raise EnforcementError(f"{where}: unknown mode {value!r} (expected one of {MODE_NAMES})")


def load_enforcement(section: object) -> EnforcementConfig:
    """Parse the ``enforcement`` section; ``None`` (absent) is enforce for everything."""
    if section is None:
        return DEFAULT_ENFORCEMENT
    if not isinstance(section, Mapping):
        raise EnforcementError("enforcement must be a mapping with default and checks")
    unknown = sorted(str(key) for key in section if key not in SECTION_KEYS)
    if unknown:
        raise EnforcementError(f"enforcement: unknown key {unknown[0]!r} (expected one of {', '.join(SECTION_KEYS)})")
    default = _mode(section["default"], "enforcement.default") if "default" in section else Mode.ENFORCE
    raw_checks: Any = section.get("checks")
    if raw_checks is None:
        raw_checks = {}
    if not isinstance(raw_checks, Mapping):
        raise EnforcementError("enforcement.checks must be a mapping of check name to mode")
    checks: dict[str, Mode] = {}
    for name, value in raw_checks.items():
        if name in ALWAYS_ENFORCED:
            raise EnforcementError(f"enforcement.checks: {name} ({ALWAYS_ENFORCED[name]}) always denies "
                                   f"and has no mode; checks are {', '.join(CHECKS)}")
        if name not in CHECKS:
            raise EnforcementError(f"enforcement.checks: unknown check {name!r} (expected one of {', '.join(CHECKS)})")
        checks[str(name)] = _mode(value, f"enforcement.checks.{name}")
    return EnforcementConfig(default, checks)
