"""Live cluster access for the CLI: kubectl's config rules and paged, raw-JSON lists.

Lists are decoded straight from the API's JSON (``_preload_content=False``): the client's model
deserialisation is several times slower and the audit needs plain mappings anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

DEFAULT_PAGE_SIZE = 500


class KubeAccessError(Exception):
    """The cluster cannot be reached or refused a request; the message says which and why."""


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
    group, version, plural = "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas"
    if namespace is None:
        return lambda **kw: custom.list_cluster_custom_object(group, version, plural, **kw)
    return lambda **kw: custom.list_namespaced_custom_object(group, version, namespace, plural, **kw)


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
)


def kubeconfig_path(kubeconfig: str | None) -> str | None:
    """kubectl's lookup: --kubeconfig, $KUBECONFIG, ~/.kube/config; None means in-cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    if path is None and (Path.home() / ".kube" / "config").is_file():
        path = str(Path.home() / ".kube" / "config")
    return path


def connect(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """A client the way kubectl picks one: --kubeconfig, $KUBECONFIG, ~/.kube/config, in-cluster."""
    path = kubeconfig_path(kubeconfig)
    try:
        if path is not None:
            loaded: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context)
            return loaded
        if context:
            raise KubeAccessError("--context needs a kubeconfig; none was given or found")
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except ConfigException as error:
        if path is None:
            raise KubeAccessError("no kubeconfig ($KUBECONFIG, ~/.kube/config) and not running in a cluster: "
                                  "give --kubeconfig, or -f for manifest files") from None
        raise KubeAccessError(f"cannot load {path}: {error}") from None
    except OSError as error:
        raise KubeAccessError(f"cannot read {path}: {error.strerror or error}") from None


def list_all(api: client.ApiClient, kind: ListedKind, namespace: str | None, *,
             page_size: int = DEFAULT_PAGE_SIZE, on_page: Callable[[str, int], None] | None = None,
             ) -> list[dict[str, Any]]:
    """Every object of ``kind`` (in ``namespace`` when given), fetched ``page_size`` at a time."""
    lister = kind.lister(api, namespace)
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        paging: dict[str, Any] = {"limit": page_size, **({"_continue": token} if token else {})}
        try:
            response = lister(_preload_content=False, _request_timeout=60, **paging)
        except ApiException as error:
            if error.status == 404 and kind.optional:
                return []
            raise KubeAccessError(f"listing {kind.kind}: {error.status} {api_error_message(error)}") from None
        except HTTPError as error:
            raise KubeAccessError(f"cannot reach the API server: {error}") from None
        page = orjson.loads(response.data or b"{}")
        for item in page.get("items", []):
            # List items carry no kind of their own; the audit dispatches on it.
            item.setdefault("kind", kind.kind)
            items.append(item)
        if on_page is not None:
            on_page(kind.kind, len(items))
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


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
    """The namespace kubectl would use without -n: the context's, else ``default``."""
    path = kubeconfig_path(kubeconfig)
    if path is None:
        in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return in_cluster.read_text().strip() if in_cluster.is_file() else "default"
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"
