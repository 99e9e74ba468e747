"""RFC 6902 JSON Patch computed from an original and a changed document.

Handlers change a copy of the object and never write patch operations by hand, so escaping of
``/`` and ``~`` in resource names (``nvidia.com~1gpu``) lives in exactly one place.

Documents come from outside (an AdmissionReview may nest objects 1,000 levels deep), so copying,
diffing and applying use explicit stacks instead of recursion: depth costs memory, never a
``RecursionError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

Operation = dict[str, Any]

# RFC 6901 array index: "0" or a number without leading zeros ("-" is handled separately).
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")


class PatchError(ValueError):
    """A patch that cannot be applied to the document (bad path, missing member, unknown op)."""


def escape_pointer_token(token: str) -> str:
    # Order matters: "~" first, or the "~1" produced for "/" would be escaped again.
    return token.replace("~", "~0").replace("/", "~1")


def unescape_pointer_token(token: str) -> str:
    # RFC 6901 §4: "~1" first, then "~0", so "~01" decodes to "~1" and not to "/".
    return token.replace("~1", "/").replace("~0", "~")


def copy_json(value: Any) -> Any:
    """A deep copy of dicts and lists (other values are immutable JSON scalars and are shared)."""
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            if isinstance(child, dict | list):
                copied: Any = {} if isinstance(child, dict) else []
                stack.append((child, copied))
            else:
                copied = child
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
    return root


def _same_scalar(original: Any, changed: Any) -> bool:
    # True == 1 in Python but not in JSON: a bool replacing an int is a change.
    return type(original) is type(changed) and original == changed


def diff(original: Any, changed: Any, path: str = "") -> list[Operation]:
    """Operations that turn ``original`` into ``changed``; empty when they are equal.

    Objects are compared member by member (removals first, then additions and changes in the
    changed object's key order); lists of equal length element by element; anything else that
    differs is replaced whole. Values placed in operations are copies, never shared with ``changed``.
    """
    operations: list[Operation] = []
    # Work items, processed last-in first-out: ("diff", a, b, path) or ("op", operation).
    stack: list[tuple[str, Any, Any, str]] = [("diff", original, changed, path)]
    while stack:
        item, left, right, where = stack.pop()
        if item == "op":
            operations.append(left)
            continue
        if left is right:
            continue
        pending: list[tuple[str, Any, Any, str]] = []
        # JSON objects are dicts; the exact type test first spares the Mapping ABC check (a
        # noticeable part of a diff) on every node.
        if (type(left) is dict or isinstance(left, Mapping)) and (type(right) is dict or isinstance(right, Mapping)):
            for key in left:
                if key not in right:
                    pending.append(("op", {"op": "remove", "path": f"{where}/{escape_pointer_token(str(key))}"},
                                    None, ""))
            for key, value in right.items():
                # Shared subtrees (canonical.canonical_view keeps every unchanged one) are skipped
                # before their pointer is even built: most of a pod is shared.
                if key not in left:
                    child = f"{where}/{escape_pointer_token(str(key))}"
                    pending.append(("op", {"op": "add", "path": child, "value": copy_json(value)}, None, ""))
                elif left[key] is not value:
                    pending.append(("diff", left[key], value, f"{where}/{escape_pointer_token(str(key))}"))
        elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
            pending = [("diff", old, new, f"{where}/{index}")
                       for index, (old, new) in enumerate(zip(left, right, strict=True)) if old is not new]
        elif isinstance(left, Mapping | list) or isinstance(right, Mapping | list) or not _same_scalar(left, right):
            pending = [("op", {"op": "replace", "path": where, "value": copy_json(right)}, None, "")]
        stack.extend(reversed(pending))
    return operations


def _tokens(path: object) -> list[str]:
    if not isinstance(path, str):
        raise PatchError(f"path must be a string, not {type(path).__name__}")
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} must be empty or start with /")
    return [unescape_pointer_token(token) for token in path[1:].split("/")]


def _index(container: list[Any], token: str, path: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(container)
    if not _ARRAY_INDEX.fullmatch(token):
        raise PatchError(f"{path}: {token!r} is not an array index")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"{path}: index {index} is out of range")
    return index


def _child(parent: Any, token: str, path: str) -> Any:
    if isinstance(parent, list):
        return parent[_index(parent, token, path, allow_end=False)]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"{path}: member {token!r} does not exist")
        return parent[token]
    raise PatchError(f"{path}: cannot descend into {type(parent).__name__}")


def apply(document: Any, operations: list[Operation]) -> Any:
    """Apply ``add``, ``remove`` and ``replace`` with RFC 6902 semantics; the input is not modified.

    Strict on purpose (used by tests to check what the webhook sends): a missing member or an index
    out of range is a :class:`PatchError`, as the API server would refuse it.
    """
    return apply_in_place(copy_json(document), operations)


def apply_in_place(document: Any, operations: list[Operation]) -> Any:
    """:func:`apply` on ``document`` itself, which may be any dict and list subclasses (a YAML
    round-trip document keeps its comments and layout); returns it, or the new whole document
    if an operation replaces that. Values are inserted as plain copies.
    """
    result = document
    for operation in operations:
        op, path = operation.get("op"), operation.get("path")
        tokens = _tokens(path)
        if op not in ("add", "remove", "replace"):
            raise PatchError(f"unsupported op {op!r}")
        if op != "remove" and "value" not in operation:
            raise PatchError(f"{path}: {op} needs a value")
        if not tokens:
            if op == "remove":
                raise PatchError("cannot remove the whole document")
            result = copy_json(operation["value"])
            continue
        parent = result
        for token in tokens[:-1]:
            parent = _child(parent, token, str(path))
        last = tokens[-1]
        if isinstance(parent, list):
            index = _index(parent, last, str(path), allow_end=op == "add")
            if op == "add":
                parent.insert(index, copy_json(operation["value"]))
            elif op == "remove":
                del parent[index]
            else:
                parent[index] = copy_json(operation["value"])
        elif isinstance(parent, dict):
            if op != "add" and last not in parent:
                raise PatchError(f"{path}: member {last!r} does not exist")
            if op == "remove":
                del parent[last]
            else:
                parent[last] = copy_json(operation["value"])
        else:
            raise PatchError(f"{path}: cannot descend into {type(parent).__name__}")
    return result
