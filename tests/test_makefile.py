"""The Makefile's install steps, read with ``make -n`` (nothing is installed): ``make run`` installs
what serving needs, ``make test`` the dev tools too, and one never stands in for the other."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
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


# -- make image / make push (hack/build-image.sh) -------------------------------------------------

BUILD_IMAGE = ROOT / "hack" / "build-image.sh"
# What the script runs besides the builder, linked into a PATH of its own: no builder of the host
# machine can be found through it.
SCRIPT_TOOLS = ("bash", "dirname", "env")


def tools_only_path(tmp_path: Path, builders: dict[str, str]) -> str:
    """A PATH with the script's own tools and ``builders`` (name -> shell script body), nothing else."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in SCRIPT_TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for name, body in builders.items():
        (bin_dir / name).write_text(f"#!{shutil.which('bash')}\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def build_image(tmp_path: Path, builders: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD_IMAGE), *args], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": tools_only_path(tmp_path, builders)}, cwd=tmp_path)


def test_make_image_without_a_builder_says_what_it_needs_in_one_line(tmp_path: Path) -> None:
    result = build_image(tmp_path, {}, "registry.example.com/team/koord-gpuquota:0.1.0")

    assert result.returncode == 1
    assert result.stderr == ("build-image.sh: no OCI image builder to build registry.example.com/team/koord-gpuquota:"
                             "0.1.0: install podman or buildah, or docker with a running daemon; or set BUILDER\n")


def test_a_docker_client_without_a_daemon_is_not_a_builder(tmp_path: Path) -> None:
    # What this machine has: the client, and `docker info` failing for want of a daemon.
    result = build_image(tmp_path, {"docker": 'echo "Cannot connect to the Docker daemon" >&2; exit 1'}, "img:1")

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "(docker is installed but its daemon does not answer 'docker info')" in result.stderr


def test_make_image_builds_the_containerfile_with_the_first_builder_and_pushes_with_it(tmp_path: Path) -> None:
    record = tmp_path / "calls"
    recorder = f'echo "$PWD $*" >> {record}'
    builders = {"buildah": recorder, "docker": recorder}

    built = build_image(tmp_path, builders, "registry.example.com/gq:1")
    pushed = subprocess.run([str(BUILD_IMAGE), "--push", "registry.example.com/gq:1"], capture_output=True,
                            text=True, timeout=60, check=False, env={"PATH": str(tmp_path / "bin")})

    assert (built.returncode, pushed.returncode) == (0, 0), built.stderr + pushed.stderr
    # buildah comes before docker; the build runs from the repository root, where Containerfile is.
    assert record.read_text().splitlines() == [
        f"{ROOT} build -f Containerfile -t registry.example.com/gq:1 .",
        f"{ROOT} push registry.example.com/gq:1",
    ]


def test_make_image_needs_an_image_name(tmp_path: Path) -> None:
    result = subprocess.run(["make", "image"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode != 0
    assert "build-image.sh: usage: build-image.sh [--push] IMAGE (make image IMAGE=" in result.stderr
