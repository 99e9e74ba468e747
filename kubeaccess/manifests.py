"""Kubernetes objects from manifest files, the way ``kubectl apply -f`` finds them.

Used by ``gpuquota serve --state``, ``gpuquota audit -f`` and ``gpuquota migrate -f``, so the
offline webhook and the offline CLI read exactly the same snapshot.
"""

from __future__ import annotations

import gc
import json
import mmap
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from gpuquota_core import collector

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
# libyaml's loader reads the same documents into the same objects as the pure-Python SafeLoader,
# about ten times faster: a 100,000-pod ``kubectl get -o yaml`` snapshot is minutes of parsing
# otherwise (docs/benchmarks.md). PyYAML wheels ship it; a source build without libyaml falls back.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml stops at its own depth bound (1,000 levels) with this problem text, where the Python
# loader would hit RecursionError; both mean the same to the user.
_LIBYAML_DEPTH_PROBLEM = "exceeded maximum nesting depth"


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file (and document) at fault."""


def load_objects(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every object in the given files or directories (``-`` is standard input), lists flattened."""
    if isinstance(paths, str | Path):
        paths = [paths]
    objects: list[dict[str, Any]] = []
    read = 0
    # Parse without the cyclic garbage collector. A 100,000-pod snapshot decodes into tens of
    # millions of dicts and lists; each counts as an allocation towards the collector's thresholds,
    # and every full collection walks all of them: about half of the parse time of a 404 MiB
    # snapshot, for nothing, since decoded JSON (and YAML without recursive aliases) holds no
    # reference cycles.
    with collector.paused():
        for path in paths:
            for source, text in _read_sources(str(path)):
                read += len(text)
                objects.extend(parse_documents(text, source))
        if read > _FREEZE_ABOVE:
            # Re-enabling the collector would make its next collections walk all of that again
            # (the audit that followed slowed down); freezing moves everything alive now into the
            # permanent generation, which collections skip. Frozen objects are still freed by
            # reference counting as soon as nothing refers to them; only a cycle that already
            # existed at this point is never collected, hence only after a large read.
            gc.freeze()
    return objects


# Characters read above which the parsed objects are frozen (see load_objects).
_FREEZE_ABOVE = 16 << 20


def _read_sources(path: str) -> Iterator[tuple[str, str]]:
    if path == "-":
        yield "<stdin>", sys.stdin.read()
        return
    target = Path(path)
    if target.is_dir():
        files = sorted(p for p in target.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
        if not files:
            raise ManifestError(f"{path}: no .yaml, .yml or .json files in this directory")
    elif target.is_file():
        files = [target]
    else:
        raise ManifestError(f"{path}: no such file or directory")
    for file in files:
        try:
            yield str(file), _read_text(file)
        except (OSError, UnicodeDecodeError) as error:
            raise ManifestError(f"{file}: cannot read: {error}") from None


# Above this size a file is decoded straight from a memory map of the page cache: read_text would
# first copy it into a bytes object of the same size (404 MiB for a 100,000-pod snapshot, ~0.3 s
# of page faults) and then decode that.
_MAP_ABOVE = 1 << 20


def _read_text(file: Path) -> str:
    """``file.read_text(encoding="utf-8")``: the same text, or the same UnicodeDecodeError."""
    size = file.stat().st_size
    if size <= _MAP_ABOVE:
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


def parse_documents(text: str, source: str = "<input>") -> list[dict[str, Any]]:
    """Objects in one file's text: JSON, or YAML with ``---`` separated documents."""
    try:
        if source.endswith(".json") or text.lstrip().startswith(("{", "[")):
            # Not orjson: it reads integers beyond 64 bits as floats, which would change a quantity.
            loaded = json.loads(text)
            documents: list[Any] = loaded if isinstance(loaded, list) else [loaded]
        else:
            documents = list(yaml.load_all(text, Loader=_YAML_LOADER))
    except (ValueError, yaml.YAMLError) as error:
        if getattr(error, "problem", None) == _LIBYAML_DEPTH_PROBLEM:
            raise _too_deep(source) from None
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ManifestError(f"{source}: not valid YAML or JSON: {first_line}") from None
    except RecursionError:
        # The Python parsers recurse per nesting level; no Kubernetes object is nested this deep.
        raise _too_deep(source) from None
    objects: list[dict[str, Any]] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        objects.extend(_flatten(document, f"{source} (document {index + 1})"))
    return objects


def _too_deep(source: str) -> ManifestError:
    return ManifestError(f"{source}: nested too deeply to be a Kubernetes object")


def _flatten(document: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(document, dict):
        raise ManifestError(f"{where}: expected a Kubernetes object, got {type(document).__name__}")
    kind = document.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ManifestError(f"{where}: object has no kind")
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
