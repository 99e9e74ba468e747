"""Live cluster access for the CLI: kubectl's config rules and paged, raw-JSON lists.

Lists are decoded straight from the API's JSON (``_preload_content=False``): the client's model
deserialisation is several times slower and the audit needs plain mappings anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from gpuquota_core.gang import POD_GROUP_API_VERSION, POD_GROUP_KIND, POD_GROUP_PLURAL
from gpuquota_core.quota_objects import ELASTICQUOTA_GROUP, ELASTICQUOTA_PLURAL, ELASTICQUOTA_VERSION

DEFAULT_PAGE_SIZE = 500
REQUEST_TIMEOUT_SECONDS = 60  # per list request of a command: an unanswering API server fails it, not hangs it


class KubeAccessError(Exception):
    """The cluster cannot be reached or refused a request; the message says which and why."""


class NoClusterFound(KubeAccessError):
    """No kubeconfig anywhere and not in a pod: the caller adds what else it could be given."""


Lister = Callable[..., Any]


@dataclass(frozen=True)
class ListedKind:
    kind: str
    # (api client, namespace or None) -> the generated client's list call for that scope
    lister: Callable[[client.ApiClient, str | None], Lister]
    optional: bool = False  # a CRD that may not be installed: a 404 means "none"


def _core(cluster_wide: str, namespaced: str) -> Callable[[client.ApiClient, str | None], Lister]:
    def pick(api: client.ApiClient, namespace: str | None) -> Lister:
        core = client.CoreV1Api(api)
        if namespace is None or not namespaced:
            return getattr(core, cluster_wide)  # type: ignore[no-any-return]
        method = getattr(core, namespaced)
        return lambda **kw: method(namespace, **kw)
    return pick


def _group(api_class: str, plural: str) -> Callable[[client.ApiClient, str | None], Lister]:
    def pick(api: client.ApiClient, namespace: str | None) -> Lister:
        group_api = getattr(client, api_class)(api)
        if namespace is None:
            return getattr(group_api, f"list_{plural}_for_all_namespaces")  # type: ignore[no-any-return]
        method = getattr(group_api, f"list_namespaced_{plural}")
        return lambda **kw: method(namespace, **kw)
    return pick


def _elasticquotas(api: client.ApiClient, namespace: str | None) -> Lister:
    custom = client.CustomObjectsApi(api)
    group, version, plural = ELASTICQUOTA_GROUP, ELASTICQUOTA_VERSION, ELASTICQUOTA_PLURAL
    if namespace is None:
        return lambda **kw: custom.list_cluster_custom_object(group, version, plural, **kw)
    return lambda **kw: custom.list_namespaced_custom_object(group, version, namespace, plural, **kw)


def _pod_groups(api: client.ApiClient, namespace: str | None) -> Lister:
    custom = client.CustomObjectsApi(api)
    group, version = POD_GROUP_API_VERSION.split("/")
    if namespace is None:
        return lambda **kw: custom.list_cluster_custom_object(group, version, POD_GROUP_PLURAL, **kw)
    return lambda **kw: custom.list_namespaced_custom_object(group, version, namespace, POD_GROUP_PLURAL, **kw)


AUDIT_KINDS: tuple[ListedKind, ...] = (
    # Nodes are always listed cluster-wide: quota checks need what the nodes advertise.
    ListedKind("Node", _core("list_node", "")),
    ListedKind("Pod", _core("list_pod_for_all_namespaces", "list_namespaced_pod")),
    ListedKind("ResourceQuota", _core("list_resource_quota_for_all_namespaces", "list_namespaced_resource_quota")),
    # Quotas always cluster-wide too: a quota's parents live in other namespaces, and quota names
    # are cluster-wide, so a namespace's quotas cannot be judged without the whole tree.
    ListedKind("ElasticQuota", lambda api, _namespace: _elasticquotas(api, None), optional=True),
    ListedKind("Deployment", _group("AppsV1Api", "deployment")),
    ListedKind("StatefulSet", _group("AppsV1Api", "stateful_set")),
    ListedKind("DaemonSet", _group("AppsV1Api", "daemon_set")),
    ListedKind("ReplicaSet", _group("AppsV1Api", "replica_set")),
    ListedKind("Job", _group("BatchV1Api", "job")),
    ListedKind("CronJob", _group("BatchV1Api", "cron_job")),
    # Gangs of PodGroups (gpuquota_core.gang); a cluster without the CRD has none.
    ListedKind(POD_GROUP_KIND, _pod_groups, optional=True),
)


KUBECONFIG_ENTRIES = (("clusters", "cluster"), ("contexts", "context"), ("users", "user"))


@dataclass(frozen=True)
class Kubeconfig:
    """The kubeconfig files kubectl would read, merged by kubectl's rules, and the context chosen."""

    files: tuple[str, ...]
    # {"current-context": ..., "clusters"|"contexts"|"users": [ConfigNode, ...]}: each entry keeps
    # the file it came from, so relative certificate paths resolve against that file's directory.
    merged: dict[str, Any]
    context: str

    @property
    def source(self) -> str:
        return ":".join(self.files)

    def context_entry(self) -> dict[str, Any]:
        for entry in self.merged["contexts"]:
            if entry.value.get("name") == self.context:
                return dict(entry.value.get("context") or {})
        return {}


def kubeconfig_files(kubeconfig: str | None) -> list[str] | None:
    """kubectl's lookup: --kubeconfig (that file only), $KUBECONFIG (every existing file of the list,
    empty entries ignored), ~/.kube/config; None means in-cluster."""
    if kubeconfig:
        return [kubeconfig]
    listed = [entry for entry in os.environ.get("KUBECONFIG", "").split(os.pathsep) if entry]
    if listed:
        present = [entry for entry in listed if Path(entry).expanduser().exists()]
        if not present:
            raise KubeAccessError(f"$KUBECONFIG names no file that exists: {os.pathsep.join(listed)}")
        return [str(Path(entry).expanduser()) for entry in present]
    home = Path.home() / ".kube" / "config"
    return [str(home)] if home.is_file() else None


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """The first file of :func:`kubeconfig_files` (what kubectl would write to), or None."""
    files = kubeconfig_files(kubeconfig)
    return files[0] if files else None


def load_kubeconfig(kubeconfig: str | None, context: str | None) -> Kubeconfig | None:
    """The merged kubeconfig and the context to use; None when there is none (in-cluster).

    kubectl's merge: the first file to set a value or a named cluster, context or user wins, and
    that entry is taken whole (a later file's entry of the same name is ignored, even for fields
    the first one lacks); current-context comes from the first file that sets it. Raises
    :class:`KubeAccessError` with one line (file, and line and column for YAML errors), also when
    the installed kubernetes client is not a release whose kubeconfig internals were tested.
    """
    files = kubeconfig_files(kubeconfig)
    if files is None:
        return None
    # The merge and connect() go through the client's non-exported kubeconfig classes: on an
    # untested release they might fail late or resolve certificate paths against the wrong file.
    from .library_pins import KUBERNETES, LibraryMismatch, check_libraries

    try:
        check_libraries([KUBERNETES])
    except LibraryMismatch as error:
        raise KubeAccessError(f"{os.pathsep.join(files)}: cannot load the kubeconfig: {error}") from None
    from kubernetes.config.kube_config import ConfigNode

    merged: dict[str, Any] = {"current-context": "", **{plural: [] for plural, _ in KUBECONFIG_ENTRIES}}
    for path in files:
        document = _read_kubeconfig(path)
        if not merged["current-context"] and document.get("current-context"):
            merged["current-context"] = document["current-context"]
        for plural, _ in KUBECONFIG_ENTRIES:
            taken = {entry.value["name"] for entry in merged[plural]}
            for entry in document.get(plural) or []:
                if entry["name"] not in taken:
                    taken.add(entry["name"])
                    merged[plural].append(ConfigNode(  # type: ignore[no-untyped-call]
                        f"{path}/{plural}[name={entry['name']}]", entry, path))
    source = ":".join(files)
    chosen = context or merged["current-context"]
    if not chosen:
        raise KubeAccessError(f"{source}: no current-context is set: give --context")
    names = [entry.value["name"] for entry in merged["contexts"]]
    if chosen not in names:
        known = ", ".join(names) if names else "none"
        raise KubeAccessError(f'{source}: context "{chosen}" not found (contexts: {known})')
    loaded = Kubeconfig(tuple(files), merged, chosen)
    cluster = loaded.context_entry().get("cluster")
    if cluster not in {entry.value["name"] for entry in merged["clusters"]}:
        raise KubeAccessError(f'{source}: context "{chosen}" names cluster "{cluster}", which is not defined')
    return loaded


def _read_kubeconfig(path: str) -> dict[str, Any]:
    """One kubeconfig file, checked for the shape the client reads (an empty file is an empty config)."""
    from .manifests import ManifestError, load_yaml_documents, not_text

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise KubeAccessError(f"{path}: {not_text(error)}") from None
    except OSError as error:
        raise KubeAccessError(f"{path}: cannot read the kubeconfig: {error.strerror or error}") from None
    try:
        documents = [d for d in load_yaml_documents(text, path) if d is not None]
    except ManifestError as error:
        raise KubeAccessError(str(error)) from None
    if not documents:
        return {}
    if len(documents) > 1:
        raise KubeAccessError(f"{path}: {len(documents)} YAML documents; a kubeconfig is one")
    document = documents[0]
    if not isinstance(document, dict):
        raise KubeAccessError(f"{path}: not a kubeconfig: a {_yaml_type(document)}, not a mapping")
    kind = document.get("kind")
    if kind not in (None, "Config"):
        raise KubeAccessError(f"{path}: not a kubeconfig: kind is {kind!r}, not 'Config'")
    if kind is None and not any(key in document for key in ("clusters", "contexts", "users", "current-context")):
        raise KubeAccessError(f"{path}: not a kubeconfig: no clusters, contexts, users or current-context")
    if not isinstance(document.get("current-context") or "", str):
        raise KubeAccessError(f"{path}: not a kubeconfig: current-context is a "
                              f"{_yaml_type(document['current-context'])}, not a string")
    for plural, singular in KUBECONFIG_ENTRIES:
        entries = document.get(plural) or []
        if not isinstance(entries, list):
            raise KubeAccessError(f"{path}: not a kubeconfig: {plural} is a {_yaml_type(entries)}, not a list")
        for position, entry in enumerate(entries, 1):
            where = f"{path}: {plural} entry {position}"
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
                raise KubeAccessError(f"{where}: not a mapping with a name")
            if not isinstance(entry.get(singular) or {}, dict):
                raise KubeAccessError(f'{where} ("{entry["name"]}"): {singular} is a '
                                      f"{_yaml_type(entry[singular])}, not a mapping")
    return document


def _yaml_type(value: object) -> str:
    names: dict[type, str] = {dict: "mapping", list: "list", str: "string"}
    return names.get(type(value), type(value).__name__)


def connect(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """A client the way kubectl picks one: --kubeconfig, $KUBECONFIG (merged), ~/.kube/config, in-cluster."""
    loaded = load_kubeconfig(kubeconfig, context)
    configuration = client.Configuration()
    if loaded is None:
        if context:
            raise KubeAccessError("--context needs a kubeconfig; none was given or found")
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException:
            raise NoClusterFound("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not running in a cluster") from None
        return client.ApiClient(configuration)
    from kubernetes.config.kube_config import ConfigNode, KubeConfigLoader

    try:
        # config_base_path=None: each entry's certificate paths are relative to its own file.
        root = ConfigNode("kubeconfig", loaded.merged, loaded.files[0])  # type: ignore[no-untyped-call]
        loader = KubeConfigLoader(config_dict=root, active_context=loaded.context,  # type: ignore[no-untyped-call]
                                  config_base_path=None)
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    except ConfigException as error:
        raise KubeAccessError(f"{loaded.source}: context {loaded.context}: {error}") from None
    except OSError as error:
        raise KubeAccessError(f"{loaded.source}: context {loaded.context}: {error.strerror or error}") from None
    except (ValueError, TypeError, AttributeError, KeyError) as error:
        # A field of the wrong type (a number where a URL belongs) fails inside the client.
        raise KubeAccessError(f"{loaded.source}: context {loaded.context}: not a valid kubeconfig entry: "
                              f"{error}") from None
    return client.ApiClient(configuration)


def list_all(api: client.ApiClient, kind: ListedKind, namespace: str | None, *,
             page_size: int = DEFAULT_PAGE_SIZE, on_page: Callable[[str, int], None] | None = None,
             ) -> list[dict[str, Any]]:
    """Every object of ``kind`` (in ``namespace`` when given), fetched ``page_size`` at a time."""
    items: list[dict[str, Any]] = []
    try:
        for page in list_pages(kind.lister(api, namespace), page_size, _request_timeout=REQUEST_TIMEOUT_SECONDS):
            for item in page.get("items", []):
                # List items carry no kind of their own; the audit dispatches on it.
                item.setdefault("kind", kind.kind)
                items.append(item)
            if on_page is not None:
                on_page(kind.kind, len(items))
    except ApiException as error:
        if error.status == 404 and kind.optional:
            return []
        raise KubeAccessError(f"listing {kind.kind}: {error.status} {api_error_message(error)}") from None
    except HTTPError as error:
        raise KubeAccessError(f"cannot reach the API server: {error}") from None
    return items


def list_pages(lister: Callable[..., Any], page_size: int, **options: Any) -> Iterator[dict[str, Any]]:
    """The decoded pages of one list, ``page_size`` objects at a time, up to the last.

    All pages come from one consistent snapshot (the continue token pins its resourceVersion). The
    lister's errors reach the caller, which knows what they mean for its list. Each response is
    dropped as soon as it is decoded, so a caller that drops a page's items before asking for the
    next holds one page at a time.
    """
    token = ""
    while True:
        paging: dict[str, Any] = {"limit": page_size, **({"_continue": token} if token else {})}
        response = lister(_preload_content=False, **options, **paging)
        page = orjson.loads(response.data or b"{}")
        del response
        token = (page.get("metadata") or {}).get("continue") or ""
        yield page
        if not token:
            return


def list_cluster(kubeconfig: str | None, context: str | None, namespace: str | None, *,
                 page_size: int = DEFAULT_PAGE_SIZE, on_page: Callable[[str, int], None] | None = None,
                 ) -> list[dict[str, Any]]:
    """Every object the audit and the migration plan look at, on one connection."""
    api = connect(kubeconfig, context)
    try:
        return [obj for kind in AUDIT_KINDS
                for obj in list_all(api, kind, namespace, page_size=page_size, on_page=on_page)]
    finally:
        api.close()  # type: ignore[no-untyped-call]


def api_error_message(error: ApiException) -> str:
    """The apiserver's own message from a Status body, else the HTTP reason."""
    try:
        return str(orjson.loads(error.body or b"{}").get("message") or error.reason)
    except (orjson.JSONDecodeError, TypeError, AttributeError):
        return str(error.reason)


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace kubectl would use without -n: the context's, else ``default``.

    A kubeconfig that cannot be read also gives ``default``: connecting reports why it cannot.
    """
    try:
        loaded = load_kubeconfig(kubeconfig, context)
    except KubeAccessError:
        return "default"
    if loaded is None:
        in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return in_cluster.read_text().strip() if in_cluster.is_file() else "default"
    namespace = loaded.context_entry().get("namespace")
    return str(namespace) if namespace else "default"
