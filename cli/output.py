"""Render rows as a kubectl-style aligned table, or documents as JSON/YAML."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

FORMATS = ("table", "wide", "json", "yaml")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to the widest cell plus three spaces, as kubectl's printer does."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
             for row in [list(headers), *rows]]
    return "\n".join(lines)


def document(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False)
    return yaml.safe_dump(data, sort_keys=False).rstrip("\n")
