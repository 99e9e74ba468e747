"""``gpuquota quota`` with kubectl's habits: ``-o name``, ``--no-headers``, ``-l``."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cli.main import cli

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "cluster")
CHILD_LABEL = "quota.scheduling.koordinator.sh/parent"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner(env={"COLUMNS": "200", "NO_COLOR": None}).invoke(cli, ["quota", "-f", EXAMPLE, *args],
                                                                        prog_name="gpuquota")
    return result.exit_code, result.stdout, result.stderr


def shown(*args: str) -> list[str]:
    code, out, err = run("-o", "json", *args)
    assert (code, err) == (0, "")
    return [quota["name"] for quota in json.loads(out)["quotas"]]


def test_output_name_lists_what_was_asked_for() -> None:
    assert run("-o", "name") == (0, "elasticquota.scheduling.sigs.k8s.io/ml-platform\n"
                                    "elasticquota.scheduling.sigs.k8s.io/team-nlp\n"
                                    "elasticquota.scheduling.sigs.k8s.io/team-vision\n", "")
    # Without the ancestors the table shows around a selection.
    assert run("-o", "name", "-n", "team-nlp")[1] == "elasticquota.scheduling.sigs.k8s.io/team-nlp\n"
    assert run("-o", "name", "ml-platform")[1].count("\n") == 3  # NAME: its subtree


def test_no_headers_drops_the_header_lines() -> None:
    _, with_headers, _ = run("--pods")
    code, out, _ = run("--no-headers", "--pods")
    assert code == 0
    assert [line for line in with_headers.splitlines()
            if line and not line.startswith(("QUOTA ", "QUOTA\t"))] == out.splitlines()
    assert not any(line.startswith("QUOTA") for line in out.splitlines())


def test_label_selector_chooses_quotas_shown_with_their_ancestors() -> None:
    assert shown("-l", f"{CHILD_LABEL}=ml-platform") == ["ml-platform", "team-nlp", "team-vision"]
    assert shown("-l", f"!{CHILD_LABEL}") == ["ml-platform"]
    assert shown("-l", "quota.scheduling.koordinator.sh/is-parent=true") == ["ml-platform"]
    assert run("-o", "name", "-l", f"{CHILD_LABEL}")[1] == ("elasticquota.scheduling.sigs.k8s.io/team-nlp\n"
                                                            "elasticquota.scheduling.sigs.k8s.io/team-vision\n")
    assert run("-l", "team=none") == (0, "No ElasticQuotas matching team=none.\n", "")
    assert run("-l", "team=none", "--no-headers") == (0, "", "")


def test_a_bad_selector_is_a_usage_error() -> None:
    code, out, err = run("-l", "a=(")
    assert (code, out) == (2, "")
    assert err.endswith("See 'gpuquota quota --help' for usage.\n")
    assert err.startswith("Error: Invalid value for '-l' / '--selector': selector 'a=(': ")
