"""Render rows as a kubectl-style aligned table, or documents as JSON/YAML; whether output goes to a
terminal (colour, fitted widths) or a pipe (plain text)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson
import yaml

from gpuquota_core.quota_objects import ELASTICQUOTA_GROUP

FORMATS = ("table", "wide", "name", "json", "yaml")
COLOUR_CHOICES = ("auto", "always", "never")

# kubectl's `-o name` prefix per kind: the resource (plural-less, lower case) and its API group
# (none for the core group), so the lines can be handed back to kubectl.
RESOURCE_NAMES = {
    "Pod": "pod", "Node": "node", "ResourceQuota": "resourcequota", "PodTemplate": "podtemplate",
    "ReplicationController": "replicationcontroller",
    "ElasticQuota": f"elasticquota.{ELASTICQUOTA_GROUP}",
    "Deployment": "deployment.apps", "StatefulSet": "statefulset.apps", "DaemonSet": "daemonset.apps",
    "ReplicaSet": "replicaset.apps", "Job": "job.batch", "CronJob": "cronjob.batch",
}


def object_name(kind: str, name: str) -> str:
    """``kind.group/name`` as ``kubectl get -o name`` prints it (no namespace: kubectl leaves it out)."""
    return f"{RESOURCE_NAMES.get(kind, kind.lower())}/{name}"


def on_terminal() -> bool:
    """Whether standard output is a terminal (a function so that tests can say it is)."""
    return sys.stdout.isatty()


def use_colour(choice: str) -> bool:
    """``--color auto|always|never``: auto is a terminal without ``NO_COLOR`` set (no-color.org).
    Every command decides colour here."""
    if choice == "auto":
        return on_terminal() and not os.environ.get("NO_COLOR")
    return choice == "always"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to the widest cell plus three spaces, as kubectl's printer does."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
             for row in [list(headers), *rows]]
    return "\n".join(lines)


def document(data: Any, fmt: str, *, plain: bool = False) -> str:
    """``data`` as indented JSON (``json.dumps(indent=2)``) or block YAML.

    ``plain``: the caller promises that ``data`` holds only dicts with str keys, lists, str, int,
    bool and None (no floats: orjson writes some differently, ``0.00001`` for ``1e-05``, ``null`` for
    ``Infinity``).
    Such a document is written by orjson, byte for byte what ``json.dumps`` writes, since the
    standard library's indenting encoder is pure Python and many times slower on a large audit's
    report (docs/benchmarks.md, "Mechanisms kept").
    """
    if fmt == "json":
        fast = _orjson_indented(data) if plain else None
        return fast if fast is not None else json.dumps(data, indent=2, sort_keys=False)
    return yaml.safe_dump(data, sort_keys=False).rstrip("\n")


def _refuse(value: object) -> Any:
    raise TypeError(f"not plain JSON: {type(value).__name__}")


# Subclasses of str/int/dict/list, dataclasses and datetimes go to _refuse instead of orjson's own
# encoding of them, so anything unusual ends up with json.dumps and its own result or error.
_ORJSON_OPTIONS = (orjson.OPT_INDENT_2 | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                   | orjson.OPT_PASSTHROUGH_DATETIME)


def _orjson_indented(data: Any) -> str | None:
    """orjson's text when it is exactly json.dumps(indent=2)'s, else None.

    The layouts agree (two-space indent, "," at line ends, ": " after keys), and so do the escapes of
    ``"``, ``\\`` and control characters; json.dumps also escapes every character beyond ``~``
    (non-ASCII and DEL) where orjson writes it as is, so such output is left to json.dumps. Integers
    beyond 64 bits and non-str keys make orjson raise, and json.dumps takes over too.
    """
    try:
        out = orjson.dumps(data, default=_refuse, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, TypeError):
        return None
    if not out.isascii() or b"\x7f" in out:
        return None
    return out.decode("ascii")
