"""The -f manifests a command reads: read, or the command ends with one ``Error:`` line.

Empty input is refused, not read as an empty cluster: "No findings", an empty plan or a prune of
every report would each look like a real answer.

The commands that judge manifests (audit, convert, explain, quota, migrate plan) read a folder as
``kubectl apply -f`` does: a file or document that is not a Kubernetes object is left out and named
on stderr (``skipped: FILE:LINE:COLUMN: why``), every other object is judged, and the command ends
with :data:`SKIPPED_EXIT`. Only input of which nothing at all can be read is an ``Error:``. The
commands that write to a cluster from a file (``policyreport apply``, ``preflight --install``)
refuse the whole input instead: a report left out would be pruned, a webhook left out not installed.
"""

from __future__ import annotations

from typing import Any

import click

from kubeaccess.manifests import ManifestError, ManifestRead, load_objects, read_manifests

from .errors import CommandError, input_names

# Done, but part of the input was left out: the answer is about the rest only. It wins over 1 (a
# "no" about part of the input is not the answer about all of it); the findings are still printed.
SKIPPED_EXIT = 3
_SKIPPED_KEY = "gpuquota.skipped-input"


def nothing_read(paths: tuple[str, ...], nothing_to: str | None, what: str = "objects") -> CommandError:
    """``no <what> in <inputs>[: nothing to <nothing_to>]``: the refusal of inputs that hold nothing."""
    message = f"no {what} in {input_names(paths)}"
    return CommandError(f"{message}: nothing to {nothing_to}" if nothing_to else message)


def objects_or_fail(paths: tuple[str, ...], nothing_to: str | None, what: str = "objects",
                    origins: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Every object in ``paths``; a file that cannot be read, or inputs that hold none, end the command.
    ``origins``: as for :func:`kubeaccess.manifests.load_objects`. For commands that write what they read."""
    try:
        objects = load_objects(paths, origins)
    except ManifestError as error:
        raise CommandError(str(error)) from None
    if not objects:
        raise nothing_read(paths, nothing_to, what)
    return objects


def readable_manifests(paths: tuple[str, ...], nothing_to: str | None) -> ManifestRead:
    """What ``paths`` hold that can be read; each file or document left out is said on stderr and
    remembered for the exit status (:func:`exit_status`). Nothing readable at all ends the command."""
    try:
        read = read_manifests(paths)
    except ManifestError as error:
        raise CommandError(str(error)) from None
    except RecursionError:
        # PyYAML's constructor recurses: a hostile document nested thousands deep ends here.
        raise CommandError("input is nested too deeply to read") from None
    if not read.objects:
        if read.skipped:
            more = f" (and {len(read.skipped) - 1} more left out)" if len(read.skipped) > 1 else ""
            raise CommandError(read.skipped[0] + more)
        raise nothing_read(paths, nothing_to)
    for why in read.skipped:
        click.echo(f"skipped: {why}", err=True)
    if read.skipped:
        context = click.get_current_context(silent=True)
        if context is not None:
            context.find_root().meta[_SKIPPED_KEY] = True
    return read


def readable_objects(paths: tuple[str, ...], nothing_to: str | None,
                     origins: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """:func:`readable_manifests`' objects; ``origins`` filled with ``id(object)`` -> its file."""
    read = readable_manifests(paths, nothing_to)
    if origins is not None:
        origins.update((id(obj), source.source) for source in read.sources for obj in source.objects)
    return read.objects


def input_was_skipped() -> bool:
    context = click.get_current_context(silent=True)
    return context is not None and bool(context.find_root().meta.get(_SKIPPED_KEY))


def exit_status(status: int) -> int:
    """The command's own status, or :data:`SKIPPED_EXIT` where it answered only part of its input."""
    return SKIPPED_EXIT if status in (0, 1, 4) and input_was_skipped() else status
