"""ElasticQuota objects as the core reads them: Koordinator's quota labels and well-known quota
names, parsing an ElasticQuota into a QuotaInfo, and its limits in canonical GPU units.

Koordinator compares resource names literally (pkg/scheduler/plugins/elasticquota/core/helper.go), so a quota written in
``nvidia.com/gpu`` never sees a pod asking for ``koordinator.sh/gpu-memory-ratio``. Here every
quota limit and every pod request is first converted with the same table the mutating webhook
uses, and only then compared.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .conversion import DEFAULT_CONFIG, ConversionConfig
from .podspec import PodShapeError, as_mapping, parse_resource_list
from .quantity import Quantity
from .resources import VENDOR_WHOLE_GPU_NAMES, GpuFamily, ResourceList, families_of

PREFIX = "quota.scheduling.koordinator.sh/"
POD_QUOTA_LABEL = PREFIX + "name"
PARENT_LABEL = PREFIX + "parent"
IS_PARENT_LABEL = PREFIX + "is-parent"
TREE_ID_LABEL = PREFIX + "tree-id"
NAMESPACES_ANNOTATION = PREFIX + "namespaces"
ADMISSION_ANNOTATION = PREFIX + "admission"

# The ElasticQuota API as Koordinator serves it; every module that names it imports these.
ELASTICQUOTA_GROUP = "scheduling.sigs.k8s.io"
ELASTICQUOTA_VERSION = "v1alpha1"
ELASTICQUOTA_PLURAL = "elasticquotas"
ELASTICQUOTA_API_VERSION = f"{ELASTICQUOTA_GROUP}/{ELASTICQUOTA_VERSION}"

ROOT_QUOTA = "koordinator-root-quota"
DEFAULT_QUOTA = "koordinator-default-quota"
SYSTEM_QUOTA = "koordinator-system-quota"
# Quotas Koordinator itself never checks at admission (pkg/webhook/pod/validating/evaluate_quota.go).
UNCHECKED_QUOTAS = frozenset({ROOT_QUOTA, SYSTEM_QUOTA})


class QuotaShapeError(ValueError):
    """An ElasticQuota whose fields cannot be read; the message names quota and field."""


def _not_an_object(where: str) -> QuotaShapeError:
    return QuotaShapeError(f"{where}: expected an object")


@dataclass(frozen=True, slots=True)
class LimitNote:
    """Something about a quota's limit a human should know (e.g. both GPU families named)."""

    quota: str
    message: str


@dataclass(frozen=True, slots=True)
class QuotaInfo:
    name: str
    namespace: str
    parent: str
    is_parent: bool
    min: ResourceList
    max: ResourceList
    admission: ResourceList | None  # the admission annotation overrides max entirely when set
    bound_namespaces: tuple[str, ...] = ()
    tree_id: str = ""
    resource_version: str = ""
    uid: str = ""  # for Events about the quota (kubectl describe matches them by uid)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def raw_limit(self) -> ResourceList:
        return self.admission if self.admission is not None else self.max


def quota_from_object(obj: Mapping[str, Any]) -> QuotaInfo:
    metadata = as_mapping(obj.get("metadata"), "metadata", _not_an_object)
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise QuotaShapeError("ElasticQuota has no metadata.name")
    labels = as_mapping(metadata.get("labels"), f"{name}: metadata.labels", _not_an_object)
    annotations = as_mapping(metadata.get("annotations"), f"{name}: metadata.annotations", _not_an_object)
    spec = as_mapping(obj.get("spec"), f"{name}: spec", _not_an_object)
    try:
        minimum = parse_resource_list(spec.get("min"), "spec.min")
        maximum = parse_resource_list(spec.get("max"), "spec.max")
        admission_raw = annotations.get(ADMISSION_ANNOTATION)
        admission = _json_resource_list(admission_raw, ADMISSION_ANNOTATION) if admission_raw else None
    except PodShapeError as error:
        raise QuotaShapeError(f"ElasticQuota {name}: {error}") from None
    parent = labels.get(PARENT_LABEL) or ROOT_QUOTA
    return QuotaInfo(
        name=name,
        namespace=str(metadata.get("namespace") or ""),
        parent=str(parent) if name != ROOT_QUOTA else "",
        is_parent=labels.get(IS_PARENT_LABEL) == "true",
        min=minimum,
        max=maximum,
        admission=admission,
        bound_namespaces=_bound_namespaces(annotations.get(NAMESPACES_ANNOTATION)),
        tree_id=str(labels.get(TREE_ID_LABEL) or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        uid=str(metadata.get("uid") or ""),
    )


def _json_resource_list(raw: object, where: str) -> ResourceList:
    if not isinstance(raw, str):
        raise PodShapeError(where, "expected a JSON string")
    try:
        loaded = json.loads(raw)
    except ValueError:
        raise PodShapeError(where, "not valid JSON") from None
    return parse_resource_list(loaded, where)


def _bound_namespaces(raw: object) -> tuple[str, ...]:
    # Koordinator ignores an unparsable namespaces annotation; so do we.
    if not isinstance(raw, str):
        return ()
    try:
        loaded = json.loads(raw)
    except ValueError:
        return ()
    return tuple(n for n in loaded if isinstance(n, str)) if isinstance(loaded, list) else ()


def canonical_spellings(resources: Mapping[str, Quantity],
                        config: ConversionConfig = DEFAULT_CONFIG) -> dict[str, list[tuple[Quantity, str]]]:
    """Per canonical name, every (amount, spelling) of a quota's list that speaks for it.

    ``{gpu-memory-ratio: 750, koordinator.sh/gpu: 300}`` gives gpu-memory-ratio two readings,
    750 (as written) and 300 (from koordinator.sh/gpu), and gpu-core one, 300.
    """
    converted: dict[str, list[tuple[Quantity, str]]] = {}
    for name, quantity in resources.items():
        rule = config.rule_for(name)
        if rule is None:
            converted.setdefault(name, []).append((quantity, name))
            continue
        for output, per_unit in rule.outputs.items():
            converted.setdefault(output, []).append((quantity.scaled(per_unit), name))
        if rule.strategy.value == "Retain":
            converted.setdefault(name, []).append((quantity, name))
    return converted


def canonical_resource_list(resources: Mapping[str, Quantity], config: ConversionConfig = DEFAULT_CONFIG,
                            quota: str = "") -> tuple[ResourceList, list[LimitNote]]:
    """A quota's list in canonical names; where two spellings give one name, the stricter wins.

    ``nvidia.com/gpu: 4`` limits ``gpu-memory-ratio`` to 400. A quota that also says
    ``gpu-memory-ratio: 300`` is limited to 300: whichever the writer meant, admitting more than
    either number would break one of the two promises.
    """
    converted = canonical_spellings(resources, config)
    result: ResourceList = {}
    notes: list[LimitNote] = []
    for name, candidates in sorted(converted.items()):
        strictest = min(candidates, key=lambda candidate: candidate[0])
        # In the writer's own format: a limit of 8Gi is quoted back as 8Gi, not 8589934592.
        result[name] = Quantity(strictest[0].amount, strictest[0].format)
        sources = sorted({source for _, source in candidates})
        if len(candidates) > 1:
            spelled = ", ".join(f"{source}={quantity}" for quantity, source in sorted(candidates, key=lambda c: c[1]))
            notes.append(LimitNote(quota, f"{name} is limited by {' and '.join(sources)} ({spelled}); "
                                          f"the stricter value {result[name]} applies"))
    return result, notes


def legacy_gpu_names(resources: Iterable[str]) -> list[str]:
    return sorted(set(resources) & VENDOR_WHOLE_GPU_NAMES)


def names_both_families(resources: Iterable[str]) -> bool:
    return families_of(resources) == {GpuFamily.VENDOR, GpuFamily.KOORDINATOR}
