"""``load_objects`` parses with the cyclic collector paused and leaves it as it found it, and reads
large files through a memory map into exactly the text ``read_text`` gives."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from kubeaccess import manifests
from kubeaccess.manifests import ManifestError, load_objects


def test_loading_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "pods.json").write_text('{"kind": "List", "items": [{"kind": "Pod"}]}')
    (tmp_path / "bad.json").write_text("{")
    assert gc.isenabled()
    assert load_objects(tmp_path / "pods.json") == [{"kind": "Pod"}]
    assert gc.isenabled()
    with pytest.raises(ManifestError):
        load_objects(tmp_path / "bad.json")
    assert gc.isenabled()
    gc.disable()
    try:
        load_objects(tmp_path / "pods.json")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_only_a_large_read_is_frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pods.json").write_text('{"kind": "List", "items": [{"kind": "Pod"}]}')
    frozen = gc.get_freeze_count()
    load_objects(tmp_path / "pods.json")
    assert gc.get_freeze_count() == frozen  # small input: whatever garbage exists stays collectable
    monkeypatch.setattr(manifests, "_FREEZE_ABOVE", 0)
    try:
        assert load_objects(tmp_path / "pods.json") == [{"kind": "Pod"}]
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("data", [
    b'{"kind": "Pod"}\r\n\r\r\n',  # universal newlines, as read_text
    "\ufeff{\u00e9\u4e2d\U0001f600}".encode(),  # a BOM stays, as read_text keeps it
    b"x" * 100 + b"\xff\xfe",  # invalid UTF-8
    b"x" * 100 + "\u00e9".encode()[:1],  # truncated
    b"x" * 100 + b"\xed\xa0\x80",  # an encoded surrogate
])
def test_a_mapped_file_reads_as_read_text_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    data: bytes) -> None:
    monkeypatch.setattr(manifests, "_MAP_ABOVE", 0)
    file = tmp_path / "f.json"
    file.write_bytes(data)

    def read(reader: Callable[[], str]) -> tuple[str, str]:
        try:
            return "text", reader()
        except UnicodeDecodeError as error:
            return "error", str(error)

    assert read(lambda: manifests._read_text(file)) == read(lambda: file.read_text(encoding="utf-8"))


def test_an_empty_large_file_threshold_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifests, "_MAP_ABOVE", -1)
    file = tmp_path / "empty.json"
    file.write_bytes(b"")
    assert manifests._read_text(file) == ""
