"""``gpuquota quota`` on the example cluster: table, wide, json, yaml, --pods, -n, NAME, terminal vs pipe."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli import output
from cli.main import cli

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "cluster")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(*args: str, columns: int = 200) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": str(columns), "NO_COLOR": None}).invoke(cli, ["quota", *args])
    return result.exit_code, result.stdout, result.stderr


def test_piped_table_is_plain_with_cards_beside() -> None:
    code, out, err = run("-f", EXAMPLE)
    assert (code, err) == (0, "")
    assert "\x1b[" not in out and "█" not in out
    lines = out.splitlines()
    assert lines[0].split() == ["QUOTA", "RESOURCE", "MIN", "MAX", "USED", "VENDOR", "SHARE", "RESERVED", "FREE",
                                "BINDS-FIRST", "USE"]
    # Parents above children, children indented.
    assert [line.split()[0] for line in lines[1:] if not line.startswith(" " * 4)] == [
        "ml-platform", "team-nlp", "team-vision"]
    nlp = next(line for line in lines if line.startswith("  team-nlp"))
    assert nlp.split("   ")[0] == "  team-nlp"
    assert re.split(r"\s{3,}", nlp.strip()) == ["team-nlp", "gpu-core", "200", "400 (4 cards)", "200 (2 cards)",
                                                "0", "200", "0", "200 (2 cards)", "team-nlp", "50%"]


def terminal(columns: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(output, "on_terminal", lambda: True)
    code, out, _ = run("-f", EXAMPLE, columns=columns)
    assert code == 0
    assert "\x1b[32m" in out  # green: nothing is near full in the example
    return [ANSI.sub("", line) for line in out.splitlines()]


def test_terminal_gets_bars_and_colour_fitted_to_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    for columns in (160, 120, 90):
        lines = terminal(columns, monkeypatch)
        assert max(len(line) for line in lines) <= columns
        nlp = next(line for line in lines if line.startswith("  team-nlp"))
        assert re.search(r" █+░+ 50%$", nlp)
    # Wide enough for everything; then the card counts go; then the narrow columns.
    assert "(4 cards)" in next(line for line in terminal(160, monkeypatch) if line.startswith("  team-nlp"))
    assert terminal(120, monkeypatch)[0].split() == ["QUOTA", "RESOURCE", "MIN", "MAX", "USED", "VENDOR", "SHARE",
                                                     "RESERVED", "FREE", "BINDS-FIRST", "USE"]
    assert not any("cards" in line for line in terminal(120, monkeypatch))
    assert terminal(90, monkeypatch)[0].split() == ["QUOTA", "RESOURCE", "MAX", "USED", "FREE", "BINDS-FIRST", "USE"]
    # Too narrow even for a short bar: the figure alone.
    assert re.split(r"\s{3,}", next(line for line in terminal(80, monkeypatch) if line.startswith("  team-nlp"))
                    .strip()) == ["team-nlp", "gpu-core", "400", "200", "200", "team-nlp", "50%"]


def test_colour_always_and_never() -> None:
    _, always, _ = run("-f", EXAMPLE, "--color", "always")
    assert "\x1b[" in always and "█" in always
    _, never, _ = run("-f", EXAMPLE, "--color", "never")
    assert "\x1b[" not in never


def test_over_and_near_full_colours(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all([
        {"kind": "ElasticQuota", "metadata": {"name": "a", "namespace": "a"},
         "spec": {"max": {"koordinator.sh/gpu-core": "100"}}},
        {"kind": "ElasticQuota", "metadata": {"name": "b", "namespace": "b"},
         "spec": {"max": {"koordinator.sh/gpu-core": "100"}}},
        {"kind": "Pod", "metadata": {"name": "x", "namespace": "a"},
         "spec": {"containers": [{"name": "c", "resources": {"limits": {"koordinator.sh/gpu-core": "200"}}}]}},
        {"kind": "Pod", "metadata": {"name": "y", "namespace": "b"},
         "spec": {"containers": [{"name": "c", "resources": {"limits": {"koordinator.sh/gpu-core": "90"}}}]}},
    ]))
    _, out, _ = run("-f", str(state), "--color", "always")
    a, b = (line for line in out.splitlines()[1:])
    assert "\x1b[31m" in a and "200% OVER" in a  # red, bold: over its limit
    assert "\x1b[33m" in b and "90%" in b  # yellow: near full


def test_json_and_yaml_are_the_same_data_with_a_schema_version() -> None:
    code, out, _ = run("-f", EXAMPLE, "-o", "json", "--pods")
    assert code == 0
    document = json.loads(out)
    assert (document["schemaVersion"], document["source"]) == (1, "files")
    nlp = document["quotas"][1]
    assert (nlp["name"], nlp["parent"], nlp["depth"]) == ("team-nlp", "ml-platform", 1)
    assert nlp["resources"][0]["usedByFamily"] == {"vendor": "0", "koordinator": "200"}
    assert [p["name"] for p in document["quotas"][2]["pods"]] == ["resnet-train-0", "notebook-alice"]
    _, as_yaml, _ = run("-f", EXAMPLE, "-o", "yaml", "--pods")
    assert yaml.safe_load(as_yaml) == document
    _, without_pods, _ = run("-f", EXAMPLE, "-o", "json")
    assert "pods" not in json.loads(without_pods)["quotas"][1]


def test_pods_largest_first() -> None:
    code, out, _ = run("-f", EXAMPLE, "--pods")
    assert code == 0
    pods = out.split("\n\n", 1)[1].splitlines()
    assert pods[0].split() == ["QUOTA", "POD", "FAMILY", "GPU-CORE", "GPU-MEMORY-RATIO"]
    assert [line.split()[1] for line in pods[1:]] == [
        "team-nlp/bert-finetune-0", "team-vision/resnet-train-0", "team-vision/notebook-alice"]
    assert pods[2].split()[2:5] == ["vendor", "200", "(2"]


def test_namespace_name_and_all_namespaces() -> None:
    _, out, _ = run("-f", EXAMPLE, "-n", "team-vision", "-o", "json")
    assert [q["name"] for q in json.loads(out)["quotas"]] == ["ml-platform", "team-vision"]
    _, out, _ = run("team-nlp", "-f", EXAMPLE, "-o", "json")
    assert [q["name"] for q in json.loads(out)["quotas"]] == ["ml-platform", "team-nlp"]
    _, out, _ = run("-f", EXAMPLE, "-A", "-o", "json")
    assert len(json.loads(out)["quotas"]) == 3
    code, out, _ = run("-f", EXAMPLE, "-n", "nowhere")
    assert (code, out.strip()) == (0, "No ElasticQuotas in namespace nowhere.")


@pytest.mark.parametrize(("args", "message"), [
    (["nope", "-f", EXAMPLE], "Error: no ElasticQuota named 'nope'"),
    (["-n", "a", "-A", "-f", EXAMPLE], "Error: -n/--namespace and -A/--all-namespaces are mutually exclusive"),
    (["-f", "/nonexistent.yaml"], "Error: /nonexistent.yaml: no such file or directory"),
    (["-f", EXAMPLE, "--kubeconfig", "k"], "Error: -f reads manifests; --kubeconfig/--context are for a live "
                                           "cluster: give one or the other"),
])
def test_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    code, _, err = run(*args)
    assert (code, err.strip().splitlines()) == (2, [message])


def test_an_unreadable_quota_is_left_out_with_a_note_and_the_others_shown(tmp_path: Path) -> None:
    """As audit leaves it out of the tree it judges with (and reports it, quota-invalid): one bad quota
    never hides the others."""
    state = tmp_path / "bad.yaml"
    state.write_text(yaml.safe_dump({"kind": "ElasticQuota", "metadata": {"name": "q"}, "spec": {"max": []}}))
    _, example, _ = run("-f", EXAMPLE)

    code, out, err = run("-f", str(state), "-f", EXAMPLE)

    assert (code, out) == (0, example)
    assert err == "note: unreadable ElasticQuota left out: ElasticQuota q: spec.max: expected an object, got list\n"
    _, as_json, _ = run("-f", str(state), "-f", EXAMPLE, "-o", "json")
    assert json.loads(as_json)["notes"] == ["unreadable ElasticQuota left out: ElasticQuota q: spec.max: expected "
                                            "an object, got list"]


def test_a_child_of_an_unreadable_quota_is_broken_as_such_not_a_root(tmp_path: Path) -> None:
    state = tmp_path / "tree.yaml"
    state.write_text(yaml.safe_dump_all([
        {"kind": "ElasticQuota", "metadata": {"name": "org", "namespace": "ops",
                                              "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
         "spec": {"max": {"koordinator.sh/gpu-core": "lots"}}},
        {"kind": "ElasticQuota", "metadata": {"name": "team", "namespace": "t",
                                              "labels": {"quota.scheduling.koordinator.sh/parent": "org"}},
         "spec": {"max": {"koordinator.sh/gpu-core": "100"}}},
    ]))

    code, out, err = run("-f", str(state), "-A")

    assert code == 1  # as the audit's quota-parent-unreadable error
    assert out.splitlines()[1].startswith("team (broken: parent org unreadable) ")
    unreadable_parent = ("ElasticQuota t/team names parent org (label quota.scheduling.koordinator.sh/parent), which "
                         "exists but cannot be read: which limits apply to its pods above its own is unknown; fix "
                         "that ElasticQuota")
    assert err.splitlines()[1:] == [f"error: {unreadable_parent}"]
    assert err.splitlines()[0].startswith("note: unreadable ElasticQuota left out: ElasticQuota org: ")
    _, as_json, _ = run("-f", str(state), "-A", "-o", "json")
    assert json.loads(as_json)["treeProblems"] == [{"check": "quota-parent-unreadable", "namespace": "t",
                                                    "name": "team", "message": unreadable_parent}]


def test_a_parent_cycle_and_a_missing_parent_are_shown_broken_and_end_1(tmp_path: Path) -> None:
    """Not drawn as an ordinary parent and child, nor as a root: the tree is marked broken, why is said,
    and the status is the audit's for the same files."""
    def eq(name: str, parent: str) -> dict[str, Any]:
        return {"kind": "ElasticQuota", "metadata": {"name": name, "namespace": "ns", "labels": {
            "quota.scheduling.koordinator.sh/parent": parent, "quota.scheduling.koordinator.sh/is-parent": "true"}},
            "spec": {"max": {"koordinator.sh/gpu-core": "100"}}}
    state = tmp_path / "tree.yaml"
    state.write_text(yaml.safe_dump_all([eq("a", "b"), eq("b", "a"), eq("orphan", "gone")]))

    code, out, err = run("-f", str(state))

    assert code == 1
    assert [line.split("   ")[0] for line in out.splitlines()[1:]] == [
        "orphan (broken: parent gone missing)", "a (broken: in a parent cycle)", "b (broken: in a parent cycle)"]
    assert err.splitlines() == [
        "error: ElasticQuota ns/orphan names parent gone (label quota.scheduling.koordinator.sh/parent), which does "
        "not exist: no ancestor limits its pods; create the parent first or fix the label",
        "error: the parent labels of ElasticQuotas a -> b -> a form a cycle: none of them reaches the root quota"]
    audit = CliRunner().invoke(cli, ["audit", "-f", str(state)])
    assert audit.exit_code == code
    code, as_json, _ = run("-f", str(state), "-o", "json")
    assert code == 1
    assert {q["name"]: [b["check"] for b in q.get("broken", [])] for q in json.loads(as_json)["quotas"]} == {
        "orphan": ["quota-parent-missing"], "a": ["quota-parent-cycle"], "b": ["quota-parent-cycle"]}
    assert run("-f", str(state), "-o", "name")[0] == 1


def test_wide_adds_namespace_chain_free_limit_source_and_every_card_count() -> None:
    code, out, _ = run("-f", EXAMPLE, "-o", "wide")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["QUOTA", "NAMESPACE", "RESOURCE", "MIN", "MAX", "USED", "VENDOR", "SHARE",
                                "RESERVED", "FREE", "BINDS-FIRST", "CHAIN-FREE", "LIMIT-FROM", "MIXED", "USE"]
    vision = next(line for line in lines if line.startswith("  team-vision"))
    assert re.split(r"\s{3,}", vision.strip()) == [
        "team-vision", "team-vision", "gpu-core", "400 (4 cards)", "800 (8 cards)", "250 (2.5 cards)",
        "200 (2 cards)", "50 (0.5 cards)", "0", "550 (5.5 cards)", "team-vision", "550 (5.5 cards)", "max", "-", "31%"]


def test_an_unreadable_pod_is_a_note_not_a_crash(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(yaml.safe_dump_all([
        {"kind": "ElasticQuota", "metadata": {"name": "a", "namespace": "a"},
         "spec": {"max": {"koordinator.sh/gpu-core": "100"}}},
        {"kind": "Pod", "metadata": {"name": "odd", "namespace": "a"}, "spec": 3},
    ]))
    code, out, err = run("-f", str(state))
    assert code == 0
    assert err.strip() == "note: unreadable pod not counted: a/odd"
    assert re.split(r"\s{3,}", out.splitlines()[1].strip())[4] == "0"  # USED
    _, document, _ = run("-f", str(state), "-o", "json")
    assert json.loads(document)["unreadablePods"] == ["a/odd"]


@pytest.mark.parametrize("fmt", ["table", "wide"])
def test_colour_into_a_pipe_keeps_every_column(fmt: str) -> None:
    """``quota --color always | less -R``: colour and bars, and every column of the piped table, whatever
    width $COLUMNS claims: only a terminal's width is fitted to."""
    _, plain, _ = run("-f", EXAMPLE, "-o", fmt, "--color", "never", columns=80)
    _, coloured, _ = run("-f", EXAMPLE, "-o", fmt, "--color", "always", columns=80)

    assert "\x1b[32m" in coloured
    bars = re.compile(r"[█░]+ ")
    assert [bars.sub("", ANSI.sub("", line), count=1) for line in coloured.splitlines()] == plain.splitlines()
    assert "(4 cards)" in coloured


def test_a_file_of_only_an_admission_review_gets_the_note_docs_promise(tmp_path: Path) -> None:
    review = tmp_path / "review.json"
    review.write_text((Path(EXAMPLE).parent / "requests" / "mutate-pod.json").read_text())

    code, out, err = run("-f", str(review))

    assert (code, out) == (0, "No ElasticQuotas.\n")
    assert err == (f"note: {review}: AdmissionReview left out: an AdmissionReview is a request to the webhook, not "
                   "an object of the cluster; `gpuquota explain -f FILE` answers it as the webhook would\n")
