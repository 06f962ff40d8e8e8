"""Rollout phases as presets, and the effective mode of a rule (DESIGN.md section 3)."""

from __future__ import annotations

from reaper.config import Mode, Settings
from reaper.model import Phase

RULES = ("terminated", "heartbeat_stale", "unlabeled_age", "sandbox_orphan")
TARGET_OF_RULE = {
    "terminated": "gce",
    "heartbeat_stale": "gce",
    "unlabeled_age": "gce",
    "sandbox_orphan": "k8s",
}

_OFF, _REPORT, _DELETE = Mode.OFF, Mode.REPORT, Mode.DELETE
PRESETS: dict[Phase, dict[str, Mode]] = {
    Phase.TELEMETRY: dict.fromkeys(RULES, _OFF),
    Phase.TERMINATED_CLEANUP: {**dict.fromkeys(RULES, _OFF), "terminated": _DELETE},
    Phase.REPORT_ONLY: {**dict.fromkeys(RULES, _REPORT), "terminated": _DELETE},
    Phase.ENFORCEMENT: dict.fromkeys(RULES, _DELETE),
}


def effective_modes(config: Settings, phase: Phase) -> dict[str, Mode]:
    """The lower of the phase preset and ``rules.<rule>``: config can only restrict."""
    return {rule: min(PRESETS[phase][rule], getattr(config.rules, rule)) for rule in RULES}
