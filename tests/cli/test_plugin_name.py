"""As a kubectl plugin the program calls itself ``kubectl gpuquota`` in help, usage and version, as
kubectl's own commands name themselves; as ``gpuquota`` it is ``gpuquota``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / program), *args], capture_output=True, text=True, timeout=60, check=False)


COMMANDS = [[], ["serve"], ["convert"], ["certs"], ["certs", "generate"], ["certs", "client"], ["audit"],
            ["migrate"], ["migrate", "plan"], ["migrate", "apply"], ["migrate", "rollback"], ["quota"], ["explain"]]


@pytest.mark.parametrize(("program", "name"), [("kubectl-gpuquota", "kubectl gpuquota"), ("gpuquota", "gpuquota")])
def test_help_of_every_command_names_the_program_as_typed(program: str, name: str) -> None:
    for command in COMMANDS:
        result = run(program, *command, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"Usage: {' '.join([name, *command])} "), result.stdout
        if program == "kubectl-gpuquota":
            # No line of help tells a plugin user to type the bare command.
            assert not [line for line in result.stdout.splitlines()[1:] if "'gpuquota " in line or "`gpuquota " in line]


def test_version_names_the_program_as_typed() -> None:
    assert run("kubectl-gpuquota", "--version").stdout.startswith("kubectl gpuquota, version ")
    assert run("gpuquota", "--version").stdout.startswith("gpuquota, version ")
