"""``gpuquota completion`` scripts (bash run for real). The krew manifest: tests/test_dist.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import SUBCOMMANDS, cli

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    # The function bash registered for the command word, called as bash calls it.
    driver = (f"{script}\nCOMP_WORDS=({words_literal}); COMP_CWORD={len(words) - 1}\n"
              f"function=$(complete -p {words[0]} | sed -E 's/.* -F ([^ ]+) .*/\\1/')\n"
              f"$function {words[0]}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([bash, "--norc", "--noprofile", "-c", driver], capture_output=True, text=True,
                            env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


def test_bash_completes_au_to_audit() -> None:
    assert bash_completions(["gpuquota", "au"]) == ["audit"]


def test_the_kubectl_plugin_binary_is_completed_too() -> None:
    """krew installs kubectl-gpuquota alone: the same script completes it, through that binary."""
    assert bash_completions(["kubectl-gpuquota", "au"]) == ["audit"]
    assert sorted(bash_completions(["kubectl-gpuquota", "migrate", ""])) == ["apply", "plan", "rollback"]
    for shell, registration in (("zsh", "compdef _kubectl_gpuquota_completion kubectl-gpuquota"),
                                ("fish", "complete --no-files --command kubectl-gpuquota")):
        assert registration in CliRunner().invoke(cli, ["completion", shell]).stdout


def test_bash_completes_subcommands_and_choices() -> None:
    assert sorted(bash_completions(["gpuquota", "migrate", ""])) == ["apply", "plan", "rollback"]
    assert bash_completions(["gpuquota", "completion", ""]) == ["bash", "zsh", "fish"]
    assert set(bash_completions(["gpuquota", ""])) == {name for _, name in SUBCOMMANDS}
