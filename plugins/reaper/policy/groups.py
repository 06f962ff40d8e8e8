"""Residual fleeting groups (docs/design.md §10): reported, never deleted.

Fleeting runners reattach to their managed instance group and adopt its instances on restart, so
their instances are never orphaned one by one; what is left behind is a group whose manager was
decommissioned while it still held instances. The group -> manager mapping is
:meth:`reaper.config.GceConfig.group_manager` (``gce.group_selector``); the manager is looked up in
the group's own project, as the (manager, project) pair writer health reports under, so "no
writer health" is decided from the same series the writer-health hold reads. The rows, first
that applies decides:

| # | condition | reason | action |
|---|---|---|---|
| 1 | the group's project is protected | ``protected_scope`` | keep |
| 2 | the group holds no instance | ``group_empty`` | keep |
| 3 | writer-health reports unknown (unread, unreadable, too little history) | ``writer_health_unknown`` | keep |
| 4 | its manager reported within the quarantine | ``manager_reporting`` | keep |
| 5 | otherwise | ``residual_group`` | report (``off`` in telemetry and terminated-cleanup) |

No row yields a delete, whatever the mode: the rule's mode is at most ``report`` (config refuses
``delete``) and its finding is built as a report here, never through ``ACTION_OF_MODE``.
"""

from __future__ import annotations

from collections import defaultdict

from reaper.config import Settings
from reaper.model import Action, Decision, Evidence, GceGroup, Mode
from reaper.policy.projects import ProjectNames
from reaper.rules import RESIDUAL_GROUP
from reaper.vocabulary import Reason

TARGET = "gce"


def evaluate_groups(
    groups: list[GceGroup], evidence: Evidence, config: Settings, mode: Mode
) -> tuple[list[Decision], list[tuple[str, Reason, list[GceGroup]]], dict[str, dict[str, int]]]:
    """Decide every selected group: its reports, plain-keep groups by reason, and the census per project.

    The census (``listed``, ``residual`` and the instances the residual groups hold) is counted
    whatever the mode, as the other censuses are.
    """
    recorded: list[Decision] = []
    kept: dict[Reason, list[GceGroup]] = defaultdict(list)
    census: dict[str, dict[str, int]] = defaultdict(empty_census)
    names = ProjectNames(evidence.resolved)
    reporting = names.reporting(evidence.reporting)
    for group in groups:
        manager = config.gce.group_manager(group.name)
        if manager is None:  # not a fleeting group (the listing selects already; an export may not)
            continue
        counts = census[group.project]
        counts["listed"] += 1
        reason = _row(group, manager, reporting, config, names)
        if reason != Reason.RESIDUAL_GROUP:
            kept[reason].append(group)
            continue
        counts["residual"] += 1
        counts["residual_instances"] += group.instances
        if mode is Mode.OFF:
            kept[Reason.RULE_OFF].append(group)
            continue
        facts: dict[str, object] = {
            "manager": manager,
            "instances": group.instances,
            "quarantine_s": config.gce.quarantine.total_seconds(),
        }
        recorded.append(Decision(TARGET, group, Action.REPORT, RESIDUAL_GROUP.name, RESIDUAL_GROUP.finding, facts))
    return recorded, [(TARGET, reason, found) for reason, found in kept.items()], dict(census)


def empty_census() -> dict[str, int]:
    """A project's group census before any group is counted."""
    return {"listed": 0, "residual": 0, "residual_instances": 0}


def _row(
    group: GceGroup,
    manager: str,
    reporting: frozenset[tuple[str, str]] | None,
    config: Settings,
    names: ProjectNames,
) -> Reason:
    """The first row of the module's table that applies to ``group`` (``reporting`` labelled by project id)."""
    if names.protected_by(group.project, config.gce.protected_projects) is not None:
        return Reason.PROTECTED_SCOPE
    if group.instances <= 0:
        return Reason.GROUP_EMPTY
    if reporting is None:
        return Reason.WRITER_HEALTH_UNKNOWN
    if (manager, group.project) in reporting:
        return Reason.MANAGER_REPORTING
    return Reason.RESIDUAL_GROUP
