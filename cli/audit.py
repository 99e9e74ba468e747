"""``gpuquota audit``: where a cluster (or a set of manifests) stands before adopting the webhook."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import click

from gpuquota_core.audit import DEFAULT_SHARED_LABEL, SCOPES, AuditReport, Finding, Severity, audit_objects
from gpuquota_core.selector import Selector
from kubeaccess import collector
from webhook.admission.status import status_of

from . import hints, output
from .errors import CommandError, cluster_error
from .inputs import SKIPPED_EXIT, exit_status, readable_objects
from .options import colour_option, no_headers_option, selector_option
from .output import FORMATS, document

SEVERITIES = [str(s) for s in Severity]
# kubeaccess.kube.DEFAULT_PAGE_SIZE (tests/cli/test_startup.py keeps them equal). Not imported:
# kubeaccess.kube loads the kubernetes client, a noticeable start-up cost that an audit of files never needs.
DEFAULT_CHUNK_SIZE = 500


# The scope argument takes kubectl's names for the kinds: singular, plural and short names. `quota`
# is an ElasticQuota here, as everywhere in gpuquota (kubectl's short name for a ResourceQuota, whose
# names here are resourcequota(s)).
SCOPE_ALIASES = {
    "nodes": ("node", "no"),
    "quotas": ("quota", "elasticquota", "elasticquotas", "eq"),
    "pods": ("pod", "po"),
    "workloads": ("workload",),
    "resourcequotas": ("resourcequota",),
}
_SCOPE_OF = {name: scope for scope, aliases in SCOPE_ALIASES.items() for name in (scope, *aliases)}


SCOPE_METAVAR = "[KIND[,KIND...]]"


def parse_scopes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """``all``, a kind, or kinds joined by commas as kubectl takes them (``pods,eq``)."""
    scopes: list[str] = []
    for word in value.split(","):
        word = word.strip().lower()
        if word == "all":
            return SCOPES
        scope = _SCOPE_OF.get(word)
        if scope is None:
            known = "; ".join(f"{scope} ({', '.join(aliases)})" for scope, aliases in SCOPE_ALIASES.items())
            raise click.BadParameter(f"{word!r} is not a kind the audit checks: all; {known}", ctx,
                                     param_hint="'KIND'")
        scopes.append(scope)
    return tuple(s for s in SCOPES if s in scopes)


@click.command()
@click.argument("scope", required=False, default="all", metavar=SCOPE_METAVAR, callback=parse_scopes)
@click.option("-f", "--filename", "paths", multiple=True, help="File, directory or - (stdin) to audit.")
@click.option("-n", "--namespace", default=None, help="Only namespaced objects in this namespace.")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every namespace (the default offline).")
@click.option("-o", "--output", "fmt", default="table", type=click.Choice([*FORMATS, "policyreport"]),
              help="policyreport: wgpolicyk8s.io/v1alpha2 (Cluster)PolicyReports, YAML documents for kubectl apply.")
@selector_option("shows findings on the objects it selects; every object is still judged")
@no_headers_option("Table output without the header line and the summary line.")
@colour_option("Severity in colour")
@click.option("--fail-on", default="error", type=click.Choice([*SEVERITIES, "none"]),
              help="Exit 1 when a finding at or above this severity exists.")
@click.option("--gpu-shared-label", default=DEFAULT_SHARED_LABEL, show_default=True)
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster (default: $KUBECONFIG, "
              "~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("--chunk-size", default=DEFAULT_CHUNK_SIZE, show_default=True, type=click.IntRange(min=1),
              help="Objects per list request (paged with continue tokens, as kubectl does).")
@collector.paused()  # see kubeaccess/collector.py
def audit(scope: tuple[str, ...], paths: tuple[str, ...], namespace: str | None, all_namespaces: bool, fmt: str,
          selector: Selector | None, no_headers: bool, colour: str, fail_on: str, gpu_shared_label: str,
          kubeconfig: str | None, context: str | None, chunk_size: int) -> None:
    """Find mixed GPU resources in nodes, quotas, pods, workloads and ResourceQuotas.

    KIND is all (the default) or kinds joined by commas: nodes, quotas, pods, workloads,
    resourcequotas, or kubectl's names for them: node|no, pod|po, eq|elasticquota|quota (an
    ElasticQuota), workload, resourcequota; singular or plural.

    Without -f it audits the live cluster: like kubectl, the context's namespace unless -n or -A.
    The table lists errors first and ends with the counts and the exit status they give.
    """
    if namespace and all_namespaces:
        raise CommandError("-n/--namespace and -A/--all-namespaces are mutually exclusive")
    if paths and (kubeconfig or context):
        raise CommandError(hints.FILES_OR_CLUSTER())
    origins: dict[int, str] = {}
    if not paths:
        from kubeaccess.kube import context_namespace

        namespace = None if all_namespaces else namespace or context_namespace(kubeconfig, context)
        # Scoped lists, except nodes and ElasticQuotas (kubeaccess.kube.AUDIT_KINDS): a quota's
        # tree spans namespaces.
        objects = _live_objects(kubeconfig, context, namespace, chunk_size)
    else:
        # "No findings." would read as a clean bill of health for files that hold nothing.
        objects = readable_objects(paths, nothing_to="audit", origins=origins)
    # -n and -l choose what is shown; everything read is judged (a quota's parents live elsewhere).
    report = audit_objects(objects, scope, shared_label=gpu_shared_label, namespace=namespace or None,
                           selector=selector, origin=lambda obj: origins.get(id(obj)))
    report.findings[:] = [_with_status(finding) for finding in report.findings]
    failing = fail_on != "none" and (worst := report.worst()) is not None and worst >= Severity[fail_on.upper()]
    exit_code = exit_status(1 if failing else 0)
    if fmt == "policyreport":
        _echo_policy_reports(report)
    elif fmt in ("json", "yaml"):
        click.echo(document(report.as_dict(), fmt, plain=True))  # findings hold only str, int, lists, dicts
    else:
        findings = by_severity(report.findings)
        if fmt == "name":
            for line in dict.fromkeys(output.object_name(f.kind, f.name) for f in findings):
                click.echo(line)
        elif findings:
            coloured = output.use_colour(colour)
            width = shutil.get_terminal_size().columns if output.on_terminal() else None
            click.echo(render_findings(findings, wide=fmt == "wide", coloured=coloured, width=width,
                                       headers=not no_headers), color=coloured)
            if not no_headers:
                click.echo(summary_line(findings, fail_on, exit_code, coloured, width), color=coloured)
        elif not no_headers:
            click.echo(f"No findings{f' on objects matching {selector}' if selector is not None else ''}.")
    raise SystemExit(exit_code)


def _with_status(finding: Finding) -> Finding:
    """A quota refusal's finding with the HTTP status the webhook would answer it with: the core
    names the reason; which status carries it is the webhook's table (webhook.admission.status)."""
    if finding.check != "pod-quota-refused" or "reason" not in finding.details:
        return finding
    return replace(finding, details={**finding.details, "code": status_of(str(finding.details["reason"]))})


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
        raise cluster_error(error) from None
    if show_progress:
        click.echo("\r\033[K", err=True, nl=False)
    return objects


SEVERITY_COLOURS = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
COLUMNS = ("SEVERITY", "KIND", "NAMESPACE", "NAME", "CHECK", "MESSAGE")
# On a terminal the message is wrapped to the room left of the width; below this much room the
# default table leaves CHECK out (-o wide and JSON keep it), and then puts the message under the row.
MIN_MESSAGE_WIDTH = 40
MESSAGE_INDENT = "    "
GAP = "   "  # kubectl's printer: three spaces between columns


def by_severity(findings: Sequence[Finding]) -> list[Finding]:
    """Errors first; within a severity the report's order (kind, namespace, name, check)."""
    return sorted(findings, key=lambda finding: -finding.severity)


def render_findings(findings: Sequence[Finding], *, wide: bool, coloured: bool, width: int | None,
                    headers: bool = True) -> str:
    """The findings as a table with the message last. ``width``: a terminal's, to wrap the message in
    (at spaces, never inside a word that fits); None when piped: one line per finding, nothing cut."""
    rows = [{"SEVERITY": str(f.severity), "KIND": f.kind, "NAMESPACE": f.namespace or "-", "NAME": _one_line(f.name),
             "CHECK": f.check, "MESSAGE": _one_line(f.message)} for f in findings]
    layouts = [COLUMNS] if wide else [COLUMNS, tuple(c for c in COLUMNS if c != "CHECK")]
    columns, room = layouts[0], None
    for columns in layouts:
        fixed = columns[:-1]
        widths = [max(len(c), *(len(row[c]) for row in rows)) for c in fixed]
        if width is None:
            break
        room = width - sum(widths) - len(GAP) * len(fixed)
        if room >= MIN_MESSAGE_WIDTH:
            break
    below = room is not None and room < MIN_MESSAGE_WIDTH  # the message goes on lines of its own

    def line(cells: Sequence[str], severity: Severity | None) -> str:
        padded = [cell.ljust(w) for cell, w in zip(cells, widths, strict=False)]
        if severity is not None and coloured:
            padded[0] = click.style(cells[0], fg=SEVERITY_COLOURS[severity],
                                    bold=severity is Severity.ERROR) + " " * (widths[0] - len(cells[0]))
        return GAP.join([*padded, *cells[len(widths):]]).rstrip()

    lines = [line(fixed if below else columns, None)] if headers else []
    for finding, row in zip(findings, rows, strict=True):
        cells = [row[c] for c in fixed]
        if room is None:
            lines.append(line([*cells, row["MESSAGE"]], finding.severity))
        elif below:
            assert width is not None
            lines.append(line(cells, finding.severity))
            lines.extend(MESSAGE_INDENT + part for part in _wrap(row["MESSAGE"], width - len(MESSAGE_INDENT)))
        else:
            parts = _wrap(row["MESSAGE"], room)
            lines.append(line([*cells, parts[0]], finding.severity))
            blank = [""] * len(cells)
            lines.extend(line([*blank, part], None) for part in parts[1:])
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """A line break in what a manifest wrote (a container's name quoted in a message) would split a
    finding over two lines of the table: it is shown as a space."""
    return " ".join(text.splitlines()) if "\n" in text or "\r" in text else text


def _wrap(message: str, width: int) -> list[str]:
    # Not at hyphens: gpu-memory-ratio stays whole. A word longer than the whole room is split.
    return textwrap.wrap(message, max(width, 1), break_on_hyphens=False) or [""]


def summary_line(findings: Sequence[Finding], fail_on: str, exit_code: int, coloured: bool,
                 width: int | None = None) -> str:
    """``6 findings: 1 error, 5 warnings, 0 info; exit status 1 (--fail-on error)``, in two lines
    where ``width`` is narrower than that."""
    counts = []
    for severity in sorted(Severity, reverse=True):
        count = sum(1 for f in findings if f.severity is severity)
        noun = str(severity) if severity is Severity.INFO or count == 1 else f"{severity}s"
        text = f"{count} {noun}"
        counts.append(click.style(text, fg=SEVERITY_COLOURS[severity]) if coloured and count else text)
    total = f"{len(findings)} finding{'' if len(findings) == 1 else 's'}"
    why = "input left out" if exit_code == SKIPPED_EXIT else f"--fail-on {fail_on}"
    exit_status = f"exit status {exit_code} ({why})"
    plain_length = len(f"{total}: ; {exit_status}") + len(", ".join(click.unstyle(c) for c in counts))
    separator = "\n" if width is not None and plain_length > width else " "
    return f"{total}: {', '.join(counts)};{separator}{exit_status}"
