"""The quota service's options cross a process boundary as one JSON argument: what the master
builds from the server's settings is exactly what the service reads back, and anything else is
refused with the field it is about."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from webhook.quota.options import Accounting, QuotaServiceOptions
from webhook.quota.service import CANNOT_START_EXIT
from webhook.quota.state import QuotaState
from webhook.serving.settings import Settings


def test_the_options_built_from_the_settings_read_back_equal() -> None:
    settings = Settings(kubeconfig_path=Path("/etc/kube/config"), context="prod", accounting=Accounting.STRICT,
                        ledger_namespace="", stale_after_seconds=45.5, reservation_ttl_seconds=90.0,
                        max_reservations_per_caller=7)
    options = settings.quota_options("gpuquota-system")
    assert options == QuotaServiceOptions(state_path=None, kubeconfig_path=Path("/etc/kube/config"), context="prod",
                                          accounting=Accounting.STRICT, ledger_namespace="gpuquota-system",
                                          stale_after_seconds=45.5, reservation_ttl_seconds=90.0,
                                          max_reservations_per_caller=7)
    read_back = QuotaServiceOptions.from_json(options.to_json())
    assert read_back == options
    assert read_back.accounting is Accounting.STRICT
    assert isinstance(read_back.kubeconfig_path, Path)


def test_the_defaults_are_the_settings_defaults() -> None:
    assert Settings().quota_options("") == QuotaServiceOptions()
    assert str(Settings().accounting) == "local"


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "quota service options are not JSON"),
    ("[]", "quota service options must be a JSON object, not list"),
    ('{"quorum": 3}', "unknown quota service options: quorum"),
    ('{"accounting": "eventual"}', "quota service option accounting must be Accounting, not 'eventual'"),
    ('{"stale_after_seconds": "soon"}', "quota service option stale_after_seconds must be float, not 'soon'"),
    ('{"max_reservations_per_caller": 2.5}', "quota service option max_reservations_per_caller must be int, not 2.5"),
    ('{"state_path": 3}', "quota service option state_path must be Path, not 3"),
])
def test_anything_else_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[")):
        QuotaServiceOptions.from_json(text)


def test_the_state_takes_its_limits_and_accounting_from_the_options() -> None:
    local = QuotaState.for_options(QuotaServiceOptions(stale_after_seconds=5.0, reservation_ttl_seconds=12.0,
                                                       max_reservations_per_caller=3))
    assert (local.stale_after_seconds, local.ledger.ttl_seconds, local.max_reservations_per_caller) == (5.0, 12.0, 3)
    assert local.reservations_known
    assert not QuotaState.for_options(QuotaServiceOptions(accounting=Accounting.STRICT)).reservations_known


def test_a_service_given_unreadable_options_exits_as_unable_to_start(tmp_path: Path) -> None:
    socket_path = tmp_path / "quota.sock"
    done = subprocess.run([sys.executable, "-m", "webhook.quota.service", "--socket", str(socket_path),
                           "--parent-pid", "1", "--options", '{"accounting": "eventual"}'],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == CANNOT_START_EXIT
    assert ("quota service: cannot start: quota service option accounting must be Accounting, not 'eventual'"
            in done.stderr)
    assert tmp_path.exists() and not socket_path.exists()

