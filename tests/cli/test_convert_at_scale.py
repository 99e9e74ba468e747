"""``convert -o yaml`` at the size users have: only the mappings a rewrite touches go through the
round trip (ruamel.yaml, pure Python), so a 4,000-pod List costs about what ``-o json`` does; and
the result is what the round trip of whole documents writes, line for line where both keep them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from ruamel.yaml import YAML

from cli.main import cli
from kubeaccess import roundtrip

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "bench"))
import cli_scale  # noqa: E402  (the benchmark's own pods: docs/benchmarks.md measures these)

COMMENTED = """# pods of team A
apiVersion: v1
kind: Pod
metadata:
  name: a  # first
  namespace: team-a
  annotations:
    owner: "alice"
spec:
  containers:
  - name: main
    image: trainer   # pinned elsewhere
    resources:
      # cards for training
      limits:
        nvidia.com/gpu: "2"   # two cards
        memory: 8Gi
      requests: {nvidia.com/gpu: "2", cpu: '1'}
    command:
    - |
      python -m trainer
      --epochs 3
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: team-a}
spec:
  containers:
  - name: main
    resources:
      limits:
        amd.com/gpu: 1
# the end
"""


def listing(pods: int) -> str:
    items = [cli_scale.pod(index, 10, 5) for index in range(pods)]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}, sort_keys=False)


def convert(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["convert", "-f", str(path)])
    return result.exit_code, result.stdout


def test_only_the_touched_mappings_go_through_the_round_trip(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(listing(60))
    given: list[str] = []
    load_all = YAML.load_all

    def counting(self: YAML, stream: Any) -> Any:
        given.append(stream)
        return load_all(self, stream)

    monkeypatch.setattr(YAML, "load_all", counting)

    code, out = convert(path)

    assert code == 0 and "koordinator.sh/gpu-core" in out
    # The resources of each rewritten container, not the pods around them (nor the List).
    assert given and sum(len(text) for text in given) < len(path.read_text()) / 10


@pytest.mark.parametrize("text", [COMMENTED, listing(12)], ids=["commented", "list"])
def test_what_is_written_is_the_whole_document_round_trip_where_both_keep_lines(
        tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    code, narrow = convert(path)
    monkeypatch.setattr(roundtrip, "patched_lines", lambda *arguments: None)  # whole documents only
    whole_code, whole = convert(path)

    assert code == whole_code == 0
    assert list(yaml.safe_load_all(narrow)) == list(yaml.safe_load_all(whole))
    # No line of the input is changed that the whole-document round trip keeps.
    original = set(text.splitlines())
    assert {line for line in original if line in whole.splitlines()} <= set(narrow.splitlines())
    assert "# cards for training" in narrow or text is not COMMENTED


def test_a_comment_left_of_a_mapping_falls_back_to_the_whole_document(tmp_path: Path) -> None:
    """A mapping whose lines do not dedent as a whole is not cut out; the document is still written in
    its layout by the whole-document round trip."""
    text = ("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: main\n"
            "    resources:\n      limits:\n# a comment at column 0\n        nvidia.com/gpu: 1\n")
    path = tmp_path / "pod.yaml"
    path.write_text(text)

    code, out = convert(path)

    assert code == 0
    assert "# a comment at column 0" in out
    assert yaml.safe_load(out)["spec"]["containers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}


def test_lines_are_never_added_after_a_block_scalar_that_keeps_its_blank_lines(tmp_path: Path) -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: k\n  generateName: |+\n    line\n\nspec:\n  containers:\n"
            "  - name: main\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n")
    path = tmp_path / "pod.yaml"
    path.write_text(text)

    code, out = convert(path)

    assert code == 0
    assert yaml.safe_load(out)["metadata"]["generateName"] == "line\n\n"
