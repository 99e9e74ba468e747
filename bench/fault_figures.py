"""Run the fault tests several times and print their figures as a Markdown table (docs/reliability.md).

    .venv/bin/python bench/fault_figures.py [RUNS] [pytest args...]

Runs tests/e2e/test_faults.py with GPUQUOTA_FAULT_RUNS=RUNS (default 3) and GPUQUOTA_FAULT_REPORT
set to a temporary file, then prints per fault: runs, the most pods any burst stored and the pods
stored after refilling, each against the room, answers to the burst's creates by outcome (summed
over runs), and the recovery time (median and maximum: from the end of the fault to the first
create answered by a quota decision). Extra
arguments go to pytest, e.g. ``-k 'not decider'``. Exits with pytest's status.

``--room`` prints the table of room lost instead (docs/reliability.md, issue 37): per fault, runs,
pods over-admitted (the tests fail on any), refill creates refused although the room had space for
them (summed over runs), and the seconds from the end of the fault until the room left was all
stored again (median and maximum).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def table(lines: list[dict[str, Any]]) -> str:
    by_fault: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_fault[line["fault"]].append(line)
    rows = ["| fault | runs | stored after the burst, max / room | stored after refilling / room "
            "| burst answers (all runs) | recovery s, median (max) |",
            "|---|---|---|---|---|---|"]
    for fault, runs in by_fault.items():
        outcomes: Counter[str] = Counter()
        for run in runs:
            outcomes.update(run["outcomes"])
        stored = sorted({f"{run['stored_at_end']}/{run['room']}" for run in runs})
        recoveries = [run["recovery_seconds"] for run in runs]
        answers = ", ".join(f"{name}: {count}" for name, count in sorted(outcomes.items()))
        burst = max(run["stored_after_burst"] for run in runs)
        rows.append(f"| {fault} | {len(runs)} | {burst}/{runs[0]['room']} | {' or '.join(stored)} | {answers} | "
                    f"{statistics.median(recoveries):.2f} ({max(recoveries):.2f}) |")
    return "\n".join(rows)


def room_table(lines: list[dict[str, Any]]) -> str:
    by_fault: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_fault[line["fault"]].append(line)
    rows = ["| fault | runs | over-admitted | refused with room (all runs) | room usable again, s, median (max) |",
            "|---|---|---|---|---|"]
    for fault, runs in by_fault.items():
        back = [run.get("room_back_seconds", 0.0) for run in runs]
        rows.append(f"| {fault} | {len(runs)} | {sum(run.get('over_admitted', 0) for run in runs)} | "
                    f"{sum(run.get('refused_with_room', 0) for run in runs)} | "
                    f"{statistics.median(back):.2f} ({max(back):.2f}) |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    room = "--room" in argv
    argv = [arg for arg in argv if arg != "--room"]
    runs = argv[0] if argv and argv[0].isdigit() else "3"
    extra = argv[1:] if argv and argv[0].isdigit() else argv
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "faults.jsonl"
        env = {**os.environ, "GPUQUOTA_FAULT_RUNS": runs, "GPUQUOTA_FAULT_REPORT": str(report)}
        status = subprocess.run([sys.executable, "-m", "pytest", "tests/e2e/test_faults.py", "-q",
                                 "-p", "no:cacheprovider", *extra], cwd=REPO, env=env, check=False).returncode
        lines = [json.loads(text) for text in report.read_text().splitlines()] if report.exists() else []
    print(room_table(lines) if room else table(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
