"""Libraries whose internals gpuquota reaches into are the releases it was tested with.

Some of gpuquota goes beyond a library's public API: it subclasses a class, reads an attribute
that is set in a constructor, or relies on a private helper behaving as it did. A release outside
the tested range may rename any of these, and the code would then fail far from the cause or, worse,
quietly do something else. So each such library has a :class:`PinnedLibrary` (kubeaccess's own
below, the server's in webhook/serving/library_check.py): the range pyproject.toml pins
(tests/webhook/serving/test_library_check.py compares the two) and a probe of every internal relied on.
:func:`check_libraries` refuses, in one line naming the library, the version found and the range
tested, when the installed release is not one of them or its internals differ.

This module lives in kubeaccess, the lowest layer that does I/O, because both sides need it:
kubeaccess itself (the kubernetes client's kubeconfig loader in :mod:`kubeaccess.kube`, ruamel.yaml's
comment table in :mod:`kubeaccess.roundtrip`) and the server, whose start-up check
(webhook/serving/library_check.py) adds gunicorn and prometheus_client. kubeaccess must not import
webhook, and gpuquota_core does no I/O (reading installed distributions' metadata is I/O).

The pins of kubeaccess's own libraries:

- kubernetes: :func:`kubeaccess.kube.load_kubeconfig` merges kubeconfig files by kubectl's rules
  into a tree of ``kube_config.ConfigNode`` entries, each carrying the file it came from, and
  :func:`kubeaccess.kube.connect` hands that tree to ``kube_config.KubeConfigLoader`` with
  ``config_base_path=None``, so that each entry's relative certificate paths resolve against its own
  file. None of this is exported API. Checked before any kubeconfig is read (the CLI refuses with one
  ``Error:`` line) and at ``gpuquota serve``'s start-up.
- ruamel.yaml: ``gpuquota convert`` moves comments through ruamel's comment table
  (``CommentedMap.ca.items``). Checked at use; an untested release does not stop the conversion: the
  file is written as plain YAML, with a note saying why (see :func:`kubeaccess.roundtrip.render_yaml`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any


class LibraryMismatch(Exception):
    """An installed library is not a release gpuquota was tested with, or lacks an internal it uses."""


def version_key(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "27.0.1" -> (27, 0, 1), "0.7.0rc1" -> (0, 7, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


@dataclass(frozen=True)
class PinnedLibrary:
    """A distribution, the version range gpuquota is tested with (``lowest`` <= v < ``below``, as
    pinned in pyproject.toml), and what of its internals gpuquota uses."""

    distribution: str
    lowest: str
    below: str
    # Yields one phrase per internal that is missing or changed; nothing when all are as tested.
    internals: Callable[[], Iterable[str]] = lambda: ()

    @property
    def tested_range(self) -> str:
        return f">={self.lowest},<{self.below}"

    def admits(self, version: str) -> bool:
        try:
            key = version_key(version)
        except ValueError:
            return False
        return version_key(self.lowest) <= key < version_key(self.below)


def check_libraries(libraries: Sequence[PinnedLibrary],
                    version_of: Callable[[str], str] = importlib.metadata.version) -> None:
    """LibraryMismatch naming the first library that is missing, of an untested version, or whose
    internals differ from the tested ones. Versions are checked before internals: the internals of
    an untested release are looked at only once its version is known to be a tested one."""
    versions = []
    for library in libraries:
        try:
            version = version_of(library.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise LibraryMismatch(f"{library.distribution} is not installed; gpuquota is tested with "
                                  f"{library.distribution}{library.tested_range}") from None
        if not library.admits(version):
            raise LibraryMismatch(f"{library.distribution} {version} is installed, but gpuquota is tested only "
                                  f"with {library.distribution}{library.tested_range} (it relies on its internals); "
                                  f"install a version in that range")
        versions.append(version)
    for library, version in zip(libraries, versions, strict=True):
        try:
            changed = list(library.internals())
        except Exception as error:  # an import or attribute the probe itself needs
            changed = [f"{type(error).__name__}: {error}"]
        if changed:
            raise LibraryMismatch(f"{library.distribution} {version} is installed and in the tested range "
                                  f"{library.tested_range}, but its internals differ from the tested ones: "
                                  + "; ".join(changed))


# --- probes of internals, pure functions of the objects they are given ------------------------------


def attributes_missing(owner: Any, names: Iterable[str], where: str) -> Iterator[str]:
    for name in names:
        if not hasattr(owner, name):
            yield f"{where}.{name} is missing"


def parameters_differ(owner: Any, expected: dict[str, tuple[str, ...]], where: str) -> Iterator[str]:
    """Methods of ``owner`` whose parameters (after ``self``) are not the expected names."""
    for name, parameters in expected.items():
        method = getattr(owner, name, None)
        if not callable(method):
            yield f"{where}.{name} is missing"
            continue
        try:
            found = tuple(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            yield f"{where}.{name} has no readable signature"
            continue
        if found[:1] == ("self",):
            found = found[1:]
        if found != parameters:
            yield f"{where}.{name} takes ({', '.join(found)}), tested with ({', '.join(parameters)})"


def not_assigned(functions: Sequence[Callable[..., Any]], names: Iterable[str], where: str) -> Iterator[str]:
    """Instance attributes that none of ``functions`` (the constructors that set them) names.

    An attribute set in ``__init__`` cannot be seen on the class; the names a function's code
    uses can, and a renamed attribute disappears from them.
    """
    used: set[str] = set()
    for function in functions:
        code = getattr(function, "__code__", None)
        if code is not None:
            used.update(code.co_names)
    for name in names:
        if name not in used:
            yield f"{where} no longer sets .{name}"


# --- what kubeaccess relies on ---------------------------------------------------------------------


def _kubernetes_internals() -> Iterator[str]:
    kube_config = importlib.import_module("kubernetes.config.kube_config")
    where = "kubernetes.config.kube_config"
    differ = list(parameters_differ(kube_config, {
        "ConfigNode": ("name", "value", "path"),
        "KubeConfigLoader": ("config_dict", "active_context", "get_google_credentials", "config_base_path",
                             "config_persister", "temp_file_path"),
    }, where))
    if not differ:
        node, loader_class = kube_config.ConfigNode, kube_config.KubeConfigLoader
        differ += not_assigned((node.__init__,), ("value", "path"), f"{where}.ConfigNode")
        differ += parameters_differ(loader_class, {"load_and_set": ("client_configuration",)},
                                    f"{where}.KubeConfigLoader")
    if differ:
        yield from differ
        return  # the behaviour below needs all of them
    # kube.connect passes config_base_path=None so that a cluster or user entry's relative
    # certificate paths resolve against the file that entry came from (the path of its ConfigNode).
    first, second = "/first/config", "/second/config"
    tree = node("probe", {
        "contexts": [node("contexts[name=c]", {"name": "c", "context": {"cluster": "k", "user": "u"}}, first)],
        "clusters": [node("clusters[name=k]", {"name": "k", "cluster": {"server": "https://k"}}, second)],
        "users": [node("users[name=u]", {"name": "u", "user": {}}, second)],
    }, first)
    loader = loader_class(config_dict=tree, active_context="c", config_base_path=None)
    if loader._get_base_path(loader._cluster.path) != str(PurePosixPath(second).parent):
        yield (f"{where}.KubeConfigLoader no longer resolves an entry's certificate paths against "
               f"the file of its ConfigNode")


def _ruamel_internals() -> Iterator[str]:
    comments = importlib.import_module("ruamel.yaml.comments")
    # roundtrip moves a replaced key's comment through the comment table.
    table = getattr(comments.CommentedMap(), "ca", None)
    if not isinstance(getattr(table, "items", None), dict):
        yield "ruamel.yaml.comments.CommentedMap().ca.items is not the comment table (a dict) it was"


# The ranges pinned in pyproject.toml (tests/webhook/serving/test_library_check.py keeps the two equal).
KUBERNETES = PinnedLibrary("kubernetes", "37.0.3", "37.1", _kubernetes_internals)
RUAMEL_YAML = PinnedLibrary("ruamel.yaml", "0.19.1", "0.20", _ruamel_internals)
