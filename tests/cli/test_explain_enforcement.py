"""``gpuquota explain`` under warn and dry-run enforcement (``--config``): a workload's pods that do
not fit the quota are admitted anyway, each with a would-deny, and explain says how many, which
check lets them through, and ends as the webhook does (0: every pod admitted).

Each count is checked against the webhook's own handlers (``AdmissionHandlers.validate_pod``, as
``/validate-pods`` calls it) admitting the same pods one after another under the same config, over
its own quota state, each admission reserving (not a dry run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from reviews import review
from statedecider import StateDecider

from cli.main import cli
from gpuquota_core.conversion import load_config
from webhook.admission.decisions import AdmissionHandlers
from webhook.admission.review import decode_review
from webhook.quota.state import QuotaState

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
GANG_NAME, GANG_MIN = "gang.scheduling.koordinator.sh/name", "gang.scheduling.koordinator.sh/min-available"
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
        "status": {"allocatable": {CORE: "1600", RATIO: "1600"}}}
WARN = "enforcement: {checks: {QuotaExceeded: warn}}\n"
DRY_RUN = "enforcement: {default: dry-run}\n"
ONE_CARD = f"{CORE}=100,{RATIO}=100"


def quota(cards: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "team-train", "namespace": "team-train"},
            "spec": {"max": {CORE: str(cards * 100), RATIO: str(cards * 100)}}}


def job(name: str, parallelism: int, annotations: dict[str, str] | None = None,
        limits: dict[str, str] | None = None) -> dict[str, Any]:
    container = {"name": "worker", "image": "trainer", "resources": {"limits": limits or {CORE: "100", RATIO: "100"}}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "team-train"},
            "spec": {"parallelism": parallelism,
                     "template": {"metadata": {"annotations": annotations or {}}, "spec": {"containers": [container]}}}}


def gang(name: str, minimum: int) -> dict[str, str]:
    return {GANG_NAME: name, GANG_MIN: str(minimum)}


def explain(tmp_path: Path, workload: dict[str, Any], cards: int, config: str | None,
            *extra: str) -> tuple[int, str]:
    (tmp_path / "state.yaml").write_text(yaml.safe_dump_all([NODE, quota(cards)]))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(workload))
    args = ["explain", "-f", str(tmp_path / "job.yaml"), "--state", str(tmp_path / "state.yaml"), *extra]
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
        args += ["--config", str(tmp_path / "config.yaml")]
    result = CliRunner().invoke(cli, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


@dataclass
class Served:
    admitted: int
    would_deny: int  # admitted only with a would-deny
    first_would_deny: tuple[int, str, str, str] | None  # (pod index, check, mode, message)


def served_one_after_another(workload: dict[str, Any], cards: int, config: str | None) -> Served:
    """The reference: /validate-pods' handler admitting the workload's pods one by one, each reserved."""
    state = QuotaState()
    state.load([NODE, quota(cards)])
    handlers = AdmissionHandlers(load_config(yaml.safe_load(config or "{}")), StateDecider(state))
    template = workload["spec"]["template"]
    served = Served(0, 0, None)
    for index in range(workload["spec"]["parallelism"]):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{workload['metadata']['name']}-{index}", "namespace": "team-train",
                            **template["metadata"]}, "spec": template["spec"]}
        outcome = handlers.validate_pod(decode_review(json.dumps(review(pod)).encode()))
        served.admitted += outcome.response.allowed
        if outcome.response.allowed and outcome.relaxed:
            served.would_deny += 1
            if served.first_would_deny is None:
                first = outcome.relaxed[-1]
                served.first_would_deny = (index, first.check, first.mode.value, first.message)
    return served


def test_warn_admits_a_plain_job_whole_and_names_the_pods_beyond_the_room(tmp_path: Path) -> None:
    plain = job("plain", 8)
    code, out = explain(tmp_path, plain, 3, WARN)
    assert code == 0
    lines = out.splitlines()
    over = (f"exceeded quota: team-train/team-train, requested: {ONE_CARD}, used: {CORE}=300,{RATIO}=300 "
            f"({CORE}=300,{RATIO}=300 of it reserved by admissions not yet seen), limited: {CORE}=300,{RATIO}=300")
    assert lines[:2] == [
        "Job team-train/plain (pod template): ADMITTED, all 8 pods, but only 3 fit now: the other 5 would be "
        "refused under enforce and pass with a warning (QuotaExceeded, warn mode)",
        f"  pods 4 to 8 would be refused (QuotaExceeded, warn mode): {over}"]
    assert lines[-1] == ("  replicas: 8; pods alike that fit now: 3 (some); admitted: 8, 5 of them only by warn or "
                         "dry-run enforcement")
    code, out = explain(tmp_path, plain, 3, WARN, "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"], explanation["replicas"], explanation["replicasThatFit"],
            explanation["fit"], explanation["replicasAdmitted"], explanation["replicasWouldBeRefused"],
            explanation["wouldDenyBeyondFit"], explanation["wouldDeny"]) == (
        0, True, 8, 3, "some", 8, 5, {"check": "QuotaExceeded", "mode": "warn", "message": over}, [])
    assert served_one_after_another(plain, 3, WARN) == Served(8, 5, (3, "QuotaExceeded", "warn", over))


def test_dry_run_admits_silently_and_says_so(tmp_path: Path) -> None:
    plain = job("plain", 4)
    code, out = explain(tmp_path, plain, 3, DRY_RUN)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("Job team-train/plain (pod template): ADMITTED, all 4 pods, but only 3 fit now: the other 1 "
                        "would be refused under enforce and pass silently, recorded as would-deny (QuotaExceeded, "
                        "dry-run mode)")
    assert lines[1].startswith("  pod 4 would be refused (QuotaExceeded, dry-run mode): exceeded quota: ")
    assert not any(line == "Warnings:" for line in lines)  # dry-run warns nobody
    reference = served_one_after_another(plain, 3, DRY_RUN)
    assert (reference.admitted, reference.would_deny) == (4, 1)
    assert reference.first_would_deny is not None and lines[1].endswith(reference.first_would_deny[3])


def test_a_gang_that_does_not_fit_is_admitted_whole_in_warn_mode_each_member_a_would_deny(tmp_path: Path) -> None:
    train = job("train", 8, gang("gang-b", 8))
    code, out = explain(tmp_path, train, 3, WARN)
    assert code == 0
    lines = out.splitlines()
    refusal = (f"gang team-train/gang-b needs {CORE}=800,{RATIO}=800 (8 × {ONE_CARD}) at team-train/team-train; "
               f"{CORE}=300,{RATIO}=300 free: pod team-train/train- is a member of gang team-train/gang-b (minimum "
               "8 members) and no member is admitted until the whole minimum fits")
    assert lines[:2] == [
        "Job team-train/train (pod template): ADMITTED, all 8 pods, but none fit now: all 8 would be refused under "
        "enforce and pass with a warning (QuotaExceeded, warn mode)",
        f"  would be refused (QuotaExceeded, warn mode): {refusal}"]
    assert ("  replicas: 8; pods alike that fit now: 0 (none); admitted: 8, 8 of them only by warn or dry-run "
            "enforcement") in lines
    # The gang's own line still says its minimum does not fit.
    assert any(line.startswith("Gang: team-train/gang-b (annotations)") and line.endswith("does not fit now")
               for line in lines)
    code, out = explain(tmp_path, train, 3, WARN, "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["replicasThatFit"], explanation["replicasAdmitted"],
            explanation["replicasWouldBeRefused"], explanation["gang"]["fits"]) == (0, 0, 8, 8, False)
    reference = served_one_after_another(train, 3, WARN)
    assert (reference.admitted, reference.would_deny) == (8, 8)
    assert reference.first_would_deny is not None and reference.first_would_deny[:3] == (0, "QuotaExceeded", "warn")
    # Served pods carry their own names; explain's template pod has the generated prefix.
    assert reference.first_would_deny[3] == refusal.replace("pod team-train/train- ", "pod team-train/train-0 ")


def test_a_gangs_minimum_then_plain_members_then_the_rest_let_through(tmp_path: Path) -> None:
    # Minimum four in room for five: the four, one plain member, and three beyond the room.
    train = job("train", 8, gang("gang-a", 4))
    code, out = explain(tmp_path, train, 5, DRY_RUN, "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["replicasThatFit"], explanation["replicasAdmitted"],
            explanation["replicasWouldBeRefused"], explanation["wouldDenyBeyondFit"]["mode"]) == (0, 5, 8, 3, "dry-run")
    reference = served_one_after_another(train, 5, DRY_RUN)
    assert reference.first_would_deny is not None
    assert (reference.admitted, reference.would_deny, reference.first_would_deny[0]) == (8, 3, 5)
    assert explanation["wouldDenyBeyondFit"]["message"] == reference.first_would_deny[3]


def test_warn_on_another_check_leaves_the_quota_enforced(tmp_path: Path) -> None:
    plain = job("plain", 8)
    code, out = explain(tmp_path, plain, 3, "enforcement: {checks: {ParentQuota: warn}}\n")
    assert code == 4
    assert out.splitlines()[0] == "Job team-train/plain (pod template): ADMITTED, but only 3 of 8 pods fit now"
    assert served_one_after_another(plain, 3, "enforcement: {checks: {ParentQuota: warn}}\n") == Served(3, 0, None)
    # And without any config, as before.
    assert explain(tmp_path, plain, 3, None)[0] == 4
    code, out = explain(tmp_path, job("train", 8, gang("gang-b", 8)), 3, None)
    assert (code, out.splitlines()[0]) == (1, "Job team-train/train (pod template): REFUSED (403 QuotaExceeded)")


def test_a_would_deny_every_pod_carries_counts_every_admitted_pod(tmp_path: Path) -> None:
    # gpu-core 150 is invalid (a share above one card); in warn, each pod passes with that would-deny.
    odd = job("odd", 2, limits={CORE: "150"})
    config = "enforcement: {checks: {Invalid: warn}}\n"
    code, out = explain(tmp_path, odd, 3, config, "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["replicasThatFit"], explanation["replicasAdmitted"],
            explanation["replicasWouldBeRefused"], explanation["wouldDenyBeyondFit"]) == (0, 2, 2, 2, None)
    assert [w["check"] for w in explanation["wouldDeny"]] == ["Invalid"]
    reference = served_one_after_another(odd, 3, config)
    assert (reference.admitted, reference.would_deny) == (2, 2)
