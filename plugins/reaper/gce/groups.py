"""Listing fleeting runners' managed instance groups (``gce.group_selector``): evidence for a rule that only reports.

Fleeting runners reattach to their instance group and adopt its instances on restart, so their
instances are not orphaned one by one; what can be left behind is a whole group whose manager was
decommissioned (docs/design.md §10, residual groups). One ``instanceGroupManagers.aggregatedList`` per
page and project (zonal and regional groups alike), every page token followed, through the same
pager as the instance listing. Groups whose name the selector does not match are dropped here.
Nothing in this module, or anywhere in the reaper, resizes or deletes a group.

A group listing that is not proven complete holds nothing (no group is ever deleted): it is
logged and counted among the scope's hygiene findings (``group_listing_incomplete``), and the
groups that were listed are still decided.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import msgspec

from reaper.config import GceConfig
from reaper.decoders import numeric_id
from reaper.gce.clients import ComputeClients
from reaper.gce.inventory import PAGE_SIZE, ApiWarning, Page, aggregated_scopes
from reaper.gce.quota import ProjectQuota
from reaper.model import GceGroup, ScopeListing
from reaper.retry import Backoff, Stop

log = logging.getLogger(__name__)
GROUP_FIELDS = "name,id,targetSize,currentActions"
GROUP_FIELD_MASK = f"items/*/instanceGroupManagers({GROUP_FIELDS}),items/*/warning,warning,nextPageToken,unreachables"
INCOMPLETE = "group_listing_incomplete"


class RawGroup(msgspec.Struct):
    """An ``InstanceGroupManager`` as the API answers it, the fields of ``GROUP_FIELDS`` (absent: empty or zero)."""

    name: str = ""
    id: str | int = ""
    targetSize: int = 0
    currentActions: dict[str, int] = {}


class ScopedGroups(msgspec.Struct):
    """One zone's or region's part of an aggregated group page."""

    instanceGroupManagers: list[RawGroup] = []
    warning: ApiWarning | None = None


GROUP_PAGE = msgspec.json.Decoder(Page[ScopedGroups])


def group_record(project: str, scope: str, igm: RawGroup) -> GceGroup:
    """An ``InstanceGroupManager`` listed under ``zones/Z`` or ``regions/R`` as the policy's record.

    Every managed instance has exactly one current action (``none`` when it is running and has
    nothing scheduled), so their sum is the number of instances the group holds; the target size
    counts too, for instances being created. A group without a name or a numeric id is refused.
    """
    name, ident = igm.name, numeric_id(igm.id)
    if not name or ident is None:
        raise ValueError(f"instance group manager {name or '?'} in {scope}: expected a name and a numeric id")
    held = sum(igm.currentActions.values())
    return GceGroup(project, scope.rsplit("/", 1)[-1], name, ident, max(held, igm.targetSize))


def list_groups(
    clients: ComputeClients,
    project: str,
    gce: GceConfig,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> ScopeListing:
    """The project's managed instance groups that ``gce.group_selector`` selects (list requests of its quota)."""
    quota = quota or ProjectQuota(gce.quota)
    listing = ScopeListing("gce", project)
    path = f"projects/{quote(project, safe='')}/aggregated/instanceGroupManagers"
    params: dict[str, str | int] = {"maxResults": PAGE_SIZE}  # read here: a test pages groups by 2
    pages = aggregated_scopes(
        clients, path, params, GROUP_FIELD_MASK, GROUP_PAGE, listing, backoff, timeout, quota, stop
    )
    for scope, scoped in pages:
        for igm in scoped.instanceGroupManagers:
            if gce.group_manager(igm.name) is None:
                continue
            try:
                listing.resources.append(group_record(project, scope, igm))
            except ValueError as exc:
                listing.problems.append(str(exc))
    return listing


def add_groups(
    listings: list[ScopeListing],
    clients: ComputeClients,
    gce: GceConfig,
    backoff: Backoff,
    timeout: float,
    quota: ProjectQuota | None = None,
    stop: Stop | None = None,
) -> None:
    """Append each project's selected groups to its instance listing, ``gce.list_concurrency`` projects at a time.

    A group listing's problems never make the instance listing incomplete (they would hold every
    instance delete of the project for a rule that deletes nothing): they are logged and counted as
    the hygiene finding ``group_listing_incomplete``.
    """
    if not gce.group_selector:
        return
    with ThreadPoolExecutor(max_workers=gce.list_concurrency, thread_name_prefix="gce-groups") as pool:
        found = list(pool.map(lambda x: list_groups(clients, x.scope, gce, backoff, timeout, quota, stop), listings))
    for listing, groups in zip(listings, found, strict=True):
        listing.resources += groups.resources
        if groups.problems:
            log.warning("managed instance groups of %s not listed completely: %s", listing.scope, groups.problems)
            listing.hygiene[INCOMPLETE] = listing.hygiene.get(INCOMPLETE, 0) + 1
