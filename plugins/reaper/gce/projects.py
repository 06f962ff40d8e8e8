"""Each configured GCE project resolved to its canonical id, once per sweep (docs/design.md §4).

The Compute API takes a project id or number in every ``projects/{project}`` path and names the
project by its id in the URLs it answers (``selfLink``, ``zone``): a sweep keyed by the configured
name would file a project configured by number under another name than its holds. So every
configured name is resolved first, with ``projects.get`` (one read request, answered with only
``name``, the id, and ``defaultServiceAccount``, the Compute Engine default service account
``PROJECT_NUMBER-compute@developer.gserviceaccount.com``: the Project's own ``id`` is no project
number). Then:

- a 404: no such project: unresolved (nothing is listed there; its listing is incomplete);
- any other failure (403 when the reaper may not read the project, throttling, a server error
  after retries, an answer without an id): an id names itself (an id starts with a letter, a
  number is all digits), its number stays unknown; a number is resolved by the ``selfLink`` of the
  first instance its listing answers (one listing request more, re-read when the project is
  listed by its id), else it is unresolved.

The list's own ``selfLink`` is not read: what the API puts there for a request by number is not
documented. Whatever resolved a project, its listing then proves every instance's ``selfLink``
names that id (:func:`reaper.gce.inventory.list_project`).
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import msgspec
from google.api_core import exceptions as gexc

from reaper.config import QuotaConfig
from reaper.decoders import gce_instance
from reaper.gce.clients import ComputeClients
from reaper.gce.inventory import instance_pages
from reaper.gce.quota import ProjectQuota, QuotaGroup
from reaper.model import Resolved, ScopeListing, is_project_number
from reaper.retry import Backoff, Stop

log = logging.getLogger(__name__)
# The Compute Engine default service account: PROJECT_NUMBER-compute@developer.gserviceaccount.com
# (Compute Engine docs, "Service accounts", default service account).
DEFAULT_SERVICE_ACCOUNT = re.compile(r"([0-9]{1,19})-compute@developer\.gserviceaccount\.com")
PROJECT_FIELDS = "name,defaultServiceAccount"  # projects.get's description: ask for the fields you need


class RawProject(msgspec.Struct):
    """The fields of ``PROJECT_FIELDS`` of a Project resource (absent: empty)."""

    name: str = ""
    defaultServiceAccount: str = ""


PROJECT = msgspec.json.Decoder(RawProject)


def get_project(
    clients: ComputeClients, name: str, backoff: Backoff, timeout: float, quota: ProjectQuota, stop: Stop | None = None
) -> RawProject:
    """``projects.get`` on the listing's session, with the bounded retry of a listing page; each try a read
    request of the project's quota share."""
    url = f"{clients.host}/compute/v1/projects/{quote(name, safe='')}"

    def once() -> bytes:
        quota.take(name, QuotaGroup.READ, stop=stop)
        response = clients.http.get(url, headers={"X-Goog-FieldMask": PROJECT_FIELDS}, timeout=timeout)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)
        return response.content

    return PROJECT.decode(backoff.call(once, quota.retryable(name), stop=stop, waited=quota.waited(name)))


def resolve_project(
    clients: ComputeClients,
    name: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota,
    stop: Stop | None = None,
) -> Resolved:
    """How one configured name resolves (the module's rules); no wait ``stop`` refuses (then as a failure)."""
    number = (name,) if is_project_number(name) else ()
    try:
        project = get_project(clients, name, backoff, timeout, quota, stop)
    except gexc.NotFound:
        return Resolved(name, (name,), how="projects.get", problem=f"projects.get: there is no project {name}")
    except Exception as exc:
        failed = f"projects.get failed: {type(exc).__name__}: {exc}"
    else:
        found = DEFAULT_SERVICE_ACCOUNT.fullmatch(project.defaultServiceAccount)
        numbers = number or ((found.group(1),) if found else ())
        if project.name and not is_project_number(project.name) and (number or project.name == name):
            return Resolved(project.name, (name,), numbers, how="projects.get")
        failed = f"projects.get of {name} answered the project {project.name!r}"
    log.warning("%s; resolving %s without it", failed, name)
    if not number:
        return Resolved(name, (name,), how=f"as configured: an id ({failed})")
    return first_instance(clients, name, selector, backoff, timeout, failed, quota, stop)


def first_instance(
    clients: ComputeClients,
    number: str,
    selector: dict[str, str],
    backoff: Backoff,
    timeout: float,
    failed: str,
    quota: ProjectQuota,
    stop: Stop | None = None,
) -> Resolved:
    """A project number resolved by the first instance its listing answers: the id its ``selfLink`` names."""
    probe = ScopeListing("gce", number)
    for _, scoped in instance_pages(clients, number, selector, probe, backoff, timeout, quota, stop):
        for raw in scoped.instances:
            try:
                project = gce_instance(raw).project
            except ValueError:
                continue
            if not is_project_number(project):
                return Resolved(project, (number,), (number,), how=f"first listing page ({failed})")
    why = "; ".join(probe.problems) or "it lists no in-scope instance"
    return Resolved(number, (number,), how="first listing page", problem=f"{failed}; no instance names its id: {why}")


def merge(found: list[Resolved]) -> list[Resolved]:
    """One entry per scope, in order of first appearance: two names of one project are one scope.

    A scope that any of its names failed to resolve is unresolved (its listing incomplete).
    """
    merged: dict[str, Resolved] = {}
    for entry in found:
        seen = merged.get(entry.scope)
        if seen is None:
            merged[entry.scope] = entry
            continue
        log.warning(
            "gce.projects: %s and %s are one project, %s: listed once", seen.configured, entry.configured, seen.scope
        )
        merged[entry.scope] = Resolved(
            entry.scope,
            seen.configured + entry.configured,
            tuple(dict.fromkeys(seen.numbers + entry.numbers)),
            "; ".join(dict.fromkeys((seen.how, entry.how))),
            "; ".join(p for p in (seen.problem, entry.problem) if p),
        )
    return list(merged.values())


def resolve_projects(
    clients: ComputeClients,
    names: list[str],
    selector: dict[str, str],
    concurrency: int,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> list[Resolved]:
    """Every configured name resolved, ``concurrency`` at a time; names of one project merged (:func:`merge`).

    Its calls are the projects' read (and, for a number ``projects.get`` cannot resolve, list) requests:
    counted against the reaper's share under the name configured, which is the project the API meters.
    """
    quota = quota or ProjectQuota(QuotaConfig())
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gce-resolve") as pool:
        found = pool.map(lambda n: resolve_project(clients, n, selector, backoff, timeout, quota, stop), names)
        return merge(list(found))
