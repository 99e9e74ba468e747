"""``gpuquota convert`` writes the input back in its own layout: a GitOps diff shows only the rewrite."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli.main import cli
from gpuquota_core.canonical import ORIGINAL_RESOURCES_ANNOTATION
from kubeaccess import library_pins
from kubeaccess.roundtrip import untested_ruamel

# Comments everywhere, keys out of the usual order, flow maps, an indented block sequence, both
# quote styles, a YAML 1.1 boolean and a long line.
MANIFEST = """\
# Trainer for team A: reviewed in GitOps, so the layout matters.
---
kind: Deployment   # kind first, on purpose
metadata:
    namespace: team-a
    name: trainer  # the name
    labels: {app: trainer, tier: "gpu"}
apiVersion: apps/v1
spec:
    replicas: 2
    selector: {matchLabels: {app: trainer}}
    template:
        metadata: {labels: {app: trainer}}
        spec:
            nodeSelector: {pool: 'a100'}
            containers:
              - image: "registry.example/trainer:1.2"   # pinned
                name: main
                args: ["--epochs", "10", "--data", "s3://bucket/a/very/long/path/that/goes/on/and/on/and/on/for/a/while"]
                resources:
                    # cards for training
                    limits: {nvidia.com/gpu: "2", cpu: '4'}   # two cards
                    requests:
                        cpu: '4'
                        nvidia.com/gpu: "2"
              - name: sidecar
                image: busybox
            enableServiceLinks: yes
---
# an object convert leaves alone
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
data: {mode: "fast", debug: 'no'}   # kept as written
"""


def convert(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["convert", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def test_only_the_resource_lines_and_the_annotation_change(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text(MANIFEST)

    code, out, _ = convert("-f", str(tmp_path / "trainer.yaml"))

    assert code == 0
    removed, added = changed_lines(MANIFEST, out)
    original = '{"containers":{"main":{"limits":{"nvidia.com/gpu":"2"},"requests":{"nvidia.com/gpu":"2"}}}}'
    assert removed == [
        "        metadata: {labels: {app: trainer}}",
        """                    limits: {nvidia.com/gpu: "2", cpu: '4'}   # two cards""",
        '                        nvidia.com/gpu: "2"',
    ]
    assert added == [
        f"        metadata: {{labels: {{app: trainer}}, annotations: "
        f"{{{ORIGINAL_RESOURCES_ANNOTATION}: '{original}'}}}}",
        """                    limits: {cpu: '4', koordinator.sh/gpu-core: "200", koordinator.sh/gpu-memory-ratio: \
"200"} # two cards""",
        '                        koordinator.sh/gpu-core: "200"',
        '                        koordinator.sh/gpu-memory-ratio: "200"',
    ]


def test_the_output_reads_as_the_webhooks_rewrite(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text(MANIFEST)

    _, out, _ = convert("-f", str(tmp_path / "trainer.yaml"))
    _, as_json, _ = convert("-f", str(tmp_path / "trainer.yaml"), "-o", "json")

    assert list(yaml.safe_load_all(out)) == json.loads(as_json)["items"]


def test_several_files_are_written_one_after_another(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("# first\n" + MANIFEST.split("---\n", 1)[1].split("---\n")[0])
    (tmp_path / "b.yaml").write_text("---\n" + MANIFEST.split("---\n")[2])

    code, out, err = convert("-f", str(tmp_path / "a.yaml"), "-f", str(tmp_path / "b.yaml"))

    assert code == 0, err
    assert out.startswith("# first\nkind: Deployment   # kind first, on purpose\n")
    assert out.endswith("---\n# an object convert leaves alone\napiVersion: v1\nkind: ConfigMap\n"
                        "metadata: {name: settings, namespace: team-a}\n"
                        """data: {mode: "fast", debug: 'no'}   # kept as written\n""")
    assert len(list(yaml.safe_load_all(out))) == 2


def test_an_anchor_shared_by_two_rewritten_containers_is_written_plainly_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
                    "  - {name: a, resources: &gpu {limits: {nvidia.com/gpu: '1'}}}\n"
                    "  - {name: b, resources: *gpu}\n")

    code, out, err = convert("-f", str(path))

    assert code == 0
    assert f"{path}: written without its comments and layout: a rewrite does not apply to the text" in err
    containers = yaml.safe_load(out)["spec"]["containers"]
    assert [c["resources"]["limits"] for c in containers] == [
        {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}] * 2


@pytest.mark.parametrize("written", ["2", '"2"', "'2'", '"2.0"', "2.0", '"2000m"'])
def test_the_annotation_records_a_quantity_one_way(tmp_path: Path, written: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(f"apiVersion: v1\nkind: Pod\nmetadata: {{name: x}}\nspec:\n  containers:\n"
                    f"  - name: main\n    resources:\n      limits:\n        nvidia.com/gpu: {written}\n")

    code, out, _ = convert("-f", str(path), "-o", "json")

    assert code == 0
    # What the webhook records: the apiserver hands it the quantity's canonical text, "2".
    assert json.loads(out)["metadata"]["annotations"][ORIGINAL_RESOURCES_ANNOTATION] == (
        '{"containers":{"main":{"limits":{"nvidia.com/gpu":"2"}}}}')


def test_objects_convert_leaves_alone_are_written_byte_for_byte(tmp_path: Path) -> None:
    # Flow maps that span lines (the example Nodes', under another kind: Nodes are context, never
    # written out): a round-trip writer would join those lines.
    nodes = Path(__file__).resolve().parents[2] / "examples" / "cluster" / "nodes.yaml"
    text = nodes.read_text().replace("kind: Node\n", "kind: ConfigMap\n")
    assert text != nodes.read_text()
    (tmp_path / "objects.yaml").write_text(text)

    code, out, _ = convert("-f", str(tmp_path / "objects.yaml"))

    assert code == 0
    assert out == text


def test_a_document_marker_with_a_comment_and_a_header_comment_stay(tmp_path: Path) -> None:
    text = ("# header\n--- # the pod\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n"
            "  - name: a\n    resources:\n      limits:\n        nvidia.com/gpu: 1  # one card\n")
    (tmp_path / "pod.yaml").write_text(text)

    _, out, err = convert("-f", str(tmp_path / "pod.yaml"))

    assert "without its comments" not in err
    removed, added = changed_lines(text, out)
    assert removed == ["        nvidia.com/gpu: 1  # one card"]
    original = '{"containers":{"a":{"limits":{"nvidia.com/gpu":"1"}}}}'
    # The comment of the replaced key stays with its replacement (the last line, as the key was last).
    assert added == [
        "  annotations:",
        f"    {ORIGINAL_RESOURCES_ANNOTATION}: '{original}'",
        "        koordinator.sh/gpu-core: '100'",
        "        koordinator.sh/gpu-memory-ratio: '100' # one card",
    ]


def test_a_yaml_directive_stays_with_its_document(tmp_path: Path) -> None:
    text = ("%YAML 1.1\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n"
            "  - name: a\n    resources: {limits: {nvidia.com/gpu: '1'}}\n")
    (tmp_path / "pod.yaml").write_text(text)

    _, out, err = convert("-f", str(tmp_path / "pod.yaml"))

    assert "without its comments" not in err
    assert out.startswith("%YAML 1.1\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: x, annotations: {")


def test_an_untested_ruamel_release_writes_plainly_with_a_note_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The layout is kept through ruamel.yaml's comment table, not public API: outside the releases
    # it is tested with, convert does not trust it and says so, but still converts.
    monkeypatch.setattr(library_pins, "RUAMEL_YAML", dataclasses.replace(library_pins.RUAMEL_YAML,
                                                                         lowest="0.20", below="0.21"))
    path = tmp_path / "trainer.yaml"
    path.write_text(MANIFEST)

    code, out, err = convert("-f", str(path))

    installed = importlib.metadata.version("ruamel.yaml")
    assert code == 0
    assert (f"{path}: written without its comments and layout: ruamel.yaml {installed} is installed, but "
            f"gpuquota is tested only with ruamel.yaml>=0.20,<0.21") in err
    assert "# cards for training" not in out
    deployment = next(doc for doc in yaml.safe_load_all(out) if doc["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "4", "koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


def test_the_installed_ruamel_is_a_tested_release() -> None:
    assert untested_ruamel() is None
    assert untested_ruamel(lambda _: "0.18.6") == (
        "ruamel.yaml 0.18.6 is installed, but gpuquota is tested only with ruamel.yaml>=0.19.1,<0.20 "
        "(it relies on its internals); install a version in that range")
