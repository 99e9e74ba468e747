"""The rewrite looks at the nodes: a real ``gpuquota serve --state`` whose manifests hold Node objects.

A pod that can only land on nodes running the vendor device plugin alone keeps ``nvidia.com/gpu``
(rewriting it would leave it Pending), says why in a warning, and is still counted in canonical
units by /validate-pods.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reviews import pod, review
from webhookproc import GPUQUOTA, REPO_ROOT, WebhookProcess, post_review, served_from_state

from gpuquota_core.jsonpatch import apply

QUOTA_LABEL = "quota.scheduling.koordinator.sh/name"
NODES = """
apiVersion: v1
kind: Node
metadata: {name: whole-0, labels: {pool: whole}}
status: {allocatable: {cpu: "8", nvidia.com/gpu: "8"}}
---
apiVersion: v1
kind: Node
metadata: {name: shared-0, labels: {pool: shared}}
spec: {taints: [{key: gpu-sharing, value: "on", effect: NoSchedule}]}
status: {allocatable: {cpu: "8", koordinator.sh/gpu-core: "400", koordinator.sh/gpu-memory-ratio: "400"}}
---
apiVersion: scheduling.sigs.k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team-a, namespace: team}
spec: {max: {koordinator.sh/gpu-core: "200", koordinator.sh/gpu-memory-ratio: "200"}}
"""
TOLERATES_SHARING = [{"key": "gpu-sharing", "operator": "Equal", "value": "on", "effect": "NoSchedule"}]
LEFT_ON_WHOLE = ("gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can be scheduled on "
                 "(whole-0) advertises koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    with served_from_state(tmp_path_factory.mktemp("placement"), NODES) as process:
        yield process


def gpu_pod(cards: str, **spec: Any) -> dict[str, Any]:
    result = pod(f"p-{uuid.uuid4().hex[:6]}", "team", labels={QUOTA_LABEL: "team-a"},
                 resources={"nvidia.com/gpu": cards})
    result["spec"].update(spec)
    return result


def mutate(server: WebhookProcess, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The response and the pod as the API server would store it."""
    response = post_review(server, "/mutate-pods", review(obj))
    assert response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return response, apply(obj, patch)


def requests_of(stored: dict[str, Any]) -> dict[str, str]:
    requests: dict[str, str] = stored["spec"]["containers"][0]["resources"]["requests"]
    return requests


def test_a_pod_that_reaches_only_the_vendor_node_is_left_and_told_why(server: WebhookProcess) -> None:
    # The sharing node is tainted, and this pod does not tolerate it: only whole-0 can take it.
    response, stored = mutate(server, gpu_pod("1"))

    assert "patch" not in response
    assert requests_of(stored) == {"nvidia.com/gpu": "1"}
    assert response["warnings"] == [LEFT_ON_WHOLE]
    status, metrics = server.get("/metrics")
    assert status == 200
    assert b'gpuquota_left_as_written_total{resource="nvidia.com/gpu"}' in metrics


def test_a_pod_that_tolerates_the_sharing_node_is_rewritten(server: WebhookProcess) -> None:
    response, stored = mutate(server, gpu_pod("1", tolerations=TOLERATES_SHARING))

    assert requests_of(stored) == {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}
    assert response["warnings"] == ['gpuquota rewrote container "main" nvidia.com/gpu: 1 -> '
                                    "koordinator.sh/gpu-core: 100, koordinator.sh/gpu-memory-ratio: 100"]


def test_required_affinity_pinning_the_vendor_pool_wins_over_a_toleration(server: WebhookProcess) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["whole"]}]}]}}}

    response, stored = mutate(server, gpu_pod("1", tolerations=TOLERATES_SHARING, affinity=affinity))

    assert requests_of(stored) == {"nvidia.com/gpu": "1"}
    assert response["warnings"] == [LEFT_ON_WHOLE]


def test_a_pod_left_as_written_is_still_counted_in_canonical_units(server: WebhookProcess) -> None:
    first = post_review(server, "/validate-pods", review(gpu_pod("2")))
    assert first["allowed"] is True

    over = post_review(server, "/validate-pods", review(gpu_pod("1")))

    assert over["allowed"] is False
    assert over["status"]["message"].startswith(
        "exceeded quota: team/team-a, requested: koordinator.sh/gpu-core=100,koordinator.sh/gpu-memory-ratio=100, "
        "used: koordinator.sh/gpu-core=200,koordinator.sh/gpu-memory-ratio=200")


@pytest.mark.parametrize(("policy", "rewritten", "warnings"), [
    pytest.param("always", True, ["gpuquota rewrote nvidia.com/gpu (rewrite: always) although none of the 1 "
                                  "node(s) this pod can be scheduled on (whole-0) advertises koordinator.sh/gpu-core, "
                                  "koordinator.sh/gpu-memory-ratio; the pod may stay Pending"], id="always"),
    pytest.param("never", False, [], id="never"),
])
def test_the_policy_in_the_config_file(tmp_path: Path, policy: str, rewritten: bool, warnings: list[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"rewrite: {policy}\n", encoding="utf-8")
    (tmp_path / "server").mkdir()
    with served_from_state(tmp_path / "server", NODES, "--config", str(config)) as process:
        response, stored = mutate(process, gpu_pod("1"))
        shared, _ = mutate(process, gpu_pod("1", tolerations=TOLERATES_SHARING))

    assert ("koordinator.sh/gpu-core" in requests_of(stored)) is rewritten
    assert [w for w in response.get("warnings", []) if not w.startswith("gpuquota rewrote container")] == warnings
    assert ("patch" in shared) is (policy == "always")


def test_an_unknown_policy_stops_serve_before_it_serves(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("rewrite: sometimes\n", encoding="utf-8")
    (tmp_path / "state.yaml").write_text(NODES, encoding="utf-8")
    result = subprocess.run([str(GPUQUOTA), "serve", "--state", str(tmp_path / "state.yaml"), "--config",
                             str(config), "--cert-dir", str(tmp_path / "no-certs")],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)

    assert result.returncode == 2
    assert result.stderr == f"Error: {config}: rewrite must be one of auto, always, never, not 'sometimes'\n"


# -- the README's walkthrough on the example cluster (examples/cluster: gpu-whole-0 is vendor-only) ---

MUTATE_EXAMPLE = REPO_ROOT / "examples" / "requests" / "mutate-pod.json"
MIXED_WARNING = ("gpuquota: this pod can be scheduled on gpu-mixed-0, which advertise(s) both a vendor GPU name and "
                 "koordinator.sh/gpu-* for the same cards: the device plugin and Koordinator may hand out one card "
                 "twice (audit check node-mixed-gpu-resources)")


def test_the_readme_example_is_rewritten_and_warned_about_the_mixed_node(offline_webhook: WebhookProcess) -> None:
    document = json.loads(MUTATE_EXAMPLE.read_text(encoding="utf-8"))

    response = post_review(offline_webhook, "/mutate-pods", document)

    assert response["warnings"] == [
        'gpuquota rewrote container "trainer" nvidia.com/gpu: 2 -> koordinator.sh/gpu-core: 200, '
        "koordinator.sh/gpu-memory-ratio: 200", MIXED_WARNING]
    stored = apply(document["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {
        "koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}


def test_the_readme_example_pinned_to_the_vendor_only_node_is_left(offline_webhook: WebhookProcess) -> None:
    document = json.loads(MUTATE_EXAMPLE.read_text(encoding="utf-8"))
    document["request"]["object"]["spec"]["nodeName"] = "gpu-whole-0"

    response = post_review(offline_webhook, "/mutate-pods", document)

    assert "patch" not in response
    assert response["warnings"] == [
        "gpuquota left nvidia.com/gpu as written: none of the 1 node(s) this pod can be scheduled on (gpu-whole-0) "
        "advertises koordinator.sh/gpu-core, koordinator.sh/gpu-memory-ratio"]


def readme_mutate_command(server: WebhookProcess, request_file: Path) -> str:
    """The README's quick-start command (curl, then the decoding one-liner), aimed at ``server``."""
    blocks = re.findall(r"```sh\n(.*?)```", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    [command] = [block for block in blocks if "/mutate-pods" in block]
    for shown, actual in (("certs/ca.crt", str(server.ca_file)), ("https://127.0.0.1:8443", server.url),
                          ("@examples/requests/mutate-pod.json", f"@{request_file}")):
        assert shown in command
        command = command.replace(shown, actual)
    return command


@pytest.mark.parametrize("pinned", [False, True], ids=["rewritten", "pinned-to-the-vendor-only-node"])
def test_the_readme_decode_command_prints_the_patch_or_says_there_is_none(
        offline_webhook: WebhookProcess, pinned: bool, tmp_path: Path) -> None:
    document = json.loads(MUTATE_EXAMPLE.read_text(encoding="utf-8"))
    if pinned:
        document["request"]["object"]["spec"]["nodeName"] = "gpu-whole-0"
    request_file = tmp_path / "review.json"
    request_file.write_text(json.dumps(document), encoding="utf-8")
    expected = post_review(offline_webhook, "/mutate-pods", document)

    result = subprocess.run(["bash", "-o", "pipefail", "-c", readme_mutate_command(offline_webhook, request_file)],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)

    assert result.returncode == 0, result.stderr
    warnings, printed = result.stdout.split("\n", 1)
    assert warnings == str(expected["warnings"])
    if pinned:
        assert printed == "no patch\n"
    else:
        assert json.loads(printed) == json.loads(base64.b64decode(expected["patch"]))
