"""``gpuquota migrate plan``: the ordered quota changes to canonical GPU keys (dry run; apply is not built yet)."""

from __future__ import annotations

import click

from gpuquota_core.migration import plan_migration
from gpuquota_core.quota import QuotaShapeError
from kubeaccess.manifests import ManifestError, load_objects

from .errors import CommandError
from .output import document


@click.group()
def migrate() -> None:
    """Move ElasticQuota trees from nvidia.com/gpu keys to canonical keys."""


@migrate.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True, help="File, directory or -.")
@click.option("-o", "--output", "fmt", default="diff", type=click.Choice(["diff", "json", "yaml"]))
@click.option("--update-resource-key-gate", is_flag=True,
              help="Koordinator runs with ElasticQuotaEnableUpdateResourceKey=true.")
def plan(paths: tuple[str, ...], fmt: str, update_resource_key_gate: bool) -> None:
    """Show every change, per quota, with before/after in canonical units."""
    try:
        result = plan_migration(load_objects(paths), update_resource_key_gate)
    except (ManifestError, QuotaShapeError) as error:
        raise CommandError(str(error)) from None
    if fmt != "diff":
        click.echo(document(result.as_dict(), fmt))
        return
    for number, step in enumerate(result.steps, 1):
        click.echo(f"# step {number}: {step.phase} ElasticQuota {step.namespace}/{step.quota}")
        for section in ("min", "max"):
            before, after = step.before[section], step.after[section]
            for key in sorted(set(before) | set(after)):
                if before.get(key) == after.get(key):
                    continue
                if key in before:
                    click.echo(f"-  {section}.{key}: {before[key]}")
                if key in after:
                    click.echo(f"+  {section}.{key}: {after[key]}")
    for reason in result.blocked:
        click.echo(f"BLOCKED: {reason}")
    for item in result.revisit:
        click.echo(f"REVISIT: {item['kind']} {item['namespace']}/{item['name']}: {item['message']}")
