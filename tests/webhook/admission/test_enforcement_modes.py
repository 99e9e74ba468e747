"""Enforcement modes and config reload through a real ``gpuquota serve`` over verified TLS.

The server runs on the offline example cluster: team-nlp has 4 cards and 2 in use, so a 9-card
pod is over quota and a 2-card pod fits. Every config is a file given with ``--config``; the
reload tests rewrite it the way kubelet updates a ConfigMap volume (a new directory, the
``..data`` symlink renamed over the old one) or the way an editor does (a file renamed over the
old one), and poll with a deadline until the running server answers differently.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from reviews import body, pod, review
from webhookproc import GPUQUOTA, REPO_ROOT, WebhookProcess

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"
JSON_HEADERS = {"Content-Type": "application/json"}
RELOAD_DEADLINE = 15.0
# Fresh connections spread over both workers; this many answers in a row means all have reloaded.
SETTLED_IN_A_ROW = 20

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
OVER_QUOTA = {CORE: "900", RATIO: "900"}
FITS = {CORE: "200", RATIO: "200"}
OVER_QUOTA_MESSAGE = (
    "exceeded quota: team-nlp/team-nlp, requested: koordinator.sh/gpu-core=900,koordinator.sh/gpu-memory-ratio=900, "
    "used: koordinator.sh/gpu-core=200,koordinator.sh/gpu-memory-ratio=200, "
    "limited: koordinator.sh/gpu-core=400,koordinator.sh/gpu-memory-ratio=400")
WARNED = f"gpuquota would deny (QuotaExceeded, enforcement: warn): {OVER_QUOTA_MESSAGE}"

ENFORCE = "enforcement: {default: enforce}\n"
WARN = "enforcement:\n  checks:\n    QuotaExceeded: warn\n"
DRY_RUN = "enforcement:\n  checks:\n    QuotaExceeded: dry-run\n"

_names = itertools.count()


class KubeletVolume:
    """A ConfigMap volume as kubelet lays it out: conversion.yaml -> ..data/conversion.yaml -> ..<version>/."""

    def __init__(self, directory: Path, text: str) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self._version = 0
        self._write(text)
        (directory / "..data").symlink_to(f"..{self._version}")
        (directory / "conversion.yaml").symlink_to("..data/conversion.yaml")

    @property
    def path(self) -> Path:
        return self.directory / "conversion.yaml"

    def _write(self, text: str) -> None:
        self._version += 1
        version = self.directory / f"..{self._version}"
        version.mkdir()
        (version / "conversion.yaml").write_text(text, encoding="utf-8")

    def update(self, text: str) -> None:
        old = self.directory / f"..{self._version}"
        self._write(text)
        scratch = self.directory / "..data_tmp"
        scratch.symlink_to(f"..{self._version}")
        scratch.replace(self.directory / "..data")  # the atomic swap (rename(2))
        (old / "conversion.yaml").unlink()
        old.rmdir()


def replace_file(path: Path, text: str) -> None:
    scratch = path.with_name(path.name + ".new")
    scratch.write_text(text, encoding="utf-8")
    scratch.replace(path)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Path], WebhookProcess]]:
    servers: list[WebhookProcess] = []

    def start(config: Path) -> WebhookProcess:
        server = WebhookProcess(tmp_path / f"server-{len(servers)}",
                                serve_args=["--state", str(EXAMPLE_STATE), "--config", str(config)])
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conversion.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def validate(server: WebhookProcess, resources: dict[str, str], *, uid: str | None = None) -> dict[str, Any]:
    """One /validate-pods call on a fresh verified connection (so calls spread over the workers)."""
    with requests.Session() as http:
        http.trust_env = False
        http.verify = str(server.ca_file)
        obj = pod(f"trainer-{next(_names)}", "team-nlp", resources=resources)
        answer = http.post(server.url + "/validate-pods", data=body(review(obj, uid=uid)), headers=JSON_HEADERS,
                           timeout=10)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def decision_lines(server: WebhookProcess) -> list[dict[str, Any]]:
    records = []
    for line in server.log_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            records.append(record)
    return records


def would_deny_count(server: WebhookProcess, reason: str, mode: str) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "gpuquota_would_deny_total" and sample.labels == {
                    "endpoint": "/validate-pods", "reason": reason, "mode": mode}:
                return float(sample.value)
    return 0.0


def denied_over_quota(response: dict[str, Any]) -> bool:
    return (response["allowed"] is False and response["status"]["reason"] == "QuotaExceeded"
            and response["status"]["message"] == OVER_QUOTA_MESSAGE)


def warned_over_quota(response: dict[str, Any]) -> bool:
    return response["allowed"] is True and response.get("warnings") == [WARNED]


def silently_allowed(response: dict[str, Any]) -> bool:
    return response["allowed"] is True and "warnings" not in response and "status" not in response


def settle(server: WebhookProcess, expected: Callable[[dict[str, Any]], bool]) -> None:
    """Poll until every worker answers the over-quota pod as ``expected``, within the deadline."""
    deadline = time.monotonic() + RELOAD_DEADLINE
    in_a_row = 0
    last: dict[str, Any] = {}
    while in_a_row < SETTLED_IN_A_ROW:
        assert time.monotonic() < deadline, f"config not in force after {RELOAD_DEADLINE:.0f}s; last answer {last}"
        last = validate(server, OVER_QUOTA)
        in_a_row = in_a_row + 1 if expected(last) else 0


# -- the three modes ---------------------------------------------------------------------------


def test_warn_allows_with_the_denial_as_warning_and_holds_no_room(serve: Callable[[Path], WebhookProcess],
                                                                 tmp_path: Path) -> None:
    server = serve(config_file(tmp_path, WARN))

    for _ in range(3):
        response = validate(server, OVER_QUOTA)
        assert response["allowed"] is True
        assert response["warnings"] == [WARNED]
        assert "status" not in response

    # Nothing was reserved for the warned pods: 2 more cards still fit, with no warning at all.
    assert silently_allowed(validate(server, FITS))
    assert would_deny_count(server, "QuotaExceeded", "warn") == 3


def test_dry_run_allows_silently_logs_and_counts(serve: Callable[[Path], WebhookProcess], tmp_path: Path) -> None:
    server = serve(config_file(tmp_path, DRY_RUN))
    before = would_deny_count(server, "QuotaExceeded", "dry-run")

    response = validate(server, OVER_QUOTA, uid="uid-dry-run-1")

    assert silently_allowed(response)
    assert would_deny_count(server, "QuotaExceeded", "dry-run") == before + 1
    deadline = time.monotonic() + RELOAD_DEADLINE
    while not (lines := [r for r in decision_lines(server) if r.get("uid") == "uid-dry-run-1"]):
        assert time.monotonic() < deadline, f"no decision line for uid-dry-run-1:\n{server.tail()}"
        time.sleep(0.05)  # polling the log file with a deadline
    line = lines[0]
    assert (line["endpoint"], line["decision"], line["code"]) == ("/validate-pods", "allowed", 200)
    assert line["reason"] == "would-deny QuotaExceeded (dry-run)"
    assert line["would_deny"] == [{"check": "QuotaExceeded", "mode": "dry-run", "message": OVER_QUOTA_MESSAGE}]
    assert silently_allowed(validate(server, FITS))  # nothing reserved either


def test_enforce_denies(serve: Callable[[Path], WebhookProcess], tmp_path: Path) -> None:
    server = serve(config_file(tmp_path, "enforcement: {default: warn, checks: {QuotaExceeded: enforce}}\n"))

    response = validate(server, OVER_QUOTA)

    assert denied_over_quota(response)
    assert response["status"]["code"] == 403
    assert "warnings" not in response
    assert would_deny_count(server, "QuotaExceeded", "enforce") == 0


def test_invalid_gpu_requests_in_warn_mode_are_still_judged_by_quota(serve: Callable[[Path], WebhookProcess],
                                                                      tmp_path: Path) -> None:
    server = serve(config_file(tmp_path, "enforcement: {checks: {Invalid: warn}}\n"))
    invalid_note = ("gpuquota would deny (Invalid, enforcement: warn): invalid resource unit koordinator.sh/gpu-core: "
                    "150: a share of one card must be 1-100, and more than one card must be a whole multiple of 100 "
                    "(use 100 or 200) (asked for by container \"main\") [rule: percentage]")

    # (core 150 with ratio 200 would be schedulable once Koordinator's pod webhook adds gpu.shared: 2)
    fits = validate(server, {CORE: "150", RATIO: "100"})
    over = validate(server, {CORE: "950", RATIO: "900"})

    assert fits["allowed"] is True
    assert fits["warnings"] == [invalid_note]
    # QuotaExceeded is still enforced: the relaxed check does not let the pod skip the quota.
    assert over["allowed"] is False
    assert over["status"]["reason"] == "QuotaExceeded"
    assert over["warnings"][0].startswith("gpuquota would deny (Invalid, enforcement: warn): invalid resource unit "
                                          "koordinator.sh/gpu-core: 950")


def test_relaxed_modes_never_apply_to_malformed_requests(serve: Callable[[Path], WebhookProcess],
                                                         tmp_path: Path) -> None:
    server = serve(config_file(tmp_path, "enforcement: {default: dry-run}\n"))
    broken_pod = pod("broken", "team-nlp", resources=OVER_QUOTA)
    broken_pod["spec"]["containers"] = "not a list"

    with requests.Session() as http:
        http.trust_env = False
        http.verify = str(server.ca_file)
        not_json = http.post(server.url + "/validate-pods", data=b"not json", headers=JSON_HEADERS, timeout=10)
        unreadable = http.post(server.url + "/validate-pods", data=body(review(broken_pod)), headers=JSON_HEADERS,
                               timeout=10).json()["response"]

    assert not_json.status_code == 400
    assert unreadable["allowed"] is False
    assert (unreadable["status"]["code"], unreadable["status"]["reason"]) == (400, "BadRequest")
    assert silently_allowed(validate(server, OVER_QUOTA))  # while the checks themselves are relaxed


def test_serve_refuses_to_start_with_an_unknown_check(tmp_path: Path) -> None:
    config = config_file(tmp_path, "enforcement: {checks: {QuotaExceded: warn}}\n")

    result = subprocess.run([str(GPUQUOTA), "serve", "--state", str(EXAMPLE_STATE), "--config", str(config),
                             "--cert-dir", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 2
    assert result.stderr == (f"Error: {config}: enforcement.checks: unknown check 'QuotaExceded' (expected one of "
                             "Invalid, QuotaExceeded, QuotaNotFound, ParentQuota, UnknownGpuMemory)\n")


# -- reload --------------------------------------------------------------------------------------


def test_a_kubelet_configmap_update_flips_the_mode_without_restart(serve: Callable[[Path], WebhookProcess],
                                                                  tmp_path: Path) -> None:
    volume = KubeletVolume(tmp_path / "config", ENFORCE)
    server = serve(volume.path)
    master = server.pid
    assert denied_over_quota(validate(server, OVER_QUOTA))

    volume.update(WARN)
    settle(server, warned_over_quota)

    volume.update(DRY_RUN)
    settle(server, silently_allowed)

    volume.update(ENFORCE)
    settle(server, denied_over_quota)

    assert server.alive() and server.pid == master
    loaded = [r for r in decision_lines(server) if r.get("event") == "config_reload" and r["result"] == "loaded"]
    assert {r["enforcement"] for r in loaded} == {"default=enforce QuotaExceeded=warn",
                                                  "default=enforce QuotaExceeded=dry-run", "default=enforce"}
    assert all(r["path"] == str(volume.path) for r in loaded)


def test_an_invalid_rewrite_keeps_the_previous_mode_and_logs_an_error(serve: Callable[[Path], WebhookProcess],
                                                                      tmp_path: Path) -> None:
    path = config_file(tmp_path, WARN)
    server = serve(path)
    assert warned_over_quota(validate(server, OVER_QUOTA))

    replace_file(path, "enforcement:\n  checks:\n    QuotaExceeded: block\n")
    expected_error = (f"{path}: enforcement.checks.QuotaExceeded: unknown mode 'block' "
                      "(expected one of enforce, warn, dry-run)")
    deadline = time.monotonic() + RELOAD_DEADLINE
    while not any(r.get("event") == "config_reload" and r["result"] == "error" for r in decision_lines(server)):
        assert time.monotonic() < deadline, f"no reload error logged:\n{server.tail()}"
        assert warned_over_quota(validate(server, OVER_QUOTA))  # the previous mode, meanwhile and after

    errors = [r for r in decision_lines(server) if r.get("event") == "config_reload" and r["result"] == "error"]
    assert {r["error"] for r in errors} == {expected_error}
    assert all(r["kept"] == "the previous config stays in force" for r in errors)
    for _ in range(SETTLED_IN_A_ROW):
        assert warned_over_quota(validate(server, OVER_QUOTA))
    assert server.alive()

    # Still watching: a good version after the bad one is picked up.
    replace_file(path, ENFORCE)
    settle(server, denied_over_quota)
