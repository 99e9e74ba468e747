"""``gpuquota audit``: where a cluster (or a set of manifests) stands before adopting the webhook."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from gpuquota_core import collector
from gpuquota_core.audit import DEFAULT_SHARED_LABEL, SCOPES, AuditReport, Severity, audit_objects
from kubeaccess.manifests import ManifestError, load_objects

from .errors import CommandError, input_names
from .output import FORMATS, document, table

SEVERITIES = [str(s) for s in Severity]
# kubeaccess.kube.DEFAULT_PAGE_SIZE (tests/cli/test_startup.py keeps them equal). Not imported:
# kubeaccess.kube loads the kubernetes client, a third of a second that an audit of files never needs.
DEFAULT_CHUNK_SIZE = 500


@click.command()
@click.argument("scope", required=False, default="all", type=click.Choice([*SCOPES, "all"]))
@click.option("-f", "--filename", "paths", multiple=True, help="File, directory or - (stdin) to audit.")
@click.option("-n", "--namespace", default=None, help="Only namespaced objects in this namespace.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace (the default offline).")
@click.option("-o", "--output", "fmt", default="table", type=click.Choice([*FORMATS, "policyreport"]),
              help="policyreport: wgpolicyk8s.io/v1alpha2 (Cluster)PolicyReports, YAML documents for kubectl apply.")
@click.option("--fail-on", default="error", type=click.Choice([*SEVERITIES, "none"]),
              help="Exit 1 when a finding at or above this severity exists.")
@click.option("--gpu-shared-label", default=DEFAULT_SHARED_LABEL, show_default=True)
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster (default: $KUBECONFIG, "
              "~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("--chunk-size", default=DEFAULT_CHUNK_SIZE, show_default=True, type=click.IntRange(min=1),
              help="Objects per list request (paged with continue tokens, as kubectl does).")
@collector.paused()  # see gpuquota_core/collector.py
def audit(scope: str, paths: tuple[str, ...], namespace: str | None, all_namespaces: bool, fmt: str,
          fail_on: str, gpu_shared_label: str, kubeconfig: str | None, context: str | None,
          chunk_size: int) -> None:
    """Find mixed GPU resources in nodes, quotas, pods, workloads and ResourceQuotas.

    Without -f it audits the live cluster: like kubectl, the context's namespace unless -n or -A.
    """
    if namespace and all_namespaces:
        raise CommandError("-n/--namespace and -A/--all-namespaces are mutually exclusive")
    if paths and (kubeconfig or context):
        raise CommandError("-f reads manifests; --kubeconfig/--context are for a live cluster: give one or the other")
    if not paths:
        from kubeaccess.kube import context_namespace

        namespace = None if all_namespaces else namespace or context_namespace(kubeconfig, context)
        # Scoped lists, except nodes and ElasticQuotas (kubeaccess.kube.AUDIT_KINDS): a quota's
        # tree spans namespaces.
        objects = _live_objects(kubeconfig, context, namespace, chunk_size)
    else:
        try:
            objects = load_objects(paths)
        except ManifestError as error:
            raise CommandError(str(error)) from None
        if not objects:
            # "No findings." would read as a clean bill of health for files that hold nothing.
            raise CommandError(f"no objects in {input_names(paths)}: nothing to audit")
    scopes = SCOPES if scope == "all" else (scope,)
    # -n shows one namespace; everything read is judged (a quota's parents live elsewhere).
    report = audit_objects(objects, scopes, shared_label=gpu_shared_label, namespace=namespace or None)
    if fmt == "policyreport":
        _echo_policy_reports(report)
    elif fmt in ("json", "yaml"):
        click.echo(document(report.as_dict(), fmt, plain=True))  # findings hold only str, int, lists, dicts
    else:
        headers = ["SEVERITY", "CHECK", "KIND", "NAMESPACE", "NAME"] + (["MESSAGE"] if fmt == "wide" else [])
        rows = [[str(f.severity), f.check, f.kind, f.namespace or "-", f.name]
                + ([f.message] if fmt == "wide" else []) for f in report.findings]
        click.echo(table(headers, rows) if rows else "No findings.")
    worst = report.worst()
    if fail_on != "none" and worst is not None and worst >= Severity[fail_on.upper()]:
        raise SystemExit(1)


def _echo_policy_reports(report: AuditReport) -> None:
    from gpuquota_core.policy_report import policy_reports

    click.echo("\n---\n".join(document(r, "yaml") for r in policy_reports(report, int(time.time()))))


def _live_objects(kubeconfig: str | None, context: str | None, namespace: str | None,
                  chunk_size: int) -> list[dict[str, Any]]:
    from kubeaccess.kube import KubeAccessError, list_cluster

    show_progress = sys.stderr.isatty()

    def progress(kind: str, count: int) -> None:
        if show_progress:
            click.echo(f"\rlisting {kind}: {count}\033[K", err=True, nl=False)

    try:
        objects = list_cluster(kubeconfig, context, namespace, page_size=chunk_size, on_page=progress)
    except KubeAccessError as error:
        raise CommandError(str(error)) from None
    if show_progress:
        click.echo("\r\033[K", err=True, nl=False)
    return objects
