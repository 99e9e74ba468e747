"""The enforcement section of the config file: modes per check, and what can never be relaxed."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuquota_core.conversion import DEFAULT_CONFIG, ConfigError, load_config
from gpuquota_core.enforcement import (
    ALWAYS_ENFORCED,
    CHECKS,
    DEFAULT_ENFORCEMENT,
    EnforcementConfig,
    EnforcementError,
    InTurn,
    Mode,
    Relaxed,
    in_turn,
    load_enforcement,
    relaxed_refusal,
)


def test_without_a_section_every_check_is_enforced() -> None:
    assert load_config({}).enforcement == DEFAULT_ENFORCEMENT
    assert DEFAULT_CONFIG.enforcement == DEFAULT_ENFORCEMENT
    assert load_enforcement(None) is DEFAULT_ENFORCEMENT
    assert {DEFAULT_ENFORCEMENT.mode_for(check) for check in CHECKS} == {Mode.ENFORCE}


def test_checks_keep_the_names_configs_and_clients_already_use() -> None:
    # The config's enforcement section and the admission response's reason both carry these names.
    assert list(CHECKS) == ["Invalid", "QuotaExceeded", "QuotaNotFound", "ParentQuota", "UnknownGpuMemory"]


def test_a_default_with_per_check_overrides() -> None:
    config = load_config(yaml.safe_load("""
enforcement:
  default: dry-run
  checks:
    QuotaExceeded: warn
    Invalid: enforce
"""))

    modes = {check: config.enforcement.mode_for(check) for check in CHECKS}
    assert modes == {"Invalid": Mode.ENFORCE, "QuotaExceeded": Mode.WARN, "QuotaNotFound": Mode.DRY_RUN,
                     "ParentQuota": Mode.DRY_RUN, "UnknownGpuMemory": Mode.DRY_RUN}
    assert config.enforcement.describe() == "default=dry-run Invalid=enforce QuotaExceeded=warn"
    # The rest of the file is still the conversion table.
    assert config.rules == DEFAULT_CONFIG.rules


@pytest.mark.parametrize("reason", [*ALWAYS_ENFORCED, "InternalError", "Forbidden", ""])
def test_availability_failures_and_unknown_reasons_always_deny(reason: str) -> None:
    relaxed_everywhere = EnforcementConfig(Mode.DRY_RUN, {})

    assert relaxed_everywhere.mode_for(reason) is Mode.ENFORCE


def test_only_checks_is_enough_and_empty_checks_is_fine() -> None:
    assert load_enforcement({"checks": {"ParentQuota": "warn"}}) == EnforcementConfig(
        Mode.ENFORCE, {"ParentQuota": Mode.WARN})
    assert load_enforcement({"default": "warn", "checks": None}) == EnforcementConfig(Mode.WARN, {})
    assert load_enforcement({}) == DEFAULT_ENFORCEMENT


QUOTA_WARN = EnforcementConfig(Mode.ENFORCE, {"QuotaExceeded": Mode.WARN})
OVER = ("QuotaExceeded", "exceeded quota: a/b")


def test_a_refusal_passes_only_when_its_check_is_in_warn_or_dry_run() -> None:
    assert relaxed_refusal(DEFAULT_ENFORCEMENT, *OVER) is None
    assert relaxed_refusal(QUOTA_WARN, *OVER) == Relaxed("QuotaExceeded", Mode.WARN, OVER[1])
    assert relaxed_refusal(QUOTA_WARN, "ParentQuota", "parent") is None
    assert relaxed_refusal(EnforcementConfig(Mode.DRY_RUN, {}), "NotReady", "not synced") is None


def test_a_workloads_pods_in_turn_all_pass_beyond_the_room_or_none_does() -> None:
    # Enforced: the three that fit, nothing passes beyond them.
    assert in_turn(DEFAULT_ENFORCEMENT, 8, 3, OVER) == InTurn(8, 3, 3, 0)
    # Warn: the five beyond the room pass too, each a would-deny.
    assert in_turn(QUOTA_WARN, 8, 3, OVER) == InTurn(8, 3, 8, 5, Relaxed("QuotaExceeded", Mode.WARN, OVER[1]))
    dry_run = in_turn(EnforcementConfig(Mode.DRY_RUN, {}), 8, 0, OVER)
    assert (dry_run.admitted, dry_run.would_be_refused, dry_run.beyond_fit) == (
        8, 8, Relaxed("QuotaExceeded", Mode.DRY_RUN, OVER[1]))
    # A reason that is no check is never relaxed.
    assert in_turn(EnforcementConfig(Mode.WARN, {}), 8, 0, ("PodGroupNotSeen", "x")) == InTurn(8, 0, 0, 0)
    # Every pod fits: nothing to relax; a would-deny the first pod carries, every pod alike carries.
    assert in_turn(QUOTA_WARN, 4, 4, None) == InTurn(4, 4, 4, 0)
    invalid = (Relaxed("Invalid", Mode.WARN, "negative"),)
    assert in_turn(QUOTA_WARN, 4, 4, None, invalid) == InTurn(4, 4, 4, 4)
    assert in_turn(DEFAULT_ENFORCEMENT, 4, 1, OVER, invalid) == InTurn(4, 1, 1, 1)


def test_the_warning_names_the_check_and_carries_the_denial_message() -> None:
    relaxed = Relaxed("QuotaExceeded", Mode.WARN, "exceeded quota: a/b, requested: x=1")

    assert relaxed.warning == ("gpuquota would deny (QuotaExceeded, enforcement: warn): "
                               "exceeded quota: a/b, requested: x=1")


ENFORCEMENT_ERRORS: list[Any] = [
    pytest.param({"checks": {"QuotaExceded": "warn"}},
                 "enforcement.checks: unknown check 'QuotaExceded' (expected one of Invalid, QuotaExceeded, "
                 "QuotaNotFound, ParentQuota, UnknownGpuMemory)", id="misspelt-check"),
    pytest.param({"checks": {"NotReady": "dry-run"}},
                 "enforcement.checks: NotReady (the quota view has not synced yet) always denies and has no "
                 "mode; checks are Invalid, QuotaExceeded, QuotaNotFound, ParentQuota, UnknownGpuMemory",
                 id="not-ready"),
    pytest.param({"checks": {"QuotaServiceDown": "warn"}},
                 "enforcement.checks: QuotaServiceDown (the quota service is unreachable) always denies and has "
                 "no mode; checks are Invalid, QuotaExceeded, QuotaNotFound, ParentQuota, UnknownGpuMemory",
                 id="service-down"),
    pytest.param({"checks": {"LedgerUnavailable": "warn"}},
                 "enforcement.checks: LedgerUnavailable (the shared reservation ledger cannot be written) always "
                 "denies and has no mode; checks are Invalid, QuotaExceeded, QuotaNotFound, ParentQuota, "
                 "UnknownGpuMemory", id="ledger"),
    pytest.param({"checks": {"BadRequest": "warn"}},
                 "enforcement.checks: BadRequest (a request the webhook cannot read) always denies and has no "
                 "mode; checks are Invalid, QuotaExceeded, QuotaNotFound, ParentQuota, UnknownGpuMemory",
                 id="bad-request"),
    pytest.param({"default": "audit"}, "enforcement.default: unknown mode 'audit' (expected one of enforce, warn, "
                 "dry-run)", id="unknown-default"),
    pytest.param({"default": "dryrun"}, "enforcement.default: unknown mode 'dryrun' (expected one of enforce, "
                 "warn, dry-run)", id="dry-run-without-dash"),
    pytest.param({"checks": {"QuotaExceeded": False}},
                 "enforcement.checks.QuotaExceeded: unknown mode False (expected one of enforce, warn, dry-run)",
                 id="yaml-off-is-false"),
    pytest.param({"checks": ["QuotaExceeded"]}, "enforcement.checks must be a mapping of check name to mode",
                 id="checks-list"),
    pytest.param({"defaults": "warn"}, "enforcement: unknown key 'defaults' (expected one of default, checks)",
                 id="unknown-key"),
    pytest.param("warn", "enforcement must be a mapping with default and checks", id="not-mapping"),
]


@pytest.mark.parametrize(("section", "message"), ENFORCEMENT_ERRORS)
def test_enforcement_errors_are_one_line_naming_the_entry(section: Any, message: str) -> None:
    with pytest.raises(EnforcementError) as direct:
        load_enforcement(section)
    with pytest.raises(ConfigError) as through_the_file:
        load_config({"enforcement": section})

    assert str(direct.value) == message
    assert str(through_the_file.value) == message
    assert "\n" not in message
