"""The README's `gpuquota quota`, `gpuquota explain` and `gpuquota audit` screens are what the commands
print today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!-- readme-output: gpuquota (?P<args>[^>]+?) -->\n```\n\$ [^\n]*\n(?P<shown>.*?)\n```", re.S)
SCREENS = [(m["args"], m["shown"]) for m in MARKER.finditer((REPO_ROOT / "README.md").read_text(encoding="utf-8"))]


def test_the_readme_has_the_screens() -> None:
    assert [args.split()[0] for args, _ in SCREENS] == ["quota", "explain", "explain", "audit"]


@pytest.mark.parametrize(("args", "shown"), SCREENS, ids=[args for args, _ in SCREENS])
def test_readme_screen_is_current(args: str, shown: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, shlex.split(args))
    assert result.stdout.rstrip("\n") == shown
    assert result.exit_code == (1 if "over-quota" in args or args.startswith("audit") else 0)
