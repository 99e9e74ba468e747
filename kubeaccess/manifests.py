"""Kubernetes objects from manifest files, the way ``kubectl apply -f`` finds them.

Used by ``gpuquota serve --state``, ``gpuquota audit -f`` and ``gpuquota migrate -f``, so the
offline webhook and the offline CLI read exactly the same snapshot.
"""

from __future__ import annotations

import gc
import json
import mmap
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kubeaccess import collector

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
# libyaml's loader reads the same documents into the same objects as the pure-Python SafeLoader,
# far faster, since the pure-Python loader builds its node graph in Python for every scalar and a
# large ``kubectl get -o yaml`` snapshot is mostly scalars (see docs/benchmarks.md, "Mechanisms
# kept"). PyYAML wheels ship it; a source build without libyaml falls back.
YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml stops at its own depth bound (1,000 levels) with this problem text, where the Python
# loader would hit RecursionError; both mean the same to the user.
_LIBYAML_DEPTH_PROBLEM = "exceeded maximum nesting depth"


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file (and document) at fault."""


def load_objects(paths: str | Path | Iterable[str | Path], origins: dict[int, str] | None = None,
                 ) -> list[dict[str, Any]]:
    """Every object in the given files or directories (``-`` is standard input), lists flattened.

    ``origins``: filled with ``id(object)`` -> the file it was read from, for messages that name it
    (valid while the objects live).
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    objects: list[dict[str, Any]] = []
    read = 0
    # Parse without the cyclic garbage collector. A 100,000-pod snapshot decodes into tens of
    # millions of dicts and lists; each counts as an allocation towards the collector's thresholds,
    # and every full collection walks all of them (a large share of a big snapshot's parse time,
    # docs/benchmarks.md, "Mechanisms kept"), for nothing, since decoded JSON (and YAML without
    # recursive aliases) holds no reference cycles.
    with collector.paused():
        for path in paths:
            for source, text in _read_sources(str(path)):
                assert isinstance(text, str)  # not lenient: an unreadable file raised
                read += len(text)
                parsed = parse_documents(text, source)
                if origins is not None:
                    origins.update((id(obj), source) for obj in parsed)
                objects.extend(parsed)
        if read > _FREEZE_ABOVE:
            # Re-enabling the collector would make its next collections walk all of that again
            # (the audit that followed slowed down); freezing moves everything alive now into the
            # permanent generation, which collections skip. Frozen objects are still freed by
            # reference counting as soon as nothing refers to them; only a cycle that already
            # existed at this point is never collected, hence only after a large read.
            gc.freeze()
    return objects


@dataclass(frozen=True)
class ManifestSource:
    """One file (or stdin) as read: its text and the objects in it, lists flattened."""

    source: str
    text: str
    objects: list[dict[str, Any]]


def load_sources(paths: Iterable[str | Path]) -> list[ManifestSource]:
    """Like :func:`load_objects`, keeping each file's text (``gpuquota convert`` writes it back)."""
    return [ManifestSource(source, text, parse_documents(text, source))
            for path in paths for source, text in _read_sources(str(path)) if isinstance(text, str)]


@dataclass
class ManifestRead:
    """What the files held that reads as Kubernetes objects, and each document or file left out.

    A GitOps folder holds more than Kubernetes objects (a Helm ``values.yaml``, a half-edited file):
    as ``kubectl apply -f DIR`` does, the commands that judge manifests read every other document and
    name each one left out, so one stray file never hides the verdict on the rest.
    """

    sources: list[ManifestSource]
    skipped: list[str]  # why each file or document was left out, naming it as FILE:LINE:COLUMN

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [obj for source in self.sources for obj in source.objects]


def read_manifests(paths: Iterable[str | Path]) -> ManifestRead:
    """Like :func:`load_sources`, leaving out what cannot be read instead of refusing the whole input.

    Still raises :class:`ManifestError` for a path that does not exist or a directory without
    manifests: nothing was given to read there. A file that cannot be read as a whole is read one
    document at a time; a source keeps only the text of its documents that were read, so what
    ``convert`` writes back holds nothing that was left out.
    """
    read = ManifestRead([], [])
    characters = 0
    with collector.paused():
        for path in paths:
            for source, text in _read_sources(str(path), lenient=True):
                if isinstance(text, ManifestError):
                    read.skipped.append(str(text))
                    continue
                characters += len(text)
                try:
                    read.sources.append(ManifestSource(source, text, parse_documents(text, source)))
                    continue
                except ManifestError as error:
                    if source.endswith(".json"):
                        read.skipped.append(str(error))
                        continue
                # Read one document at a time, as YAML: a file that only looked like JSON (a Helm
                # template opens with "{{") is named by its YAML problem, not a JSON one.
                kept: list[str] = []
                objects: list[dict[str, Any]] = []
                line = 1
                for chunk in split_documents(text):
                    try:
                        objects += parse_documents(chunk, source, first_line=line, as_yaml=True)
                        kept.append(chunk)
                    except ManifestError as error:
                        read.skipped.append(str(error))
                    line += chunk.count("\n")
                if objects:
                    read.sources.append(ManifestSource(source, "".join(kept), objects))
        if characters > _FREEZE_ABOVE:
            gc.freeze()  # as load_objects does, for the same reason
    return read


# A document start marker line, bare or with a comment.
DOCUMENT_MARKER = re.compile(r"---(\s+#.*)?\s*")


def split_documents(text: str) -> list[str]:
    """The text cut before each ``---`` line that follows content: one document per piece.

    A ``---`` at the start of a line is always a document marker (content, even a block scalar's,
    is indented or cannot start with it), so cutting there never splits a document.
    """
    pieces: list[str] = []
    current: list[str] = []
    has_content = False
    for line in text.splitlines(keepends=True):
        if DOCUMENT_MARKER.fullmatch(line.rstrip("\r\n")) and has_content:
            pieces.append("".join(current))
            current, has_content = [], False
        elif line.strip() and not line.startswith(("#", "%")) and not line.lstrip().startswith("#") \
                and not DOCUMENT_MARKER.fullmatch(line.rstrip("\r\n")):
            has_content = True  # comments and directives (%YAML) belong to the document they precede
        current.append(line)
    if current:
        pieces.append("".join(current))
    return pieces


def _first_content_line(text: str) -> int:
    """The line (from 1) of a document's first content, past comments, directives and its marker."""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "%")) and not DOCUMENT_MARKER.fullmatch(stripped):
            return number
    return 1


# Characters read above which the parsed objects are frozen (see load_objects).
_FREEZE_ABOVE = 16 << 20


def _read_sources(path: str, lenient: bool = False) -> Iterator[tuple[str, str | ManifestError]]:
    """Each file's text; ``lenient``: a file that cannot be read as text is yielded as its error."""
    if path == "-":
        try:
            yield "<stdin>", _read_stdin()
        except UnicodeDecodeError as error:
            if not lenient:
                raise ManifestError(f"<stdin>: {not_text(error)}") from None
            yield "<stdin>", ManifestError(f"<stdin>: {not_text(error)}")
        return
    target = Path(path)
    if target.is_dir():
        files = sorted(p for p in target.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
        if not files:
            raise ManifestError(f"{path}: no .yaml, .yml or .json files in this directory")
    elif target.exists():
        # A regular file, or one to read to its end like stdin: a pipe (``-f <(kubectl get ...)``
        # hands over /dev/fd/N), /dev/stdin, /dev/null (empty).
        files = [target]
    else:
        raise ManifestError(f"{path}: no such file or directory")
    for file in files:
        try:
            text = _read_text(file)
        except UnicodeDecodeError as error:
            failure = ManifestError(f"{file}: {not_text(error)}")
        except OSError as error:
            failure = ManifestError(f"{file}: cannot read: {error.strerror or error}")
        else:
            yield str(file), text
            continue
        if not lenient:
            raise failure
        yield str(file), failure


def _read_stdin() -> str:
    # Bytes, decoded strictly: a text-mode stdin may decode invalid bytes to lone surrogates
    # (surrogateescape) that only fail later, inside the YAML parser.
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    text = raw.decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def not_text(error: UnicodeDecodeError) -> str:
    """Why a file is not YAML or JSON text, for a binary file given by mistake."""
    return f"not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start}): a binary file?"


# Above this size a file is decoded straight from a memory map of the page cache: read_text would
# first copy it into a bytes object of the same size (page faults for all of it) and then decode that.
_MAP_ABOVE = 1 << 20


def _read_text(file: Path) -> str:
    """``file.read_text(encoding="utf-8")``: the same text, or the same UnicodeDecodeError."""
    status = file.stat()
    if status.st_size <= _MAP_ABOVE or not stat.S_ISREG(status.st_mode):
        return file.read_text(encoding="utf-8")
    with file.open("rb") as raw:
        try:
            mapped = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system without mmap, or the file shrank to nothing
            return file.read_text(encoding="utf-8")
        with mapped:
            text = str(mapped, "utf-8")  # the whole file in one decode, as read_text does
    if "\r" in text:
        # read_text reads with universal newlines: "\r\n" and a lone "\r" both become "\n".
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _is_json(text: str, source: str) -> bool:
    return source.endswith(".json") or text.lstrip().startswith(("{", "["))


def parse_documents(text: str, source: str = "<input>", first_line: int = 1,
                    as_yaml: bool = False) -> list[dict[str, Any]]:
    """Objects in one file's text: JSON, or YAML with ``---`` separated documents.

    ``first_line``: where ``text`` begins in its file (a document read on its own), for positions;
    ``as_yaml``: read as YAML even where the text looks like JSON.
    """
    if not as_yaml and _is_json(text, source):
        try:
            # Not orjson: it reads integers beyond 64 bits as floats, which would change a quantity.
            loaded = json.loads(text)
        except json.JSONDecodeError as error:
            raise ManifestError(f"{source}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}") from None
        except ValueError as error:
            raise ManifestError(f"{source}: not valid JSON: {error}") from None
        except RecursionError:
            # The Python parsers recurse per nesting level; no Kubernetes object is nested this deep.
            raise _too_deep(source) from None
        documents: list[Any] = loaded if isinstance(loaded, list) else [loaded]
    else:
        documents = load_yaml_documents(text, source, first_line)
    objects: list[dict[str, Any]] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        # One document read on its own is named by where it starts; in a whole file, by its number.
        where = (f"{source}:{first_line - 1 + _first_content_line(text)}:1" if len(documents) == 1
                 else f"{source} (document {index + 1})")
        objects.extend(_flatten(document, where))
    return objects


def load_yaml_documents(text: str, source: str, first_line: int = 1) -> list[Any]:
    """Every YAML document in ``text``, refused with file, line and column when it cannot be read.

    Also refused: aliases that expand a document far beyond what is written (the "billion laughs":
    a few hundred bytes that every later copy or walk expands to billions of nodes) and aliases that
    make a document contain itself (a walk would never end).
    """
    try:
        documents = list(yaml.load_all(text, Loader=YAML_LOADER))
    except yaml.MarkedYAMLError as error:
        if error.problem == _LIBYAML_DEPTH_PROBLEM:
            raise _too_deep(source) from None
        raise ManifestError(f"{source}:{_yaml_position(error, first_line - 1)}") from None
    except yaml.reader.ReaderError as error:
        before = text[: error.position]
        line, column = before.count("\n") + first_line, error.position - (before.rfind("\n") + 1) + 1
        raise ManifestError(f"{source}:{line}:{column}: not YAML text: {error.reason} "
                            f"(character {_printable(error.character)})") from None
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not valid YAML: {' '.join(str(error).split())}") from None
    except RecursionError:
        raise _too_deep(source) from None
    if may_share_nodes(text):
        for index, document in enumerate(documents):
            _check_aliases(document, f"{source} (document {index + 1})")
    return documents


# An alias token: "*" then a name, where a plain scalar could not start with it. Inside quotes it
# may also match ("*/5 * * * *" does not); that costs only the walk below.
_ALIAS_TOKEN = re.compile(r"(?:^|[\s\[{,:])\*[^\s,\[\]{}\"']", re.MULTILINE)


def may_share_nodes(text: str) -> bool:
    """False when the text holds no alias, so nothing is shared and the alias walk can be skipped
    (it would visit every node of a large ``kubectl get -o yaml`` snapshot)."""
    return "*" in text and "&" in text and _ALIAS_TOKEN.search(text) is not None


def _yaml_position(error: yaml.MarkedYAMLError, lines_before: int = 0) -> str:
    """``LINE:COLUMN: not valid YAML: problem`` (1-based, as editors count), with where the enclosing
    construct began; ``lines_before``: lines of the file above the text that was parsed."""
    mark = error.problem_mark or error.context_mark
    where = f"{lines_before + mark.line + 1}:{mark.column + 1}: " if mark is not None else " "
    message = f"{where}not valid YAML: {error.problem or error.context or 'unreadable'}"
    if error.context and error.problem and error.context_mark is not None:
        message += (f" ({error.context} started at line {lines_before + error.context_mark.line + 1}, "
                    f"column {error.context_mark.column + 1})")
    return message


def _printable(character: object) -> str:
    if isinstance(character, int):
        return f"0x{character:02x}"
    return f"U+{ord(character):04X}" if isinstance(character, str) and len(character) == 1 else repr(character)


# Aliases may make a document this many times larger than what is written (and 100,000 nodes in
# any case): generous for anchors that share a resources block between containers, far below a
# bomb's expansion (nine levels of nine aliases: 387 million nodes from about 100).
ALIAS_EXPANSION_FACTOR = 10
ALIAS_EXPANSION_FLOOR = 100_000


def _check_aliases(document: Any, where: str) -> None:
    """Refuse a document whose aliases expand it beyond the bounds above, or make it contain itself.

    Counts without expanding: each distinct dict or list is visited once (iteratively, as
    documents may nest 1,000 levels) and its expanded size computed from its children's.
    """
    expanded: dict[int, int] = {}
    written = 0
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(document, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None or key in expanded:
            continue
        if children_done:
            visiting.discard(key)
            expanded[key] = 1 + sum(expanded.get(id(child), 1) for child in children)
            written += 1 + len(children)
            continue
        if key in visiting:
            raise ManifestError(f"{where}: a YAML alias makes the document contain itself; refused")
        visiting.add(key)
        stack.append((node, True))
        for child in children:
            if isinstance(child, dict | list):
                if id(child) in visiting:
                    raise ManifestError(f"{where}: a YAML alias makes the document contain itself; refused")
                stack.append((child, False))
    total = expanded.get(id(document), 1)
    if total > max(ALIAS_EXPANSION_FLOOR, ALIAS_EXPANSION_FACTOR * written):
        raise ManifestError(f"{where}: YAML aliases expand {written} written nodes to {total}; refused "
                            "(an alias bomb?)")


def _too_deep(source: str) -> ManifestError:
    return ManifestError(f"{source}: nested too deeply to be a Kubernetes object")


def _flatten(document: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(document, dict):
        raise ManifestError(f"{where}: not a Kubernetes object: expected a mapping, got {type(document).__name__}")
    kind = document.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ManifestError(f"{where}: not a Kubernetes object: it has no kind")
    if kind == "List" or (kind.endswith("List") and isinstance(document.get("items"), list)):
        items = document.get("items")
        if not isinstance(items, list):
            raise ManifestError(f"{where}: {kind} has no items list")
        item_kind = kind[: -len("List")] if kind != "List" else None
        flattened: list[dict[str, Any]] = []
        for position, item in enumerate(items):
            if isinstance(item, dict) and item_kind and "kind" not in item:
                item = {**item, "kind": item_kind}
            flattened.extend(_flatten(item, f"{where} item {position + 1}"))
        return flattened
    return [document]
