"""``gpuquota explain`` of gang members and of workloads of several pods: whether the whole gang
fits now, its need and the room at each level, and how many of a workload's pods fit now (all,
some, none), in the verdict and in the exit status (0, 4, 1).

The counts are checked against the webhook's own state admitting the same pods one after another
(``QuotaState.admit_pod``, not a dry run), so a count the view gives is the count the webhook admits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli.main import cli
from gpuquota_core.conversion import DEFAULT_CONFIG
from gpuquota_core.pod_admission import PodAdmission, read_pod_admission
from webhook.quota.state import QuotaState

CORE, RATIO = "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory-ratio"
GANG_NAME, GANG_MIN = "gang.scheduling.koordinator.sh/name", "gang.scheduling.koordinator.sh/min-available"
POD_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io"


def quota(cards: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
            "metadata": {"name": "team-train", "namespace": "team-train"},
            "spec": {"max": {CORE: str(cards * 100), RATIO: str(cards * 100)}}}


NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
        "status": {"allocatable": {CORE: "1600", RATIO: "1600"}}}


def spec(cards: int = 1) -> dict[str, Any]:
    return {"containers": [{"name": "worker", "image": "trainer",
                            "resources": {"limits": {CORE: str(cards * 100), RATIO: str(cards * 100)}}}]}


def job(name: str, parallelism: int, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "team-train"},
            "spec": {"parallelism": parallelism,
                     "template": {"metadata": {"annotations": annotations or {}, "labels": labels or {}},
                                  "spec": spec()}}}


def gang(name: str, minimum: int) -> dict[str, str]:
    return {GANG_NAME: name, GANG_MIN: str(minimum)}


def member(index: int, gang_name: str, minimum: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{gang_name}-{index}", "namespace": "team-train", "uid": f"uid-{index}",
                         "annotations": gang(gang_name, minimum)},
            "spec": spec(), "status": {"phase": "Running"}}


def explain(tmp_path: Path, subjects: list[dict[str, Any]], state: list[dict[str, Any]],
            *extra: str) -> tuple[int, str]:
    (tmp_path / "state.yaml").write_text(yaml.safe_dump_all([NODE, *state]))
    (tmp_path / "subjects.yaml").write_text(yaml.safe_dump_all(subjects))
    result = CliRunner().invoke(cli, ["explain", "-f", str(tmp_path / "subjects.yaml"),
                                      "--state", str(tmp_path / "state.yaml"), *extra])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout


def admitted_one_after_another(workload: dict[str, Any], state_objects: list[dict[str, Any]]) -> int:
    """The reference: the webhook's state admitting the workload's pods one by one, each reserved."""
    state = QuotaState()
    state.load([NODE, *state_objects])
    template = workload["spec"]["template"]
    admitted = 0
    for index in range(workload["spec"]["parallelism"]):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{workload['metadata']['name']}-{index}", "namespace": "team-train",
                            "uid": f"pod-{index}", **template["metadata"]}, "spec": template["spec"]}
        reading = read_pod_admission(pod, None, DEFAULT_CONFIG, uid=f"review-{index}", operation="CREATE")
        assert isinstance(reading.admission, PodAdmission)
        admitted += state.admit_pod(reading.admission).allowed
    return admitted


def test_a_gang_job_of_eight_in_room_for_three_fits_not_at_all(tmp_path: Path) -> None:
    train = job("train", 8, gang("gang-b", 8))
    code, out = explain(tmp_path, [train], [quota(3)])
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "Job team-train/train (pod template): REFUSED (403 QuotaExceeded)"
    assert lines[1] == (
        f"  gang team-train/gang-b needs {CORE}=800,{RATIO}=800 (8 × {CORE}=100,{RATIO}=100) at team-train/team-train; "
        f"{CORE}=300,{RATIO}=300 free: pod team-train/train- is a member of gang team-train/gang-b (minimum 8 members) "
        "and no member is admitted until the whole minimum fits")
    gang_at = lines.index("  replicas: 8; pods alike that fit now: 0 (none)")
    room = "300 (3 cards)   0 (0 cards)   800 (8 cards)   300 (3 cards)   -500 (-5 cards)   over"
    assert lines[gang_at + 1:gang_at + 5] == [
        f"Gang: team-train/gang-b (annotations), minimum 8 members, 0 taking room: the minimum needs {CORE}=800,"
        f"{RATIO}=800 (8 × one member's request); the rest of it, {CORE}=800,{RATIO}=800, does not fit now",
        "  LEVEL        RESOURCE           LIMIT           USED          GANG ADDS       FREE BEFORE     FREE AFTER",
        f"  team-train   gpu-core           {room}",
        f"  team-train   gpu-memory-ratio   {room}"]
    assert admitted_one_after_another(train, [quota(3)]) == 0


def test_a_plain_job_of_eight_in_room_for_three_fits_in_part_and_exits_4(tmp_path: Path) -> None:
    plain = job("plain", 8)
    code, out = explain(tmp_path, [plain], [quota(3)])
    assert code == 4
    lines = out.splitlines()
    assert lines[0] == "Job team-train/plain (pod template): ADMITTED, but only 3 of 8 pods fit now"
    assert lines[-1] == "  replicas: 8; pods alike that fit now: 3 (some)"
    code, out = explain(tmp_path, [plain], [quota(3)], "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"], explanation["replicas"], explanation["replicasThatFit"],
            explanation["fit"], explanation["gang"]) == (4, True, 8, 3, "some", None)
    assert admitted_one_after_another(plain, [quota(3)]) == 3


def test_refused_beats_some_in_the_exit_status_and_all_fit_exits_0(tmp_path: Path) -> None:
    assert explain(tmp_path, [job("plain", 8), job("train", 8, gang("gang-b", 8))], [quota(3)])[0] == 1
    assert explain(tmp_path, [job("plain", 8), job("small", 2)], [quota(3)])[0] == 4
    assert explain(tmp_path, [job("small", 2)], [quota(3)])[0] == 0


def test_members_beyond_the_minimum_fit_like_plain_pods_in_the_room_the_gang_leaves(tmp_path: Path) -> None:
    # A minimum of eight in room for nine: the eight, then one plain pod of the two beyond it.
    train = job("train", 10, gang("gang-a", 8))
    code, out = explain(tmp_path, [train], [quota(9)], "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["replicasThatFit"], explanation["fit"]) == (4, 9, "some")
    assert explanation["gang"] == {
        "gang": "team-train/gang-a", "source": "annotations", "minMembers": 8, "members": 0,
        "need": {CORE: "800", RATIO: "800"}, "rest": {CORE: "800", RATIO: "800"}, "held": {}, "complete": False,
        "fits": True, "levels": [
            {"quota": "team-train", "namespace": "team-train", "resource": resource, "limit": "900", "used": "0",
             "needs": "800", "freeBefore": "900", "freeAfter": "100", "fits": True} for resource in (CORE, RATIO)]}
    assert admitted_one_after_another(train, [quota(9)]) == 9


def test_stored_members_take_their_part_of_the_gangs_need(tmp_path: Path) -> None:
    # Five of eight members run; three cards are left of ten, just the rest of the minimum.
    stored = [member(index, "gang-a", 8) for index in range(5)]
    train = job("train", 3, gang("gang-a", 8))
    code, out = explain(tmp_path, [train], [quota(8), *stored], "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["replicasThatFit"], explanation["fit"]) == (0, 3, "all")
    found = explanation["gang"]
    assert (found["members"], found["need"], found["rest"], found["fits"]) == (
        5, {CORE: "800", RATIO: "800"}, {CORE: "300", RATIO: "300"}, True)
    levels = [(level["used"], level["needs"], level["freeAfter"]) for level in found["levels"]]
    assert levels == [("500", "300", "0")] * 2
    # One card less and the rest of the minimum no longer fits: none of the three is admitted.
    code, out = explain(tmp_path, [train], [quota(7), *stored], "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"], explanation["replicasThatFit"], explanation["gang"]["fits"]) == (
        1, False, 0, False)
    assert admitted_one_after_another(train, [quota(7), *stored]) == 0
    assert admitted_one_after_another(train, [quota(8), *stored]) == 3


def test_a_pod_groups_members_given_with_their_pod_group(tmp_path: Path) -> None:
    # The PodGroup is given with the workload (created together); its minResources is the need.
    group = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "pg", "namespace": "team-train"},
             "spec": {"minMember": 4, "minResources": {"nvidia.com/gpu": "6"}}}
    workers = job("workers", 4, labels={POD_GROUP_LABEL: "pg"})
    code, out = explain(tmp_path, [group, workers], [quota(5)], "-o", "json")
    explanation = json.loads(out)["explanations"][0]
    assert (code, explanation["admitted"], explanation["replicasThatFit"]) == (1, False, 0)
    assert explanation["message"].startswith(
        f"gang team-train/pg needs {CORE}=600,{RATIO}=600 (its PodGroup's minResources) at team-train/team-train; ")
    assert (explanation["gang"]["source"], explanation["gang"]["need"]) == ("PodGroup", {CORE: "600", RATIO: "600"})
    # In the cluster's state instead, the same as given with it.
    code, _ = explain(tmp_path, [workers], [quota(5), group])
    assert code == 1
