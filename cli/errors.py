"""How every subcommand fails: one line on stderr, exit status 2, never a traceback."""

from __future__ import annotations

import click

USAGE_EXIT = 2


class CommandError(click.ClickException):
    """A usage, file or connection error the user can fix; click prints ``Error: <message>``."""

    exit_code = USAGE_EXIT


def input_names(paths: tuple[str, ...] | list[str]) -> str:
    """The -f arguments as a message names them (``-`` is standard input)."""
    return ", ".join("<stdin>" if path == "-" else str(path) for path in paths)
