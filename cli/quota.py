"""``gpuquota quota``: the ElasticQuota tree with what each quota uses, reserves and has left.

The numbers come from :mod:`gpuquota_core.quota_view`, built on the webhook's own usage index;
this module loads and renders them (bars and colour on a terminal, plain text when piped).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from fractions import Fraction
from typing import NoReturn

import click

from gpuquota_core.quantity import Quantity
from gpuquota_core.quota_view import (
    FAMILY_KOORDINATOR,
    FAMILY_MIXED,
    FAMILY_VENDOR,
    ResourceView,
    TreeView,
    build_view,
    pod_groups_of,
    with_cards,
)
from gpuquota_core.resources import ResourceList
from gpuquota_core.selector import Selector

from . import output, snapshot
from .errors import CommandError
from .options import colour_option, no_headers_option, selector_option
from .output import FORMATS, document, table

STATE_COLOURS = {"ok": "green", "near-full": "yellow", "full": "red", "over": "red"}
BAR_MIN, BAR_MAX = 5, 20
INDENT = "  "
BROKEN_TREE_EXIT = 1


def short(resource: str) -> str:
    return resource.removeprefix("koordinator.sh/")


@click.command()
@click.argument("name", required=False)
@click.option("-f", "--filename", "paths", multiple=True, help="File, directory or - (stdin) holding the cluster.")
@click.option("--kubeconfig", default=None, help="Kubeconfig of the live cluster (default: $KUBECONFIG, "
              "~/.kube/config, in-cluster).")
@click.option("--context", default=None, help="Kubeconfig context to use.")
@click.option("-n", "--namespace", default=None,
              help="Only quotas in this namespace or bound to it (with their ancestors).")
@click.option("-A", "--all-namespaces", is_flag=True, help="Every quota (the default offline).")
@click.option("-o", "--output", "fmt", default="table", type=click.Choice(FORMATS))
@selector_option("quotas whose labels it selects, with their ancestors")
@no_headers_option("Table output without the header lines.")
@click.option("--pods", "with_pods", is_flag=True, help="Also list the pods charged to each quota, largest first.")
@colour_option("Usage bars and colour")
def quota(name: str | None, paths: tuple[str, ...], kubeconfig: str | None, context: str | None,
          namespace: str | None, all_namespaces: bool, fmt: str, selector: Selector | None, no_headers: bool,
          with_pods: bool, colour: str) -> None:
    """Show the ElasticQuota tree with each quota's GPU usage, in canonical units.

    Per quota and limited GPU resource: min, max (or the admission annotation), used (split by the
    family the pods wrote: vendor nvidia.com/gpu-style or koordinator.sh/gpu-* shares), reserved but
    not yet seen (live, strict accounting), free, and which quota of the chain binds first.
    Without -f it reads the live cluster: like kubectl, the context's namespace unless -n or -A.
    """
    if namespace and all_namespaces:
        raise CommandError("-n/--namespace and -A/--all-namespaces are mutually exclusive")
    state = snapshot.load(paths, kubeconfig, context, nothing_to="show")
    if state.live and not namespace and not all_namespaces and name is None:
        from kubeaccess.kube import context_namespace

        namespace = context_namespace(kubeconfig, context)
    # The built-in conversion table, as the webhook's quota service charges stored pods and reads
    # quota limits with it (its --config governs the rewrite of new pods, not the accounting).
    tree = state.readable_tree()
    if name is not None and name not in tree.quotas:
        raise CommandError(f"no ElasticQuota named {name!r}")
    view = build_view(tree, state.of_kind("Pod"), reservations=state.reservations,
                      ledger_trees=state.ledger_trees, now=time.time(), problems=state.tree_problems,
                      pod_groups=pod_groups_of(state.objects))
    labelled = None if selector is None else {
        str((obj.get("metadata") or {}).get("name")) for obj in state.of_kind("ElasticQuota")
        if selector.matches_object(obj)}
    if fmt == "name":  # what was asked for, without the ancestors the table shows around it
        asked = view.select(name, namespace, labelled, with_ancestors=False)
        for quota_view in asked.quotas:
            click.echo(output.object_name("ElasticQuota", quota_view.quota.name))
        _end(asked)
    view = view.select(name, namespace, labelled)
    if fmt in ("json", "yaml"):
        data = view.as_dict(with_pods)
        data["source"] = "live" if state.live else "files"
        data["notes"] = [*data["notes"], *state.notes]
        click.echo(document(data, fmt, plain=True))
        _end(view)
    if not view.quotas:
        if not no_headers:
            click.echo(f"No ElasticQuotas{f' in namespace {namespace}' if namespace else ''}"
                       f"{f' matching {selector}' if selector is not None else ''}.")
        _say_notes(view, state)  # why there is nothing, where a file held an AdmissionReview
        _end(view)
    coloured = output.use_colour(colour)
    # Only a terminal's width is fitted to: piped (`--color always | less -R`) nothing is cut.
    width = shutil.get_terminal_size().columns if output.on_terminal() else None
    text = render_table(view, wide=fmt == "wide", coloured=coloured, width=width)
    click.echo(_without_header(text) if no_headers else text, color=coloured)
    if with_pods and not no_headers:
        click.echo("")
        click.echo(render_pods(view))
    elif with_pods and any(quota_view.pods for quota_view in view.quotas):
        click.echo(_without_header(render_pods(view)))
    if view.gangs:  # gang reservations and members, under the quotas shown (docs/cli.md)
        click.echo(_without_header(render_gangs(view)) if no_headers else "\n" + render_gangs(view))
    _say_notes(view, state)
    _end(view)


def _say_notes(view: TreeView, state: snapshot.Snapshot) -> None:
    for note in [*view.notes, *state.notes, *(f"unreadable pod not counted: {p}" for p in view.unreadable_pods)]:
        click.echo(f"note: {note}", err=True)
    for message in view.problem_messages():
        click.echo(f"error: {message}", err=True)


def _end(view: TreeView) -> NoReturn:
    """Exit 1 where the quotas shown do not form a tree (the audit's errors for them), else 0."""
    raise SystemExit(BROKEN_TREE_EXIT if view.broken else 0)


def _without_header(text: str) -> str:
    return text.split("\n", 1)[1] if "\n" in text else ""


def _amount(resource: str, quantity: Quantity | None, cards: bool) -> str:
    if quantity is None:
        return "-"
    return with_cards(resource, quantity) if cards and not quantity.is_zero() else str(quantity)


def _percent(row: ResourceView) -> str:
    if row.limit is None:
        return ""
    if row.limit.amount == 0:
        return "100%" if row.taken.amount > 0 else "0%"
    return f"{int(row.taken.amount * 100 / row.limit.amount)}%"


DEFAULT_COLUMNS = ("QUOTA", "RESOURCE", "MIN", "MAX", "USED", "VENDOR", "SHARE", "RESERVED", "FREE", "BINDS-FIRST",
                   "USE")
WIDE_COLUMNS = ("QUOTA", "NAMESPACE", "RESOURCE", "MIN", "MAX", "USED", "VENDOR", "SHARE", "RESERVED", "FREE",
                "BINDS-FIRST", "CHAIN-FREE", "LIMIT-FROM", "MIXED", "USE")
# What a terminal too narrow for the default table keeps: the limit, the use, the room, who binds.
NARROW_COLUMNS = ("QUOTA", "RESOURCE", "MAX", "USED", "FREE", "BINDS-FIRST", "USE")


def _rows(view: TreeView, columns: Sequence[str], cards: bool,
          every: bool) -> tuple[list[str], list[list[str]], list[ResourceView | None]]:
    """``cards``: counts beside MAX, USED, FREE and CHAIN-FREE; ``every``: beside every figure."""
    rows: list[list[str]] = []
    resources: list[ResourceView | None] = []
    for quota_view in view.quotas:
        label = INDENT * quota_view.depth + quota_view.quota.name
        if quota_view.broken:
            label += f" (broken: {quota_view.broken_because})"
        if not quota_view.resources:
            rows.append([label if column == "QUOTA" else "" for column in columns])
            resources.append(None)
            continue
        for index, row in enumerate(quota_view.resources):
            name = row.resource
            cells = {
                "QUOTA": label if index == 0 else "",
                "NAMESPACE": quota_view.quota.namespace if index == 0 else "",
                "RESOURCE": short(name),
                "MIN": _amount(name, row.min, every),
                "MAX": _amount(name, row.limit, cards),
                "USED": _amount(name, row.used, cards),
                "VENDOR": _amount(name, row.used_by_family.get(FAMILY_VENDOR), every),
                "SHARE": _amount(name, row.used_by_family.get(FAMILY_KOORDINATOR), every),
                "MIXED": _amount(name, row.used_by_family.get(FAMILY_MIXED), every),
                "RESERVED": _amount(name, row.reserved, every),
                "FREE": _amount(name, row.free, cards),
                "BINDS-FIRST": row.binds_first or "-",
                "CHAIN-FREE": _amount(name, row.chain_free, cards),
                "LIMIT-FROM": quota_view.limit_source,
                "USE": _percent(row),
            }
            rows.append([cells[column] for column in columns])
            resources.append(row)
    return list(columns), rows, resources


def _width(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def render_table(view: TreeView, *, wide: bool, coloured: bool, width: int | None) -> str:
    """The tree as a table; ``coloured``: with usage bars; ``width``: a terminal's, to fit to (None:
    piped, nothing is cut).

    Piped, every column with its card counts. On a terminal the first layout that leaves room for
    a short bar: as piped; without card counts (the canonical figures stay); the narrow columns.
    """
    layouts: list[tuple[Sequence[str], bool, bool]]
    if wide:
        layouts = [(WIDE_COLUMNS, True, True), (WIDE_COLUMNS, False, False)]
    else:
        layouts = [(DEFAULT_COLUMNS, True, False), (DEFAULT_COLUMNS, False, False), (NARROW_COLUMNS, False, False)]
    if not coloured or width is None:
        layouts = layouts[:1]
    for columns, cards, every in layouts:
        headers, rows, resources = _rows(view, columns, cards, every)
        text = table(headers, rows)
        if width is None or _width(text) + BAR_MIN + 1 <= width:
            break
    if not coloured:
        return text
    lines = text.splitlines()
    # The USE column is last: its cell is replaced by a bar and the figure, both coloured.
    start = lines[0].rindex("USE")
    bar = BAR_MAX if width is None else max(0, min(BAR_MAX, width - start - len(" 100%") - 1))
    out = [lines[0]]
    for line, row in zip(lines[1:], resources, strict=True):
        prefix = line[:start].ljust(start)
        if row is None or row.limit is None:
            out.append(line.rstrip())
            continue
        out.append(prefix + _bar(row, bar))
    return "\n".join(out)


def _bar(row: ResourceView, width: int) -> str:
    colour = STATE_COLOURS.get(row.state, "")
    figure = _percent(row) + (" OVER" if row.state == "over" else "")
    if width < BAR_MIN:
        return click.style(figure, fg=colour, bold=row.state == "over")
    assert row.limit is not None
    share = Fraction(1) if row.limit.amount == 0 else min(Fraction(1), row.taken.amount / row.limit.amount)
    filled = int(share * width)
    return click.style("█" * filled + "░" * (width - filled) + " " + figure, fg=colour, bold=row.state == "over")


def render_pods(view: TreeView) -> str:
    names = sorted({name for quota_view in view.quotas for pod in quota_view.pods for name in pod.requests})
    headers: Sequence[str] = ["QUOTA", "POD", "FAMILY", *(short(n).upper() for n in names)]
    rows = [[quota_view.quota.name, f"{pod.namespace}/{pod.name}", pod.family or "-",
             *(with_cards(n, pod.requests[n]) if n in pod.requests else "-" for n in names)]
            for quota_view in view.quotas for pod in quota_view.pods]
    return table(headers, rows) if rows else "No pods are charged to these quotas."


def _resources(resources: ResourceList | None) -> str:
    if resources is None:
        return "-"
    return ",".join(f"{short(name)}={resources[name]}" for name in sorted(resources)) or "0"


def render_gangs(view: TreeView) -> str:
    """The gangs with a member stored or a live reservation, under the quotas shown."""
    rows = [[gang.gang, gang.quota, str(gang.min_members), str(gang.stored), _resources(gang.need),
             _resources(gang.rest), _resources(gang.reserved), gang.state] for gang in view.gangs]
    return table(["GANG", "QUOTA", "MIN", "STORED", "NEED", "REST", "RESERVED", "STATE"], rows)
