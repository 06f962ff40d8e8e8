"""Compute clients built from an Airflow connection (``google_cloud_default`` by default).

``ComputeEngineHook`` has neither list nor setLabels, so the clients are the SDK's
own ``compute_v1`` clients, built with the hook's credentials. Connection extras
``api_endpoint`` (e.g. an emulator's ``http://127.0.0.1:8085``) and
``anonymous: true`` (no credentials, for emulators) override the defaults. The
zone-operations client is built with the same client options: the SDK's
extended-operation poller would otherwise poll the real endpoint. Listing pages are read as
JSON on an authorized session of the same credentials, at the same endpoint
(:mod:`reaper.gce.inventory`).

Every request says who sends it (``x-goog-api-client: reaper/...``, where the SDK puts its client
info): a project's rate quotas are shared with its runner managers, and the emulator tells the
callers apart by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.api_core.gapic_v1.client_info import ClientInfo
from google.auth.credentials import AnonymousCredentials, Credentials, with_scopes_if_required
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1
from requests import exceptions as rexc

from reaper import __version__

USER_AGENT = f"reaper/{__version__}"
# Transient failures worth a bounded retry with backoff: server errors, timeouts, dropped connections.
# Throttling (429, a used-up quota) is not among them: it waits for the quota to refill (reaper.gce.quota).
TRANSIENT = (gexc.ServerError, rexc.Timeout, rexc.ConnectionError)
# How the Compute API says a rate quota is used up: HTTP 403 with reason ``rateLimitExceeded`` (domain
# ``usageLimits``), refilled at the next synchronized minute (Compute Engine docs, "Rate quotas";
# google.rpc ErrorInfo spells the reason RATE_LIMIT_EXCEEDED). Throttling, never a permission failure.
RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})


def transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


def throttled(exc: BaseException) -> bool:
    """A used-up rate quota (403 ``rateLimitExceeded``) or other throttling (429, ``RESOURCE_EXHAUSTED``).

    A 403 for any other reason (a missing permission) is final, as before.
    """
    if isinstance(exc, gexc.TooManyRequests):
        return True
    if isinstance(exc, gexc.Forbidden):
        reasons = {error.get("reason") for error in exc.errors if isinstance(error, dict)} | {exc.reason}
        return bool(reasons & RATE_LIMIT_REASONS)
    return False


class _ClientArgs(TypedDict):
    """The keyword arguments every Compute SDK client of :func:`compute_clients` is made with."""

    credentials: Credentials
    client_options: ClientOptions | None
    transport: str
    client_info: ClientInfo


@dataclass(frozen=True)
class ComputeClients:
    instances: compute_v1.InstancesClient
    operations: compute_v1.ZoneOperationsClient
    groups: compute_v1.InstanceGroupManagersClient
    http: AuthorizedSession  # the listing's pages, as JSON
    host: str  # the endpoint the SDK's clients call, with its scheme: https://compute.googleapis.com by default


def compute_clients(
    credentials: Credentials | None = None, api_endpoint: str | None = None, user_agent: str = USER_AGENT
) -> ComputeClients:
    options = ClientOptions(api_endpoint=api_endpoint) if api_endpoint else None
    credentials = credentials or AnonymousCredentials()
    info = ClientInfo(user_agent=user_agent)
    kwargs: _ClientArgs = {
        "credentials": credentials,
        "client_options": options,
        "transport": "rest",
        "client_info": info,
    }
    instances = compute_v1.InstancesClient(**kwargs)
    # Scoped as the SDK scopes them (credentials without scopes get its default ones).
    http = AuthorizedSession(with_scopes_if_required(credentials, None, default_scopes=instances.transport.AUTH_SCOPES))
    # The SDK's clients name themselves in x-goog-api-client (their User-Agent is requests'): so does this one.
    http.headers.update({"User-Agent": user_agent, "x-goog-api-client": user_agent})
    clients = ComputeClients(
        instances,
        compute_v1.ZoneOperationsClient(**kwargs),
        compute_v1.InstanceGroupManagersClient(**kwargs),
        http,
        instances.transport.host,
    )
    for session in sessions(clients):
        environment_once(session, clients.host)
    return clients


def sessions(clients: ComputeClients) -> list[requests.Session]:
    """Every HTTP session the clients send on: the listing's, and each SDK client's REST transport's."""
    sdk = (clients.instances, clients.operations, clients.groups)
    found = [getattr(client.transport, "_session", None) for client in sdk]  # the REST transport's session
    return [clients.http, *(s for s in found if isinstance(s, requests.Session))]


def environment_once(session: requests.Session, url: str) -> None:
    """Resolve requests' environment settings for ``url`` once, on the session, instead of on every request.

    With ``trust_env`` (the default) requests reads, for every request, the proxy variables (and whether
    ``url`` bypasses them), the CA-bundle variables and ``~/.netrc``: environment scans and file checks that the
    delete threads pay for under one GIL (14% of their samples in ``bench/sweep.py``). Here the proxies that
    apply to ``url`` (``no_proxy`` honoured) and the CA bundle are taken from the environment once, as requests
    would, and kept on the session. ``~/.netrc`` is not read any more, which for these sessions is a fix: requests
    applies a netrc entry for the endpoint as basic auth over the credentials' bearer token.
    """
    settings = session.merge_environment_settings(url, {}, None, None, None)
    session.proxies, session.verify = settings["proxies"], settings["verify"]
    session.trust_env = False


def clients_from_connection(conn_id: str) -> ComputeClients:
    """Clients for the Airflow connection ``conn_id`` (google_cloud_platform type)."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    hook = GoogleBaseHook(gcp_conn_id=conn_id)
    extras = hook.get_connection(conn_id).extra_dejson
    anonymous = str(extras.get("anonymous", "")).lower() in ("1", "true", "yes")
    credentials = AnonymousCredentials() if anonymous else hook.get_credentials()
    return compute_clients(credentials, extras.get("api_endpoint") or None)
