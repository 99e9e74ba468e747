"""RFC 6902 JSON Patch computed from an original and a changed document.

Handlers change a copy of the object and never write patch operations by hand, so escaping of
``/`` and ``~`` in resource names (``nvidia.com~1gpu``) lives in exactly one place.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Operation = dict[str, Any]


def escape_pointer_token(token: str) -> str:
    # Order matters: "~" first, or the "~1" produced for "/" would be escaped again.
    return token.replace("~", "~0").replace("/", "~1")


def unescape_pointer_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def diff(original: Any, changed: Any, path: str = "") -> list[Operation]:
    """Operations that turn ``original`` into ``changed``; empty when they are equal."""
    if isinstance(original, Mapping) and isinstance(changed, Mapping):
        operations: list[Operation] = []
        for key in original:
            if key not in changed:
                operations.append({"op": "remove", "path": f"{path}/{escape_pointer_token(str(key))}"})
        for key, value in changed.items():
            child = f"{path}/{escape_pointer_token(str(key))}"
            if key not in original:
                operations.append({"op": "add", "path": child, "value": value})
            else:
                operations.extend(diff(original[key], value, child))
        return operations
    if isinstance(original, list) and isinstance(changed, list) and len(original) == len(changed):
        return [op for index, (old, new) in enumerate(zip(original, changed, strict=True))
                for op in diff(old, new, f"{path}/{index}")]
    if type(original) is type(changed) and original == changed:
        return []
    if path == "":
        return [{"op": "replace", "path": "", "value": changed}]
    return [{"op": "replace", "path": path, "value": changed}]


def apply(document: Any, operations: list[Operation]) -> Any:
    """A small, strict applier for the operations :func:`diff` emits (used by tests and the CLI)."""


    result = copy.deepcopy(document)
    for operation in operations:
        tokens = [unescape_pointer_token(t) for t in operation["path"].split("/")[1:]]
        if not tokens:
            result = copy.deepcopy(operation["value"])
            continue
        parent = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last: Any = int(tokens[-1]) if isinstance(parent, list) else tokens[-1]
        if operation["op"] == "remove":
            del parent[last]
        elif operation["op"] in ("add", "replace"):
            if operation["op"] == "replace" and not isinstance(parent, list) and last not in parent:
                raise KeyError(operation["path"])
            parent[last] = copy.deepcopy(operation["value"])
        else:
            raise ValueError(f"unsupported op {operation['op']}")
    return result
