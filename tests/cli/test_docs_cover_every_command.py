"""docs/cli.md has a section for every command the CLI has, with its synopsis, every option, examples
and exit status, read from the commands themselves (a new flag without its documentation fails)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cli.main import cli

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()


def leaf_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def section(path: tuple[str, ...]) -> str:
    match = re.search(rf"^# CLI: {re.escape(' '.join(path))}\n(.*?)(?=^# CLI: |\Z)", DOCS, re.M | re.S)
    assert match is not None, f"docs/cli.md has no '# CLI: {' '.join(path)}' section"
    return match.group(1)


COMMANDS = sorted(leaf_commands(cli))


def test_every_command_is_found() -> None:
    assert {" ".join(path) for path, _ in COMMANDS} >= {
        "serve", "convert", "certs generate", "certs client", "audit", "quota", "explain",
        "migrate plan", "migrate apply", "migrate rollback"}


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_section_has_synopsis_options_examples_and_exit_status(path: tuple[str, ...], command: click.Command) -> None:
    text = section(path)
    assert re.search(rf"^    gpuquota {re.escape(' '.join(path))}\b", text, re.M), "synopsis"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden and "--help" not in param.opts:
            assert any(f"`{opt}" in text or f"[{opt}" in text or f" {opt} " in text or f"{opt}]" in text
                       or f"{opt}\n" in text for opt in param.opts), f"option {param.opts} of {' '.join(path)}"
    assert "Examples:" in text, "examples"
    examples = text.split("Examples:", 1)[1]
    assert re.search(r"^    (?:kubectl )?gpuquota " + re.escape(" ".join(path)) + r" ", examples, re.M), "example"
    assert re.search(r"Exit status", text), "exit status"
