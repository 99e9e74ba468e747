"""``gpuquota completion`` scripts (bash run for real) and the krew plugin manifest's shape."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli.main import SUBCOMMANDS, cli

REPO_ROOT = Path(__file__).resolve().parents[2]
KREW_MANIFEST = REPO_ROOT / "manifests" / "krew" / "gpuquota.yaml"
VENV_BIN = Path(sys.executable).parent


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash", "complete -o nosort -F _gpuquota_completion gpuquota"),
    ("zsh", "#compdef gpuquota"),
    ("fish", "complete --no-files --command gpuquota"),
])
def test_each_shell_gets_its_script(shell: str, marker: str) -> None:
    result = CliRunner().invoke(cli, ["completion", shell])

    assert result.exit_code == 0, result.output
    assert marker in result.stdout
    assert "_GPUQUOTA_COMPLETE" in result.stdout


def test_an_unknown_shell_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["completion", "tcsh"])

    assert result.exit_code == 2
    assert "'tcsh' is not one of 'bash', 'zsh', 'fish'" in result.stderr


def bash_completions(words: list[str]) -> list[str]:
    """What bash offers after sourcing `gpuquota completion bash`, for the command line ``words``."""
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to test bash completion"
    script = subprocess.run([str(VENV_BIN / "gpuquota"), "completion", "bash"], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    words_literal = " ".join(f"'{w}'" for w in words)
    driver = (f"{script}\nCOMP_WORDS=({words_literal}); COMP_CWORD={len(words) - 1}\n"
              "_gpuquota_completion gpuquota\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([bash, "--norc", "--noprofile", "-c", driver], capture_output=True, text=True,
                            env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completes_au_to_audit() -> None:
    assert bash_completions(["gpuquota", "au"]) == ["audit"]


def test_bash_completes_subcommands_and_choices() -> None:
    assert sorted(bash_completions(["gpuquota", "migrate", ""])) == ["apply", "plan", "rollback"]
    assert bash_completions(["gpuquota", "completion", ""]) == ["bash", "zsh", "fish"]
    assert set(bash_completions(["gpuquota", ""])) == {name for _, name in SUBCOMMANDS}


def test_krew_manifest_shape() -> None:
    manifest = yaml.safe_load(KREW_MANIFEST.read_text())
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]

    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin"
    assert manifest["metadata"]["name"] == KREW_MANIFEST.stem == "gpuquota"
    spec = manifest["spec"]
    assert spec["version"] == f"v{version}"
    assert spec["shortDescription"] and spec["description"] and spec["homepage"].startswith("https://")
    selectors = [(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"]) for p in spec["platforms"]]
    assert sorted(selectors) == sorted({(o, a) for o in ("linux", "darwin") for a in ("amd64", "arm64")})
    for platform, (os_name, arch) in zip(spec["platforms"], selectors, strict=True):
        assert platform["bin"] == "kubectl-gpuquota"
        assert platform["uri"].startswith("https://") and platform["uri"].endswith(
            f"/v{version}/kubectl-gpuquota_{os_name}_{arch}.tar.gz")
        # Filled in at release time; nothing else may stand where the digest goes.
        assert platform["sha256"] == f"${{SHA256_{os_name.upper()}_{arch.upper()}}}"
        assert {f["from"] for f in platform["files"]} == {"kubectl-gpuquota"}


def test_krew_manifest_has_no_placeholder_but_the_digests() -> None:
    placeholders = set(re.findall(r"\$\{([A-Z0-9_]+)\}", KREW_MANIFEST.read_text()))

    assert placeholders == {f"SHA256_{o}_{a}" for o in ("LINUX", "DARWIN") for a in ("AMD64", "ARM64")}
