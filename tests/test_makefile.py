"""The Makefile's install steps, read with ``make -n`` (nothing is installed): ``make run`` installs
what serving needs, ``make test`` the dev tools too, and one never stands in for the other."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_INSTALL = "pip install --quiet -e ."
DEV_INSTALL = "pip install --quiet -e '.[dev]'"


def dry_run(target: str, venv: Path, tmp_path: Path) -> list[str]:
    result = subprocess.run(["make", "-n", target, f"VENV={venv}", f"CERT_DIR={tmp_path / 'certs'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True)
    return [line.removeprefix(f"{venv}/bin/") for line in result.stdout.splitlines() if "pip install" in line]


def test_run_on_a_fresh_clone_installs_the_runtime_only(tmp_path: Path) -> None:
    assert dry_run("run", tmp_path / "venv", tmp_path) == ["pip install --quiet --upgrade pip", RUNTIME_INSTALL]


@pytest.mark.parametrize("target", ["test", "lint", "unit", "e2e"])
def test_test_targets_on_a_fresh_clone_install_the_dev_tools(tmp_path: Path, target: str) -> None:
    assert dry_run(target, tmp_path / "venv", tmp_path) == ["pip install --quiet --upgrade pip", DEV_INSTALL]


def test_test_after_run_still_installs_the_dev_tools(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-runtime").touch()  # what `make run` left
    assert DEV_INSTALL in dry_run("test", venv, tmp_path)
    assert dry_run("run", venv, tmp_path) == []


def test_run_after_test_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()  # `make test` touches both stamps: the dev install holds the runtime
    (venv / ".installed-runtime").touch()
    assert dry_run("run", venv, tmp_path) == []
    assert dry_run("test", venv, tmp_path) == []


def _third_party_imports() -> set[str]:
    """Top-level modules the shipped packages import (at module level or inside functions)."""
    names: set[str] = set()
    for package in ("webhook", "cli", "gpuquota_core", "kubeaccess"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    own = {"webhook", "cli", "gpuquota_core", "kubeaccess"}
    return {name for name in names if name not in own and name not in sys.stdlib_module_names}


def _runtime_closure() -> set[str]:
    """Every distribution `pip install .` brings in: the project's requirements without extras, and theirs."""
    seen: set[str] = set()
    pending = ["koord-gpuquota"]
    while pending:
        name = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional requirement of a dependency that is not installed
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            marker = requirement.split(";", 1)
            if len(marker) == 2 and "python_version" not in marker[1] and "sys_platform" not in marker[1]:
                continue
            pending.append(re.split(r"[\s<>=!~\[;(]", requirement, maxsplit=1)[0])
    return seen


def test_the_runtime_install_holds_everything_the_server_and_cli_import() -> None:
    distributions = importlib.metadata.packages_distributions()
    closure = _runtime_closure()
    missing = {}
    for module in _third_party_imports():
        owners = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions.get(module, [])}
        if not owners & closure:
            missing[module] = sorted(owners)
    assert missing == {}
