"""Objects that cannot be judged or converted are named, with their file and the path at fault, and
never stop the others: an AdmissionReview among manifests, a workload whose template is not a
mapping, a pod without a spec, a pod with an unreadable quantity."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from cli.main import cli

GOOD_POD = """apiVersion: v1
kind: Pod
metadata: {name: good, namespace: team-a}
spec:
  containers:
  - {name: main, image: trainer, resources: {limits: {nvidia.com/gpu: 1}}}
"""
BAD_POD = """apiVersion: v1
kind: Pod
metadata: {name: bad, namespace: team-a}
spec:
  containers:
  - {name: main, image: trainer, resources: {limits: {nvidia.com/gpu: two}}}
"""
LIST_TEMPLATE = """apiVersion: apps/v1
kind: Deployment
metadata: {name: listed, namespace: team-a}
spec:
  template: [1, 2]
"""
NO_SPEC = """apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: team-a}
"""
REVIEW = """apiVersion: admission.k8s.io/v1
kind: AdmissionReview
request:
  uid: "1"
  namespace: team-a
  object:
    apiVersion: v1
    kind: Pod
    metadata: {name: reviewed}
    spec:
      containers:
      - {name: main, image: trainer, resources: {limits: {nvidia.com/gpu: 2}}}
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def write(directory: Path, **files: str) -> dict[str, str]:
    paths = {}
    for name, text in files.items():
        (directory / f"{name}.yaml").write_text(text)
        paths[name] = str(directory / f"{name}.yaml")
    return paths


def test_one_unreadable_pod_does_not_stop_convert_of_the_others(tmp_path: Path) -> None:
    paths = write(tmp_path, a_bad=BAD_POD, b_good=GOOD_POD)

    code, out, err = run("convert", "-f", str(tmp_path))

    assert code == 1
    bad, good = yaml.safe_load_all(out)
    assert bad == yaml.safe_load(BAD_POD)  # as written
    assert good["spec"]["containers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
    assert f"{paths['a_bad']}: Pod/team-a/bad: not converted: spec.containers[0].resources.limits[nvidia.com/gpu]: " \
           "quantities must match" in err
    assert "Pod/team-a/good: rewrote" in err


def test_a_workload_whose_template_is_not_a_mapping_is_named_by_convert(tmp_path: Path) -> None:
    paths = write(tmp_path, listed=LIST_TEMPLATE, pod=GOOD_POD)

    code, out, err = run("convert", "-f", str(tmp_path))

    assert code == 1
    listed, _ = yaml.safe_load_all(out)
    assert listed == yaml.safe_load(LIST_TEMPLATE)
    assert f"{paths['listed']}: Deployment/team-a/listed: not converted: spec.template: is a list, not a mapping\n" \
           in err


def test_convert_says_what_it_does_not_do_with_an_admission_review(tmp_path: Path) -> None:
    paths = write(tmp_path, review=REVIEW)

    code, out, err = run("convert", "-f", paths["review"])

    assert (code, yaml.safe_load(out)) == (0, yaml.safe_load(REVIEW))
    assert err == (f"{paths['review']}: AdmissionReview/?: not converted: an AdmissionReview is a request to the "
                   "webhook, not an object of the cluster; `gpuquota explain -f FILE` answers it as the webhook "
                   "would\n")


def test_audit_names_every_object_it_cannot_judge_with_file_and_path(tmp_path: Path) -> None:
    paths = write(tmp_path, bare=NO_SPEC, listed=LIST_TEMPLATE, review=REVIEW, good=GOOD_POD)

    code, out, _ = run("audit", "-f", str(tmp_path), "-o", "json")

    assert code == 1  # the unreadable pod and workload are errors, as the API server would refuse them
    findings = [f for f in json.loads(out)["findings"] if f["check"] == "object-not-judged"]
    assert [(f["severity"], f["kind"], f["namespace"], f["name"], f["details"]) for f in findings] == [
        ("warning", "AdmissionReview", "", "", {"file": paths["review"], "path": "request.object"}),
        ("error", "Deployment", "team-a", "listed", {"file": paths["listed"], "path": "spec.template"}),
        ("error", "Pod", "team-a", "bare", {"file": paths["bare"], "path": "spec"}),
    ]
    assert findings[1]["message"] == (f"{paths['listed']}: spec.template: is a list, not a mapping; the audit "
                                      "cannot judge this object")
    assert findings[2]["message"] == f"{paths['bare']}: spec: is missing; the audit cannot judge this object"


def test_audit_table_shows_them_too_and_keeps_judging_the_rest(tmp_path: Path) -> None:
    write(tmp_path, listed=LIST_TEMPLATE, good=GOOD_POD)

    code, out, _ = run("audit", "-f", str(tmp_path), "-o", "name")

    assert (code, out) == (1, "deployment.apps/listed\npod/good\n")


EXAMPLE_CLUSTER = str(Path(__file__).resolve().parents[2] / "examples" / "cluster")


def test_explain_names_a_workload_it_cannot_read_and_explains_the_others(tmp_path: Path) -> None:
    paths = write(tmp_path, listed=LIST_TEMPLATE, pod=GOOD_POD.replace("team-a", "team-nlp"))

    code, out, err = run("explain", "-f", str(tmp_path), "--state", EXAMPLE_CLUSTER)

    assert code == 1  # the API server would refuse the workload: not everything given would be admitted
    assert out.startswith("Pod team-nlp/good: ")
    assert f"{paths['listed']}: Deployment team-a/listed: not explained: spec.template: is a list, not a mapping\n" \
        in err


def test_explain_of_only_an_unreadable_workload_says_why_in_one_error_line(tmp_path: Path) -> None:
    paths = write(tmp_path, listed=LIST_TEMPLATE)

    code, out, err = run("explain", "-f", paths["listed"], "--state", EXAMPLE_CLUSTER)

    assert (code, out) == (2, "")
    assert err == (f"Error: {paths['listed']}: Deployment team-a/listed: spec.template: is a list, not a mapping; "
                   "nothing to explain\n")


QUOTA = """apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team-a}
spec:
  max: {nvidia.com/gpu: 2}
"""
REVIEW_NOT_AN_OBJECT = ("an AdmissionReview is a request to the webhook, not an object of the cluster; "
                        "`gpuquota explain -f FILE` answers it as the webhook would")


def test_migrate_plan_says_what_it_does_not_do_with_an_admission_review(tmp_path: Path) -> None:
    paths = write(tmp_path, quota=QUOTA, review=REVIEW)
    note = f"{paths['review']}: AdmissionReview not planned: {REVIEW_NOT_AN_OBJECT}"

    code, out, err = run("migrate", "plan", "-f", str(tmp_path))

    assert (code, err) == (0, "")
    assert out.splitlines()[0] == "# step 1: convert ElasticQuota team-a/team-a"
    assert out.splitlines()[-1] == f"NOTE: {note}"
    code, out, err = run("migrate", "plan", "-f", str(tmp_path), "-o", "json")
    assert (code, err, json.loads(out)["notes"]) == (0, "", [note])


def test_quota_says_what_it_does_not_do_with_an_admission_review(tmp_path: Path) -> None:
    paths = write(tmp_path, quota=QUOTA, review=REVIEW)
    note = f"{paths['review']}: AdmissionReview left out: {REVIEW_NOT_AN_OBJECT}"

    code, out, err = run("quota", "-f", str(tmp_path))

    assert (code, err) == (0, f"note: {note}\n")
    assert out.splitlines()[1].split()[:2] == ["team-a", "gpu-core"]
    code, out, _ = run("quota", "-f", str(tmp_path), "-o", "json")
    assert (code, json.loads(out)["notes"]) == (0, [note])


def test_explain_says_it_left_an_admission_review_out_of_the_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    paths = write(state, quota=QUOTA, review=REVIEW)
    pod = write(tmp_path, pod=GOOD_POD)["pod"]

    code, out, err = run("explain", "-f", pod, "--state", str(state))

    assert code == 0
    assert err.splitlines()[0] == f"note: --state {paths['review']}: AdmissionReview left out: {REVIEW_NOT_AN_OBJECT}"
    assert out.startswith("Pod team-a/good: ")
