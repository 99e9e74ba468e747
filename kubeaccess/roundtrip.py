"""Rewritten manifests in the input's own layout, for ``gpuquota convert``.

GitOps repositories review the output of ``convert`` as a diff: it must show the resource change
and nothing else. The rewrite is the core's (its JSON patch per object); this module only applies
those operations to a round-trip parse (ruamel.yaml keeps comments, key order, flow or block style
and quoting) of the mappings they touch (:mod:`roundtrip_narrow`), or of the whole document where
those cannot be cut out, and writes it back. What is written anew is read again the way every
manifest is read (:func:`manifests.parse_documents`) and must equal the core's objects exactly;
when it does not (anchors shared by two rewritten containers, YAML 1.1 spellings the round-trip
parser reads differently) the objects are written plainly instead, with a note saying so.

The comments are moved through ruamel's comment table, which is not public API. An installed
ruamel.yaml that is not a tested release (:data:`kubeaccess.library_pins.RUAMEL_YAML`) is not
trusted with it: every file is then written plainly, with a note naming the release. This is
deliberate: the conversion itself (the core's) does not depend on ruamel, so ``convert`` still
converts and only the layout is lost, where a refusal would stop a GitOps rewrite over a cosmetic.
"""

from __future__ import annotations

import importlib.metadata
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError as RoundTripYAMLError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString
from yaml.nodes import Node

from gpuquota_core.jsonpatch import Operation, PatchError, apply_in_place, unescape_pointer_token

from . import library_pins
from .manifests import DOCUMENT_MARKER, ManifestError, ManifestSource, parse_documents, split_documents
from .roundtrip_narrow import composed, patched_lines

# A long annotation value must not be folded onto several lines.
_NO_WRAP = 1 << 16
_QUOTED = (DoubleQuotedScalarString, SingleQuotedScalarString)
# "key:" (maybe with a comment) opening a nested block, and the line after it.
_BLOCK_KEY = re.compile(r"(\s*)(- )?[^#\s][^#]*:\s*(#.*)?")


class RoundTripError(ValueError):
    """The input's layout cannot be kept for this file; the message says why."""


def untested_ruamel(version_of: Callable[[str], str] = importlib.metadata.version) -> str | None:
    """Why the installed ruamel.yaml cannot be trusted to keep a layout, or None when it is as tested."""
    try:
        library_pins.check_libraries([library_pins.RUAMEL_YAML], version_of)
    except library_pins.LibraryMismatch as mismatch:
        return str(mismatch)
    return None


def render_yaml(sources: Sequence[ManifestSource], patches: Sequence[list[Operation]],
                expected: Sequence[dict[str, Any]]) -> tuple[str, list[str]]:
    """Every source with its objects' ``patches`` applied, as YAML; and notes for stderr.

    ``patches`` and ``expected`` (the core's rewritten objects) follow the sources' objects in order.
    """
    parts: list[str] = []
    notes: list[str] = []
    position = 0
    untested = untested_ruamel()
    for source in sources:
        count = len(source.objects)
        wanted = list(expected[position:position + count])
        operations = list(patches[position:position + count])
        position += count
        if not count:
            continue
        if source.source.endswith(".json") or source.text.lstrip().startswith(("{", "[")):
            parts.append(_plain(wanted))  # JSON has no comments to keep; YAML out, as before
            continue
        try:
            if untested:
                raise RoundTripError(untested)
            parts.append(_patched(source, operations, wanted))
        except RoundTripError as error:
            notes.append(f"{source.source}: written without its comments and layout: {error}")
            parts.append(_plain(wanted))
    text = ""
    for part in parts:
        if text and not _preamble(part):
            text += "---\n"
        text += part if part.endswith("\n") else part + "\n"
    return text, notes


def _plain(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def _patched(source: ManifestSource, operations: list[list[Operation]], wanted: list[dict[str, Any]]) -> str:
    """The source's text, document by document: unchanged documents verbatim, the others patched."""
    mapping_indent, offset = guess_indent(source.text)
    pieces: list[str] = []
    position = 0
    # Whether every document is known to read as wanted: unchanged ones are the text that was read,
    # each patched one is read back on its own; else the whole text is read back at the end.
    verified = True
    for chunk in split_documents(source.text):
        tree = composed(chunk)  # by libyaml: no objects built to count them
        if tree is None:
            raise RoundTripError("its documents cannot be read one at a time")
        node, count = tree
        chunk_operations = operations[position:position + count]
        chunk_wanted = wanted[position:position + count]
        position += count
        if any(chunk_operations) and node is not None:
            chunk, checked = _patched_chunk(chunk, node, chunk_operations, chunk_wanted, mapping_indent, offset)
            verified = verified and checked
        pieces.append(chunk)
    if position != len(operations):
        raise RoundTripError("its documents do not line up with the objects read")
    text = "".join(pieces)
    if verified:
        return text
    try:
        matches = parse_documents(text, source.source) == wanted
    except ManifestError:
        matches = False
    if not matches:
        raise RoundTripError("the text written back would not read as the rewritten objects")
    return text


def _patched_chunk(chunk: str, node: Node, operations: list[list[Operation]], wanted: list[dict[str, Any]],
                   mapping_indent: int, offset: int) -> tuple[str, bool]:
    """One document patched: only the lines the operations touch where they can be cut out
    (:mod:`roundtrip_narrow`) and the result reads as ``wanted``; else the whole document. And
    whether the result was read back."""
    round_trip = _round_trip(mapping_indent, offset)

    def patch_mapping(text: str, mapping_operations: list[Operation]) -> str:
        return _patched_document(text, [mapping_operations], round_trip)

    try:
        narrow = patched_lines(chunk, node, operations, wanted, patch_mapping, mapping_indent)
    except RoundTripError:
        narrow = None
    if narrow is not None:
        return narrow, True  # each mapping written anew was read back (roundtrip_narrow.patched_lines)
    return _patched_document(chunk, operations, round_trip), False


def _round_trip(mapping_indent: int, offset: int) -> YAML:
    round_trip = YAML(typ="rt")
    round_trip.preserve_quotes = True
    round_trip.width = _NO_WRAP
    round_trip.indent(mapping=mapping_indent, sequence=offset + 2, offset=offset)
    return round_trip


def _patched_document(chunk: str, operations: list[list[Operation]], round_trip: YAML) -> str:
    # ruamel drops what comes before the document's "---" (a file's header comment): kept here instead.
    preamble = _preamble(chunk)
    # The preamble carries the marker line's comment; parsed too, ruamel would write it a second time.
    body = preamble.rsplit("---", 1)[0] + "---\n" + chunk[len(preamble):] if preamble else chunk
    try:
        documents = [d for d in round_trip.load_all(body) if d is not None]
    except RoundTripYAMLError as error:
        raise RoundTripError(f"the round-trip parser cannot read it ({type(error).__name__})") from None
    targets = [target for document in documents for target in _objects(document)]
    if len(targets) != len(operations):
        raise RoundTripError("its documents do not line up with the objects read")
    for target, object_operations in zip(targets, operations, strict=True):
        styles = _quote_styles(target, object_operations)
        comments = _removed_comments(target, object_operations)
        try:
            if apply_in_place(target, object_operations) is not target:
                raise RoundTripError("a rewrite replaces a whole object")
        except PatchError as error:
            raise RoundTripError(f"a rewrite does not apply to the text ({error})") from None
        _restyle(target, object_operations, styles)
        _carry_comments(target, object_operations, comments)
    out = io.StringIO()
    round_trip.dump_all(documents, out)
    return preamble + out.getvalue()


def _preamble(text: str) -> str:
    """Comment and blank lines up to and including a first ``---`` line; "" if there is none."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        stripped = line.strip()
        if DOCUMENT_MARKER.fullmatch(stripped):
            return "".join(lines[: index + 1])
        if stripped and not stripped.startswith("#"):
            return ""
    return ""


def _objects(document: Any) -> list[Any]:
    """The objects of one document, ``kind: List`` flattened as :func:`manifests.parse_documents` does."""
    if not isinstance(document, dict):
        return [document]
    kind, items = document.get("kind"), document.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        return [obj for item in items for obj in _objects(item)]
    return [document]


def _parent_and_key(document: Any, path: str) -> tuple[Any, str | int] | None:
    tokens = [unescape_pointer_token(token) for token in path[1:].split("/")] if path else []
    if not tokens:
        return None
    node = document
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    last = tokens[-1]
    return node, int(last) if isinstance(node, list) and last.isdigit() else last


def _quote_styles(document: Any, operations: list[Operation]) -> dict[int, type]:
    """Per parent map (by identity): the quoting of the values these operations remove or replace."""
    styles: dict[int, type] = {}
    for operation in operations:
        if operation.get("op") not in ("remove", "replace"):
            continue
        found = _parent_and_key(document, str(operation.get("path", "")))
        if found is None or not isinstance(found[0], dict):
            continue
        parent, key = found
        value = parent.get(key)
        if isinstance(value, _QUOTED):
            styles.setdefault(id(parent), type(value))
    return styles


def _removed_comments(document: Any, operations: list[Operation]) -> dict[int, tuple[Any, bool]]:
    """Per parent map: the comment on the first key these operations remove (``nvidia.com/gpu: 2  # two
    cards``), and whether that key was the map's last (its entry then also holds the comment lines
    that follow the map)."""
    comments: dict[int, tuple[Any, bool]] = {}
    for operation in operations:
        if operation.get("op") != "remove":
            continue
        found = _parent_and_key(document, str(operation.get("path", "")))
        if found is None or not isinstance(found[0], CommentedMap) or id(found[0]) in comments:
            continue
        parent, key = found
        comment = parent.ca.items.get(key)
        if comment is not None:
            comments[id(parent)] = (comment, list(parent)[-1] == key)
    return comments


def _carry_comments(document: Any, operations: list[Operation], comments: dict[int, tuple[Any, bool]]) -> None:
    """A removed key's comment moves to the key that replaces it (the last one added when the removed
    key was last, so the lines after the map stay after it)."""
    added: dict[int, tuple[CommentedMap, list[Any]]] = {}
    for operation in operations:
        if operation.get("op") != "add":
            continue
        found = _parent_and_key(document, str(operation.get("path", "")))
        if found is not None and isinstance(found[0], CommentedMap) and id(found[0]) in comments:
            added.setdefault(id(found[0]), (found[0], []))[1].append(found[1])
    for key, (parent, keys) in added.items():
        comment, was_last = comments[key]
        parent.ca.items[keys[-1] if was_last else keys[0]] = comment


def _restyle(document: Any, operations: list[Operation], styles: dict[int, type]) -> None:
    """New text values quoted as the values they replace were (``"2"`` stays ``"200"``, not ``'200'``)."""
    for operation in operations:
        if operation.get("op") not in ("add", "replace") or not isinstance(operation.get("value"), str):
            continue
        found = _parent_and_key(document, str(operation.get("path", "")))
        if found is None or not isinstance(found[0], dict):
            continue
        parent, key = found
        style = styles.get(id(parent)) or next(
            (type(value) for value in parent.values() if isinstance(value, _QUOTED)), None)
        if style is not None and isinstance(parent.get(key), str) and not isinstance(parent[key], _QUOTED):
            parent[key] = style(parent[key])


def guess_indent(text: str) -> tuple[int, int]:
    """(mapping indent, offset of a block sequence's dash under its key) as the text writes them.

    ``containers:\\n- name: a`` is offset 0 (kubectl's own output); ``containers:\\n  - name: a`` is 2.
    The first nested mapping and the first block sequence decide; 2 and 0 when there is none.
    """
    mapping_indent: int | None = None
    offset: int | None = None
    opener: int | None = None  # indentation of the key whose block starts on the next line
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        if not stripped or stripped.startswith(("#", "---", "...")):
            continue
        indent = len(line) - len(stripped)
        if opener is not None:
            if stripped.startswith("- ") or stripped == "-":
                offset = indent - opener if offset is None else offset
            elif indent > opener:
                mapping_indent = indent - opener if mapping_indent is None else mapping_indent
        if mapping_indent is not None and offset is not None:
            break
        match = _BLOCK_KEY.fullmatch(line)
        if match and not line.rstrip().endswith(("|", ">", "|-", ">-")):
            # "- key:" opens a block under the key, which sits two columns right of the dash.
            opener = indent + (2 if match.group(2) else 0)
        else:
            opener = None
    return (mapping_indent if mapping_indent and mapping_indent > 0 else 2,
            offset if offset is not None and offset >= 0 else 0)
