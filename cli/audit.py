"""``gpuquota audit``: where a cluster (or a set of manifests) stands before adopting the webhook."""

from __future__ import annotations

import click

from gpuquota_core.audit import DEFAULT_SHARED_LABEL, SCOPES, Severity, audit_objects
from kubeaccess.manifests import ManifestError, load_objects

from .errors import CommandError
from .output import FORMATS, document, table

SEVERITIES = [str(s) for s in Severity]


@click.command()
@click.argument("scope", required=False, default="all", type=click.Choice([*SCOPES, "all"]))
@click.option("-f", "--filename", "paths", multiple=True, help="File, directory or - (stdin) to audit.")
@click.option("-n", "--namespace", default=None, help="Only namespaced objects in this namespace.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace (the default offline).")
@click.option("-o", "--output", "fmt", default="table", type=click.Choice(FORMATS))
@click.option("--fail-on", default="error", type=click.Choice([*SEVERITIES, "none"]),
              help="Exit 1 when a finding at or above this severity exists.")
@click.option("--gpu-shared-label", default=DEFAULT_SHARED_LABEL, show_default=True)
def audit(scope: str, paths: tuple[str, ...], namespace: str | None, all_namespaces: bool, fmt: str,
          fail_on: str, gpu_shared_label: str) -> None:
    """Find mixed GPU resources in nodes, quotas, pods, workloads and ResourceQuotas."""
    if not paths:
        raise CommandError("live cluster access is not available yet; pass -f PATH (file, directory or -)")
    if namespace and all_namespaces:
        raise CommandError("-n/--namespace and -A/--all-namespaces are mutually exclusive")
    try:
        objects = load_objects(paths)
    except ManifestError as error:
        raise CommandError(str(error)) from None
    if namespace:
        # Cluster-scoped objects (nodes) stay: quota checks need to know what nodes advertise.
        objects = [o for o in objects if not (o.get("metadata") or {}).get("namespace")
                   or (o.get("metadata") or {}).get("namespace") == namespace]
    scopes = SCOPES if scope == "all" else (scope,)
    report = audit_objects(objects, scopes, shared_label=gpu_shared_label)
    if fmt in ("json", "yaml"):
        click.echo(document(report.as_dict(), fmt))
    else:
        headers = ["SEVERITY", "CHECK", "KIND", "NAMESPACE", "NAME"] + (["MESSAGE"] if fmt == "wide" else [])
        rows = [[str(f.severity), f.check, f.kind, f.namespace or "-", f.name]
                + ([f.message] if fmt == "wide" else []) for f in report.findings]
        click.echo(table(headers, rows) if rows else "No findings.")
    worst = report.worst()
    if fail_on != "none" and worst is not None and worst >= Severity[fail_on.upper()]:
        raise SystemExit(1)
