"""Messages quote what the user wrote: the number as written (``1.5``, not the canonical ``1500m``)
and the resource name as written (``nvidia.com/gpu``, not the ``koordinator.sh/gpu-core`` the
rewrite would have made of it), in every view."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CLUSTER = str(REPO_ROOT / "examples" / "cluster")


def pod(resources: str) -> str:
    return ("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\nspec:\n  containers:\n"
            f"  - name: main\n    resources: {resources}\n")


VIEWS = {
    "audit": ["audit", "-f", "POD", "-o", "wide"],
    "convert": ["convert", "-f", "POD"],
    "explain": ["explain", "-f", "POD", "--state", EXAMPLE_CLUSTER],
}


def run(view: str, text: str, tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "pod.yaml").write_text(text)
    arguments = [str(tmp_path / "pod.yaml") if word == "POD" else word for word in VIEWS[view]]
    result = CliRunner().invoke(cli, arguments)
    return result.exit_code, result.output


@pytest.mark.parametrize("view", VIEWS)
def test_a_fraction_of_a_card_is_quoted_as_written(view: str, tmp_path: Path) -> None:
    code, output = run(view, pod("{limits: {nvidia.com/gpu: 1.5}}"), tmp_path)

    assert code == 1
    assert 'resources.limits[nvidia.com/gpu]: 1.5 must be a whole number' in output
    assert "1500m" not in output


@pytest.mark.parametrize("view", VIEWS)
def test_requests_unlike_limits_names_the_resource_the_user_wrote(view: str, tmp_path: Path) -> None:
    code, output = run(view, pod("{requests: {nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: 2}}"), tmp_path)

    assert code == 1
    assert 'container "main": nvidia.com/gpu requests (1) and limits (2) must be equal' in output
    assert "gpu-core requests" not in output and "rewrote" not in output
