"""``gpuquota preflight`` refuses input it cannot install before it connects to anything: one
``Error:`` line, exit 2. The checks themselves: tests/core/test_preflight_checks.py and
tests/e2e/test_preflight.py."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cli.main import cli

# A kubeconfig that would fail to connect: the command must stop before it is ever read.
NO_CLUSTER = ["--kubeconfig", "/nonexistent/kubeconfig"]


def test_objects_other_than_webhook_configurations_are_refused(tmp_path: Path) -> None:
    manifest = tmp_path / "step1.yaml"
    manifest.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: gpuquota-webhook}\n")

    result = CliRunner().invoke(cli, ["preflight", "--install", "-f", str(manifest), *NO_CLUSTER])

    assert result.exit_code == 2
    assert result.stderr == ("Error: Deployment gpuquota-webhook: only admissionregistration.k8s.io/v1 Mutating- "
                             "and ValidatingWebhookConfigurations are installed by preflight (step 2; apply the "
                             "rest with kubectl)\n")


def test_an_empty_input_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")

    result = CliRunner().invoke(cli, ["preflight", "--install", "-f", str(empty), *NO_CLUSTER])

    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1


def test_install_without_configurations_and_an_unknown_check_are_usage_errors() -> None:
    no_file = CliRunner().invoke(cli, ["preflight", "--install", *NO_CLUSTER])
    unknown = CliRunner().invoke(cli, ["preflight", "--skip", "dns", *NO_CLUSTER])

    assert (no_file.exit_code, unknown.exit_code) == (2, 2)
    assert no_file.stderr.startswith("Error: --install writes the configurations of -f")
    assert "Error: Invalid value for '--skip': 'dns' is not one of 'image', 'pods'" in unknown.stderr
