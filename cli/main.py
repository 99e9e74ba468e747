"""Entry point of ``gpuquota`` / ``kubectl-gpuquota``.

Each subcommand lives in its own module; this file only assembles the group, so adding a command
never touches another command's code.
"""

from __future__ import annotations

import importlib

import click

# (module, attribute) of every subcommand, in the order ``--help`` lists them.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("cli.serve", "serve"),
    ("cli.convert", "convert"),
    ("cli.certs", "certs"),
    ("cli.audit", "audit"),
    ("cli.migrate", "migrate"),
    ("cli.quota", "quota"),
    ("cli.explain", "explain"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="koord-gpuquota", prog_name="gpuquota")
def cli() -> None:
    """Canonical GPU requests and ElasticQuota enforcement for Koordinator clusters."""


for _module, _attribute in SUBCOMMANDS:
    try:
        cli.add_command(getattr(importlib.import_module(_module), _attribute))
    except ModuleNotFoundError as _missing:
        if _missing.name != _module:
            raise


def main() -> None:
    cli(prog_name="gpuquota")
