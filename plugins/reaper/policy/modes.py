"""Rollout phases as presets, and the effective mode of a rule (docs/design.md §3)."""

from __future__ import annotations

from reaper.config import Settings
from reaper.model import Mode, Phase

RULES = ("terminated", "heartbeat_stale", "unlabeled_age", "sandbox_orphan", "residual_group")
TARGET_OF_RULE = {
    "terminated": "gce",
    "heartbeat_stale": "gce",
    "unlabeled_age": "gce",
    "sandbox_orphan": "k8s",
    "residual_group": "gce",
}

_OFF, _REPORT, _DELETE = Mode.OFF, Mode.REPORT, Mode.DELETE
# residual_group (docs/design.md §10) only ever reports: from report-only on, never delete.
PRESETS: dict[Phase, dict[str, Mode]] = {
    Phase.TELEMETRY: dict.fromkeys(RULES, _OFF),
    Phase.TERMINATED_CLEANUP: {**dict.fromkeys(RULES, _OFF), "terminated": _DELETE},
    Phase.REPORT_ONLY: {**dict.fromkeys(RULES, _REPORT), "terminated": _DELETE},
    Phase.ENFORCEMENT: {**dict.fromkeys(RULES, _DELETE), "residual_group": _REPORT},
}


def effective_modes(config: Settings, phase: Phase) -> dict[str, Mode]:
    """The lower of the phase preset and ``rules.<rule>``: config can only restrict."""
    return {rule: min(PRESETS[phase][rule], getattr(config.rules, rule)) for rule in RULES}


# The rules whose deletes each scope hold stops (docs/design.md §4 and §5): a GCE listing that is
# not proven complete holds every rule, writer health and the budget only the heartbeat rule.
HELD_RULES: dict[str, dict[str, tuple[str, ...]]] = {
    "gce": {
        "inventory_incomplete": ("terminated", "heartbeat_stale", "unlabeled_age"),
        "writer_health_unknown": ("heartbeat_stale",),
        "writer_unhealthy": ("heartbeat_stale",),
        "budget_exceeded": ("heartbeat_stale",),
    },
    "k8s": {"inventory_incomplete": ("sandbox_orphan",), "budget_exceeded": ("sandbox_orphan",)},
}


def blocking(target: str, holds: tuple[str, ...], modes: dict[str, Mode]) -> tuple[str, ...]:
    """The holds that stop a delete in this phase: those holding a rule whose mode is ``delete``.

    A hold on a rule that only reports (or is off) changes nothing the phase would do: it is
    information, never a page. Nor does any hold of a protected scope: nothing is ever deleted
    there, so a budget or writer hold stops no delete the protection had not stopped already. The
    verdict still lists them (the audit view shows them); only the page goes.
    """
    if "protected_scope" in holds:
        return ()
    return tuple(h for h in holds if any(modes[r] is Mode.DELETE for r in HELD_RULES[target].get(h, ())))
