"""The benchmark scripts still run and report what docs/benchmarks.md quotes, at toy sizes.

Nothing here is timed: each script runs as its README command runs it, with sizes small enough
for CI, and the tests check that it reached the end and that its tables say what was measured
(the pod and quota counts, the process tree, every mode and every row). A script that rots
would otherwise only be found the next time someone tries to reproduce a number.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Every script here needs Go (the control plane, the Go reference, bench/loadgen): the same
# fixture as the rest of the e2e suite skips locally without it and fails under CI.
pytestmark = pytest.mark.usefixtures("control_plane_binaries")

REPO = Path(__file__).resolve().parents[2]
SCRIPT_TIMEOUT = 420


def run_script(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT, env={**os.environ, **(env or {})}, check=False)
    assert result.returncode == 0, f"{args[0]} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result.stdout


def table_rows(output: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown row whose first cell is ``first_cell``."""
    rows = []
    for line in output.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if cells[0] == first_cell:
                rows.append(cells)
    return rows


def test_cache_scale_measures_the_cache_and_the_whole_server() -> None:
    output = run_script(["bench/cache_scale.py", "--pods", "300", "--nodes", "20", "--repeat", "1",
                         "--events", "200", "--variants", "live,live-nodeless,live-nodepage7,served", "--workers", "2"])
    [live] = table_rows(output, "live")
    assert live[1:4] == ["300", "2000", "20"]  # every pod, quota and node created was cached
    assert float(live[4]) > 0 and float(live[5]) > 0  # sync seconds, peak RSS
    assert float(live[8]) > 0 and float(live[11]) > 0  # nodes.json published, node events applied
    [nodeless] = table_rows(output, "live-nodeless")
    assert nodeless[1:4] == ["300", "2000", "0"] and nodeless[8] == "0.0"
    [paging] = table_rows(output, "live-nodepage7")  # the what-if: the 20 nodes listed in 3 pages
    assert paging[1:4] == ["300", "2000", "20"] and paging[8] == live[8]
    [served] = table_rows(output, "300")
    # pods, workers, processes: the master, the quota service and the two workers.
    assert served[1:3] == ["2", "4"]
    rss_synced, pss_synced, rss_served, pss_served = (float(cell) for cell in served[4:8])
    assert 0 < pss_synced <= rss_synced and 0 < pss_served <= rss_served


def test_watch_fanout_measures_every_watcher_count() -> None:
    output = run_script(["bench/watch_fanout.py", "--repetitions", "1", "--counts", "1,2", "--burst-size", "10",
                         "--clients", "4"])
    rows = table_rows(output, "1") + table_rows(output, "2")
    assert len(rows) == 2, output
    # CPU time is counted in clock ticks: ten pods may cost a watcher less than one.
    assert all(float(cell.split()[0]) >= 0 for row in rows for cell in row[1:]), output
    assert float(rows[0][1].split()[0]) > 0, output  # the apiserver stored ten pods


def test_apiserver_overhead_times_every_mode() -> None:
    output = run_script(["bench/apiserver_overhead.py", "3", "2"])
    assert "3 cycles of one create per mode" in output
    modes = [line for line in output.splitlines()
             if line.startswith("| ") and not line.startswith(("| mode", "|---"))]
    assert len(modes) == 6, output
    for row in modes:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert re.fullmatch(r"[+-]\d+\.\d\d", cells[4]), row  # the paired overhead in ms


def test_apiserver_overhead_times_a_baseline_checkout_beside_local() -> None:
    # This checkout as its own baseline: the mode runs a second local server from the given directory.
    output = run_script(["bench/apiserver_overhead.py", "3", "1", "--baseline", str(REPO), "--modes", "local,baseline"])
    modes = [line.split("|")[1].strip() for line in output.splitlines()
             if line.startswith("| ") and not line.startswith(("| mode", "|---"))]
    assert modes == ["no webhook", "webhooks, local accounting",
                     "webhooks, local accounting, baseline checkout"], output


def test_cli_scale_times_audit_and_plan() -> None:
    output = run_script(["bench/cli_scale.py", "--nodes", "20", "--quotas", "30", "--pods", "300",
                         "--repeat", "1", "--format", "json"])
    for command in ("`audit all`", "`migrate plan`"):
        [row] = table_rows(output, command)
        assert row[1].startswith("json") and float(row[2]) > 0 and float(row[5]) > 0


def test_admission_bench_checks_every_server_and_prints_every_row() -> None:
    output = run_script(["bench/run.py"], env={"BENCH_DURATION": "1s", "BENCH_WARMUP": "1s",
                                               "BENCH_ROUNDS": "1", "BENCH_RATES": "200"})
    closed = [line for line in output.splitlines() if re.match(r"\| 1 \| [^|]+ \| [a-z-]+ \| (1|8|32) \|", line)]
    assert len(closed) == 12, output  # four servers or endpoints at 1, 8 and 32 connections
    assert all(cells.split("|")[10].strip() == "0" for cells in closed), output  # no non-2xx answers
    [ratios] = [line for line in output.splitlines() if re.match(r"\| 1 \| \d+ % ", line)]
    assert ratios.count("%") >= 4
    fixed = [line for line in output.splitlines() if re.match(r"\| 1 \| [^|]+ \| [a-z-]+ \| 200 \|", line)]
    assert len(fixed) == 4, output
    assert all(cells.split("|")[11].strip() == "0/0/0" for cells in fixed), output  # no errors at 200 req/s


def test_production_shape_fills_the_table_and_stores_exactly_the_room() -> None:
    output = run_script(["bench/production_shape.py", "--repetitions", "1", "--bursts", "1", "--cycles", "3",
                         "--burst-size", "10", "--clients", "4", "--room", "3"])
    assert "1 repetitions; sequential: 3 cycles per repetition" in output
    figures, by_group = output.split("CPU per admitted pod by process group")
    by_group, counted_local, counted_strict = by_group.split("What the quota services of ")
    rows = [line for line in figures.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    assert len(rows) == 6, output
    group_rows = [line for line in by_group.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    assert len(group_rows) == 3 and all(line.count("|") == 6 for line in group_rows), by_group
    # What our quota services counted, per mode of ours: each server's watch showed every stored pod
    # of every mode's burst once, and strict's writes to its ledger are counted in its own bursts.
    assert counted_local.startswith("local server counted") and counted_strict.startswith("strict replicas counted")
    titles = ("native ResourceQuota (`requests.nvidia.com/gpu`)", "ours, local, 1 server",
              "ours, strict, 3 replicas + HAProxy")
    for counted in (counted_local, counted_strict):
        [header] = table_rows(counted, "bursts of")
        for title in titles:
            [row] = table_rows(counted, title)
            assert row[header.index("Pod ADDED")] == "1.00", counted
    [header] = table_rows(counted_strict, "bursts of")
    [strict_row] = table_rows(counted_strict, titles[2])
    assert float(strict_row[header.index("ledger writes, ok")]) > 0, counted_strict
    cells = [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]
    overhead, rate, refused, room, cpu, alone = cells
    assert all(len(row) == 4 for row in cells), output  # the row's title and the three modes
    for cell in overhead[1:]:
        assert re.match(r"[+-]\d+\.\d\d", cell), overhead
    assert all(float(cell.split()[0]) > 0 for cell in rate[1:]), rate
    # CPU time is counted in clock ticks: ten pods may cost less than one.
    assert all(float(cell.split()[0]) >= 0 for cell in cpu[1:]), cpu
    assert all(float(own.split()[0]) <= float(every.split()[0]) for own, every in zip(alone[1:], cpu[1:],
                                                                                  strict=True)), (alone, cpu)
    # Our two modes say how they compare with native.
    assert all(re.search(r"\(\*\*\d+\.\d\dx\*\* native\)", cell) for cell in rate[2:]), rate
    assert refused[1:] == ["0, 0; 0 of 1 bursts"] * 3, refused  # room for all: nothing refused
    # Room for 3: exactly 3 stored in every mode; ours at the parent, whose limit is the one that binds.
    assert room[0] == "room for 3, 10 creates: stored (leaf, and at the ancestor)"
    assert room[1] == "3 of 3 (the namespace's ResourceQuota)"
    assert all(cell.startswith("3 of 3 at the ancestor; leaves ") for cell in room[2:]), room


def test_production_shape_measures_koordinators_own_quota_admission() -> None:
    # koord-manager with EnableQuotaAdmission, one replica and three behind HAProxy, beside native.
    output = run_script(["bench/production_shape.py", "--repetitions", "1", "--bursts", "1", "--cycles", "3",
                         "--burst-size", "10", "--clients", "4", "--room", "3", "--modes", "none,native,koord,koord3"])
    figures, by_group = output.split("CPU per admitted pod by process group")
    [header] = table_rows(figures, "")
    assert header[1:] == ["native ResourceQuota (`requests.nvidia.com/gpu`)",
                          "Koordinator (koord-manager, EnableQuotaAdmission), 1 replica",
                          "Koordinator (koord-manager, EnableQuotaAdmission), 3 replicas + HAProxy"], header
    rows = [line for line in figures.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    overhead, rate, refused, room, cpu, alone = ([cell.strip() for cell in row.strip().strip("|").split("|")]
                                                for row in rows)
    # As if each mode ran alone: the other modes' servers left out, so never more than all processes.
    assert all(float(own.split()[0]) <= float(every.split()[0]) for own, every in zip(alone[1:], cpu[1:],
                                                                                  strict=True)), (alone, cpu)
    assert all(re.fullmatch(r"[+-]\d+\.\d\d \(.*native\)", cell) for cell in overhead[2:]), overhead
    assert all(float(cell.split()[0]) > 0 for cell in rate[1:]), rate
    assert refused[1:] == ["0, 0; 0 of 1 bursts"] * 3, refused
    # Its admission checks the leaf only: both leaves have room for the burst, so the parent's room
    # of 3 holds nothing back and all 10 are stored.
    assert room[1] == "3 of 3 (the namespace's ResourceQuota)"
    assert all(cell.startswith("10 of 3 at the ancestor; leaves ") for cell in room[2:]), room
    assert all(float(cell.split()[0]) >= 0 for cell in cpu[1:]), cpu
    [group_header] = table_rows(by_group, "")
    assert group_header[1:] == ["apiserver + etcd", "koord-manager", "koord-manager replicas",
                                "koord-manager's HAProxy"], group_header
    [replicas] = table_rows(by_group, "Koordinator (koord-manager, EnableQuotaAdmission), 3 replicas + HAProxy")
    assert float(replicas[3]) > 0, replicas  # its own replicas did its admissions


def test_production_shape_measures_a_baseline_checkout_beside_strict(tmp_path: Path) -> None:
    # This commit as its own baseline, exported (not a worktree: nothing is left registered in the repository).
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive, check=True)
    output = run_script(["bench/production_shape.py", "--repetitions", "1", "--bursts", "1", "--cycles", "3",
                         "--burst-size", "10", "--clients", "4", "--room", "3", "--baseline", str(baseline),
                         "--modes", "none,native,strict,strict-baseline"])
    assert f"baseline checkout: ours, strict, 3 replicas + HAProxy: the code of {baseline.resolve()}" in output
    figures, by_group = output.split("CPU per admitted pod by process group")
    by_group = by_group.split("What the quota services of ")[0]
    [header] = table_rows(figures, "")
    # No local server: only the chosen modes, the baseline last.
    assert header[1:] == ["native ResourceQuota (`requests.nvidia.com/gpu`)", "ours, strict, 3 replicas + HAProxy",
                          "baseline checkout: ours, strict, 3 replicas + HAProxy"], header
    rows = [line for line in figures.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    overhead, rate, refused, room, cpu, alone = ([cell.strip() for cell in row.strip().strip("|").split("|")]
                                                for row in rows)
    # As if each mode ran alone: the other modes' servers left out, so never more than all processes.
    assert all(float(own.split()[0]) <= float(every.split()[0]) for own, every in zip(alone[1:], cpu[1:],
                                                                                  strict=True)), (alone, cpu)
    # The baseline against native and against strict (three cycles: an overhead may come out at or below zero).
    assert re.fullmatch(r"[+-]\d+\.\d\d \(.*native.*, .*strict.*\)", overhead[3]), overhead
    assert re.fullmatch(r"\d+\.\d \(\*\*\d+\.\d\dx\*\* native, \*\*\d+\.\d\dx\*\* strict\)", rate[3]), rate
    assert float(rate[3].split()[0]) > 0, rate
    assert re.fullmatch(r"\d+\.\d\d \(.+, .+\)", cpu[3]), cpu
    assert refused[3] == "0, 0; 0 of 1 bursts", refused
    assert room[3].startswith("3 of 3 at the ancestor; leaves "), room
    [group_header] = table_rows(by_group, "")
    assert group_header[1:] == ["apiserver + etcd", "strict replicas", "baseline strict replicas", "HAProxy",
                                "baseline's HAProxy"], group_header
    [baseline_groups] = table_rows(by_group, "baseline checkout: ours, strict, 3 replicas + HAProxy")
    assert float(baseline_groups[3]) > 0, baseline_groups  # its own replicas did its admissions
