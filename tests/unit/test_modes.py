"""DESIGN.md section 3: phase presets, and config can only restrict them."""

import pytest

from reaper.config import Mode
from reaper.model import Phase
from reaper.policy.modes import effective_modes
from tests.builders import settings

OFF, REPORT, DELETE = Mode.OFF, Mode.REPORT, Mode.DELETE
TABLE = {
    Phase.TELEMETRY: (OFF, OFF, OFF, OFF),
    Phase.TERMINATED_CLEANUP: (DELETE, OFF, OFF, OFF),
    Phase.REPORT_ONLY: (DELETE, REPORT, REPORT, REPORT),
    Phase.ENFORCEMENT: (DELETE, DELETE, DELETE, DELETE),
}
RULES = ("terminated", "heartbeat_stale", "unlabeled_age", "sandbox_orphan")


@pytest.mark.parametrize("phase", list(Phase))
def test_presets_with_default_rules(phase: Phase) -> None:
    modes = effective_modes(settings(), phase)
    assert tuple(modes[r] for r in RULES) == TABLE[phase]


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("configured", ["off", "report", "delete"])
def test_effective_mode_is_the_lower_of_phase_and_config(phase: Phase, configured: str) -> None:
    modes = effective_modes(settings(rules=dict.fromkeys(RULES, configured)), phase)
    for rule, preset in zip(RULES, TABLE[phase], strict=True):
        assert modes[rule] == min(preset, Mode[configured.upper()])
