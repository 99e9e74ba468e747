"""``gpuquota convert``: the webhook's rewrite, offline, on manifest files."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import click
import yaml

from gpuquota_core.audit import Severity
from gpuquota_core.conversion import ConversionConfig
from gpuquota_core.convert import ConvertedObject, convert_object, unconverted
from gpuquota_core.placement import NodeView, RewritePolicy
from gpuquota_core.podspec import PodShapeError
from gpuquota_core.quantity import QuantityError
from gpuquota_core.unjudged import why_unjudged
from kubeaccess import collector
from kubeaccess.conversion_config import ConfigFileError, load_conversion_config
from kubeaccess.manifests import ManifestSource, parse_documents, split_documents

from . import hints
from .errors import CommandError, input_names
from .inputs import readable_manifests

UNSCHEDULABLE_EXIT = 1
# Read to decide as the webhook does (which nodes a pod can reach; the quotas it counts against),
# never written out: `convert -f pods.yaml -f nodes.yaml > deploy.yaml` must not put Nodes in a manifest.
CONTEXT_KINDS = ("ElasticQuota", "Node")


@click.command()
@click.option("-f", "--filename", "paths", multiple=True, required=True,
              help="File, directory or - (stdin): Pods and workloads (Deployment, Job, CronJob, ...).")
@click.option("-o", "--output", type=click.Choice(["yaml", "json", "patch"]), default="yaml", show_default=True,
              help="The rewritten objects, or the RFC 6902 patch of each.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML conversion table; the built-in defaults without it.")
@collector.paused()  # see kubeaccess/collector.py
def convert(paths: tuple[str, ...], output: str, config_path: Path | None) -> None:
    """Print manifests with GPU requests in the canonical form the webhook stores.

    With Node objects among the input, a pod (or template) is rewritten only where the webhook
    would: when a node it can be scheduled on advertises the canonical names (``rewrite: auto``).
    YAML output keeps the input's comments, key order, flow style and quoting: only the rewritten
    resources and the original-resources annotation change. What was rewritten, or left and why,
    goes to stderr, and so does any object that could not be converted (left as written, with its
    file). Exit 1 when a result would still be refused by /validate-pods (the reason is printed) or an
    object could not be converted, 2 on bad flags or files, or when the input holds no object.
    """
    try:
        config: ConversionConfig = load_conversion_config(config_path)
    except ConfigFileError as error:
        raise CommandError(str(error)) from None
    read = readable_manifests(paths, nothing_to="convert")
    nodes = NodeView.from_objects(read.objects)
    sources, context = _without_context(read.sources)
    if context:
        counts = Counter(obj.get("kind") for obj in context)
        read_as = ", ".join(f"{count} {kind}{'' if count == 1 else 's'}" for kind, count in sorted(counts.items()))
        click.echo(f"note: {read_as} read to decide as the webhook does, not written out", err=True)
    if not sources:
        raise CommandError(f"nothing to convert in {input_names(paths)}: it holds only "
                           f"{' and '.join(f'{kind}s' for kind in CONTEXT_KINDS)}, which are read as context")
    converted: list[ConvertedObject] = []
    # What could not be converted, with its file: said on stderr, left as written in the output; one
    # such object never stops the others.
    not_converted: list[tuple[str, ConvertedObject, Severity]] = []
    for source in sources:
        for obj in source.objects:
            unjudged = why_unjudged(obj)
            if unjudged is not None:
                reason, severity = (unjudged.reason if unjudged.severity is Severity.WARNING
                                    else unjudged.describe()), unjudged.severity
            else:
                try:
                    converted.append(convert_object(obj, config, nodes))
                    continue
                except (PodShapeError, QuantityError) as error:
                    reason, severity = str(error), Severity.ERROR
            item = unconverted(obj, reason)
            converted.append(item)
            not_converted.append((source.source, item, severity))
    for file, item, _ in not_converted:
        click.echo(f"{file}: {item.ref}: not converted: {item.skipped}", err=True)
    if nodes is None and config.rewrite is RewritePolicy.AUTO and any(item.summary for item in converted):
        click.echo(hints.NO_NODES["convert"](), err=True)
    for item in converted:
        for line in item.summary:
            click.echo(f"{item.ref}: rewrote {line}", err=True)
        for note in item.notes:
            click.echo(f"{item.ref}: {note}", err=True)
    text, layout_notes = _render(sources, converted, output)
    for note in layout_notes:
        click.echo(note, err=True)
    click.echo(text, nl=False)
    refused = [item for item in converted if item.problems]
    for item in refused:
        reasons = "; ".join(problem.message for problem in item.problems)
        click.echo(f"{item.ref}: would be refused by /validate-pods: {reasons}", err=True)
    if refused or any(severity is Severity.ERROR for _, _, severity in not_converted):
        sys.exit(UNSCHEDULABLE_EXIT)


def _without_context(sources: list[ManifestSource]) -> tuple[list[ManifestSource], list[dict[str, Any]]]:
    """The sources with the context objects taken out of their text and objects, and those objects.

    A document of context objects only is dropped whole; a ``kind: List`` that mixes them with
    objects to convert is written back as plain YAML of the others.
    """
    written: list[ManifestSource] = []
    context: list[dict[str, Any]] = []
    for source in sources:
        if not any(_is_context(obj) for obj in source.objects):
            written.append(source)
            continue
        context += [obj for obj in source.objects if _is_context(obj)]
        if all(_is_context(obj) for obj in source.objects):
            continue
        chunks: list[str] = []
        objects: list[dict[str, Any]] = []
        for chunk in split_documents(source.text):
            chunk_objects = parse_documents(chunk, source.source)
            kept = [obj for obj in chunk_objects if not _is_context(obj)]
            if kept and len(kept) < len(chunk_objects):
                chunk = yaml.safe_dump_all(kept, sort_keys=False)
            if kept:
                chunks.append(chunk)
                objects += kept
        written.append(ManifestSource(source.source, "".join(chunks), objects))
    return written, context


def _is_context(obj: dict[str, Any]) -> bool:
    return obj.get("kind") in CONTEXT_KINDS


def _ref(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return f"{obj.get('kind', '?')}/{(metadata or {}).get('name', '?')}"


def _render(sources: list[ManifestSource], converted: list[ConvertedObject], output: str) -> tuple[str, list[str]]:
    if output == "patch":
        patches = [{"kind": c.kind, "namespace": c.namespace, "name": c.name, "patch": c.patch} for c in converted]
        return json.dumps(patches[0] if len(patches) == 1 else patches, indent=2) + "\n", []
    objects = [c.obj for c in converted]
    if output == "json":
        document: Any = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        return json.dumps(document, indent=2) + "\n", []
    # The core's patches applied to the input's own text: comments and layout stay (a module of
    # its own, and ruamel.yaml imported only here, so other commands start without them).
    from kubeaccess.roundtrip import render_yaml

    return render_yaml(sources, [c.patch for c in converted], objects)
