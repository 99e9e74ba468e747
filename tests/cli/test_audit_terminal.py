"""``gpuquota audit`` as people read it: the message in the default table, errors first, a summary
line, the width of the terminal (wrapped at word boundaries), colour on a terminal only, and
kubectl's habits: ``-o name``, ``--no-headers``, ``-l``, kind aliases."""

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

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"


def pod(name: str, namespace: str, limits: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


OBJECTS: list[dict[str, Any]] = [
    # A warning (legacy request) that sorts first by kind, an error that sorts later: the table
    # must still list the error first.
    {"kind": "Deployment", "metadata": {"name": "api", "namespace": "team", "labels": {"app": "api"}},
     "spec": {"template": {"spec": {"containers": [
         {"name": "server", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}},
    pod("bad", "team", {CORE: "150"}, {"app": "trainer", "tier": "gpu"}),
    pod("legacy", "team", {"nvidia.com/gpu": "1"}, {"app": "trainer"}),
    pod("legacy", "other", {"nvidia.com/gpu": "1"}, {"app": "batch"}),
    {"kind": "ResourceQuota", "metadata": {"name": "rq", "namespace": "team"},
     "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}},
]


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(OBJECTS))
    return path


def run(cluster: Path, *args: str, columns: int = 200, env: dict[str, str | None] | None = None
        ) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": str(columns), "NO_COLOR": None, **(env or {})}).invoke(
        cli, ["audit", "-f", str(cluster), *args])
    return result.exit_code, result.stdout, result.stderr


def findings(cluster: Path) -> list[dict[str, Any]]:
    _, out, _ = run(cluster, "-o", "json")
    return list(json.loads(out)["findings"])


def test_piped_table_has_the_message_errors_first_and_a_summary(cluster: Path) -> None:
    code, out, err = run(cluster, columns=60)  # piped: the width does not matter, nothing is cut
    assert (code, err) == (1, "")
    assert "\x1b[" not in out
    lines = out.splitlines()
    assert lines[0].split() == ["SEVERITY", "KIND", "NAMESPACE", "NAME", "CHECK", "MESSAGE"]
    rows = [re.split(r"\s{3,}", line, maxsplit=5) for line in lines[1:-1]]
    assert [row[0] for row in rows] == ["error", "warning", "warning", "warning", "warning"]
    messages = {(f["kind"], f["namespace"], f["name"], f["check"]): f["message"] for f in findings(cluster)}
    # One line per finding with its whole message, in the MESSAGE column.
    assert {tuple(row[1:5]): row[5] for row in rows} == messages
    assert all(line.index(row[5]) == lines[0].index("MESSAGE") for line, row in zip(lines[1:], rows, strict=False))
    assert lines[-1] == "5 findings: 1 error, 4 warnings, 0 info; exit status 1 (--fail-on error)"


def test_summary_says_what_fail_on_makes_of_it(cluster: Path) -> None:
    for args, code, summary in [
        (["--fail-on", "none"], 0, "5 findings: 1 error, 4 warnings, 0 info; exit status 0 (--fail-on none)"),
        (["resourcequota"], 0, "1 finding: 0 errors, 1 warning, 0 info; exit status 0 (--fail-on error)"),
        (["resourcequota", "--fail-on", "warning"], 1,
         "1 finding: 0 errors, 1 warning, 0 info; exit status 1 (--fail-on warning)"),
    ]:
        result = run(cluster, *args)
        assert (result[0], result[1].splitlines()[-1]) == (code, summary)


def on_terminal(monkeypatch: pytest.MonkeyPatch, cluster: Path, columns: int, *args: str) -> list[str]:
    monkeypatch.setattr(output, "on_terminal", lambda: True)
    code, out, _ = run(cluster, *args, columns=columns)
    assert code == 1
    return out.splitlines()


@pytest.mark.parametrize("columns", [200, 160, 120, 100, 80, 60])
def test_terminal_table_fits_the_width_and_wraps_between_words(monkeypatch: pytest.MonkeyPatch, cluster: Path,
                                                               columns: int) -> None:
    lines = [ANSI.sub("", line) for line in on_terminal(monkeypatch, cluster, columns)]
    assert max(len(line) for line in lines) <= columns
    header = lines[0]
    messages = [f["message"] for f in sorted(findings(cluster), key=lambda f: f["severity"] != "error")]
    text = "\n".join(lines[1:-1])
    for message in messages:
        # The message's words, in order, each whole: the line breaks fall only where it had a space.
        words = r"\s+".join(re.escape(word) for word in message.split(" "))
        assert re.search(words, text), message
    if "MESSAGE" in header:
        start = header.index("MESSAGE")
        assert all(line[start:start + 1].strip() for line in lines[1:-1])  # every part in the column
    else:  # too narrow for a column: each message on indented lines under its row
        assert columns <= 80
        assert any(line.startswith("    the webhook would rewrite:") for line in lines)
    if columns >= 160:
        assert "CHECK" in header  # room for everything
    if columns <= 100:
        assert "CHECK" not in header  # -o wide and -o json keep it


def test_wide_keeps_the_check_column_on_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch, cluster: Path) -> None:
    lines = [ANSI.sub("", line) for line in on_terminal(monkeypatch, cluster, 100, "-o", "wide")]
    assert lines[0].split()[:5] == ["SEVERITY", "KIND", "NAMESPACE", "NAME", "CHECK"]
    assert max(len(line) for line in lines) <= 100


def test_summary_line_breaks_on_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch, cluster: Path) -> None:
    lines = [ANSI.sub("", line) for line in on_terminal(monkeypatch, cluster, 50)]
    assert lines[-2:] == ["5 findings: 1 error, 4 warnings, 0 info;", "exit status 1 (--fail-on error)"]


def test_colour_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, cluster: Path) -> None:
    _, piped, _ = run(cluster)
    assert "\x1b[" not in piped
    coloured = on_terminal(monkeypatch, cluster, 400)  # wide enough for every message on one line
    assert coloured[1].startswith("\x1b[31m\x1b[1merror\x1b[0m")  # red, bold
    assert coloured[2].startswith("\x1b[33m")  # yellow warning
    assert "\x1b[" not in coloured[0]  # the header is plain
    assert [ANSI.sub("", line) for line in coloured] == piped.splitlines()  # same text, same alignment
    _, no_color, _ = run(cluster, env={"NO_COLOR": "1"})
    assert "\x1b[" not in no_color
    _, never, _ = run(cluster, "--color", "never")
    assert "\x1b[" not in never


def test_colour_always_when_piped(cluster: Path) -> None:
    _, out, _ = run(cluster, "--color", "always")
    assert "\x1b[31m" in out
    assert ANSI.sub("", out.splitlines()[1]).startswith("error ")


def test_output_name_is_kubectls(cluster: Path) -> None:
    code, out, _ = run(cluster, "-o", "name")
    assert code == 1
    # Errors first, one line per object (the pod legacy of two namespaces is one name, as kubectl's -A).
    assert out.splitlines() == ["pod/bad", "deployment.apps/api", "pod/legacy", "resourcequota/rq"]


def test_no_headers(cluster: Path) -> None:
    code, out, _ = run(cluster, "--no-headers")
    lines = out.splitlines()
    assert code == 1
    assert len(lines) == 5 and lines[0].startswith("error ")
    assert not any("SEVERITY" in line or "findings:" in line for line in lines)
    code, out, _ = run(cluster, "--no-headers", "-l", "app=nothing")
    assert (code, out) == (0, "")


@pytest.mark.parametrize(("selector", "names"), [
    ("app=trainer", {("team", "bad"), ("team", "legacy")}),
    ("app!=trainer", {("team", "api"), ("other", "legacy"), ("team", "rq")}),  # rq has no labels
    ("app in (api, batch)", {("team", "api"), ("other", "legacy")}),
    ("app notin (api, batch),app", {("team", "bad"), ("team", "legacy")}),
    ("tier", {("team", "bad")}),
    ("!app", {("team", "rq")}),
    ("app=trainer,tier=gpu", {("team", "bad")}),
])
def test_label_selector_chooses_the_objects_shown(cluster: Path, selector: str, names: set[tuple[str, str]]) -> None:
    _, out, _ = run(cluster, "-o", "json", "-l", selector)
    assert {(f["namespace"], f["name"]) for f in json.loads(out)["findings"]} == names


def test_selector_keeps_judging_everything(tmp_path: Path) -> None:
    # The pod's quota is over its limit only with the unlabelled pod counted too.
    quota = {"kind": "ElasticQuota", "metadata": {"name": "team", "namespace": "team", "labels": {"team": "a"}},
             "spec": {"max": {CORE: "100", RATIO: "100"}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all([quota, pod("a", "team", {CORE: "60", RATIO: "60"}),
                                        pod("b", "team", {CORE: "60", RATIO: "60"})]))
    code, out, _ = run(path, "-l", "team=a", "-o", "json")
    assert code == 1
    report = json.loads(out)
    assert [(f["check"], f["name"]) for f in report["findings"]] == [("quota-over-limit", "team")]
    assert set(report["summary"]["quotaUsage"]) == {"team"}


def test_a_bad_selector_is_a_usage_error(cluster: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", "-f", str(cluster), "-l", "app in trainer"], prog_name="gpuquota")
    assert result.exit_code == 2
    assert result.stderr == ("Error: Invalid value for '-l' / '--selector': selector 'app in trainer': app in needs "
                             "a list of values in parentheses\nSee 'gpuquota audit --help' for usage.\n")


@pytest.mark.parametrize(("aliases", "scope"), [
    (["pod", "pods", "po", "POD"], "pods"),
    (["node", "nodes", "no"], "nodes"),
    (["eq", "elasticquota", "elasticquotas", "quota", "quotas"], "quotas"),
    (["workload", "workloads"], "workloads"),
    (["resourcequota", "resourcequotas"], "resourcequotas"),
])
def test_kind_aliases(aliases: list[str], scope: str) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "cluster"
    # The example cluster has findings of every scope but pods (its legacy pod can reach only a
    # vendor-only node, so the webhook leaves it as written); its pods without the nodes have one.
    example = str(example / "pods.yaml" if scope == "pods" else example)
    expected = CliRunner().invoke(cli, ["audit", scope, "-f", example, "-o", "json"]).stdout
    assert json.loads(expected)["findings"]
    for alias in aliases:
        assert CliRunner().invoke(cli, ["audit", alias, "-f", example, "-o", "json"]).stdout == expected


def test_kinds_joined_by_commas(cluster: Path) -> None:
    _, out, _ = run(cluster, "po,rq".replace("rq", "resourcequota"), "-o", "json")
    assert {f["kind"] for f in json.loads(out)["findings"]} == {"Pod", "ResourceQuota"}
    _, everything, _ = run(cluster, "pods,all", "-o", "json")
    assert everything == run(cluster, "-o", "json")[1]


def test_an_unknown_kind_lists_the_known_ones(cluster: Path) -> None:
    result = CliRunner().invoke(cli, ["audit", "deploy", "-f", str(cluster)], prog_name="gpuquota")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        "Error: Invalid value for 'KIND': 'deploy' is not a kind the audit checks: all; nodes (node, no); "
        "quotas (quota, elasticquota, elasticquotas, eq); pods (pod, po); workloads (workload); "
        "resourcequotas (resourcequota)")


def test_a_line_break_in_a_manifest_never_splits_a_finding(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    odd = pod("odd", "team", {"nvidia.com/gpu": "1"})
    odd["spec"]["containers"][0]["name"] = "two\nlines"
    path.write_text(yaml.safe_dump_all([odd]))
    code, out, _ = run(path, "--no-headers")
    assert code == 0
    assert len(out.splitlines()) == 1
    assert 'container "two lines"' in out
