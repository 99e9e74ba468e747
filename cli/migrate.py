"""``gpuquota migrate plan|apply|rollback``: move ElasticQuota trees to canonical GPU keys, step by step."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from gpuquota_core.migration import (
    DETACH_PHASES,
    PRE_MIGRATION_SPEC_ANNOTATION,
    Plan,
    Refusal,
    Step,
    changed_only_by_koordinator_bookkeeping,
    originals_from_annotations,
    plan_migration,
    plan_rollback,
    read_backup,
)
from gpuquota_core.quota_admission import IN_PROGRESS, MIGRATION_IN_PROGRESS_ANNOTATION
from gpuquota_core.quota_objects import (
    ELASTICQUOTA_GROUP,
    ELASTICQUOTA_PLURAL,
    ELASTICQUOTA_VERSION,
    PARENT_LABEL,
    ROOT_QUOTA,
)
from kubeaccess import collector
from kubeaccess.manifests import ManifestError, load_objects

from . import hints
from .errors import CommandError, cluster_error
from .inputs import readable_objects
from .output import document

ALL_AT_ONCE_HELP = ("ElasticQuotaEnableUpdateResourceKey is off: migrate multi-level trees in one maintenance "
                    "window, detaching each quota from its parent while its keys change (see docs/cli.md).")


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
@click.option("--all-at-once", is_flag=True, help=ALL_AT_ONCE_HELP)
@collector.paused()  # see kubeaccess/collector.py
def plan(paths: tuple[str, ...], kubeconfig: str | None, context: str | None, fmt: str,
         update_resource_key_gate: bool, all_at_once: bool) -> None:
    """Show every change, per quota, with before/after in canonical units.

    Exits 1 when any step is blocked (what blocks it comes first), as `apply` would write nothing.
    """
    _check_modes(update_resource_key_gate, all_at_once)
    origins: dict[int, str] = {}
    objects = (readable_objects(paths, nothing_to="plan", origins=origins) if paths
               else _live_objects(kubeconfig, context))
    result = _plan(objects, update_resource_key_gate, all_at_once, lambda obj: origins.get(id(obj)))
    nothing = _nothing_to_migrate(result, objects, "the input" if paths else "the cluster")
    if fmt != "diff":
        click.echo(document(result.as_dict(), fmt))
        if nothing:
            click.echo(nothing, err=True)  # stdout stays the document scripts parse
    else:
        _print_blocked(result)
        _print_steps(result.steps, result.blocked_quotas())
        _print_window_and_revisit(result)
        for note in result.notes:
            click.echo(f"NOTE: {note}")
        if nothing:
            click.echo(nothing)
    if result.blocked:
        sys.exit(CONFLICT_EXIT)


def _nothing_to_migrate(result: Plan, objects: list[dict[str, Any]], where: str) -> str:
    """What to say when the plan has no step and nothing blocks one; "" otherwise."""
    if result.steps or result.blocked:
        return ""
    if not any(o.get("kind") == "ElasticQuota" for o in objects):
        return f"nothing to migrate: no ElasticQuota in {where}"
    return "nothing to migrate: every ElasticQuota already uses canonical GPU keys"


def _check_modes(update_resource_key_gate: bool, all_at_once: bool) -> None:
    if update_resource_key_gate and all_at_once:
        raise CommandError(hints.BOTH_MODES())


def _print_blocked(result: Plan) -> None:
    # One line per distinct reason: a multi-level tree blocks each of its quotas with one message
    # that names them all (the JSON output has one entry per quota).
    for reason, message in dict.fromkeys((entry.reason, entry.message) for entry in result.blocked):
        click.echo(f"BLOCKED: {message} [{reason}]")


def _print_blocked_and_revisit(result: Plan) -> None:
    _print_blocked(result)
    _print_window_and_revisit(result)


def _print_window_and_revisit(result: Plan) -> None:
    for line in result.window:
        click.echo(f"WINDOW: {line}")
    for item in result.revisit:
        click.echo(f"REVISIT: {item['kind']} {item['namespace']}/{item['name']}: {item['message']}")


def _plan(objects: list[dict[str, Any]], gate: bool, all_at_once: bool = False,
          origin: Callable[[Mapping[str, Any]], str | None] | None = None) -> Plan:
    # An unreadable ElasticQuota is a blocked entry of the plan, not an error: the others are still shown.
    return plan_migration(objects, gate, all_at_once=all_at_once, origin=origin)


def _live_objects(kubeconfig: str | None, context: str | None) -> list[dict[str, Any]]:
    # The kubernetes client is imported where it is used: it is a noticeable start-up cost
    # that plan -f (and every other gpuquota command, which imports this module) never needs.
    from kubeaccess.kube import KubeAccessError, list_cluster

    try:
        return list_cluster(kubeconfig, context, None)
    except KubeAccessError as error:
        raise cluster_error(error) from None


CONFLICT_EXIT = 1
# Writes of one step refused only because Koordinator's quota controller updated its summaries on
# the quota meanwhile, tried again from a fresh read; a busy quota is rewritten about once a second.
BOOKKEEPING_RETRIES = 5
DRY_RUN_HELP = ("client: print the steps and write nothing; server: send every step as a server-side dry run "
                "(the apiserver and its webhooks judge it), nothing is stored.")


def _print_steps(steps: list[Step], blocked: Collection[str] = ()) -> None:
    for number, step in enumerate(steps, 1):
        mark = " (BLOCKED)" if step.quota in blocked else ""
        click.echo(f"# step {number}: {step.phase} ElasticQuota {step.namespace}/{step.quota}{mark}")
        for section in ("min", "max"):
            before, after = step.before[section], step.after[section]
            for key in sorted(set(before) | set(after)):
                if before.get(key) == after.get(key):
                    continue
                if key in before:
                    click.echo(f"-  {section}.{key}: {before[key]}")
                if key in after:
                    click.echo(f"+  {section}.{key}: {after[key]}")
        if step.parent_after is not None:
            click.echo(f"-  metadata.labels.{PARENT_LABEL}: {step.parent_before}")
            click.echo(f"+  metadata.labels.{PARENT_LABEL}: {step.parent_after}")


def _write_steps(kubeconfig: str | None, context: str | None, steps: list[Step],
                 current: dict[tuple[str, str], dict[str, Any]], dry_run: str,
                 body_of: Callable[[dict[str, Any], Step], dict[str, Any]], recovery: str) -> None:
    """One replace per step (server-side dry run first), each carrying the resourceVersion last
    read or written for that quota.

    A quota changed by anyone else since is a 409 from the apiserver: the run stops at that step
    (exit 1) and writes nothing further; ``recovery`` tells the user what to do next.
    """
    if dry_run == "client":
        for number, step in enumerate(steps, 1):
            click.echo(f"would apply step {number}: {step.phase} ElasticQuota {step.namespace}/{step.quota}")
        return
    from kubernetes import client  # see _live_objects
    from kubernetes.client.exceptions import ApiException

    from kubeaccess.kube import KubeAccessError, api_error_message, connect

    try:
        api = connect(kubeconfig, context)
    except KubeAccessError as error:
        raise cluster_error(error) from None
    custom = client.CustomObjectsApi(api)

    def write(step: Step, body: dict[str, Any]) -> Any:
        # Every real write is tried with dryRun=All first: admission (Koordinator's webhook, ours)
        # judges the step before anything is stored, so a refusal leaves no half-step.
        stored = custom.replace_namespaced_custom_object(
            ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, step.namespace, ELASTICQUOTA_PLURAL, step.quota, body,
            dry_run="All")
        if dry_run != "server":
            stored = custom.replace_namespaced_custom_object(
                ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, step.namespace, ELASTICQUOTA_PLURAL, step.quota, body)
        return stored

    try:
        for number, step in enumerate(steps, 1):
            key = (step.namespace, step.quota)
            for attempt in range(1, BOOKKEEPING_RETRIES + 2):
                body = body_of(current[key], step)
                try:
                    stored = write(step, body)
                    break
                except ApiException as error:
                    if error.status == 409 and attempt <= BOOKKEEPING_RETRIES:
                        # Koordinator's quota controller rewrites its usage summaries on the quota as
                        # pods come and go: a step planned before that is still right after it.
                        fresh = custom.get_namespaced_custom_object(
                            ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, step.namespace, ELASTICQUOTA_PLURAL, step.quota)
                        if isinstance(fresh, dict) and changed_only_by_koordinator_bookkeeping(current[key], fresh):
                            current[key] = fresh
                            continue
                    if error.status == 409:
                        version = (current[key].get("metadata") or {}).get("resourceVersion")
                        what = (f"conflict: ElasticQuota {step.namespace}/{step.quota} changed since it was read "
                                f"(resourceVersion {version}); it was not overwritten")
                    else:
                        what = api_error_message(error)
                    click.echo(f"step {number} ({step.phase} {step.namespace}/{step.quota}) refused: {what}",
                               err=True)
                    click.echo(f"{number - 1} of {len(steps)} step(s) applied, nothing further written; {recovery}",
                               err=True)
                    sys.exit(CONFLICT_EXIT)
            current[key] = stored if isinstance(stored, dict) else body
            verb = "would apply" if dry_run == "server" else "applied"
            click.echo(f"{verb} step {number}: {step.phase} ElasticQuota {step.namespace}/{step.quota}")
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _quotas_by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {((o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"]): o
            for o in objects if o.get("kind") == "ElasticQuota"}


@migrate.command()
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-n", "--namespace", default=None,
              help="Only ElasticQuotas in this namespace (one tree at a time); default every namespace.")
@click.option("--backup", "backup_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="New file that receives every quota to be changed, before the first write (required unless "
                   "--dry-run=client).")
@click.option("--dry-run", "dry_run", type=click.Choice(["none", "client", "server"]), default="none",
              show_default=True, help=DRY_RUN_HELP + " No backup is written with client.")
@click.option("--update-resource-key-gate", is_flag=True,
              help="Koordinator runs with ElasticQuotaEnableUpdateResourceKey=true.")
@click.option("--all-at-once", is_flag=True, help=ALL_AT_ONCE_HELP)
def apply(kubeconfig: str | None, context: str | None, namespace: str | None, backup_path: Path | None, dry_run: str,
          update_resource_key_gate: bool, all_at_once: bool) -> None:
    """Write the plan to the cluster, one optimistic-concurrency update per step.

    Nothing is written when the plan is blocked. Every update carries the resourceVersion the plan
    was computed from, so a quota changed by someone else since is a conflict that stops the run
    (exit 1) instead of being overwritten. The original spec stays in an annotation for rollback.
    """
    _check_modes(update_resource_key_gate, all_at_once)
    if backup_path is None and dry_run != "client":
        raise click.UsageError(hints.BACKUP_REQUIRED())
    if backup_path is not None and backup_path.exists():
        raise CommandError(hints.BACKUP_EXISTS(backup=backup_path))
    objects = _live_objects(kubeconfig, context)
    if namespace:
        objects = [o for o in objects if (o.get("metadata") or {}).get("namespace") in (None, "", namespace)]
    result = _plan(objects, update_resource_key_gate, all_at_once)
    if result.blocked:
        _print_blocked_and_revisit(result)
        click.echo("nothing written: the plan is blocked", err=True)
        sys.exit(CONFLICT_EXIT)
    if not result.steps:
        click.echo("nothing to migrate: every ElasticQuota already uses canonical GPU keys")
        return
    current = _quotas_by_key(objects)
    touched = [current[(step.namespace, step.quota)] for step in result.steps]
    unique = list({(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in touched}.values())
    if dry_run != "client":
        assert backup_path is not None  # refused above
        try:
            backup_path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": unique},
                                                  sort_keys=False))
        except OSError as error:
            raise CommandError(f"{backup_path}: cannot write the backup: {error.strerror or error}") from None
        click.echo(f"backup of {len(unique)} ElasticQuota(s) written to {backup_path}", err=True)
    recovery = hints.APPLY_STOPPED(backup=backup_path)
    body_of = _updated
    if all_at_once:
        for line in result.window:
            click.echo(f"WINDOW: {line}", err=True)
        recovery = hints.APPLY_ALL_AT_ONCE_STOPPED(backup=backup_path)
        body_of = _updated_all_at_once
    _write_steps(kubeconfig, context, result.steps, current, dry_run, body_of, recovery)
    if not all_at_once:
        _print_blocked_and_revisit(result)
    else:
        for item in result.revisit:
            click.echo(f"REVISIT: {item['kind']} {item['namespace']}/{item['name']}: {item['message']}")


def _updated(obj: dict[str, Any], step: Step) -> dict[str, Any]:
    body, annotations = _with_step(obj, step, move=False)
    # Only the first step records the original: later steps must not replace it with an interim spec.
    annotations.setdefault(PRE_MIGRATION_SPEC_ANNOTATION, json.dumps(
        {"min": obj.get("spec", {}).get("min", {}), "max": obj.get("spec", {}).get("max", {})}, sort_keys=True))
    if step.phase == "add-canonical":
        annotations[MIGRATION_IN_PROGRESS_ANNOTATION] = IN_PROGRESS
    else:
        annotations.pop(MIGRATION_IN_PROGRESS_ANNOTATION, None)
    return body


def _with_step(obj: dict[str, Any], step: Step, *, move: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of ``obj`` with the step's spec (and, with ``move``, its parent label); its annotations."""
    body = copy.deepcopy(obj)
    spec = body.setdefault("spec", {})
    spec["min"], spec["max"] = dict(step.after["min"]), dict(step.after["max"])
    if move:
        _set_parent(body, step)
    annotations = body["metadata"].setdefault("annotations", {}) or {}
    body["metadata"]["annotations"] = annotations
    return body, annotations


def _set_parent(body: dict[str, Any], step: Step) -> None:
    if step.parent_after is not None:
        labels = body["metadata"].setdefault("labels", {}) or {}
        body["metadata"]["labels"] = labels
        labels[PARENT_LABEL] = step.parent_after


def _updated_all_at_once(obj: dict[str, Any], step: Step) -> dict[str, Any]:
    """A step of ``apply --all-at-once``: spec and parent label; the original spec and parent recorded."""
    body, annotations = _with_step(obj, step)
    original_parent = ((obj.get("metadata") or {}).get("labels") or {}).get(PARENT_LABEL) or ROOT_QUOTA
    annotations.setdefault(PRE_MIGRATION_SPEC_ANNOTATION, json.dumps(
        {"min": obj.get("spec", {}).get("min", {}), "max": obj.get("spec", {}).get("max", {}),
         "parent": original_parent}, sort_keys=True))
    if step.phase in DETACH_PHASES:
        # Detached from its parent until its reattach step: the window is open for this quota.
        annotations[MIGRATION_IN_PROGRESS_ANNOTATION] = IN_PROGRESS
    else:
        annotations.pop(MIGRATION_IN_PROGRESS_ANNOTATION, None)
    return body


@migrate.command()
@click.option("-f", "--filename", "backup", default=None,
              help="Backup written by `migrate apply --backup`; without it, each quota's "
                   f"{PRE_MIGRATION_SPEC_ANNOTATION} annotation.")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster.")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-n", "--namespace", default=None, help="Only ElasticQuotas in this namespace.")
@click.option("--dry-run", "dry_run", type=click.Choice(["none", "client", "server"]), default="none",
              show_default=True, help=DRY_RUN_HELP)
@click.option("--all-at-once", is_flag=True,
              help="Undo `apply --all-at-once` (detected from the quotas when not given).")
def rollback(backup: str | None, kubeconfig: str | None, context: str | None, namespace: str | None,
             dry_run: str, all_at_once: bool) -> None:
    """Put migrated ElasticQuotas back to their original spec, in the reverse of apply's order.

    All or nothing up front: if any quota changed since the migration (its spec is neither the
    original nor a state apply writes) or is gone, every such quota is named and nothing is
    written (exit 1). Each update carries the resourceVersion just read, so a change during the
    run is a conflict that stops it (exit 1); running rollback again continues from there.
    """
    originals: dict[tuple[str, str], dict[str, dict[str, str]]] | None = None
    parents: dict[tuple[str, str], str] | None = None
    # An item of the backup, or a live quota, that cannot be read is refused by name (nothing is
    # written), never the end of the others: every refusal is listed in one run.
    refused: list[Refusal] = []
    if backup is not None:
        try:
            saved = read_backup(load_objects(backup), backup)
        except ManifestError as error:
            raise CommandError(str(error)) from None
        if not saved.originals and not saved.refused:
            raise CommandError(f"{backup}: no ElasticQuota in this file; is it a `migrate apply --backup` file?")
        originals, parents = saved.originals, saved.parents
        refused = [r for r in saved.refused if not namespace or r.namespace in ("", namespace)]
    objects = _live_objects(kubeconfig, context)  # the whole tree: parents may live in other namespaces
    if originals is None:
        originals, annotation_refusals = originals_from_annotations(objects)
        refused = [r for r in annotation_refusals if not namespace or r.namespace == namespace]
    if namespace:
        originals = {key: spec for key, spec in originals.items() if key[0] == namespace}
    result = plan_rollback(objects, originals, original_parents=parents, all_at_once=all_at_once or None)
    result.refused = sorted([*refused, *result.refused], key=lambda r: (r.namespace, r.quota))
    if result.refused:
        for refusal in result.refused:
            click.echo(f"REFUSED: ElasticQuota {refusal.namespace}/{refusal.quota}: {refusal.reason}", err=True)
        click.echo(hints.ROLLBACK_REFUSED(), err=True)
        sys.exit(CONFLICT_EXIT)
    for ref in result.unchanged:
        click.echo(f"unchanged: ElasticQuota {ref} already has its original spec", err=True)
    if not result.steps:
        source = backup if backup is not None else f"the {PRE_MIGRATION_SPEC_ANNOTATION} annotation"
        click.echo(f"nothing to roll back: no ElasticQuota differs from {source}")
        return
    if dry_run == "client":
        _print_steps(result.steps)
    recovery = hints.ROLLBACK_STOPPED()
    _write_steps(kubeconfig, context, result.steps, _quotas_by_key(objects), dry_run, _restored, recovery)


def _restored(obj: dict[str, Any], step: Step) -> dict[str, Any]:
    body, annotations = _with_step(obj, step)
    if step.phase == "re-add-legacy" or step.phase in DETACH_PHASES:
        # Both GPU families again until the restore step: the webhook admits that only when marked.
        annotations[MIGRATION_IN_PROGRESS_ANNOTATION] = IN_PROGRESS
    else:
        annotations.pop(MIGRATION_IN_PROGRESS_ANNOTATION, None)
        annotations.pop(PRE_MIGRATION_SPEC_ANNOTATION, None)
    return body
