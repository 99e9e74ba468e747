"""``gpuquota convert``: the webhook's rewrite on manifest files, exact output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from cli.hints import NO_NODES as NO_NODES_HINTS
from cli.main import cli

NO_NODES = NO_NODES_HINTS["convert"]()

POD = """
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-a}
spec:
  containers:
  - name: main
    image: x
    resources:
      requests: {cpu: "2", nvidia.com/gpu: "2"}
      limits: {nvidia.com/gpu: "2"}
"""

CRONJOB = """
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: team-a}
spec:
  schedule: "@daily"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: job
            image: x
            resources: {limits: {amd.com/gpu: "1"}}
"""

CANONICAL_TWO = {"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["convert", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_pod_is_printed_canonical_and_the_rewrite_reported_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(POD)

    code, out, err = run("-f", str(tmp_path / "pod.yaml"))

    assert code == 0
    pod = yaml.safe_load(out)
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "2", **CANONICAL_TWO},
                                                         "limits": CANONICAL_TWO}
    assert err == (f"{NO_NODES}\n"
                   'Pod/team-a/trainer: rewrote container "main" nvidia.com/gpu: 2 -> '
                   "koordinator.sh/gpu-core: 200, koordinator.sh/gpu-memory-ratio: 200\n")


def test_cronjob_template_is_rewritten_from_stdin_as_json() -> None:
    code, out, _ = run("-f", "-", "-o", "json", stdin=CRONJOB)

    assert code == 0
    template = json.loads(out)["spec"]["jobTemplate"]["spec"]["template"]
    assert template["spec"]["containers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
    assert "gpuquota.koord-gpuquota.io/original-resources" in template["metadata"]["annotations"]


def test_patch_output_is_the_rfc6902_patch_per_object(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(POD + "---\n" + CRONJOB)

    code, out, _ = run("-f", str(tmp_path / "all.yaml"), "-o", "patch")

    assert code == 0
    first, second = json.loads(out)
    assert (first["kind"], first["name"], second["kind"], second["name"]) == ("Pod", "trainer", "CronJob", "nightly")
    assert {"op": "remove", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu"} in first["patch"]
    assert {"op": "add", "path": "/spec/jobTemplate/spec/template/spec/containers/0/resources/limits/"
            "koordinator.sh~1gpu-core", "value": "100"} in second["patch"]


def test_canonical_input_is_a_fixed_point(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(POD)
    _, once, _ = run("-f", str(tmp_path / "pod.yaml"))
    (tmp_path / "once.yaml").write_text(once)

    code, out, err = run("-f", str(tmp_path / "once.yaml"), "-o", "patch")

    assert (code, json.loads(out)["patch"], err) == (0, [], "")


def test_a_result_the_webhook_would_refuse_exits_1_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(POD.replace("nvidia.com/gpu", "koordinator.sh/gpu-core"))

    code, _, err = run("-f", str(tmp_path / "bad.yaml"))

    assert code == 1
    assert err.startswith("Pod/team-a/trainer: would be refused by /validate-pods: invalid resource device "
                          "requests: [koordinator.sh/gpu-core]")


def test_a_missing_file_exits_2_with_one_line(tmp_path: Path) -> None:
    code, _, err = run("-f", str(tmp_path / "nope.yaml"))
    assert (code, err) == (2, f"Error: {tmp_path}/nope.yaml: no such file or directory\n")


def test_a_bad_quantity_is_named_and_left_as_written_exit_1(tmp_path: Path) -> None:
    """As the audit reports it (pod-invalid-gpu-request), not as unreadable input: the file was read."""
    odd = POD.replace('nvidia.com/gpu: "2"}', 'nvidia.com/gpu: "two"}', 1)
    (tmp_path / "odd.yaml").write_text(odd)

    code, out, err = run("-f", str(tmp_path / "odd.yaml"))

    assert (code, out) == (1, odd)
    assert err.startswith(f"{tmp_path}/odd.yaml: Pod/team-a/trainer: not converted: spec.containers[0]")
    assert err.count("\n") == 1


DEPLOYMENT_AND_CONFIGMAP = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ns}
spec:
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: main
        resources: {limits: {koordinator.sh/gpu: "50"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a: b}
"""


def test_workload_template_and_untouched_objects_exact_yaml(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(DEPLOYMENT_AND_CONFIGMAP)

    code, out, err = run("-f", str(tmp_path / "d.yaml"))

    assert code == 0
    # The input's flow style stays: only the resources and the annotation change (its first, blank
    # line too: only the lines of the rewritten mappings are written anew).
    assert out == """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ns}
spec:
  template:
    metadata: {labels: {app: web}, annotations: {gpuquota.koord-gpuquota.io/original-resources: \
'{"containers":{"main":{"limits":{"koordinator.sh/gpu":"50"}}}}'}}
    spec:
      containers:
      - name: main
        resources: {limits: {koordinator.sh/gpu-core: "50", koordinator.sh/gpu-memory-ratio: "50"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
data: {a: b}
"""
    assert err == (f"{NO_NODES}\n"
                   'Deployment/ns/web: rewrote container "main" koordinator.sh/gpu: 50 -> koordinator.sh/gpu-core: 50, '
                   "koordinator.sh/gpu-memory-ratio: 50\n")


def test_exact_patch_for_one_object(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(DEPLOYMENT_AND_CONFIGMAP.split("---")[0])

    code, out, _ = run("-f", str(tmp_path / "d.yaml"), "-o", "patch")

    assert code == 0
    prefix = "/spec/template/spec/containers/0/resources/limits/"
    assert json.loads(out) == {"kind": "Deployment", "namespace": "ns", "name": "web", "patch": [
        {"op": "add", "path": "/spec/template/metadata/annotations", "value": {
            "gpuquota.koord-gpuquota.io/original-resources":
                '{"containers":{"main":{"limits":{"koordinator.sh/gpu":"50"}}}}'}},
        {"op": "remove", "path": prefix + "koordinator.sh~1gpu"},
        {"op": "add", "path": prefix + "koordinator.sh~1gpu-core", "value": "50"},
        {"op": "add", "path": prefix + "koordinator.sh~1gpu-memory-ratio", "value": "50"}]}


def test_a_bad_conversion_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(POD)
    (tmp_path / "c.yaml").write_text("transformation: []\n")

    code, out, err = run("-f", str(tmp_path / "d.yaml"), "--config", str(tmp_path / "c.yaml"))

    assert (code, out) == (2, "")
    assert err == (f"Error: {tmp_path}/c.yaml: the conversion config: unknown key 'transformation' (expected one of "
                   "transformations, gpuMemoryByModel, gpuModelLabel, renameDeprecated, enforcement, rewrite)\n")


def test_a_conversion_config_with_card_memory_turns_bytes_into_a_ratio(tmp_path: Path) -> None:
    pinned = POD.replace("spec:\n", "spec:\n  nodeSelector: {node.koordinator.sh/gpu-model: T4}\n", 1).replace(
        '{cpu: "2", nvidia.com/gpu: "2"}', "{koordinator.sh/gpu-memory: 8Gi}").replace(
        '{nvidia.com/gpu: "2"}', "{koordinator.sh/gpu-memory: 8Gi}")
    (tmp_path / "p.yaml").write_text(pinned)
    (tmp_path / "c.yaml").write_text("gpuMemoryByModel: {T4: 16Gi}\n")

    code, out, err = run("-f", str(tmp_path / "p.yaml"), "--config", str(tmp_path / "c.yaml"), "-o", "json")

    assert code == 0
    assert json.loads(out)["spec"]["containers"][0]["resources"] == {
        "requests": {"koordinator.sh/gpu-memory-ratio": "50"}, "limits": {"koordinator.sh/gpu-memory-ratio": "50"}}
    assert err == (f"{NO_NODES}\n"
                   'Pod/team-a/trainer: rewrote container "main" koordinator.sh/gpu-memory: 8Gi -> '
                   "koordinator.sh/gpu-memory-ratio: 50\n")


def test_deeply_nested_input_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "deep.yaml").write_text("kind: Pod\nspec: " + "[" * 5000 + "]" * 5000 + "\n")

    code, out, err = run("-f", str(tmp_path / "deep.yaml"))

    assert (code, out, err) == (2, "", f"Error: {tmp_path}/deep.yaml: nested too deeply to be a Kubernetes object\n")


def test_an_unknown_output_format_is_a_usage_error() -> None:
    code, _, err = run("-f", "-", "-o", "xml", stdin=POD)

    assert code == 2
    assert err == ("Error: Invalid value for '-o' / '--output': 'xml' is not one of 'yaml', 'json', 'patch'.\n"
                   "See 'cli convert --help' for usage.\n")


VENDOR_NODE = """apiVersion: v1
kind: Node
metadata: {name: gpu-whole-0, labels: {pool: whole}}
status: {allocatable: {nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: gpu-shared-0, labels: {pool: shared}}
status: {allocatable: {koordinator.sh/gpu-core: "400", koordinator.sh/gpu-memory-ratio: "400"}}
"""


def test_with_nodes_in_the_input_a_pod_pinned_to_a_vendor_only_node_is_left(tmp_path: Path) -> None:
    pinned = POD.replace("spec:\n", "spec:\n  nodeSelector: {pool: whole}\n", 1)
    (tmp_path / "nodes.yaml").write_text(VENDOR_NODE)
    (tmp_path / "pod.yaml").write_text(pinned)

    code, out, err = run("-f", str(tmp_path / "nodes.yaml"), "-f", str(tmp_path / "pod.yaml"), "-o", "json")

    assert code == 0
    pod = json.loads(out)  # the Nodes decide, but are not written out
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert err == ("note: 2 Nodes read to decide as the webhook does, not written out\n"
                   "Pod/team-a/trainer: gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can "
                   "be scheduled on (gpu-whole-0) advertises koordinator.sh/gpu-core, "
                   "koordinator.sh/gpu-memory-ratio\n")


def test_with_nodes_in_the_input_an_unpinned_pod_is_rewritten_without_the_notice(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(VENDOR_NODE)
    (tmp_path / "pod.yaml").write_text(POD)

    code, out, err = run("-f", str(tmp_path / "nodes.yaml"), "-f", str(tmp_path / "pod.yaml"))

    assert code == 0
    assert [document["kind"] for document in yaml.safe_load_all(out)] == ["Pod"]
    assert err == ("note: 2 Nodes read to decide as the webhook does, not written out\n"
                   'Pod/team-a/trainer: rewrote container "main" nvidia.com/gpu: 2 -> '
                   "koordinator.sh/gpu-core: 200, koordinator.sh/gpu-memory-ratio: 200\n")


def test_objects_given_as_context_are_not_written_out(tmp_path: Path) -> None:
    """`convert -f pods.yaml -f nodes.yaml > deploy.yaml` must not put Nodes or quotas in a manifest,
    also where a kubectl List mixes them with pods."""
    quota = ("apiVersion: scheduling.sigs.k8s.io/v1alpha1\nkind: ElasticQuota\n"
             "metadata: {name: team-a, namespace: team-a}\nspec: {max: {nvidia.com/gpu: 4}}\n")
    (tmp_path / "nodes.yaml").write_text(VENDOR_NODE)
    (tmp_path / "cluster.yaml").write_text(POD + "---\n" + quota)
    listing = {"apiVersion": "v1", "kind": "List", "items": [
        yaml.safe_load(quota), {**yaml.safe_load(POD), "metadata": {"name": "other", "namespace": "team-a"}}]}
    (tmp_path / "list.yaml").write_text(yaml.safe_dump(listing))

    for output in ("yaml", "json", "patch"):
        code, out, err = run("-f", str(tmp_path), "-o", output)

        assert code == 0, err
        documents = [d for d in yaml.safe_load_all(out) if d]
        written = (documents[0]["items"] if output == "json" else documents[0] if output == "patch" else documents)
        assert sorted(d["kind"] + "/" + (d.get("metadata") or d)["name"] for d in written) == [
            "Pod/other", "Pod/trainer"], output
        assert err.splitlines()[0] == ("note: 2 ElasticQuotas, 2 Nodes read to decide as the webhook does, "
                                       "not written out")


def test_input_of_context_objects_only_is_nothing_to_convert(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(VENDOR_NODE)

    code, out, err = run("-f", str(tmp_path / "nodes.yaml"))

    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (f"Error: nothing to convert in {tmp_path / 'nodes.yaml'}: it holds only "
                                    "ElasticQuotas and Nodes, which are read as context")


def test_rewrite_never_in_the_config_rewrites_nothing(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(POD)
    (tmp_path / "c.yaml").write_text("rewrite: never\n")

    code, out, err = run("-f", str(tmp_path / "pod.yaml"), "--config", str(tmp_path / "c.yaml"), "-o", "patch")

    assert (code, err) == (0, "")
    assert json.loads(out)["patch"] == []
