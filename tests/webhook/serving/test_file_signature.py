"""``kubeaccess.file_signature``: the one rule by which the serving certificate and the conversion
config notice a change without reading the file (a Secret's symlink swap, an in-place rewrite)."""

from __future__ import annotations

import os
from pathlib import Path

from kubeaccess.file_signature import file_signature


def test_a_missing_file_has_no_signature(tmp_path: Path) -> None:
    assert file_signature(tmp_path / "absent") is None


def test_an_untouched_file_keeps_its_signature(tmp_path: Path) -> None:
    path = tmp_path / "tls.crt"
    path.write_text("one")
    assert file_signature(path) == file_signature(str(path))


def test_an_in_place_rewrite_changes_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("one")
    before = file_signature(path)
    path.write_text("two, longer")
    assert file_signature(path) != before


def test_a_swapped_symlink_changes_it_even_with_the_same_size_and_mtime(tmp_path: Path) -> None:
    # How a mounted Secret rotates: ..data points at a new directory holding a new file.
    old, new = tmp_path / "v1", tmp_path / "v2"
    old.mkdir()
    new.mkdir()
    (old / "tls.crt").write_text("same")
    (new / "tls.crt").write_text("same")
    stat = (old / "tls.crt").stat()
    os.utime(new / "tls.crt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (tmp_path / "..data").symlink_to(old)
    (tmp_path / "tls.crt").symlink_to(tmp_path / "..data" / "tls.crt")
    before = file_signature(tmp_path / "tls.crt")
    (tmp_path / "..data.tmp").symlink_to(new)
    (tmp_path / "..data.tmp").replace(tmp_path / "..data")
    assert file_signature(tmp_path / "tls.crt") != before
