"""Kubernetes API access through the cncf-kubernetes provider's hook, and raw calls.

Every call goes through ``ApiClient.call_api`` with ``_preload_content=False``:
the typed list calls overwrite ``Accept``, and Secrets must be listed as
``PartialObjectMetadataList`` so that their ``data`` never reaches the reaper.
Raw JSON is decoded with the same typed decoder as ``kubectl`` exports.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3 import exceptions as u3exc

PATHS = {
    "Pod": ("/api/v1", "pods"),
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def collection_paths(kind: str, namespaces: Sequence[str]) -> list[str]:
    """Where objects of ``kind`` are listed: cluster-wide, or in each of ``namespaces`` when named.

    Named namespaces are what lets a namespaced ``Role`` suffice in the swept cluster (``k8s.namespaces``).
    """
    prefix, resource = PATHS[kind]
    if not namespaces:
        return [f"{prefix}/{resource}"]
    return [f"{prefix}/namespaces/{namespace}/{resource}" for namespace in namespaces]


def api_client_from_connection(conn_id: str) -> k8s.ApiClient:
    """The ApiClient of the Airflow connection ``conn_id`` (kubeconfig in the connection)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id).api_client


def transient(exc: BaseException) -> bool:
    """Throttling, server errors, timeouts and dropped connections are worth a bounded retry."""
    if isinstance(exc, ApiException):
        return exc.status == 429 or exc.status >= 500
    return isinstance(exc, u3exc.HTTPError)


def call(
    api: k8s.ApiClient,
    method: str,
    path: str,
    timeout: float,
    query: list[tuple[str, object]] | None = None,
    body: object = None,
    accept: str = "application/json",
) -> bytes:
    """One raw API call; the answer's bytes. Raises ``ApiException`` on an error status."""
    response = api.call_api(
        path,
        method,
        query_params=query or [],
        header_params={"Accept": accept, "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=timeout,
    )
    return response.data


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
