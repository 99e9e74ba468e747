"""bench/production_shape.py's variants: which modes a command line measures, what each is called, and
which command lines it refuses before starting anything.

The script puts tests/ before the repository on sys.path when imported (it is a script), so it is
imported in a child interpreter, never into this test session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READ_ARGUMENTS = """
import json, sys
sys.path.insert(0, "bench")
import production_shape as shape
args = shape.parse(sys.argv[1:])
ours = [mode for mode in args.modes if shape.is_ours(mode)]
print(json.dumps({"modes": args.modes, "rounds": [args.repetitions, args.bursts],
                  "variants": {mode: str(path) for mode, path in args.variants.items()},
                  "titles": [shape.title(mode) for mode in args.modes],
                  "groups": [shape.process_groups(mode) for mode in ours],
                  "ledgers": [shape.ledger_namespace(mode) for mode in ours],
                  "labelled": [mode for mode in args.modes if shape.selected_by_label(mode)],
                  "room_bursts": [mode for mode in args.modes if shape.has_room(mode)],
                  "balances": args.balances}))
"""


def read_arguments(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", READ_ARGUMENTS, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def parsed(*argv: str) -> dict[str, list[str] | dict[str, str] | list[list[str]]]:
    result = read_arguments(*argv)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def refusal(*argv: str) -> str:
    result = read_arguments(*argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    return result.stderr.splitlines()[-1]


def test_every_variant_is_a_strict_mode_of_its_own_after_strict() -> None:
    other = ROOT / "bench" / ".."  # the same checkout by another spelling: resolved to one path
    got = parsed("--variant", "without-fastpath=.", "--baseline", str(other), "--variant", "no-date=" + str(ROOT))
    assert got["modes"] == ["native", "local", "strict", "strict-baseline", "strict-without-fastpath",
                            "strict-no-date"]
    assert got["variants"] == {"strict-baseline": str(ROOT), "strict-without-fastpath": str(ROOT),
                               "strict-no-date": str(ROOT)}
    assert got["titles"][2:] == ["ours, strict, 3 replicas + HAProxy",
                                 "baseline checkout: ours, strict, 3 replicas + HAProxy",
                                 "variant without-fastpath: ours, strict, 3 replicas + HAProxy",
                                 "variant no-date: ours, strict, 3 replicas + HAProxy"]
    assert got["groups"] == [["local server", ""], ["strict replicas", "HAProxy"],
                             ["baseline strict replicas", "baseline's HAProxy"],
                             ["without-fastpath strict replicas", "without-fastpath's HAProxy"],
                             ["no-date strict replicas", "no-date's HAProxy"]]
    # Each variant's replicas keep their own ledger; --baseline's is the one docs/benchmarks.md ran with.
    assert got["ledgers"] == ["gpuquota-ledger", "gpuquota-ledger", "gpuquota-ledger-baseline",
                              "gpuquota-ledger-without-fastpath", "gpuquota-ledger-no-date"]


def test_modes_choose_among_the_variants_and_unchosen_variants_are_not_started() -> None:
    got = parsed("--variant", "a=.", "--variant", "b=.", "--modes", "none,strict-b,native,koord")
    assert got["modes"] == ["native", "strict-b", "koord"]
    assert got["variants"] == {"strict-b": str(ROOT)}


def test_the_issue_sizes_give_way_to_explicit_repetitions_and_bursts() -> None:
    assert parsed()["rounds"] == [10, 10]
    assert parsed("--issue-sizes")["rounds"] == [16, 20]
    assert parsed("--issue-sizes", "--repetitions", "5", "--bursts", "5")["rounds"] == [5, 5]
    assert parsed("--issue-sizes", "--bursts", "6")["rounds"] == [16, 6]


def test_malformed_variants_are_refused_with_the_spec_named(tmp_path: Path) -> None:
    assert refusal("--variant", "fastpath").endswith("error: --variant 'fastpath': expected NAME=CHECKOUT")
    assert "--variant 'Fast=.': the name must be 1 to 24 lower-case letters" in refusal("--variant", "Fast=.")
    assert refusal("--variant", f"x={tmp_path}").endswith(
        f"error: --variant 'x={tmp_path}': {tmp_path} is not a checkout of this repository")
    assert refusal("--variant", "x=.", "--variant", "x=.").endswith("the name x is given twice")
    assert refusal("--baseline", ".", "--variant", "baseline=.").endswith(
        "the name baseline is given twice (--baseline is --variant baseline=CHECKOUT)")
    assert refusal("--modes", "none,native,strict-x").endswith(
        "error: unknown modes: strict-x (known: native, go-both, local, strict, koord, koord3); "
        "strict-x needs --variant x=CHECKOUT")


def test_a_variant_may_name_haproxys_balance_and_only_a_measured_variant_may() -> None:
    got = parsed("--variant", "owner=.", "--balance", "owner=first")
    assert got["balances"] == {"strict-owner": "first"}
    assert "--balance 'other=first'" in refusal("--variant", "owner=.", "--balance", "other=first")
    assert "--balance 'owner=random'" in refusal("--variant", "owner=.", "--balance", "owner=random")


def test_the_two_webhook_limit_runs_only_when_named_and_is_measured_beside_native() -> None:
    assert "go-both" not in parsed()["modes"]
    got = parsed("--variant", "a=.", "--modes", "none,strict,go-both,koord3,native,strict-a")
    # The references first (native, then the limit), then ours, then Koordinator's.
    assert got["modes"] == ["native", "go-both", "strict", "strict-a", "koord3"]
    assert got["titles"][1] == ("the two-webhook limit: Go stdlib reference behind our two configurations "
                                "(validating: decode and allow)")
    # Not ours: no ledger, no replicas of ours; its namespaces are selected by our configurations' label.
    assert got["ledgers"] == ["gpuquota-ledger", "gpuquota-ledger-a"]
    assert got["labelled"] == ["go-both", "strict", "strict-a", "koord3"]
    # It admits every pod: no burst with room for fewer.
    assert got["room_bursts"] == ["native", "strict", "strict-a", "koord3"]


TABLE_WITH_THE_LIMIT = """
import sys
from collections import Counter
sys.path.insert(0, "bench")
import production_shape as shape
args = shape.parse(["--modes", "native,go-both,strict", "--room", "3", "--burst-size", "10", "--clients", "4"])
samples = shape.Samples(args.modes)
samples.paired_ms = {"native": [[2.0]], "go-both": [[4.0]], "strict": [[5.0]]}
groups = {"apiserver + etcd": 1.0, "Go reference": 0.5, "strict replicas": 2.0, "HAProxy": 0.1}
for mode, kinds in (("native", ("all", "room")), ("go-both", ("all",)), ("strict", ("all", "room"))):
    for kind in kinds:
        stored = 10 if kind == "all" else 3
        samples.bursts.append(shape.BurstResult(mode, kind, 1.0, stored, Counter(), groups, stored,
                                                [stored] if mode == "native" else [2, 1]))
print(shape.process_groups("go-both"))
print(shape.table(samples, args))
"""


def test_the_table_weighs_every_sequential_overhead_against_the_two_webhook_limit() -> None:
    result = subprocess.run([sys.executable, "-c", TABLE_WITH_THE_LIMIT], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    groups, *table = result.stdout.splitlines()
    assert groups == "('Go reference', '')"
    rows = {cells[0]: cells[1:] for cells in ([cell.strip() for cell in line.strip("|").split("|")]
                                               for line in table if line.startswith("| ") and "---" not in line)}
    overhead = next(cells for title, cells in rows.items() if title.startswith("added to a sequential create"))
    assert overhead == ["+2.00 (**0.50x** the two-webhook limit)", "+4.00 (**2.00x** native)",
                        "+5.00 (**2.50x** native, **1.25x** the two-webhook limit)"]
    # The limit has no quota: its room-for-fewer cell says so; the bursts' rows weigh against native only.
    room = next(cells for title, cells in rows.items() if title.startswith("room for 3"))
    assert room[1] == "n/a (no quota: it admits every pod)" and room[2].startswith("3 of 3 at the ancestor")
    rate = next(cells for title, cells in rows.items() if title.startswith("burst of 10 creates"))
    assert rate == ["10.0", "10.0 (**1.00x** native)", "10.0 (**1.00x** native)"]
    # Every process counts in the first CPU row; as if it ran alone, each mode's own: native the plane's
    # 1.0 ms a pod over 10 pods, the Go pair that and its server's, strict that, its replicas' and HAProxy's.
    every = next(cells for title, cells in rows.items() if title.startswith("CPU per admitted pod, all"))
    assert every == ["0.36", "0.36 (**1.00x** native)", "0.36 (**1.00x** native)"]
    alone = next(cells for title, cells in rows.items() if title.startswith("CPU per admitted pod, the apiserver"))
    assert alone == ["0.10", "0.15 (**1.50x** native)", "0.31 (**3.10x** native)"]


COUNTED = """
import sys
from collections import Counter
sys.path.insert(0, "bench")
import production_shape as shape
from prometheus_client import CollectorRegistry, Counter as Metric, Gauge, generate_latest

# One replica's scrape, as prometheus_client writes it: the two counters the table reads, and a gauge it skips.
registry = CollectorRegistry()
events = Metric("gpuquota_watch_events", "", ["kind", "type"], registry=registry)
writes = Metric("gpuquota_ledger_writes", "", ["result"], registry=registry)
Gauge("gpuquota_reservations", "", registry=registry).set(7)
events.labels("Pod", "ADDED").inc(10)
events.labels("ElasticQuota", "MODIFIED").inc(4)
writes.labels("ok").inc(3)
scraped = shape.counters(generate_latest(registry).decode())
print(sorted((" ".join(key), value) for key, value in scraped.items()))

args = shape.parse(["--modes", "native,strict", "--room", "3", "--burst-size", "10", "--clients", "4"])
samples = shape.Samples(args.modes)
samples.paired_ms = {"native": [[2.0]], "strict": [[5.0]]}
groups = {"apiserver + etcd": 1.0, "strict replicas": 2.0, "HAProxy": 0.1}
pod_added = ("gpuquota_watch_events_total", "Pod", "ADDED")
writes_ok = ("gpuquota_ledger_writes_total", "ok")
quota_modified = ("gpuquota_watch_events_total", "ElasticQuota", "MODIFIED")
recharged = ("gpuquota_usage_recharged_pods_total",)
# Three replicas each see every pod; in strict's bursts the writer alone writes the ledger.
watched = {"native": [Counter({pod_added: 10, recharged: 30}) for _ in range(3)],
           "strict": [Counter({pod_added: 10, writes_ok: 4, quota_modified: 2}), Counter({pod_added: 10}),
                      Counter({pod_added: 10, quota_modified: 1})]}
for mode in ("native", "strict"):
    samples.bursts.append(shape.BurstResult(mode, "all", 1.0, 10, Counter(), groups, 10, [10],
                                            {"strict": watched[mode]}))
    samples.bursts.append(shape.BurstResult(mode, "room", 1.0, 3, Counter(), groups, 3, [3],
                                            {"strict": [Counter({pod_added: 3})] * 3}))
print(shape.table(samples, args).split("counted per admitted pod")[1])
"""


def test_the_quota_services_counters_are_read_per_admitted_pod_and_per_replica() -> None:
    result = subprocess.run([sys.executable, "-c", COUNTED], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    scraped, *table = result.stdout.splitlines()
    # Every counter sample under its name and label values; the gauge is no counter.
    assert scraped == str([("gpuquota_ledger_writes_total ok", 3.0),
                           ("gpuquota_watch_events_total ElasticQuota MODIFIED", 4.0),
                           ("gpuquota_watch_events_total Pod ADDED", 10.0)])
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table
            if line.startswith("| ") and "---" not in line]
    assert rows[0] == ["bursts of", "ElasticQuota MODIFIED", "Pod ADDED", "pods charged again", "ledger writes, ok"]
    # Watch events and pods charged again: each replica's mean per admitted pod; ledger writes: all
    # replicas' per admitted pod.
    assert rows[1] == ["native ResourceQuota (`requests.nvidia.com/gpu`)", "0.00", "1.00", "3.00", "0.00"]
    assert rows[2] == ["ours, strict, 3 replicas + HAProxy", "0.10", "1.00", "0.00", "0.40"]
