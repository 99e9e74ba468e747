"""Recovery hints name flags that exist: every command line a hint quotes parses with the command's
own click parser, and every flag a hint names belongs to the command that gives it.

The hints live in cli/hints.py; messages of the core and the webhook that quote a ``gpuquota``
command line are found in the source, so one written anywhere is checked too.
"""

from __future__ import annotations

import ast
import re
import shlex
import string
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli import hints
from cli.main import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("cli", "gpuquota_core", "kubeaccess", "webhook")
EXAMPLE_CLUSTER = REPO_ROOT / "examples" / "cluster"
# A command line quoted in single backticks (double backticks are reStructuredText in docstrings),
# or in single quotes.
QUOTED_COMMAND = re.compile(r"(?<!`)`(gpuquota [^`]+)`(?!`)|'(gpuquota [^']+)'")
# A flag named in prose: "-f", "--state"; not the middle of a word ("re-run", "multi-level").
FLAG = re.compile(r"(?<![\w`/-])(--?[A-Za-z][\w-]*)")
POD = """apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-a}
spec:
  containers:
  - {name: main, image: trainer, resources: {limits: {nvidia.com/gpu: 1}}}
"""


def command_of(path: str) -> click.Command:
    command: click.Command = cli
    for word in path.split():
        assert isinstance(command, click.Group), path
        command = command.commands[word]
    return command


def parse(line: str) -> None:
    """Parse ``gpuquota ...`` as the command would (options, required ones, value checks), without running it."""
    words = shlex.split(line)
    assert words[0] == "gpuquota", line
    command: click.Command = cli
    rest = words[1:]
    while isinstance(command, click.Group) and rest:
        command, rest = command.commands[rest[0]], rest[1:]
    command.make_context(command.name, rest)


def quoted_lines(text: str) -> list[str]:
    return [backticked or single for backticked, single in QUOTED_COMMAND.findall(text)]


def filled(text: str) -> str:
    """The hint as given, with a sample value in each placeholder."""
    fields = {name for _, name, _, _ in string.Formatter().parse(text) if name}
    return text.format(**dict.fromkeys(fields, "backup-0001.yaml"))


def flags_of(command: click.Command) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


def prose_flags(text: str) -> list[str]:
    """The flags a hint names outside the command lines it quotes."""
    return FLAG.findall(QUOTED_COMMAND.sub("", text))


def string_literals(source: str) -> list[str]:
    """Every string the code writes (adjacent literals joined, as Python joins them; an f-string's
    fields as ``{}``), not its comments."""
    texts: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            texts.append("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
    return texts


def quoted_in_sources() -> list[str]:
    found: list[str] = []
    for directory in SOURCES:
        for path in sorted((REPO_ROOT / directory).rglob("*.py")):
            found += [re.sub(r"\{[^}]*\}", "backup-0001.yaml", line)
                      for text in string_literals(path.read_text()) for line in quoted_lines(text)]
    return sorted(set(found))


@pytest.mark.parametrize("hint", hints.every_hint(), ids=lambda hint: hint.text[:60])
def test_every_hint_names_flags_of_its_own_commands(hint: hints.Hint) -> None:
    text = filled(hint.text)
    for line in quoted_lines(text):
        parse(line)
    for path in hint.commands:
        assert set(prose_flags(text)) <= flags_of(command_of(path)), (path, text)


@pytest.mark.parametrize("line", quoted_in_sources())
def test_every_command_line_quoted_in_a_message_parses(line: str) -> None:
    parse(line)


def every_quoted_line() -> list[str]:
    in_hints = (line for hint in hints.every_hint() for line in quoted_lines(filled(hint.text)))
    return sorted({*quoted_in_sources(), *in_hints})


# What the user has in hand where a message quotes these placeholders: the pod a note is about, a
# backup apply wrote, a new file for the next backup.
PLACEHOLDERS = {"FILE": POD, "backup-0001.yaml": None, "NEW_FILE": None}


@pytest.mark.parametrize("line", every_quoted_line())
def test_every_quoted_command_line_runs_as_printed(line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only parsed: run where the user would be (no cluster configured here). It answers, or
    stops only for want of the cluster or a file the user supplies, never for a flag it lacks
    (`certs generate --out DIR` alone refuses: a certificate needs a name)."""
    monkeypatch.chdir(tmp_path)
    for placeholder, content in PLACEHOLDERS.items():
        if content is not None:
            (tmp_path / placeholder).write_text(content)

    result = CliRunner(env=no_cluster_anywhere(tmp_path)).invoke(cli, shlex.split(line)[1:])

    error = result.stderr.splitlines()[0] if result.stderr else ""
    assert (result.exit_code in (0, 1) or error.startswith("Error: no kubeconfig")
            or any(placeholder in error for placeholder in PLACEHOLDERS)), (line, result.output)


def commands_reading_a_kubeconfig() -> list[str]:
    paths: list[str] = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())
        elif "--kubeconfig" in flags_of(command):
            paths.append(path)
    walk(cli, "")
    return paths


def test_every_command_that_reads_a_kubeconfig_has_a_no_cluster_hint_and_context() -> None:
    """kubeaccess says "give --context" to any of them; each has its own hint for no cluster at all."""
    readers = commands_reading_a_kubeconfig()
    assert "serve" in readers and "migrate apply" in readers
    for path in readers:
        assert "--context" in flags_of(command_of(path)), path
    assert set(hints.NO_CLUSTER) == set(readers) - {"serve"}  # serve reports it in its own words


def no_cluster_anywhere(home: Path) -> dict[str, str | None]:
    """No $KUBECONFIG, a home without ~/.kube/config, and not in a pod."""
    return {"KUBECONFIG": None, "HOME": str(home), "KUBERNETES_SERVICE_HOST": None, "KUBERNETES_SERVICE_PORT": None}


# Each command as it reaches for a cluster that is not configured anywhere, and the flags its error
# must name: a kubeconfig, or where the command reads manifests instead (explain's -f is the pod,
# rollback's the backup, policyreport's the reports: none of those stands in for a cluster).
LIVE_COMMANDS = {
    "audit": (["audit"], ["--kubeconfig", "-f"]),
    "quota": (["quota"], ["--kubeconfig", "-f"]),
    "explain": (["explain", "-f", "POD"], ["--kubeconfig", "--state"]),
    "migrate plan": (["migrate", "plan"], ["--kubeconfig", "-f"]),
    "migrate apply": (["migrate", "apply", "--backup", "NEW"], ["--kubeconfig"]),
    "migrate rollback": (["migrate", "rollback"], ["--kubeconfig"]),
    "policyreport apply": (["policyreport", "apply", "-f", "REPORTS"], ["--kubeconfig"]),
    "preflight": (["preflight"], ["--kubeconfig"]),
}


@pytest.mark.parametrize("path", LIVE_COMMANDS)
def test_without_any_cluster_the_error_names_flags_the_command_has(tmp_path: Path, path: str) -> None:
    (tmp_path / "pod.yaml").write_text(POD)
    reports = CliRunner().invoke(cli, ["audit", "-f", str(EXAMPLE_CLUSTER), "-o", "policyreport"]).stdout
    (tmp_path / "reports.yaml").write_text(reports)
    values = {"POD": str(tmp_path / "pod.yaml"), "NEW": str(tmp_path / "backup.yaml"),
              "REPORTS": str(tmp_path / "reports.yaml")}
    words, expected = LIVE_COMMANDS[path]
    arguments = [values.get(word, word) for word in words]
    environment = no_cluster_anywhere(tmp_path)

    result = CliRunner(env=environment).invoke(cli, arguments)

    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.startswith("Error: no kubeconfig") and result.stderr.count("\n") == 1, result.stderr
    assert prose_flags(result.stderr) == expected, result.stderr
    assert set(expected) <= flags_of(command_of(path))


def test_explain_without_nodes_points_at_its_state_flag(tmp_path: Path) -> None:
    (tmp_path / "pod.yaml").write_text(POD)
    (tmp_path / "state.yaml").write_text((EXAMPLE_CLUSTER / "quotas.yaml").read_text())

    result = CliRunner().invoke(cli, ["explain", "-f", str(tmp_path / "pod.yaml"),
                                      "--state", str(tmp_path / "state.yaml")])

    note = next(line for line in result.stderr.splitlines() if line.startswith("no Node objects"))
    assert set(prose_flags(note)) <= flags_of(command_of("explain")), note
    assert "--state" in prose_flags(note)


def test_apply_with_client_dry_run_needs_no_backup(tmp_path: Path) -> None:
    """--dry-run=client writes nothing, so there is nothing to back up: --backup is not asked for."""
    result = CliRunner(env=no_cluster_anywhere(tmp_path)).invoke(cli, ["migrate", "apply", "--dry-run=client"])

    assert "--backup" not in result.stderr, result.stderr
    assert result.stderr.startswith("Error: no kubeconfig"), result.stderr


def test_apply_without_backup_asks_for_it_or_a_client_dry_run() -> None:
    result = CliRunner().invoke(cli, ["migrate", "apply"])

    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == ("Error: --backup FILE is required (a new file that receives every "
                                             "quota before it changes), unless --dry-run=client")
