"""ConfigSource on its own: when the file is looked at, and what a bad new version does."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gpuquota_core.conversion import DEFAULT_CONFIG, ConversionConfig
from gpuquota_core.enforcement import Mode
from kubeaccess.conversion_config import read_config_file
from webhook.admission.config_source import ConfigSource

WARN = "enforcement: {checks: {QuotaExceeded: warn}}\n"
DRY_RUN = "enforcement: {checks: {QuotaExceeded: dry-run}}\n"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replace(path: Path, text: str) -> None:
    """A new file renamed over the old one, as an editor or kubelet's atomic writer does."""
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(text, encoding="utf-8")
    scratch.replace(path)


def mode(source: ConfigSource) -> Mode:
    return source.current().enforcement.mode_for("QuotaExceeded")


@pytest.fixture
def file(tmp_path: Path) -> Path:
    path = tmp_path / "conversion.yaml"
    path.write_text(WARN, encoding="utf-8")
    return path


def test_without_a_path_the_config_is_fixed() -> None:
    assert ConfigSource(DEFAULT_CONFIG).current() is DEFAULT_CONFIG


def test_a_replaced_file_is_seen_after_the_interval_and_not_before(file: Path) -> None:
    clock = Clock()
    source = ConfigSource(read_config_file(file), file, clock=clock)
    assert mode(source) is Mode.WARN

    replace(file, DRY_RUN)
    clock.now += 0.5
    assert mode(source) is Mode.WARN  # checked at most once a second
    clock.now += 0.6
    assert mode(source) is Mode.DRY_RUN


def test_the_file_is_not_reread_while_it_is_unchanged(file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    source = ConfigSource(read_config_file(file), file, clock=clock)
    source.current()  # the first check re-reads once
    reads: list[Path] = []
    monkeypatch.setattr("webhook.admission.config_source.read_config_file",
                        lambda path: reads.append(path) or ConversionConfig())

    for _ in range(5):
        clock.now += 2
        source.current()

    assert reads == []


def test_a_version_written_before_the_first_check_is_not_missed(file: Path) -> None:
    startup = read_config_file(file)
    replace(file, DRY_RUN)  # between the master's read and the worker's first request

    assert mode(ConfigSource(startup, file, clock=Clock())) is Mode.DRY_RUN


def test_an_invalid_version_keeps_the_previous_config_and_is_logged_once(
        file: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    source = ConfigSource(read_config_file(file), file, clock=clock)
    source.current()
    caplog.set_level(logging.INFO, logger="gpuquota.webhook")

    replace(file, "enforcement: {checks: {QuotaExceeded: block}}\n")
    for _ in range(3):
        clock.now += 1.5
        assert mode(source) is Mode.WARN

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert (f'"result":"error","path":"{file}","pid":{os.getpid()},"error":"{file}: '
            "enforcement.checks.QuotaExceeded: unknown mode 'block' (expected one of enforce, warn, dry-run)\""
            ) in errors[0].getMessage()

    replace(file, DRY_RUN)  # still watching after the error
    clock.now += 1.5
    assert mode(source) is Mode.DRY_RUN


@pytest.mark.parametrize(("text", "error"), [
    pytest.param("enforcement: [\n", "not valid YAML", id="yaml"),
    pytest.param(None, "cannot read the conversion config: No such file or directory", id="deleted"),
])
def test_unreadable_versions_keep_the_previous_config(file: Path, caplog: pytest.LogCaptureFixture,
                                                      text: str | None, error: str) -> None:
    clock = Clock()
    source = ConfigSource(read_config_file(file), file, clock=clock)
    source.current()
    if text is None:
        file.unlink()
    else:
        replace(file, text)

    clock.now += 1.5
    assert mode(source) is Mode.WARN
    assert error in caplog.text
