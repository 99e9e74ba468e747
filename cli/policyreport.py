"""``gpuquota policyreport apply``: store the reports of ``gpuquota audit -o policyreport``, prune stale ones.

kubectl can apply the reports but not prune them across namespaces: ``apply --prune`` only looks in
the namespaces of the objects it applies, so a namespace whose last finding was fixed would keep its
old report. This command applies every report server-side and then deletes each stored report with
the audit's labels that the file no longer holds, in every namespace.
"""

from __future__ import annotations

from typing import Any

import click

from gpuquota_core.policy_report import REPORT_LABELS, report_key, report_problem, stale_reports

from .errors import CommandError, cluster_error
from .inputs import objects_or_fail

GROUP, VERSION = "wgpolicyk8s.io", "v1alpha2"
PLURALS = {"PolicyReport": "policyreports", "ClusterPolicyReport": "clusterpolicyreports"}
FIELD_MANAGER = "gpuquota-audit"


@click.group()
def policyreport() -> None:
    """wgpolicyk8s.io/v1alpha2 reports written by `gpuquota audit -o policyreport`."""


@policyreport.command("apply")
@click.option("-f", "--filename", "paths", multiple=True, required=True,
              help="Reports from `gpuquota audit -o policyreport` (file, directory or -).")
@click.option("--kubeconfig", default=None, help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
def apply_reports(paths: tuple[str, ...], kubeconfig: str | None, context: str | None) -> None:
    """Apply the reports server-side, then delete the audit's reports that the file no longer holds."""
    # Pruning against an empty set would delete every report: refused.
    reports = objects_or_fail(paths, nothing_to=None, what="reports")
    for report in reports:
        problem = report_problem(report)
        if problem:
            raise CommandError(problem)
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kubeaccess.kube import KubeAccessError, api_error_message, connect

    try:
        api = connect(kubeconfig, context)
    except KubeAccessError as error:
        raise cluster_error(error) from None
    custom = client.CustomObjectsApi(api)
    try:
        for report in reports:
            kind, namespace, name = report_key(report)
            apply: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True,
                                     "_content_type": "application/apply-patch+yaml"}
            if namespace:
                custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name, report, **apply)
            else:
                custom.patch_cluster_custom_object(GROUP, VERSION, PLURALS[kind], name, report, **apply)
            click.echo(f"{_printed(kind, namespace, name)} serverside-applied")
        selector = ",".join(f"{key}={value}" for key, value in REPORT_LABELS.items())
        # Cluster-wide lists: the namespaced kind's list covers every namespace.
        stored: list[dict[str, Any]] = []
        for plural in PLURALS.values():
            listed: Any = custom.list_cluster_custom_object(GROUP, VERSION, plural, label_selector=selector)
            stored.extend(listed["items"])
        for kind, namespace, name in stale_reports(stored, reports):
            if namespace:
                custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
            else:
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURALS[kind], name)
            click.echo(f"{_printed(kind, namespace, name)} pruned")
    except ApiException as error:
        raise CommandError(f"{api_error_message(error)} (HTTP {error.status})") from None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _printed(kind: str, namespace: str, name: str) -> str:
    """As kubectl prints an object it applied: ``policyreport.wgpolicyk8s.io/NAME``, with the namespace."""
    return f"{kind.lower()}.{GROUP}/{name}" + (f" -n {namespace}" if namespace else "")
