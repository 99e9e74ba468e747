"""``gpuquota completion bash|zsh|fish``: the shell completion script, from click's own completion."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")
# The program names the scripts complete: the command, and the kubectl plugin binary (krew installs
# only that one). Both answer to one variable (cli/main.py passes it to click), so
# ``_GPUQUOTA_COMPLETE=bash_source gpuquota`` prints the first part of the bash script.
PROG_NAME = "gpuquota"
PLUGIN_NAME = "kubectl-gpuquota"
COMPLETE_VAR = "_GPUQUOTA_COMPLETE"
# zsh: where a script stops defining its function and starts registering it (autoloaded or sourced).
_ZSH_REGISTRATION = "if [[ $zsh_eval_context[-1] == loadautofunc ]]; then"


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
    command, plugin = (completer(root, {}, name, COMPLETE_VAR).source() for name in (PROG_NAME, PLUGIN_NAME))
    if shell == "zsh":
        # One file may be autoloaded for gpuquota: the plugin's function is defined and registered
        # with compdef, never called at load as the first script's is.
        plugin = plugin.split(_ZSH_REGISTRATION, 1)[0].replace(f"#compdef {PLUGIN_NAME}\n", "")
        plugin += f"compdef _{PLUGIN_NAME.replace('-', '_')}_completion {PLUGIN_NAME}\n"
    click.echo(command.rstrip("\n") + "\n\n" + plugin)
