"""``gpuquota migrate plan|apply``: move ElasticQuota trees to canonical GPU keys, step by step."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuquota_core.migration import (
    IN_PROGRESS,
    MIGRATION_IN_PROGRESS_ANNOTATION,
    PRE_MIGRATION_SPEC_ANNOTATION,
    Plan,
    Step,
    plan_migration,
)
from gpuquota_core.quota import QuotaShapeError
from kubeaccess.kube import KubeAccessError, api_error_message, connect, list_cluster
from kubeaccess.manifests import ManifestError, load_objects

from .errors import CommandError
from .output import document


@click.group()
def migrate() -> None:
    """Move ElasticQuota trees from nvidia.com/gpu keys to canonical keys."""


@migrate.command()
@click.option("-f", "--filename", "paths", multiple=True,
              help="File, directory or -; without it the live cluster is read.")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-o", "--output", "fmt", default="diff", type=click.Choice(["diff", "json", "yaml"]))
@click.option("--update-resource-key-gate", is_flag=True,
              help="Koordinator runs with ElasticQuotaEnableUpdateResourceKey=true.")
def plan(paths: tuple[str, ...], kubeconfig: str | None, context: str | None, fmt: str,
         update_resource_key_gate: bool) -> None:
    """Show every change, per quota, with before/after in canonical units."""
    objects = load_objects_or_fail(paths) if paths else _live_objects(kubeconfig, context)
    result = _plan(objects, update_resource_key_gate)
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
    _print_blocked_and_revisit(result)


def _print_blocked_and_revisit(result: Plan) -> None:
    for reason in result.blocked:
        click.echo(f"BLOCKED: {reason}")
    for item in result.revisit:
        click.echo(f"REVISIT: {item['kind']} {item['namespace']}/{item['name']}: {item['message']}")


def load_objects_or_fail(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    try:
        return load_objects(paths)
    except ManifestError as error:
        raise CommandError(str(error)) from None


def _plan(objects: list[dict[str, Any]], gate: bool) -> Plan:
    try:
        return plan_migration(objects, gate)
    except QuotaShapeError as error:
        raise CommandError(str(error)) from None


def _live_objects(kubeconfig: str | None, context: str | None) -> list[dict[str, Any]]:
    try:
        return list_cluster(kubeconfig, context, None)
    except KubeAccessError as error:
        raise CommandError(str(error)) from None


EQ = ("scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas")
CONFLICT_EXIT = 1


@migrate.command()
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-n", "--namespace", default=None,
              help="Only ElasticQuotas in this namespace (one tree at a time); default every namespace.")
@click.option("--backup", "backup_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="New file that receives every quota to be changed, before the first write.")
@click.option("--dry-run", "dry_run", type=click.Choice(["none", "server"]), default="none", show_default=True,
              help="server: send every step as a server-side dry run; nothing is stored.")
@click.option("--update-resource-key-gate", is_flag=True,
              help="Koordinator runs with ElasticQuotaEnableUpdateResourceKey=true.")
def apply(kubeconfig: str | None, context: str | None, namespace: str | None, backup_path: Path, dry_run: str,
          update_resource_key_gate: bool) -> None:
    """Write the plan to the cluster, one optimistic-concurrency update per step.

    Nothing is written when the plan is blocked. Every update carries the resourceVersion the plan
    was computed from, so a quota changed by someone else since is a conflict that stops the run
    (exit 1) instead of being overwritten. The original spec stays in an annotation for rollback.
    """
    if backup_path.exists():
        raise CommandError(f"{backup_path} exists; choose a new backup file (an old backup is never overwritten)")
    objects = _live_objects(kubeconfig, context)
    if namespace:
        objects = [o for o in objects if (o.get("metadata") or {}).get("namespace") in (None, "", namespace)]
    result = _plan(objects, update_resource_key_gate)
    if result.blocked:
        _print_blocked_and_revisit(result)
        click.echo("nothing written: the plan is blocked", err=True)
        sys.exit(CONFLICT_EXIT)
    if not result.steps:
        click.echo("nothing to migrate: every ElasticQuota already uses canonical GPU keys")
        return
    current = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
               for o in objects if o.get("kind") == "ElasticQuota"}
    touched = [current[(step.namespace, step.quota)] for step in result.steps]
    unique = list({(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in touched}.values())
    try:
        backup_path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": unique}, sort_keys=False))
    except OSError as error:
        raise CommandError(f"{backup_path}: cannot write the backup: {error.strerror or error}") from None
    click.echo(f"backup of {len(unique)} ElasticQuota(s) written to {backup_path}", err=True)
    try:
        api = connect(kubeconfig, context)
    except KubeAccessError as error:
        raise CommandError(str(error)) from None
    custom = client.CustomObjectsApi(api)
    for number, step in enumerate(result.steps, 1):
        key = (step.namespace, step.quota)
        body = _updated(current[key], step)
        try:
            stored = custom.replace_namespaced_custom_object(
                EQ[0], EQ[1], step.namespace, EQ[2], step.quota, body,
                dry_run="All" if dry_run == "server" else None)
        except ApiException as error:
            reason = api_error_message(error)
            what = "conflict: it changed since it was read; re-run" if error.status == 409 else reason
            click.echo(f"step {number} ({step.phase} {step.namespace}/{step.quota}) refused: {what}", err=True)
            click.echo(f"{number - 1} of {len(result.steps)} step(s) applied; originals are in {backup_path}",
                       err=True)
            sys.exit(CONFLICT_EXIT)
        current[key] = stored if isinstance(stored, dict) else body
        verb = "would apply" if dry_run == "server" else "applied"
        click.echo(f"{verb} step {number}: {step.phase} ElasticQuota {step.namespace}/{step.quota}")
    _print_blocked_and_revisit(result)


def _updated(obj: dict[str, Any], step: Step) -> dict[str, Any]:
    body = copy.deepcopy(obj)
    spec = body.setdefault("spec", {})
    spec["min"], spec["max"] = dict(step.after["min"]), dict(step.after["max"])
    annotations = body["metadata"].setdefault("annotations", {}) or {}
    body["metadata"]["annotations"] = annotations
    # Only the first step records the original: later steps must not replace it with an interim spec.
    annotations.setdefault(PRE_MIGRATION_SPEC_ANNOTATION, json.dumps(
        {"min": obj.get("spec", {}).get("min", {}), "max": obj.get("spec", {}).get("max", {})}, sort_keys=True))
    if step.phase == "add-canonical":
        annotations[MIGRATION_IN_PROGRESS_ANNOTATION] = IN_PROGRESS
    else:
        annotations.pop(MIGRATION_IN_PROGRESS_ANNOTATION, None)
    return body
