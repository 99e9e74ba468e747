"""``gpuquota completion bash|zsh|fish``: the shell completion script, from click's own completion."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")
# The program name the scripts complete and the variable click's entry point answers to
# (``_GPUQUOTA_COMPLETE=bash_source gpuquota`` prints the same bash script).
PROG_NAME = "gpuquota"
COMPLETE_VAR = "_GPUQUOTA_COMPLETE"


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL.

    \b
    bash:  source <(gpuquota completion bash)      (bash 4.4 or later)
    zsh:   source <(gpuquota completion zsh)
    fish:  gpuquota completion fish > ~/.config/fish/completions/gpuquota.fish
    """
    root = click.get_current_context().find_root().command
    completer = get_completion_class(shell)
    assert completer is not None  # every name in SHELLS is one of click's built-in shells
    click.echo(completer(root, {}, PROG_NAME, COMPLETE_VAR).source())
