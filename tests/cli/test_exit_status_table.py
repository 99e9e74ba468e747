"""docs/cli.md's table of exit statuses: every example it gives ends with the status of its row."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = (REPO_ROOT / "docs" / "cli.md").read_text()
TABLE = DOCS.split("## Exit status\n", 1)[1].split("\n\n", 2)[1]
ROWS = {int(status): row for status, row in re.findall(r"^\| (\d+) \|(.*)$", TABLE, re.MULTILINE)}


def examples() -> list[tuple[int, str]]:
    return [(status, line) for status, row in ROWS.items()
            for line in re.findall(r"`(gpuquota [^`|]+)`", row.rsplit("|", 2)[-2])]


def test_the_table_has_every_status_the_cli_ends_with() -> None:
    assert sorted(ROWS) == [0, 1, 2, 3, 4, 130, 141]
    assert "test_closed_pipe.py" in ROWS[141] and "test_closed_pipe.py" in ROWS[130]  # real pipes and signals there
    assert {status for status, _ in examples()} == {0, 1, 2, 3, 4}


@pytest.mark.parametrize(("status", "line"), examples())
def test_every_example_ends_with_its_rows_status(status: int, line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # the examples name files of the repository

    result = CliRunner().invoke(cli, shlex.split(line)[1:])

    assert result.exit_code == status, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
