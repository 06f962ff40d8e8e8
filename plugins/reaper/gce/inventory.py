"""Listing in-scope instances per project, with completeness proven rather than assumed.

One ``aggregated_list`` per page (``max_results=500``), the selector pushed down
as a server-side label filter, every page token followed to the end. A page that
fails after its retries, a top-level warning (``PARTIAL_SUCCESS``: "some results
may be missing"), a zone entry with a warning other than "no results", an
``unreachables`` entry, an instance listed twice (an instance created between
page reads shifts the pages) or an instance that cannot be normalized marks the
project's listing incomplete: the policy then holds every delete there.

Pages are read as JSON and decoded by typed ``msgspec`` structs (:class:`Page`), not through the
Compute SDK's protobuf parser: that parser is pure Python and took about 120 µs per instance, more
than everything else in a 100,000-instance listing. The request is the one the SDK sends (path,
``filter``, ``maxResults``, ``pageToken``, the field-mask header), on the clients' authorized
session, and an HTTP error becomes the same ``google.api_core`` exception. A page the structs
cannot decode (a field of the wrong type), or that repeats a key in one object (the SDK's parser
refused it; msgspec would keep the last value), fails like an unreadable page: the listing is
incomplete. Ids are read as the SDK read them (:func:`reaper.decoders.numeric_id`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar
from urllib.parse import quote

import msgspec
from google.api_core import exceptions as gexc

from reaper.config import QuotaConfig
from reaper.decoders import RawInstance, gce_instance
from reaper.gce.clients import ComputeClients
from reaper.gce.quota import ProjectQuota, QuotaGroup
from reaper.model import ScopeListing
from reaper.retry import Backoff, Stop

PAGE_SIZE = 500
HARMLESS_WARNINGS = ("NO_RESULTS_ON_PAGE",)
# Partial response: only what the rules read. A full instance is ~3 KB of JSON the SDK would parse.
# Of the metadata only the keys: ``created-by`` marks a managed instance group's member.
INSTANCE_FIELDS = (
    "name,id,status,zone,selfLink,labels,labelFingerprint,creationTimestamp,lastStopTimestamp,lastSuspendedTimestamp,"
    "deletionProtection,metadata/items/key"
)
# The top-level warning must stay in the mask: without it a partial answer reads as a complete one.
LIST_FIELD_MASK = f"items/*/instances({INSTANCE_FIELDS}),items/*/warning,warning,nextPageToken,unreachables"


class ApiWarning(msgspec.Struct):
    """A page's or a scope's warning; present at all (even empty) means the answer may be partial."""

    code: str = ""
    message: str = ""


class Scoped(Protocol):
    """A zone's or region's part of an aggregated page (:class:`ScopedInstances`, ``gce.groups.ScopedGroups``)."""

    @property
    def warning(self) -> ApiWarning | None: ...


S = TypeVar("S", bound=Scoped)


class ScopedInstances(msgspec.Struct):
    """One zone's part of an aggregated instance page."""

    instances: list[RawInstance] = []
    warning: ApiWarning | None = None


class Page(msgspec.Struct, Generic[S]):
    """One page of an aggregated list: zone or region -> its scoped list, and what says it is partial."""

    items: dict[str, S] = {}
    warning: ApiWarning | None = None
    unreachables: list[str] = []
    nextPageToken: str = ""


INSTANCE_PAGE = msgspec.json.Decoder(Page[ScopedInstances])


def label_filter(selector: dict[str, str]) -> str:
    """The Compute list filter for label equalities: ``labels.k = "v" AND ...``."""
    return " AND ".join(f'labels.{key} = "{value}"' for key, value in sorted(selector.items()))


# Every string of a JSON text, in order, and whether a colon follows it (then it is an object's key).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?', re.DOTALL)


def _keys(tree: object) -> int:
    """How many keys the objects of a decoded JSON tree hold (a repeated key counts once: a dict's)."""
    if isinstance(tree, dict):
        return len(tree) + sum(map(_keys, tree.values()))
    if isinstance(tree, list):
        return sum(map(_keys, tree))
    return 0


def decode_once_each(decoder: msgspec.json.Decoder[S], raw: bytes) -> S:
    """``decoder.decode(raw)``, refusing an answer with a key repeated in one object, as the SDK's parser did.

    msgspec, like most JSON parsers, keeps a repeated key's last value: a zone listed twice in one
    page would hide the first one's instances, a second ``warning`` erase a partial answer's. The
    keys written in the answer are counted exactly (once the text decodes, it is valid JSON, so
    scanning its strings from the start, each quote found opens a string, escapes and all) against
    those of the same answer decoded into dicts; any difference raises ``ValueError``, and the page
    is unreadable.
    """
    page = decoder.decode(raw)
    written = sum(1 for string in _STRING.finditer(raw) if string.group(1) is not None)
    if written != _keys(msgspec.json.decode(raw)):
        raise ValueError("a key is repeated in one object of the answer")
    return page


def aggregated_scopes(
    clients: ComputeClients,
    path: str,
    params: dict[str, str | int],
    field_mask: str,
    decoder: msgspec.json.Decoder[Page[S]],
    listing: ScopeListing,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota,
    stop: Stop | None = None,
) -> Iterator[tuple[str, S]]:
    """Each ``(zone or region, scoped list)`` of every page of an aggregated list at ``path`` (``params``: its
    query, ``maxResults`` included), decoded by ``decoder``.

    Every page token is followed to the end, each page with its own bounded retry, and each try a list
    request of the project's quota share (``listing.scope``); a used-up quota is waited for while
    ``stop`` allows. Why the answer is not proven complete (a failed or undecodable page, a page that
    could not be read before the run must stop, a partial answer, a scope warning other than "no
    results", an unreachable scope, a repeated token) goes to ``listing.problems``; ``listing.pages``
    counts the pages read.
    """
    url = f"{clients.host}/compute/v1/{path}"
    headers = {"X-Goog-FieldMask": field_mask}
    seen_tokens: set[str] = set()
    token = ""

    project = listing.scope

    def one_page() -> bytes:
        quota.take(project, QuotaGroup.LIST, stop=stop)
        query = {**params, **({"pageToken": token} if token else {})}
        response = clients.http.get(url, params=query, headers=headers, timeout=timeout)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)  # the SDK's own mapping: 429 and 5xx are transient
        return response.content

    while True:
        try:
            answer = backoff.call(one_page, quota.retryable(project), stop=stop, waited=quota.waited(project))
            page = decode_once_each(decoder, answer)
        except Exception as exc:
            listing.problems.append(f"page {listing.pages + 1}: {type(exc).__name__}: {exc}")
            return
        listing.pages += 1
        if page.warning is not None:
            listing.problems.append(f"page {listing.pages}: {page.warning.code}: {page.warning.message}")
        for scope, scoped in page.items.items():
            warning = scoped.warning
            if warning is not None and warning.code not in HARMLESS_WARNINGS:
                listing.problems.append(f"{scope}: {warning.code}: {warning.message}")
            yield scope, scoped
        listing.problems += [f"unreachable: {u}" for u in page.unreachables]
        token = page.nextPageToken
        if not token:
            return
        if token in seen_tokens:
            listing.problems.append(f"page {listing.pages}: the API repeated a page token")
            return
        seen_tokens.add(token)


def instance_pages(
    clients: ComputeClients,
    project: str,
    selector: dict[str, str],
    listing: ScopeListing,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> Iterator[tuple[str, ScopedInstances]]:
    """Each zone's part of every page of the project's in-scope instances (:func:`aggregated_scopes`)."""
    path = f"projects/{quote(project, safe='')}/aggregated/instances"
    params: dict[str, str | int] = {"filter": label_filter(selector), "maxResults": PAGE_SIZE}
    quota = quota or ProjectQuota(QuotaConfig())
    return aggregated_scopes(
        clients, path, params, LIST_FIELD_MASK, INSTANCE_PAGE, listing, backoff, timeout, quota, stop
    )


def list_project(
    clients: ComputeClients,
    project: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> ScopeListing:
    """The project's in-scope instances; ``project`` is its id (docs/design.md §4: projects by canonical id),
    within the reaper's share of its quotas (the defaults' when ``quota`` is not given), pages waited for
    no later than ``stop`` allows.

    An instance whose URLs name another project is none of this listing's: it is left out, and the
    listing is incomplete (a project is never learnt from what a listing answers).
    """
    listing = ScopeListing("gce", project)
    seen_ids: set[str] = set()
    for _, scoped in instance_pages(clients, project, selector, listing, backoff, timeout, quota, stop):
        for inst in scoped.instances:
            try:
                record = gce_instance(inst)
            except ValueError as exc:
                listing.problems.append(str(exc))
                continue
            if record.project != project:
                where = f"project {record.project}, not {project}"
                listing.problems.append(f"instance {record.id} ({record.name}): its selfLink names {where}")
                continue
            if record.id in seen_ids:
                listing.problems.append(f"instance {record.id} ({record.name}) listed twice: the pages moved")
            seen_ids.add(record.id)
            listing.resources.append(record)
    return listing


def list_projects(
    clients: ComputeClients,
    projects: list[str],
    selector: dict[str, str],
    concurrency: int,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> list[ScopeListing]:
    """Every project's listing, ``concurrency`` projects at a time, in the order given."""
    quota = quota or ProjectQuota(QuotaConfig())
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gce-list") as pool:
        return list(pool.map(lambda p: list_project(clients, p, selector, backoff, timeout, quota, stop), projects))
