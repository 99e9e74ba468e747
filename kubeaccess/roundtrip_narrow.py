"""The round trip of only the lines a rewrite touches, for ``gpuquota convert -o yaml`` at scale.

ruamel.yaml's round-trip parser and emitter are pure Python and cost milliseconds per pod; given a
whole document (or a ``kubectl get -o yaml`` List of thousands of pods) they read and write every
line of it to change a few. Here libyaml (C) composes the document once, with the line of every
node, and each operation is taken to the smallest block mapping around its target that stands on
lines of its own (``limits:``, ``resources:``, ``metadata:``). Only those lines go through the
round trip (:func:`roundtrip.patch_mapping_text`, the same rules of quoting and comments); every
other line is kept as it is. Where no such mapping exists (a flow-style ``metadata: {...}``, an
anchor shared between nodes, a line that does not dedent cleanly) the caller round-trips the whole
document instead; what this writes is read back and compared by the caller either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpuquota_core.jsonpatch import Operation, escape_pointer_token, unescape_pointer_token

from .manifests import YAML_LOADER, may_share_nodes

Path = tuple[str, ...]
_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# A long annotation value must not be folded onto several lines (as roundtrip._NO_WRAP).
_NO_WRAP = 1 << 16


def patched_lines(chunk: str, root: Node, operations: Sequence[list[Operation]], wanted: Sequence[Any],
                  patch_mapping: Callable[[str, list[Operation]], str], mapping_indent: int = 2) -> str | None:
    """``chunk`` (one YAML document) with each object's ``operations`` applied, or None where the
    touched lines cannot be cut out on their own. ``root``: the chunk as :func:`composed`.
    ``patch_mapping`` applies operations to the text of one block mapping written from column 0 and
    returns its new text.

    Each mapping written anew is read back on its own and must equal its place in ``wanted`` (the
    objects the operations make): the lines around it are as they were read, and a block mapping
    that starts its own line and is indented as a whole reads the same wherever it stands, so the
    document need not be read again (that second read was most of the time of a large List).

    A new key whose value is a map of text (the original-resources annotation where a pod has no
    annotations yet) is not a round trip of its whole parent (``metadata``, most of a pod's lines):
    its lines are written after the parent's last line, at the parent's column, as libyaml writes them.
    """
    if may_share_nodes(chunk) or any("from" in op for ops in operations for op in ops):
        return None
    objects = _object_paths(root, ())
    if len(objects) != len(operations) or len(objects) != len(wanted):
        return None
    wanted_at = dict(zip(objects, wanted, strict=True))
    lines = chunk.splitlines(keepends=True)
    by_unit: dict[Path, list[tuple[Path, Operation]]] = {}
    appended: list[tuple[Path, Operation]] = []  # new keys written after their parent's lines
    for object_path, object_operations in zip(objects, operations, strict=True):
        for operation in object_operations:
            path = str(operation.get("path", ""))
            tokens = tuple(unescape_pointer_token(t) for t in path[1:].split("/")) if path else ()
            if not tokens:
                return None  # the whole object replaced
            target = object_path + tokens
            if _appendable(root, target, operation, lines):
                appended.append((target, operation))
                continue
            unit = _unit(root, target[:-1], lines)
            if unit is None:
                return None
            by_unit.setdefault(unit, []).append((target, operation))
    edits: list[tuple[int, int, int, list[str]]] = []  # (first line, last line, column, new lines)
    for target, operation in appended:
        # Inside a mapping that is round-tripped anyway: one more operation of it.
        around = _outermost(target, by_unit)
        if around is not None:
            by_unit[around].append((target, operation))
            continue
        parent = _node_at(root, target[:-1])
        assert isinstance(parent, MappingNode)
        written = yaml.dump({target[-1]: operation["value"]}, Dumper=_DUMPER, default_flow_style=False,
                            sort_keys=False, width=_NO_WRAP, indent=mapping_indent, allow_unicode=True)
        if yaml.load(written, Loader=YAML_LOADER) != {target[-1]: operation["value"]}:
            return None
        after = _last_line(parent)
        column = parent.start_mark.column
        edits.append((after + 1, after, column, [" " * column + line for line in written.splitlines(keepends=True)]))
    # A unit inside another unit is edited as part of the outer one.
    merged: dict[Path, list[tuple[Path, Operation]]] = {}
    for unit in sorted(by_unit, key=len):
        merged.setdefault(_outermost(unit, merged) or unit, []).extend(by_unit[unit])
    for unit, targeted in merged.items():
        node = _node_at(root, unit)
        assert isinstance(node, MappingNode)
        start, end, column = node.start_mark.line, _last_line(node), node.start_mark.column
        text = "".join(line[column:] if line.strip() else line for line in lines[start:end + 1])
        relative = [{**operation, "path": "/" + "/".join(escape_pointer_token(t) for t in target[len(unit):])}
                    for target, operation in targeted]
        written = patch_mapping(text, relative)
        if not _reads_as(written, _wanted_at(wanted_at, unit)):
            return None
        edits.append((start, end, column, [(" " * column + line) if line.strip() else line
                                           for line in written.splitlines(keepends=True)]))
    # Top down into a new list: one pass over the lines, however many edits.
    out: list[str] = []
    kept_from = 0
    for start, end, _, new_lines in sorted(edits, key=lambda edit: (edit[0], edit[1])):
        out += lines[kept_from:start]
        out += new_lines
        kept_from = end + 1
    out += lines[kept_from:]
    return "".join(out)


def _wanted_at(wanted_at: dict[Path, Any], path: Path) -> Any:
    """What ``wanted`` holds at ``path`` (a path of the document: the object's path, then inside it)."""
    object_path = next(path[:depth] for depth in range(len(path), -1, -1) if path[:depth] in wanted_at)
    value = wanted_at[object_path]
    for token in path[len(object_path):]:
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return _MISSING
    return value


_MISSING = object()


def _reads_as(text: str, expected: Any) -> bool:
    try:
        return expected is not _MISSING and yaml.load(text, Loader=YAML_LOADER) == expected
    except yaml.YAMLError:
        return False


def _outermost(path: Path, units: dict[Path, Any]) -> Path | None:
    """The shortest of ``units`` that ``path`` is at or below."""
    return next((path[:depth] for depth in range(1, len(path) + 1) if path[:depth] in units), None)


def _appendable(root: Node, target: Path, operation: Operation, lines: list[str]) -> bool:
    """An ``add`` of a key its block mapping lacks, whose value is a map of text (nothing a round
    trip would quote after its neighbours or lay out as a sequence)."""
    value = operation.get("value")
    if operation.get("op") != "add" or not isinstance(value, dict) or not target:
        return False
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return False
    parent = _node_at(root, target[:-1])
    return (isinstance(parent, MappingNode) and not parent.flow_style and bool(parent.value)
            and len(target) > 1 and _stands_alone(parent, lines) and _node_at(parent, target[-1:]) is None
            # A block scalar last ("|+" keeps the blank lines after it): lines written after it
            # would change it, and only the new lines are read back.
            and not _is_block_scalar(_last_node(parent)))


def composed(chunk: str) -> tuple[Node | None, int] | None:
    """One document's node tree and how many objects it holds (``kind: List`` flattened), or None
    where it cannot be read: composed by libyaml, without building the objects."""
    try:
        root = yaml.compose(chunk, Loader=YAML_LOADER)
    except yaml.YAMLError:
        return None
    return root, 0 if root is None else len(_object_paths(root, ()))


def _object_paths(node: Node, path: Path) -> list[Path]:
    """Where each object of a document is: the document, or the items of a ``kind: List``, flattened
    as :func:`manifests.parse_documents` flattens them."""
    if isinstance(node, MappingNode):
        fields = {key.value: value for key, value in node.value if isinstance(key, ScalarNode)}
        kind, items = fields.get("kind"), fields.get("items")
        if isinstance(kind, ScalarNode) and kind.value.endswith("List") and isinstance(items, SequenceNode):
            return [p for index, item in enumerate(items.value)
                    for p in _object_paths(item, (*path, "items", str(index)))]
    return [path]


def _node_at(root: Node, path: Path) -> Node | None:
    node: Node | None = root
    for token in path:
        if isinstance(node, MappingNode):
            node = next((value for key, value in node.value if isinstance(key, ScalarNode) and key.value == token),
                        None)
        elif isinstance(node, SequenceNode) and token.isdigit() and int(token) < len(node.value):
            node = node.value[int(token)]
        else:
            return None
    return node


def _unit(root: Node, parent: Path, lines: list[str]) -> Path | None:
    """The deepest block mapping at or above ``parent`` (never the document itself) whose lines can
    be cut out: it starts its line, and every line down to its last holds only it."""
    nodes: list[Node] = [root]
    for depth in range(1, len(parent) + 1):
        node = _node_at(nodes[-1], parent[depth - 1:depth])
        if node is None:
            return None
        nodes.append(node)
    for depth in range(len(parent), 0, -1):
        node = nodes[depth]
        if isinstance(node, MappingNode) and not node.flow_style and node.value and _stands_alone(node, lines):
            return parent[:depth]
    return None


def _stands_alone(node: MappingNode, lines: list[str]) -> bool:
    start, column = node.start_mark.line, node.start_mark.column
    if lines[start][:column].strip():
        return False  # "- key: ..." or "key: {": the first line holds more than this mapping
    for line in lines[start + 1:_last_line(node) + 1]:
        stripped = line.lstrip(" ")
        if stripped.strip() and len(line) - len(stripped) < column:
            return False  # a comment left of the mapping: it would not dedent
    return True


def _is_block_scalar(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.style in ("|", ">")


def _last_node(node: Node) -> Node:
    """The node a block collection ends with (itself for a scalar or a flow collection)."""
    while isinstance(node, MappingNode | SequenceNode) and not node.flow_style and node.value:
        last: Any = node.value[-1]
        node = last[1] if isinstance(node, MappingNode) else last
    return node


def _last_line(node: Node) -> int:
    """The line of a node's last character (its trailing comment lines belong to what follows)."""
    node = _last_node(node)
    end = node.end_mark
    # A block scalar (and a plain one at a line's end) ends at the start of the next line.
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line
