"""Kubernetes API access through the cncf-kubernetes provider's hook, and raw calls.

Every call goes through ``ApiClient.call_api`` with ``_preload_content=False``:
the typed list calls overwrite ``Accept``, and Secrets must be listed as
``PartialObjectMetadataList`` so that their ``data`` never reaches the reaper.
Raw JSON is decoded with the same typed decoder as ``kubectl`` exports.

Every call is one request, bounded by its own timeout (:func:`single_tries`), and the only retries
are the reaper's own (:class:`reaper.retry.Backoff` with :func:`retryable`): bounded, guarded, and
believing a ``Retry-After`` the API server sends.
"""

from __future__ import annotations

from collections.abc import Sequence

from kubernetes import client as k8s
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from urllib3 import exceptions as u3exc

PATHS = {
    "Pod": ("/api/v1", "pods"),
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
# The longest ``Retry-After`` believed. The API server's own 429s (API Priority and Fairness, and the
# max-in-flight limit it replaces) ask for 1 s; a larger value comes from something in between, and is
# believed up to this, never past the run's stop (a delete task's guard) or ``k8s.max_retries``.
RETRY_AFTER_CAP = 30.0


def collection_path(kind: str, namespace: str | None = None) -> str:
    """The collection of ``kind``: cluster-wide, or one namespace's."""
    prefix, resource = PATHS[kind]
    return f"{prefix}/{resource}" if namespace is None else f"{prefix}/namespaces/{namespace}/{resource}"


def collection_paths(kind: str, namespaces: Sequence[str]) -> list[str]:
    """Where objects of ``kind`` are listed: cluster-wide, or in each of ``namespaces`` when named.

    Named namespaces are what lets a namespaced ``Role`` suffice in the swept cluster (``k8s.namespaces``).
    """
    if not namespaces:
        return [collection_path(kind)]
    return [collection_path(kind, namespace) for namespace in namespaces]


def api_client_from_connection(conn_id: str) -> k8s.ApiClient:
    """The ApiClient of the Airflow connection ``conn_id`` (kubeconfig in the connection)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return single_tries(KubernetesHook(conn_id=conn_id).api_client)


def single_tries(api: k8s.ApiClient) -> k8s.ApiClient:
    """``api`` with urllib3's own retries off: each call is one request, bounded by its timeout.

    By default urllib3 retries a read timeout or a dropped connection three times, GET and DELETE
    alike (both idempotent to it), and sleeps the ``Retry-After`` of a 429 or 503 (up to six hours) before
    each of three more tries: one call could take four request timeouts or sleep far past the send
    margin (docs/design.md §6), and a DELETE could go out again unseen by the send guard (no lease
    check, not marked sent). The pool manager is made from the configuration once, so it is made again.
    """
    api.configuration.retries = False
    api.rest_client.pool_manager.clear()
    api.rest_client = rest.RESTClientObject(api.configuration)
    return api


def retryable(exc: BaseException) -> bool | float:
    """How to retry a failed call (:class:`reaper.retry.Backoff`): False (final), True (exponential
    backoff), or the seconds the server asked for.

    429 (throttled: API Priority and Fairness) and 5xx are retried, after their ``Retry-After`` when
    it is a number of seconds ("delay-seconds", RFC 9110 section 10.2.3; the API server sends "1"),
    capped at :data:`RETRY_AFTER_CAP`; without one (or with an HTTP-date, which the API server never
    sends) after the backoff, as client-go does (``rest/request.go`` ``checkWait``). Timeouts and
    dropped connections back off; any other answer is final.
    """
    if isinstance(exc, ApiException):
        status = exc.status or 0  # 0: the client's own failure (TLS), no answer to retry
        if status != 429 and status < 500:
            return False
        value = str((exc.headers or {}).get("Retry-After") or "").strip()
        # ASCII digits only: str.isdigit alone takes "²" for a digit.
        return min(float(value), RETRY_AFTER_CAP) if value.isascii() and value.isdigit() else True
    return isinstance(exc, u3exc.HTTPError)


def answer(exc: BaseException | None) -> str:
    """A failed call's answer in a few words, for outcomes and logs (never the response's headers or body).

    None (a :class:`reaper.retry.GaveUp` with no last error) reads ``NoneType``."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return type(exc).__name__


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
    data: bytes = response.data  # urllib3's response (the client is untyped): its body, unread until now
    return data


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
