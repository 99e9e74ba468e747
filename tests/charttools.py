"""Render the install manifests both ways: ``kubectl kustomize`` and ``helm template``.

helm comes from hack/build-helm.sh (built from the Go module proxy, cached in .cache/helm/), as the
control plane comes from hack/build-control-plane.sh.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "manifests" / "helm" / "koord-gpuquota"
BUILD_HELM = REPO_ROOT / "hack" / "build-helm.sh"
RELEASE_NAMESPACE = "gpuquota-system"
BUILD_TIMEOUT = 1800.0
RUN_TIMEOUT = 120.0


@cache
def helm() -> str:
    """The cached helm binary; builds it on first use (a missing Go toolchain fails under CI only)."""
    result = subprocess.run([str(BUILD_HELM)], cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=BUILD_TIMEOUT, check=False)
    if result.returncode != 0 and shutil.which("go") is None and not os.environ.get("CI"):
        pytest.skip("no helm in .cache/helm and no Go toolchain to build it (hack/build-helm.sh)")
    assert result.returncode == 0, f"{BUILD_HELM} failed:\n{result.stderr}"
    return str(Path(result.stdout.strip().splitlines()[-1]) / "helm")


@cache
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI"):
            raise AssertionError("kubectl is required to render the kustomizations")
        pytest.skip("no kubectl on PATH")
    return path


def run(args: Sequence[str]) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    return documents(run([kubectl(), "kustomize", str(directory)]))


def helm_template(*sets: str, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """The chart rendered as `helm install` would create it, CRDs included."""
    args = [helm(), "template", "gpuquota", str(CHART), "--namespace", namespace, "--include-crds"]
    for value in sets:
        args += ["--set", value]
    return documents(run(args))
