"""Entry point of ``gpuquota`` / ``kubectl-gpuquota``.

Each subcommand lives in its own module; this file only assembles the group, so adding a command
never touches another command's code.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from .completion import COMPLETE_VAR
from .inputs import exit_status

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


def end_by_signal(number: signal.Signals) -> NoReturn:
    """End as ``cat`` and ``kubectl`` do: killed by the signal, which a shell reports as 128 + its
    number (141 for SIGPIPE, 130 for SIGINT) and a script's loop sees as an interruption.

    Python turns both into exceptions (a write to a closed pipe raises, Ctrl-C raises
    KeyboardInterrupt), and click would end with exit 1, the status of findings and refusals. SIGPIPE
    stays ignored everywhere else: a connection to the API server that breaks must be an error the
    command reports, not a silent death.
    """
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)  # not reached: the signal ends the process first


@contextlib.contextmanager
def _ends_as_signalled() -> Iterator[None]:
    # A socket's broken pipe reaches the commands as the HTTP client's own error (urllib3 wraps
    # it); one that reaches here is a write to standard output or error.
    try:
        yield
    except BrokenPipeError:
        end_by_signal(signal.SIGPIPE)
    except KeyboardInterrupt:
        end_by_signal(signal.SIGINT)


class KubectlStyleGroup(click.Group):
    """Parses like kubectl (``-o=json``) and reports usage errors in two lines instead of click's four;
    ends quietly, as killed by the signal, when its output pipe is closed or on Ctrl-C."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            with _ends_as_signalled():  # --help and --version print while parsing
                return super().make_context(info_name, split_short_equals(args), parent, **extra)
        except click.UsageError as error:
            if isinstance(error, _HELP_INSTEAD):
                raise
            raise BriefUsageError(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _ends_as_signalled():
                result = super().invoke(ctx)
        except click.UsageError as error:
            if isinstance(error, _HELP_INSTEAD):
                raise
            raise BriefUsageError(error) from None
        except SystemExit as end:
            # A command that left part of its input out says so in its status (cli/inputs.py).
            if isinstance(end.code, int) and exit_status(end.code) != end.code:
                raise SystemExit(exit_status(end.code)) from None
            raise
        if exit_status(0):
            raise SystemExit(exit_status(0))
        return result


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


class _WholeWrites(io.RawIOBase):
    """A file descriptor that takes each write whole or raises.

    The standard streams' buffered writer may report a write to a pipe whose reader has just gone
    as done when the kernel took only part of it, and the text layer never looks: the rest of a
    large document (an audit's JSON, convert's output) would be dropped without an error, and the
    command would end 0 into a closed pipe. Here a short write is continued, so a closed pipe is a
    BrokenPipeError on the spot.
    """

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            view = view[os.write(self._fd, view):]
        return total


def _whole_writes(stream: Any) -> Any:
    """``stream`` (sys.stdout or sys.stderr) rebuilt over :class:`_WholeWrites`, same encoding and buffering."""
    if not isinstance(stream, io.TextIOWrapper):
        return stream
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return stream
    stream.flush()
    return io.TextIOWrapper(io.BufferedWriter(_WholeWrites(fd)), encoding=stream.encoding, errors=stream.errors,
                            line_buffering=stream.line_buffering, write_through=stream.write_through)


def main() -> None:
    sys.stdout, sys.stderr = _whole_writes(sys.stdout), _whole_writes(sys.stderr)
    # As a kubectl plugin, help and usage errors name the command the user typed.
    plugin = Path(sys.argv[0]).name == "kubectl-gpuquota"
    # One completion variable for both names (cli/completion.py): click would derive another from
    # "kubectl gpuquota", which no completion script sets.
    cli(prog_name="kubectl gpuquota" if plugin else "gpuquota", complete_var=COMPLETE_VAR)
