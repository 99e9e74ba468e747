"""docs/webhook.md's metrics table names every ``result`` the server counts admissions under.

The values are read from the server's code, not listed here: every call of
``observability.observe`` (the one writer of ``gpuquota_admission_requests_total``) and every
``decision`` an ``AdmissionResponse`` can carry. A call whose result this test cannot read as a
string fails it, so a new outcome cannot slip past the table.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from webhook.admission.observability import REQUESTS
from webhook.admission.review import AdmissionResponse

REPO_ROOT = Path(__file__).resolve().parents[3]
DOC = REPO_ROOT / "docs" / "webhook.md"
METRIC = "gpuquota_admission_requests_total"


def strings(node: ast.expr) -> set[str] | None:
    """The strings an expression can be, when it is made of literals alone; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = strings(node.body), strings(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def decisions() -> set[str]:
    """Every ``decision`` an AdmissionResponse is built with, and its default."""
    default = {f.name: f.default for f in dataclasses.fields(AdmissionResponse)}["decision"]
    found = {default} if isinstance(default, str) else set()
    for path in sorted((REPO_ROOT / "webhook").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AdmissionResponse":
                for keyword in node.keywords:
                    if keyword.arg == "decision":
                        values = strings(keyword.value)
                        assert values is not None, f"{path}:{node.lineno}: a decision that is not a literal"
                        found |= values
    return found


def emitted_results() -> set[str]:
    results: set[str] = set()
    calls = 0
    for path in sorted((REPO_ROOT / "webhook").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "observe"):
                continue
            calls += 1
            result = node.args[2]
            if isinstance(result, ast.Attribute) and result.attr == "decision":
                results |= decisions()
                continue
            values = strings(result)
            assert values is not None, f"{path}:{node.lineno}: observe() with a result this test cannot read"
            results |= values
    assert calls >= 3  # decisions, rejected bodies, failures: the test reads the code it means to
    return results


def documented_results() -> set[str]:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith(f"| `{METRIC}{{")]
    assert len(rows) == 1, rows
    cell = rows[0].split("|")[3]
    listed = re.sub(r"\([^)]*\)", "", cell).strip().removeprefix("result:")
    return {value.strip() for value in re.split(r"[,;]", listed) if value.strip()}


def test_the_metrics_table_names_every_result_the_server_counts() -> None:
    assert documented_results() == emitted_results()


def test_the_counters_help_names_them_too() -> None:
    help_text = REQUESTS._documentation
    listed = re.search(r"result \(([^)]*)\)", help_text)
    assert listed is not None, help_text
    assert {value.strip() for value in listed.group(1).split(",")} == emitted_results()


def test_observe_is_the_one_writer_of_the_counter() -> None:
    writers = [path for path in (REPO_ROOT / "webhook").rglob("*.py")
               if "REQUESTS.labels(" in path.read_text(encoding="utf-8")]
    assert [p.relative_to(REPO_ROOT).as_posix() for p in writers] == ["webhook/admission/observability.py"]
    assert (REPO_ROOT / "webhook/admission/observability.py").read_text(encoding="utf-8").count("REQUESTS.labels(") == 1
