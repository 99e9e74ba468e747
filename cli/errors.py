"""How every subcommand fails: one line on stderr, exit status 2, never a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from kubeaccess.kube import KubeAccessError

USAGE_EXIT = 2


class CommandError(click.ClickException):
    """A usage, file or connection error the user can fix; click prints ``Error: <message>``."""

    exit_code = USAGE_EXIT


def input_names(paths: tuple[str, ...] | list[str]) -> str:
    """The -f arguments as a message names them (``-`` is standard input)."""
    return ", ".join("<stdin>" if path == "-" else str(path) for path in paths)


def cluster_error(error: KubeAccessError) -> CommandError:
    """A cluster that cannot be used, as one line; where none is configured at all, with the running
    command's own hint (cli/hints.py: what it could be given instead)."""
    from kubeaccess.kube import NoClusterFound

    from .hints import NO_CLUSTER

    if isinstance(error, NoClusterFound):
        hint = NO_CLUSTER.get(_command_path())
        if hint is not None:
            return CommandError(f"{error}: {hint()}")
    return CommandError(str(error))


def _command_path() -> str:
    """The running command below the root (``migrate apply``), whatever the root is called."""
    names: list[str] = []
    context = click.get_current_context(silent=True)
    while context is not None and context.parent is not None:
        names.append(context.info_name or "")
        context = context.parent
    return " ".join(reversed(names))
