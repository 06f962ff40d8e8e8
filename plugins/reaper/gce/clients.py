"""Compute clients built from an Airflow connection (``google_cloud_default`` by default).

``ComputeEngineHook`` has neither list nor setLabels, so the clients are the SDK's
own ``compute_v1`` clients, built with the hook's credentials. Connection extras
``api_endpoint`` (e.g. an emulator's ``http://127.0.0.1:8085``) and
``anonymous: true`` (no credentials, for emulators) override the defaults. The
zone-operations client is built with the same client options: the SDK's
extended-operation poller would otherwise poll the real endpoint. Listing pages are read as
JSON on an authorized session of the same credentials, at the same endpoint
(:mod:`reaper.gce.inventory`).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials, with_scopes_if_required
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1
from requests import exceptions as rexc

# Transient failures worth a bounded retry: throttling, server errors, timeouts, dropped connections.
TRANSIENT = (gexc.TooManyRequests, gexc.ServerError, rexc.Timeout, rexc.ConnectionError)


def transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


@dataclass(frozen=True)
class ComputeClients:
    instances: compute_v1.InstancesClient
    operations: compute_v1.ZoneOperationsClient
    groups: compute_v1.InstanceGroupManagersClient
    http: AuthorizedSession  # the listing's pages, as JSON
    host: str  # the endpoint the SDK's clients call, with its scheme: https://compute.googleapis.com by default


def compute_clients(credentials: Credentials | None = None, api_endpoint: str | None = None) -> ComputeClients:
    options = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None
    credentials = credentials or AnonymousCredentials()
    instances = compute_v1.InstancesClient(credentials=credentials, client_options=options, transport="rest")
    return ComputeClients(
        instances,
        compute_v1.ZoneOperationsClient(credentials=credentials, client_options=options, transport="rest"),
        compute_v1.InstanceGroupManagersClient(credentials=credentials, client_options=options, transport="rest"),
        # Scoped as the SDK scopes them (credentials without scopes get its default ones).
        AuthorizedSession(with_scopes_if_required(credentials, None, default_scopes=instances.transport.AUTH_SCOPES)),
        instances.transport.host,
    )


def clients_from_connection(conn_id: str) -> ComputeClients:
    """Clients for the Airflow connection ``conn_id`` (google_cloud_platform type)."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    hook = GoogleBaseHook(gcp_conn_id=conn_id)
    extras = hook.get_connection(conn_id).extra_dejson
    anonymous = str(extras.get("anonymous", "")).lower() in ("1", "true", "yes")
    credentials = AnonymousCredentials() if anonymous else hook.get_credentials()
    return compute_clients(credentials, extras.get("api_endpoint") or None)
