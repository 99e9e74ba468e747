"""The -f manifests a command reads: read, or the command ends with one ``Error:`` line.

Empty input is refused, not read as an empty cluster: "No findings", an empty plan or a prune of
every report would each look like a real answer.
"""

from __future__ import annotations

from typing import Any

from kubeaccess.manifests import ManifestError, load_objects

from .errors import CommandError, input_names


def nothing_read(paths: tuple[str, ...], nothing_to: str | None, what: str = "objects") -> CommandError:
    """``no <what> in <inputs>[: nothing to <nothing_to>]``: the refusal of inputs that hold nothing."""
    message = f"no {what} in {input_names(paths)}"
    return CommandError(f"{message}: nothing to {nothing_to}" if nothing_to else message)


def objects_or_fail(paths: tuple[str, ...], nothing_to: str | None, what: str = "objects",
                    origins: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Every object in ``paths``; a file that cannot be read, or inputs that hold none, end the command.
    ``origins``: as for :func:`kubeaccess.manifests.load_objects`."""
    try:
        objects = load_objects(paths, origins)
    except ManifestError as error:
        raise CommandError(str(error)) from None
    if not objects:
        raise nothing_read(paths, nothing_to, what)
    return objects
