"""The checks of the libraries whose internals gpuquota relies on: the server's start-up check
(webhook/serving/library_check.py) and the pins it shares with kubeaccess (kubeaccess/library_pins.py)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeaccess.library_pins import (
    KUBERNETES,
    RUAMEL_YAML,
    LibraryMismatch,
    PinnedLibrary,
    attributes_missing,
    check_libraries,
    not_assigned,
    parameters_differ,
    version_key,
)
from webhook.serving.library_check import SERVING_LIBRARIES, check_serving_libraries

# Every library pinned for its internals: the server's, and ruamel.yaml, which only convert uses.
PINNED_LIBRARIES = (*SERVING_LIBRARIES, RUAMEL_YAML)


def versions(**found: str):  # type: ignore[no-untyped-def]
    def version_of(distribution: str) -> str:
        if distribution not in found:
            raise importlib.metadata.PackageNotFoundError(distribution)
        return found[distribution]
    return version_of


def test_versions_compare_by_their_release_numbers() -> None:
    assert version_key("27.0.1") == (27, 0, 1)
    assert version_key("0.7.0rc1") == (0, 7, 0)
    library = PinnedLibrary("gunicorn", "27.0.1", "27.1")
    assert [library.admits(v) for v in ("27.0.0", "27.0.1", "27.0.9", "27.1", "27.1.0", "28.0.0", "26.9")] \
        == [False, True, True, False, False, False, False]
    assert not library.admits("not-a-version")


def test_a_version_outside_the_tested_range_is_refused_naming_library_version_and_range() -> None:
    with pytest.raises(LibraryMismatch) as refused:
        check_libraries([PinnedLibrary("gunicorn", "27.0.1", "27.1")], versions(gunicorn="28.0.0"))
    message = str(refused.value)
    assert "gunicorn 28.0.0 is installed" in message and "gunicorn>=27.0.1,<27.1" in message
    assert "\n" not in message


def test_a_missing_library_is_refused() -> None:
    with pytest.raises(LibraryMismatch, match=r"gunicorn_h1c is not installed.*gunicorn_h1c>=0.6.10,<0.7"):
        check_libraries([PinnedLibrary("gunicorn_h1c", "0.6.10", "0.7")], versions())


def test_internals_are_looked_at_only_once_every_version_is_a_tested_one() -> None:
    looked: list[str] = []

    def internals() -> Iterator[str]:
        looked.append("gunicorn")
        yield "gthread.ThreadWorker.handle is missing"

    libraries = [PinnedLibrary("gunicorn", "27.0.1", "27.1", internals),
                 PinnedLibrary("prometheus_client", "0.26.0", "0.27")]
    with pytest.raises(LibraryMismatch, match=r"prometheus_client 0\.30\.0 is installed"):
        check_libraries(libraries, versions(gunicorn="27.0.1", prometheus_client="0.30.0"))
    assert looked == []
    with pytest.raises(LibraryMismatch) as refused:
        check_libraries(libraries, versions(gunicorn="27.0.1", prometheus_client="0.26.0"))
    assert str(refused.value) == ("gunicorn 27.0.1 is installed and in the tested range >=27.0.1,<27.1, but its "
                                  "internals differ from the tested ones: gthread.ThreadWorker.handle is missing")


def test_a_probe_that_fails_is_a_refusal_not_a_crash() -> None:
    def internals() -> Iterator[str]:
        raise ImportError("cannot import name '_DEFER' from 'gunicorn.workers.gthread'")

    with pytest.raises(LibraryMismatch, match="ImportError: cannot import name '_DEFER'"):
        check_libraries([PinnedLibrary("gunicorn", "27.0.1", "27.1", internals)], versions(gunicorn="27.0.1"))


class WorkerAsTested:
    def __init__(self) -> None:
        self.nr_conns = 0

    def handle_request(self, req: object, conn: object) -> bool:
        return True


class WorkerChanged:
    def __init__(self) -> None:
        self.open_connections = 0

    def handle_request(self, request: object, conn: object, extra: object = None) -> bool:
        return True


def test_the_probes_see_renamed_attributes_and_changed_parameters() -> None:
    expected = {"handle_request": ("req", "conn"), "handle": ("conn",)}
    assert list(parameters_differ(WorkerAsTested, {"handle_request": ("req", "conn")}, "W")) == []
    assert list(parameters_differ(WorkerChanged, expected, "W")) == [
        "W.handle_request takes (request, conn, extra), tested with (req, conn)", "W.handle is missing"]
    assert list(not_assigned((WorkerAsTested.__init__,), ("nr_conns",), "W")) == []
    assert list(not_assigned((WorkerChanged.__init__,), ("nr_conns",), "W")) == ["W no longer sets .nr_conns"]
    assert list(attributes_missing(WorkerChanged, ("handle_request", "accept"), "W")) == ["W.accept is missing"]


def test_the_installed_libraries_are_the_tested_ones() -> None:
    check_serving_libraries()
    check_libraries([RUAMEL_YAML])
    assert {library.distribution for library in SERVING_LIBRARIES} == {
        "gunicorn", "prometheus_client", "kubernetes"}


def installed_versions_but(**changed: str):  # type: ignore[no-untyped-def]
    def version_of(distribution: str) -> str:
        return changed.get(distribution) or importlib.metadata.version(distribution)
    return version_of


def test_an_untested_kubernetes_release_stops_the_server() -> None:
    with pytest.raises(LibraryMismatch) as refused:
        check_serving_libraries(installed_versions_but(kubernetes="38.0.0"))
    assert str(refused.value) == ("kubernetes 38.0.0 is installed, but gpuquota is tested only with "
                                  "kubernetes>=37.0.3,<37.1 (it relies on its internals); install a version "
                                  "in that range")


def test_a_kubeconfig_loader_method_gone_from_kubernetes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config.kube_config import KubeConfigLoader

    monkeypatch.delattr(KubeConfigLoader, "load_and_set")
    with pytest.raises(LibraryMismatch, match=r"kubernetes 37\.0\.\d+ is installed and in the tested range "
                                              r">=37\.0\.3,<37\.1, but its internals differ from the tested ones: "
                                              r"kubernetes\.config\.kube_config\.KubeConfigLoader\.load_and_set "
                                              "is missing"):
        check_serving_libraries()


def test_a_kubeconfig_loader_with_other_parameters_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import kube_config

    class Loader(kube_config.KubeConfigLoader):  # type: ignore[misc]
        def __init__(self, config_dict: Any, active_context: Any = None, base_path: Any = "") -> None:
            super().__init__(config_dict, active_context, config_base_path=base_path)

    monkeypatch.setattr(kube_config, "KubeConfigLoader", Loader)
    with pytest.raises(LibraryMismatch, match=r"kubernetes .*KubeConfigLoader takes \(config_dict, active_context, "
                                              r"base_path\), tested with \(config_dict, active_context, "
                                              r"get_google_credentials, config_base_path, "):
        check_libraries([KUBERNETES])


def test_a_config_node_that_no_longer_keeps_its_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config.kube_config import ConfigNode

    def renamed(self: Any, name: Any, value: Any, path: Any = None) -> None:
        self.name, self.data, self.path = name, value, path

    monkeypatch.setattr(ConfigNode, "__init__", renamed)
    with pytest.raises(LibraryMismatch, match=r"kubernetes .*kube_config\.ConfigNode no longer sets \.value"):
        check_libraries([KUBERNETES])


def test_certificate_paths_resolved_against_another_file_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # kube.connect's per-file certificate paths rest on this private behaviour of the loader.
    from kubernetes.config.kube_config import KubeConfigLoader

    monkeypatch.setattr(KubeConfigLoader, "_get_base_path", lambda self, config_path: "")
    with pytest.raises(LibraryMismatch, match=r"kubernetes .*KubeConfigLoader no longer resolves an entry's "
                                              "certificate paths against the file of its ConfigNode"):
        check_libraries([KUBERNETES])


def test_an_untested_ruamel_release_is_named_with_its_range() -> None:
    with pytest.raises(LibraryMismatch, match=r"^ruamel\.yaml 0\.18\.6 is installed, but gpuquota is tested only "
                                              r"with ruamel\.yaml>=0\.19\.1,<0\.20 "):
        check_libraries([RUAMEL_YAML], installed_versions_but(**{"ruamel.yaml": "0.18.6"}))


def test_a_ruamel_without_its_comment_table_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from ruamel.yaml.comments import CommentedMap

    monkeypatch.setattr(CommentedMap, "ca", property(lambda self: None))
    with pytest.raises(LibraryMismatch, match=r"ruamel\.yaml .* but its internals differ from the tested ones: "
                                              r"ruamel\.yaml\.comments\.CommentedMap\(\)\.ca\.items is not"):
        check_libraries([RUAMEL_YAML])


def test_a_method_the_worker_overrides_gone_from_gunicorn_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn.workers.gthread import ThreadWorker

    monkeypatch.delattr(ThreadWorker, "is_parent_alive")
    with pytest.raises(LibraryMismatch, match=r"gunicorn 27\.0\.\d+ is installed .*ThreadWorker\.is_parent_alive "
                                              "is missing"):
        check_serving_libraries()


@pytest.mark.parametrize("setting", ["http_parser", "proxy_protocol"])  # set by gunicorn_conf; read by the worker
def test_a_setting_gunicorn_does_not_know_is_refused(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    from gunicorn import config

    monkeypatch.setattr(config, "KNOWN_SETTINGS", [known for known in config.KNOWN_SETTINGS
                                                   if known.name != setting])
    with pytest.raises(LibraryMismatch, match=f"gunicorn 27.* gunicorn has no setting '{setting}'"):
        check_serving_libraries()


def test_a_parser_without_its_unreader_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn.http.parser import Parser

    def renamed(self: Any, cfg: Any, source: Any, source_addr: Any) -> None:
        self.cfg, self.reader, self.source_addr = cfg, source, source_addr

    monkeypatch.setattr(Parser, "__init__", renamed)
    with pytest.raises(LibraryMismatch, match=r"gunicorn 27.* gunicorn\.http\.parser\.Parser no longer sets "
                                              r"\.unreader"):
        check_serving_libraries()


def test_a_body_without_its_reader_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn.http.body import Body

    def renamed(self: Any, reader: Any) -> None:
        self.source = reader

    monkeypatch.setattr(Body, "__init__", renamed)
    with pytest.raises(LibraryMismatch, match=r"gunicorn 27.* gunicorn\.http\.body\.Body no longer sets \.reader"):
        check_serving_libraries()


def test_the_pins_of_pyproject_are_the_ranges_checked() -> None:
    import tomllib

    from webhookproc import REPO_ROOT

    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    pinned = {dependency.replace("-", "_") for dependency in dependencies}
    assert {library.distribution for library in PINNED_LIBRARIES} == {
        "gunicorn", "prometheus_client", "kubernetes", "ruamel.yaml"}
    for library in PINNED_LIBRARIES:
        assert f"{library.distribution}{library.tested_range}" in pinned


def test_the_kubernetes_pin_is_the_one_the_cli_checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The CLI's live-cluster commands load their kubeconfig through kubeaccess.kube, which reads the
    # same pin: a kubernetes release outside it is refused before any file is read.
    from kubeaccess import library_pins
    from kubeaccess.kube import KubeAccessError, load_kubeconfig

    monkeypatch.setattr(library_pins, "KUBERNETES", dataclasses.replace(KUBERNETES, lowest="38.0", below="38.1"))
    never_read = tmp_path / "kubeconfig"
    with pytest.raises(KubeAccessError) as refused:
        load_kubeconfig(str(never_read), None)
    installed = importlib.metadata.version("kubernetes")
    assert str(refused.value) == (f"{never_read}: cannot load the kubeconfig: kubernetes {installed} is installed, "
                                  "but gpuquota is tested only with kubernetes>=38.0,<38.1 (it relies on its "
                                  "internals); install a version in that range")
