"""``make dist``: the wheel, the self-contained zipapp of the CLI, its krew archive and the krew
manifest filled in for that archive, with checksums. Built for real (pip and shiv fetch the runtime
dependencies from the package index), then run."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
KREW_TEMPLATE = ROOT / "manifests" / "krew" / "gpuquota.yaml"
README = ROOT / "README.md"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
ARCHIVE = "kubectl-gpuquota_linux_amd64.tar.gz"
WHEEL = f"koord_gpuquota-{VERSION}-py3-none-any.whl"
DIST_TIMEOUT = 900


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("dist")
    result = subprocess.run(["make", "dist", f"DIST_DIR={directory}", "DIST_URL=https://downloads.example/gq/v1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=DIST_TIMEOUT, check=False)
    assert result.returncode == 0, f"make dist failed:\n{result.stdout}\n{result.stderr}"
    return directory


@pytest.fixture(scope="module")
def krew(dist: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((dist / "gpuquota.yaml").read_text())
    return manifest


def test_dist_holds_the_wheel_zipapp_archive_manifest_and_checksums(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted([WHEEL, "kubectl-gpuquota", ARCHIVE, "gpuquota.yaml",
                                                             "SHA256SUMS"])
    sums = dict(reversed(line.split("  ", 1)) for line in (dist / "SHA256SUMS").read_text().splitlines())
    assert sums == {name: sha256(dist / name) for name in (WHEEL, "kubectl-gpuquota", ARCHIVE, "gpuquota.yaml")}
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        assert {name.split("/")[0] for name in wheel.namelist()} >= {"cli", "gpuquota_core", "kubeaccess", "webhook"}


def test_krew_manifest_points_at_the_built_archive(krew: dict[str, Any], dist: Path) -> None:
    assert krew["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert krew["kind"] == "Plugin"
    assert krew["metadata"]["name"] == KREW_TEMPLATE.stem == "gpuquota"
    spec = krew["spec"]
    assert spec["version"] == f"v{VERSION}"
    assert spec["shortDescription"] and spec["description"] and spec["homepage"].startswith("https://")
    (platform,) = spec["platforms"]
    assert platform["selector"] == {"matchLabels": {"os": "linux", "arch": "amd64"}}
    assert platform["uri"] == f"https://downloads.example/gq/v1/{ARCHIVE}"
    assert platform["sha256"] == sha256(dist / ARCHIVE)
    assert platform["bin"] == "kubectl-gpuquota"
    assert platform["files"] == [{"from": "kubectl-gpuquota", "to": "."}]
    # What krew unpacks: the zipapp, executable, under the name `bin` and `files` use.
    with tarfile.open(dist / ARCHIVE) as archive:
        (member,) = archive.getmembers()
        assert (member.name, member.mode & 0o111) == ("kubectl-gpuquota", 0o111)
        unpacked = archive.extractfile(member)
        assert unpacked is not None and unpacked.read() == (dist / "kubectl-gpuquota").read_bytes()


def test_the_zipapp_runs_as_a_kubectl_plugin(dist: Path, tmp_path: Path) -> None:
    # Only the interpreter from PATH: no virtualenv, no installed package.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SHIV_ROOT": str(tmp_path / "shiv")}
    result = subprocess.run([str(dist / "kubectl-gpuquota"), "--help"], capture_output=True, text=True, env=env,
                            timeout=300, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: kubectl gpuquota")
    audit = subprocess.run([str(dist / "kubectl-gpuquota"), "audit", "-f", str(ROOT / "examples" / "cluster"),
                            "-o", "json", "--fail-on", "none"], capture_output=True, text=True, env=env, timeout=300,
                           check=False, cwd=tmp_path)
    assert audit.returncode == 0, audit.stderr
    assert audit.stdout.lstrip().startswith(("{", "["))


def test_the_built_manifest_has_a_header_of_its_own(dist: Path) -> None:
    """The template's header explains its placeholders; filled in, it read "https://... becomes where the
    archive is served". The built manifest says what it is instead, and its comments quote no URL."""
    text = (dist / "gpuquota.yaml").read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header == text.splitlines()[:len(header)]  # one block, at the top
    assert header[0].startswith("# krew plugin manifest for `kubectl gpuquota`, made by `make dist`")
    assert not any("downloads.example" in line or "becomes" in line or "${" in line for line in header), header
    assert any(re.search(r"CPython 3\.\d+", line) for line in header), header


def test_the_template_leaves_only_what_make_dist_fills() -> None:
    assert set(re.findall(r"\$\{([A-Z0-9_]+)\}", KREW_TEMPLATE.read_text())) == {
        "DIST_URL", "SHA256_LINUX_AMD64", "PYTHON_MINOR"}


def test_nothing_tells_users_to_install_from_an_index_that_has_no_package() -> None:
    """The package is on no index; README says where it comes from instead."""
    for path in (README, KREW_TEMPLATE):
        assert "pip install koord-gpuquota" not in path.read_text(), path
    readme = README.read_text()
    assert "not published" in readme and "make dist" in readme
