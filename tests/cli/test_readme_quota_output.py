"""The `gpuquota quota`, `gpuquota explain` and `gpuquota audit` screens of the README and of
docs/walkthrough.md are what the commands print today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(
    r"<!-- readme-output: gpuquota (?P<args>[^>]+?) -->\n```\n\$ (?P<typed>[^\n]*)\n(?P<shown>.*?)\n```", re.S)
DOCUMENTS = ("README.md", "docs/walkthrough.md")
SCREENS = [(document, m["args"], m["typed"], m["shown"]) for document in DOCUMENTS
           for m in MARKER.finditer((REPO_ROOT / document).read_text(encoding="utf-8"))]


def test_the_documents_have_the_screens() -> None:
    assert [(document, args.split()[0]) for document, args, _, _ in SCREENS] == [
        ("README.md", "quota"), ("docs/walkthrough.md", "explain"), ("docs/walkthrough.md", "explain"),
        ("docs/walkthrough.md", "audit")]


@pytest.mark.parametrize(("document", "args", "typed", "shown"), SCREENS,
                         ids=[f"{document}: {args}" for document, args, _, _ in SCREENS])
def test_the_screen_is_current(document: str, args: str, typed: str, shown: str,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert typed == f"gpuquota {args}"  # the command shown is the command run
    monkeypatch.chdir(REPO_ROOT)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, shlex.split(args))
    assert result.stdout.rstrip("\n") == shown
    assert result.exit_code == (1 if "over-quota" in args or args.startswith("audit") else 0)
