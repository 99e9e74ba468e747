"""Rewrite a pod's GPU requests into the canonical form, recording what the user asked for.

The rewrite works on the raw JSON of the pod so that everything it does not own (other resources,
their original spelling, unknown fields) passes through byte-for-byte. Running it on its own output
changes nothing, which is what makes the webhook safe under ``reinvocationPolicy: IfNeeded``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .conversion import DEFAULT_CONFIG, ConversionConfig, Strategy, memory_bytes_to_ratio, pinned_gpu_model
from .jsonpatch import copy_json
from .memo import BoundedMemo
from .podspec import (
    CONTAINER_KINDS,
    PodShapeError,
    as_list,
    as_mapping,
    parse_resource_list,
    pod_requests,
    read_containers,
)
from .quantity import Quantity
from .reading import in_range, read_list
from .resources import (
    DEPRECATED_RENAMES,
    GPU_MEMORY,
    GPU_MEMORY_RATIO,
    GPU_SHARED,
    VENDOR_WHOLE_GPU_NAMES,
    ResourceList,
)
from .validation import describe, pod_gpu_schedulable, validate_pod_gpu

ORIGINAL_RESOURCES_ANNOTATION = "gpuquota.koord-gpuquota.io/original-resources"
RESOURCE_FIELDS: tuple[str, ...] = ("requests", "limits")


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One resource of one container that was rewritten, for warnings, metrics and audits."""

    container: str  # 'container "trainer"'
    field: str  # "requests" or "limits"
    source: str
    source_quantity: str
    outputs: Mapping[str, str]
    kind: str  # "convert", "rename", "memory-to-ratio"

    def describe(self) -> str:
        outputs = ", ".join(f"{name}: {value}" for name, value in sorted(self.outputs.items()))
        return f"{self.container} {self.field}: {self.source}: {self.source_quantity} -> {outputs}"


@dataclass(slots=True)
class CanonicalResult:
    """The rewritten object (a copy) and what changed; ``changed`` is False for canonical input."""

    obj: dict[str, Any]
    rewrites: list[Rewrite] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # things left alone on purpose, with the reason

    @property
    def changed(self) -> bool:
        return bool(self.rewrites)

    def summary(self) -> list[str]:
        """One line per container and resource (requests and limits change together), for warnings."""
        lines: list[str] = []
        for rewrite in self.rewrites:
            line = rewrite.describe().replace(f" {rewrite.field}:", "", 1)
            if line not in lines:
                lines.append(line)
        return lines


# It runs for every converted resource of every pod the cache or an audit reads, on the same few
# counts ("100", "200"); it is a pure function of an int, so remember it.
@lru_cache(maxsize=1024)
def _format_count(amount: int) -> str:
    return str(Quantity.of(amount))


ListRewrite = tuple[dict[str, Any], list[tuple[str, str, dict[str, str], str]], list[str]]


class ConfigIdentity:
    """A cache key for a config by identity (configs hold dicts, so they do not hash by value).

    The cache keeps the key, and the key keeps the config alive, so its id is never reused for
    another config while the entry exists.
    """

    __slots__ = ("config",)

    def __init__(self, config: ConversionConfig) -> None:
        self.config = config

    def __hash__(self) -> int:
        return id(self.config)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigIdentity) and other.config is self.config


def values_key(values: object) -> object:
    """A resource map as a key: each value with its type (1, 1.0 and True differ as quantities)."""
    if values is None:
        return None
    if type(values) is not dict:
        raise TypeError("not plain JSON")
    # The pairs and, beside them, the values' types: the same information as a (name, type, value)
    # triple per entry, built by C loops instead of a generator (this runs for every container of
    # every pod an audit reads, twice, so the cost of these keys shows in a large audit's time).
    return tuple(values.items()), tuple(map(type, values.values()))


# ConfigIdentity hashes and compares by the config's identity, so one instance per config serves
# every key; building a new one per pod cost more than the rest of a cache hit.
_last_identity: ConfigIdentity | None = None


def pinned_model_key(spec: Mapping[str, Any], config: ConversionConfig) -> str | None:
    """The GPU model ``spec`` pins, as a memo key reads it."""
    # Most pods pin no GPU model; without either field pinned_gpu_model has nothing to read.
    if "nodeSelector" not in spec and "affinity" not in spec:
        return None
    return pinned_gpu_model(spec, config.model_label)


def config_identity(config: ConversionConfig) -> ConfigIdentity:
    global _last_identity
    identity = _last_identity
    if identity is None or identity.config is not config:
        identity = _last_identity = ConfigIdentity(config)
    return identity


def canonicalize_resource_list(
    raw: Mapping[str, Any],
    path: str,
    config: ConversionConfig,
    pinned_model: str | None,
) -> ListRewrite:
    """Rewrite one ``requests`` or ``limits`` map; see :func:`_rewrite_resource_list`.

    The answer depends only on the arguments, and a cluster's pods repeat a few resource maps
    (every replica of a workload asks alike), while the quota cache and the audit rewrite every pod
    they read, so answers are remembered. The key holds each value with its type (``1``, ``1.0``
    and ``True`` are equal in Python but not as quantities); maps with unhashable values, and maps
    that fail to parse (exceptions are not cached), take the uncached path. Callers get copies,
    so nothing they change can alter a remembered answer.
    """
    try:
        key = (tuple((name, type(value), value) for name, value in raw.items()), path,
               ConfigIdentity(config), pinned_model)
        hash(key)
    except TypeError:
        return _rewrite_resource_list(raw, path, config, pinned_model)
    result, changes, notes = _remembered_rewrite(key, raw, path, config, pinned_model)
    return dict(result), [(s, q, dict(o), k) for s, q, o, k in changes], list(notes)


_rewrites: BoundedMemo[ListRewrite] = BoundedMemo()


def _remembered_rewrite(key: object, raw: Mapping[str, Any], path: str, config: ConversionConfig,
                        pinned_model: str | None) -> ListRewrite:
    cached = _rewrites.get(key)
    if cached is None:
        cached = _rewrites.remember(key, _rewrite_resource_list(raw, path, config, pinned_model))
    return cached


def _rewrite_resource_list(
    raw: Mapping[str, Any],
    path: str,
    config: ConversionConfig,
    pinned_model: str | None,
) -> ListRewrite:
    """Rewrite one ``requests`` or ``limits`` map; returns (new map, [(source, qty, outputs, kind)], notes).

    The map is read by :func:`reading.read_list`. Whatever cannot be converted without changing
    what the pod asks for (negative or fractional counts, spellings that disagree, two vendors,
    readings past the range bound) is left as it is, with a note: validation then refuses it with
    the user's own spelling. Zeros ask for nothing and stay as written.
    """
    parsed: ResourceList = parse_resource_list(raw, path)
    result: dict[str, Any] = dict(raw)
    values: ResourceList = dict(parsed)
    changes: list[tuple[str, str, dict[str, str], str]] = []
    notes: list[str] = []

    # Names whose deprecated twin is also present: converting them would let the next pass rename
    # the twin into their place and convert again, so both stay for validation to refuse.
    blocked: set[str] = set()
    if config.rename_deprecated:
        for old, new in DEPRECATED_RENAMES.items():
            if old not in values:
                continue
            if new in values:
                notes.append(f"{path}: both {old} and {new} are set; both left as is")
                blocked.add(new)
                continue
            result[new] = result.pop(old)
            values[new] = values.pop(old)
            changes.append((old, str(parsed[old]), {new: str(parsed[old])}, "rename"))

    reading = read_list(values, config, blocked)
    notes.extend(f"{path}[{name}]: {why}" for name, why in reading.skipped)
    if reading.inputs and len(reading.vendors) > 1:
        # Different hardware: one pool of "cards" would let the scheduler place either kind.
        notes.append(f"{path}: {' and '.join(reading.vendors)} are different hardware; left as is for "
                     f"validation to refuse")
        return result, changes, notes
    if reading.disagreements:
        # Summing them would hand the pod more than either reading; keeping one would drop the other.
        notes.append(f"{path}: {reading.disagreements[0].describe()}; left as is for validation to refuse")
        return result, changes, notes
    written: set[str] = set()
    for output, amount in reading.agreed.items():
        if output in values and values[output].amount == amount:
            continue  # already says so, in the user's own spelling
        values[output] = Quantity.of(amount)
        result[output] = _format_count(amount)
        written.add(output)
    for spelling in reading.inputs:
        rule = config.rule_for(spelling.name)
        assert rule is not None
        if rule.strategy is Strategy.REPLACE:
            del values[spelling.name]
            del result[spelling.name]
        elif not written & set(spelling.reads):
            continue  # a retained input whose outputs are already there: nothing new
        changes.append((spelling.name, str(spelling.quantity),
                        {output: _format_count(math.ceil(amount)) for output, amount in spelling.reads.items()},
                        "convert"))

    card_bytes = config.gpu_memory_by_model.get(pinned_model) if pinned_model else None
    if (GPU_MEMORY in values and GPU_MEMORY_RATIO not in values and GPU_MEMORY not in blocked and card_bytes
            and values[GPU_MEMORY].amount > 0):
        memory = values[GPU_MEMORY]
        shared = values[GPU_SHARED].ceil() if GPU_SHARED in values else 1
        ratio = memory_bytes_to_ratio(memory.ceil(), card_bytes, shared)
        if in_range(ratio):
            del result[GPU_MEMORY]
            result[GPU_MEMORY_RATIO] = _format_count(ratio)
            changes.append((GPU_MEMORY, str(memory), {GPU_MEMORY_RATIO: _format_count(ratio)}, "memory-to-ratio"))
        else:
            notes.append(f"{path}[{GPU_MEMORY}]: {memory} is too large to convert; left as is")
    return result, changes, notes


def _container_label(kind: str, entry: Mapping[str, Any], index: int) -> tuple[str, str]:
    """(name, label) exactly as :mod:`podspec` names the container, so messages agree."""
    raw_name = entry.get("name")
    name = raw_name if isinstance(raw_name, str) and raw_name else f"#{index}"
    return name, f'{"init container" if kind == "initContainers" else "container"} "{name}"'


def canonicalize_pod_spec(spec: object, config: ConversionConfig = DEFAULT_CONFIG,
                          path: str = "spec", *, whole_pod: bool = True,
                          ) -> tuple[dict[str, Any], list[Rewrite], list[str],
                                     dict[str, dict[str, dict[str, dict[str, Any]]]]]:
    """Rewrite every container of a pod spec; also returns the original values of what changed.

    The new spec is a shallow copy: containers that change are new objects, everything else is the
    input's own (callers that keep the result copy it, see :func:`canonicalize_pod`).

    ``whole_pod``: also judge the pod as a whole (:func:`_why_left_as_written`) and rewrite nothing
    when the rewrite would change what Koordinator does with it. The quota count reads every
    container in canonical units whatever the pod as a whole would be, and passes False.
    """
    spec = as_mapping(spec, path)
    new_spec = dict(spec)
    pinned = pinned_gpu_model(spec, config.model_label)
    rewrites: list[Rewrite] = []
    notes: list[str] = []
    originals: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for kind in CONTAINER_KINDS:
        entries = as_list(spec.get(kind), f"{path}.{kind}")
        new_entries: list[Any] = list(entries)
        for index, entry in enumerate(entries):
            where = f"{path}.{kind}[{index}]"
            container = as_mapping(entry, where)
            name, label = _container_label(kind, container, index)
            resources = dict(as_mapping(container.get("resources"), f"{where}.resources"))
            unequal = _requests_unlike_limits(resources, f"{where}.resources", config)
            if unequal is not None:
                notes.append(unequal)
                continue
            changed = False
            for field_name in RESOURCE_FIELDS:
                if field_name not in resources:
                    continue
                raw = as_mapping(resources[field_name], f"{where}.resources.{field_name}")
                rewritten, changes, found = canonicalize_resource_list(
                    raw, f"{where}.resources.{field_name}", config, pinned)
                notes.extend(found)
                if not changes:
                    continue
                resources[field_name] = rewritten
                changed = True
                for source, quantity, outputs, change_kind in changes:
                    rewrites.append(Rewrite(label, field_name, source, quantity, outputs, change_kind))
                    if source in raw:
                        # A renamed-then-converted name (kubernetes.io/gpu -> koordinator.sh/gpu ->
                        # gpu-core) is recorded once, under the spelling the user wrote. The value is
                        # the quantity's canonical text, as the apiserver hands it to the webhook:
                        # a manifest's 2, "2" and "2.0" are recorded alike.
                        originals.setdefault(kind, {}).setdefault(name, {}).setdefault(field_name, {}).setdefault(
                            source, quantity)
            if changed:
                new_entries[index] = {**container, "resources": resources}
        if any(new is not old for new, old in zip(new_entries, entries, strict=True)):
            new_spec[kind] = new_entries
    if rewrites and whole_pod:
        reason = _why_left_as_written(spec, new_spec, config, path)
        if reason is not None:
            return dict(spec), [], [*notes, reason], {}
    return new_spec, rewrites, notes, originals


def _requests_unlike_limits(resources: Mapping[str, Any], path: str, config: ConversionConfig) -> str | None:
    """Why a container whose requests and limits of a name the table converts differ is left as
    written, or None. Rewritten, each side would be converted on its own and validation would refuse
    koordinator.sh/gpu-core, a name the user never wrote; as written, it names theirs."""
    requests, limits = resources.get("requests"), resources.get("limits")
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        return None
    try:
        asked = parse_resource_list(requests, f"{path}.requests")
        capped = parse_resource_list(limits, f"{path}.limits")
    except PodShapeError:
        return None  # unreadable: the map's own rewrite says why
    for name in sorted(set(asked) & set(capped) & config.input_names):
        if asked[name] != capped[name]:
            return (f"{path}: {name} requests ({asked[name].as_written()}) and limits "
                    f"({capped[name].as_written()}) differ; left as is for validation to refuse")
    return None


def _why_left_as_written(spec: Mapping[str, Any], new_spec: Mapping[str, Any], config: ConversionConfig,
                         path: str) -> str | None:
    """Why the rewrite of the pod as a whole must not happen, or None.

    Two vendors' cards are different hardware: pooled into one canonical count, a pod Koordinator
    refuses would become one it places on either kind. And a pod Koordinator schedules as written
    must not become one it refuses once its own pod webhook has run (it adds ``gpu.shared`` to app
    containers only, so an init container asking for more cards than the app containers breaks the
    shared split: ``init: amd.com/gpu 3, app: amd.com/gpu 2``).
    """
    try:
        before, after = read_containers(spec, path), read_containers(new_spec, path)
        before_request, after_request = pod_requests(spec, before), pod_requests(new_spec, after)
    except PodShapeError:
        return None  # the rewrite itself read it; validation will say what is wrong
    vendors: dict[str, list[str]] = {}
    for container in before:
        for name, quantity in (*container.requests.items(), *container.limits.items()):
            if name in VENDOR_WHOLE_GPU_NAMES and not quantity.is_zero():
                labels = vendors.setdefault(name, [])
                if container.label not in labels:
                    labels.append(container.label)
    if len(vendors) > 1:
        asked = " and ".join(f"{name} ({', '.join(labels)})" for name, labels in sorted(vendors.items()))
        return f"{path}: the pod asks for {asked}: different hardware, not one pool of cards; left as written"
    if (pod_gpu_schedulable(before, before_request, config)
            and not pod_gpu_schedulable(after, after_request, config)):
        why = describe(validate_pod_gpu(after, after_request, config))
        return (f"{path}: left as written: Koordinator schedules the pod as written, but could not schedule it "
                f"rewritten ({why})")
    return None


def canonicalize_pod(pod: object, config: ConversionConfig = DEFAULT_CONFIG) -> CanonicalResult:
    """The pod with canonical GPU requests and the original-request annotation (a deep copy)."""
    view = canonical_view(pod, config)
    # copy_json, not copy.deepcopy: it has no recursion limit, and a pod may nest deeply.
    return CanonicalResult(copy_json(view.obj), view.rewrites, view.notes)


def canonical_view(pod: object, config: ConversionConfig = DEFAULT_CONFIG) -> CanonicalResult:
    """Like :func:`canonicalize_pod`, but ``obj`` shares every unchanged subtree with ``pod``.

    For readers that never modify the result: the webhook diffs it against the request (the
    diff skips shared subtrees by identity, so it walks only what the rewrite touched) and the
    quota check reads its requests. Copying the whole pod and diffing all of it (env vars included)
    would cost more than the rest of a ``/mutate-pods`` call (see docs/benchmarks.md, "Mechanisms
    kept"), while a rewrite touches only a few resource maps. Without rewrites ``obj`` is a shallow copy.
    """
    pod = as_mapping(pod, "pod")
    spec = as_mapping(pod.get("spec"), "spec")
    new_spec, rewrites, notes, originals = canonicalize_pod_spec(spec, config)
    if not rewrites:
        return CanonicalResult(dict(pod), [], notes)
    metadata = dict(as_mapping(pod.get("metadata"), "metadata"))
    annotations = dict(as_mapping(metadata.get("annotations"), "metadata.annotations"))
    annotations[ORIGINAL_RESOURCES_ANNOTATION] = _merge_originals(
        annotations.get(ORIGINAL_RESOURCES_ANNOTATION), originals)
    metadata["annotations"] = annotations
    return CanonicalResult({**pod, "spec": new_spec, "metadata": metadata}, rewrites, notes)


def _merge_originals(existing: object, originals: Mapping[str, Any]) -> str:
    """Keep what an earlier pass recorded: after reinvocation the annotation still shows the user's ask.

    The existing value is user-writable text: anything that is not the shape we write is replaced.
    """
    merged: dict[str, Any] = {}
    if isinstance(existing, str):
        try:
            loaded = json.loads(existing)
        except (ValueError, RecursionError):
            loaded = None
        if isinstance(loaded, dict):
            merged = loaded
    for kind, containers in originals.items():
        if not isinstance(merged.get(kind), dict):
            merged[kind] = {}
        for name, fields in containers.items():
            if not isinstance(merged[kind].get(name), dict):
                merged[kind][name] = {}
            for field_name, values in fields.items():
                if not isinstance(merged[kind][name].get(field_name), dict):
                    merged[kind][name][field_name] = {}
                slot = merged[kind][name][field_name]
                for resource, value in values.items():
                    slot.setdefault(resource, value)
    try:
        return json.dumps(merged, sort_keys=True, separators=(",", ":"))
    except RecursionError:
        # Defensive: json.loads and json.dumps hit the recursion limit at about the same depth
        # (measured), but if a value read back cannot be written, keep only what this pass knows
        # rather than fail the admission.
        return json.dumps(originals, sort_keys=True, separators=(",", ":"))


def original_resources(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the user asked for before the webhook rewrote the pod, if it did."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    raw = annotations.get(ORIGINAL_RESOURCES_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        loaded = json.loads(raw)
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None

