"""``gpuquota serve`` on a gunicorn release it was not tested with refuses to start, in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import gunicorn
from controlplane import free_ports
from webhookproc import GPUQUOTA, LOOPBACK, REPO_ROOT, generate_certs

EXAMPLE_STATE = REPO_ROOT / "examples" / "cluster"


def install_gunicorn_as(version: tuple[int, int, int], site: Path) -> None:
    """The installed gunicorn, copied into ``site`` with its version and metadata saying ``version``:
    what a later gunicorn looks like to the server, ahead of the real one on PYTHONPATH."""
    package = site / "gunicorn"
    shutil.copytree(Path(gunicorn.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    init = package / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8").replace(f"version_info = {gunicorn.version_info}",
                                                              f"version_info = {version}"), encoding="utf-8")
    dotted = ".".join(map(str, version))
    metadata = site / f"gunicorn-{dotted}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gunicorn\nVersion: {dotted}\n", encoding="utf-8")


def test_serve_refuses_a_gunicorn_outside_the_tested_range(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install_gunicorn_as((28, 0, 0), site)
    generate_certs(tmp_path / "certs")
    port = free_ports(1)[0]
    environment = {**os.environ, "PYTHONPATH": str(site)}
    assert subprocess.run([str(GPUQUOTA.parent / "python"), "-c", "import gunicorn; print(gunicorn.__version__)"],
                          env=environment, capture_output=True, text=True, check=True).stdout.strip() == "28.0.0"

    result = subprocess.run([str(GPUQUOTA), "serve", "--cert-dir", str(tmp_path / "certs"), "--host", LOOPBACK,
                             "--port", str(port), "--state", str(EXAMPLE_STATE)],
                            env=environment, capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "Error: gunicorn 28.0.0 is installed, but gpuquota is tested only with gunicorn>=27.0.1,<27.1 "
        "(it relies on its internals); install a version in that range"]
