"""``load_objects`` parses with the cyclic collector paused and leaves it as it found it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

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
