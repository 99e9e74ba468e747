"""Entry point of ``gpuquota`` / ``kubectl-gpuquota``.

Each subcommand lives in its own module; this file only assembles the group, so adding a command
never touches another command's code.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import click

# (module, attribute) of every subcommand, in the order ``--help`` lists them.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("cli.serve", "serve"),
    ("cli.convert", "convert"),
    ("cli.certs", "certs"),
    ("cli.audit", "audit"),
    ("cli.migrate", "migrate"),
    ("cli.quota", "quota"),
    ("cli.explain", "explain"),
    ("cli.policyreport", "policyreport"),
    ("cli.preflight", "preflight"),
    ("cli.completion", "completion"),
)

# ``-o=json``: kubectl's flag parser reads ``=`` after a one-letter flag as the start of its value;
# click would take ``=json`` as the value.
_SHORT_WITH_EQUALS = re.compile(r"-([A-Za-z])=(.*)", re.DOTALL)


def split_short_equals(args: list[str]) -> list[str]:
    """``-o=json`` as ``-o json``; everything after ``--`` is left alone."""
    result: list[str] = []
    for position, arg in enumerate(args):
        if arg == "--":
            return result + args[position:]
        match = _SHORT_WITH_EQUALS.fullmatch(arg)
        result.extend([f"-{match.group(1)}", match.group(2)] if match else [arg])
    return result


# A group called without a command shows its help (click raises that as a usage error since 8.2).
_HELP_INSTEAD = tuple(e for e in [getattr(click.exceptions, "NoArgsIsHelpError", None)] if e is not None)


class BriefUsageError(click.ClickException):
    """A usage error in kubectl's two lines: what is wrong, and where help is."""

    exit_code = 2

    def __init__(self, error: click.UsageError) -> None:
        # Some click messages carry a second line (a "did you mean" list): one line here.
        super().__init__(" ".join(error.format_message().split()))
        self.command_path = error.ctx.command_path if error.ctx is not None else "gpuquota"

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}\nSee '{self.command_path} --help' for usage.", err=True)


class KubectlStyleGroup(click.Group):
    """Parses like kubectl (``-o=json``) and reports usage errors in two lines instead of click's four."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, split_short_equals(args), parent, **extra)
        except click.UsageError as error:
            if isinstance(error, _HELP_INSTEAD):
                raise
            raise BriefUsageError(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as error:
            if isinstance(error, _HELP_INSTEAD):
                raise
            raise BriefUsageError(error) from None


@click.group(cls=KubectlStyleGroup, context_settings={"help_option_names": ["-h", "--help"]})
# No prog_name: the version line names the command as typed (`kubectl gpuquota` as a plugin).
@click.version_option(package_name="koord-gpuquota")
def cli() -> None:
    """Canonical GPU requests and ElasticQuota enforcement for Koordinator clusters."""


for _module, _attribute in SUBCOMMANDS:
    try:
        cli.add_command(getattr(importlib.import_module(_module), _attribute))
    except ModuleNotFoundError as _missing:
        if _missing.name != _module:
            raise


def main() -> None:
    # As a kubectl plugin, help and usage errors name the command the user typed.
    plugin = Path(sys.argv[0]).name == "kubectl-gpuquota"
    cli(prog_name="kubectl gpuquota" if plugin else "gpuquota")
