"""Listing managed Pods, Secrets (metadata only) and NetworkPolicies of a cluster, completely or not at all.

Cluster-wide lists (or, with ``k8s.namespaces``, one list per named namespace) with the
label selector, ``limit=500`` and ``continue`` tokens to the end. A ``410 Gone`` (the
continue token expired) restarts that list once; a second one, a continue token the server
already gave (a list that would never end), or any failure after retries (a namespace the
reaper may not list among them), marks the cluster incomplete, which holds every delete in it.
Pages are decoded by the structs and rules of ``kubectl`` exports (:mod:`reaper.decoders`), so that
both readers accept and refuse the same answers: one without ``items``, or with an item of another kind
than the one listed, is undecodable, which makes the cluster incomplete.
Hygiene findings (Pods without ``activeDeadlineSeconds``, objects without ``ownerReferences``)
are collected for the report: the seed design's two other defences.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import partial

import msgspec
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reaper.decoders import KubeList, item_kinds, k8s_object
from reaper.k8s.client import METADATA_ONLY, PATHS, answer, call, collection_paths, retryable, selector_string
from reaper.model import K8sObject, ScopeListing
from reaper.retry import Backoff

PAGE_SIZE = 500


_PAGE = msgspec.json.Decoder(KubeList)


def read_page(raw: bytes, cluster: str, kind: str) -> tuple[list[K8sObject], str]:
    """One answer of a list of ``kind``: its objects and its continue token (empty at the end).

    Raises ``ValueError`` (msgspec's decode errors are ones) for an answer that is no list of ``kind``.
    """
    page = _PAGE.decode(raw)
    return [k8s_object(item, cluster, kind) for item, _ in item_kinds(page, kind)], page.metadata.next


def hygiene(objects: list[K8sObject]) -> dict[str, int]:
    """Report-only findings, counted: the cluster's own defences missing on managed objects."""
    findings: Counter[str] = Counter()
    for obj in objects:
        if obj.kind == "Pod" and obj.active_deadline_seconds is None:
            findings["pod_without_active_deadline"] += 1
        if obj.owner_references == 0:
            findings["no_owner_reference"] += 1
    return dict(findings)


def list_kind(
    api: k8s.ApiClient,
    cluster: str,
    kind: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    page_size: int = PAGE_SIZE,
    namespaces: Sequence[str] = (),
) -> tuple[list[K8sObject], int, str | None]:
    """All objects of one kind, cluster-wide or in each named namespace: (objects, pages, problem or None).

    Secrets are metadata only. A problem in one namespace is the whole kind's: the cluster is incomplete.
    """
    objects: list[K8sObject] = []
    pages = 0
    for path in collection_paths(kind, namespaces):
        found, read, problem = _list_path(api, cluster, kind, path, selector, backoff, timeout, page_size)
        objects += found
        pages += read
        if problem:
            return objects, pages, problem
    return objects, pages, None


def _list_path(
    api: k8s.ApiClient,
    cluster: str,
    kind: str,
    path: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    page_size: int,
) -> tuple[list[K8sObject], int, str | None]:
    """One collection to its end: every page, an expired continue token restarting it once."""
    accept = METADATA_ONLY if kind == "Secret" else "application/json"
    restarts = 0
    while True:
        objects: list[K8sObject] = []
        pages, token = 0, ""
        seen: set[str] = set()
        try:
            while True:
                query: list[tuple[str, object]] = [("labelSelector", selector_string(selector)), ("limit", page_size)]
                if token:
                    query.append(("continue", token))
                # A 429's Retry-After is believed (capped); a listing has no delete guard to stop it.
                raw = backoff.call(partial(call, api, "GET", path, timeout, query, accept=accept), retryable)
                found, token = read_page(raw, cluster, kind)
                pages += 1
                objects += found
                if not token:
                    return objects, pages, None
                if token in seen:
                    return objects, pages, f"{kind}: the API repeated a continue token after {pages} pages"
                seen.add(token)
        except ApiException as exc:
            if exc.status == 410 and token and restarts == 0:
                restarts += 1
                continue  # the continue token expired: start this list again, once
            return objects, pages, f"{kind}: {answer(exc)}"
        except (msgspec.DecodeError, ValueError) as exc:
            return objects, pages, f"{kind}: undecodable answer: {exc}"
        except Exception as exc:
            return objects, pages, f"{kind}: {type(exc).__name__}: {exc}"


def list_cluster(
    api: k8s.ApiClient,
    cluster: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    page_size: int = PAGE_SIZE,
    namespaces: Sequence[str] = (),
) -> ScopeListing:
    listing = ScopeListing("k8s", cluster)
    managed: list[K8sObject] = []
    for kind in PATHS:
        objects, pages, problem = list_kind(api, cluster, kind, selector, backoff, timeout, page_size, namespaces)
        managed += objects
        listing.pages += pages
        if problem:
            listing.problems.append(problem)
    listing.resources += managed
    listing.hygiene = hygiene(managed)
    return listing
