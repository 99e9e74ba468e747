"""The quota service's options are one value from `gpuquota serve` to the service: each of its
fields is a flag of ``serve``, held once in the server's settings, and crosses the process boundary
as one JSON argument that the service reads back equal; anything else is refused with the field it
is about."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from cli.serve import serve, settings_from_flags
from webhook.quota.options import Accounting, QuotaServiceOptions
from webhook.quota.service import CANNOT_START_EXIT
from webhook.quota.state import QuotaState
from webhook.serving import server
from webhook.serving.server import quota_service_options
from webhook.serving.settings import Settings


def serve_settings(arguments: list[str]) -> Settings:
    """The settings ``gpuquota serve`` would run with for these arguments (click's own parsing)."""
    with serve.make_context("serve", arguments) as context:
        return settings_from_flags(context.params)


# Filled by the server from a flag of its own (--cert-dir), which serving uses too.
FROM_SERVER_SETTINGS = {"tls_dir"}


def test_every_quota_service_option_is_a_serve_flag_and_no_settings_field() -> None:
    fields = set(QuotaServiceOptions.field_names()) - FROM_SERVER_SETTINGS
    assert sorted(fields - {parameter.name for parameter in serve.params if parameter.name}) == []
    # Settings holds them once, as Settings.quota, never as copies beside it.
    assert sorted(fields & {field.name for field in dataclasses.fields(Settings)}) == []


def test_the_serve_flags_reach_the_quota_service_unchanged(tmp_path: Path) -> None:
    state, kubeconfig = tmp_path / "state.yaml", tmp_path / "kubeconfig"
    state.write_text("", encoding="utf-8")
    kubeconfig.write_text("", encoding="utf-8")
    given = QuotaServiceOptions(state_path=state, kubeconfig_path=kubeconfig, context="prod",
                                accounting=Accounting.STRICT, ledger_namespace="gpuquota-ledger",
                                stale_after_seconds=45.5, reservation_ttl_seconds=90.0, max_reservations_per_caller=7,
                                writer_lease="ledger-writer", peer_address="10.0.0.7", peer_port=9444)
    # Every field away from its default: a field added without a flag here cannot pass on its default.
    defaults = QuotaServiceOptions()
    assert [name for name in QuotaServiceOptions.field_names()
            if getattr(given, name) == getattr(defaults, name) and name not in FROM_SERVER_SETTINGS] == []

    settings = serve_settings(["--state", str(state), "--kubeconfig", str(kubeconfig), "--context", "prod",
                               "--accounting", "strict", "--ledger-namespace", "gpuquota-ledger",
                               "--stale-after", "45.5", "--reservation-ttl", "90",
                               "--max-reservations-per-caller", "7", "--writer-lease", "ledger-writer",
                               "--peer-address", "10.0.0.7", "--peer-port", "9444", "--cert-dir", str(tmp_path)])
    assert settings.quota == given
    read_back = QuotaServiceOptions.from_json(quota_service_options(settings).to_json())
    assert read_back == dataclasses.replace(given, tls_dir=tmp_path)
    assert read_back.accounting is Accounting.STRICT
    assert isinstance(read_back.kubeconfig_path, Path)


def test_without_the_flag_the_service_gets_the_pods_own_namespace(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("gpuquota-system\n", encoding="utf-8")
    monkeypatch.setattr(server, "SERVICE_ACCOUNT_NAMESPACE", namespace_file)
    settings = serve_settings(["--accounting", "strict"])
    assert settings.quota.ledger_namespace == ""
    assert quota_service_options(settings) == QuotaServiceOptions(accounting=Accounting.STRICT,
                                                                  ledger_namespace="gpuquota-system",
                                                                  tls_dir=settings.cert_dir)
    assert quota_service_options(serve_settings(["--ledger-namespace", "ledgers"])).ledger_namespace == "ledgers"


def test_the_flags_defaults_are_the_settings_defaults() -> None:
    assert serve_settings([]) == Settings()
    assert Settings().quota == QuotaServiceOptions()
    assert str(Settings().quota.accounting) == "local"


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

