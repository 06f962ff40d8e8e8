"""docs/design.md §3: phase presets, and config can only restrict them."""

import pytest

from reaper import rules
from reaper.config import ConfigError, RulesConfig, Settings
from reaper.config_reference import rows
from reaper.model import Evidence, Mode, Phase, WriterRecord
from reaper.policy.gce import HEARTBEAT_HOLDS
from reaper.policy.modes import blocking, effective_modes
from tests.builders import NOW, D, inst, plan, settings

OFF, REPORT, DELETE = Mode.OFF, Mode.REPORT, Mode.DELETE
TABLE = {
    Phase.TELEMETRY: (OFF, OFF, OFF, OFF),
    Phase.TERMINATED_CLEANUP: (DELETE, OFF, OFF, OFF),
    Phase.REPORT_ONLY: (DELETE, REPORT, REPORT, REPORT),
    Phase.ENFORCEMENT: (DELETE, DELETE, DELETE, DELETE),
}
RULES = ("terminated", "heartbeat_stale", "unlabeled_age", "sandbox_orphan")
GCE_HOLDS = ("inventory_incomplete", "writer_health_unknown", "writer_unhealthy", "budget_exceeded")


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


@pytest.mark.parametrize(
    ("phase", "gce", "k8s"),
    [
        (Phase.TELEMETRY, (), ()),
        (Phase.TERMINATED_CLEANUP, ("inventory_incomplete",), ()),
        (Phase.REPORT_ONLY, ("inventory_incomplete",), ()),
        (Phase.ENFORCEMENT, GCE_HOLDS, ("inventory_incomplete", "budget_exceeded")),
    ],
)
def test_a_hold_blocks_only_where_the_phase_deletes_a_rule_it_holds(
    phase: Phase, gce: tuple[str, ...], k8s: tuple[str, ...]
) -> None:
    modes = effective_modes(settings(), phase)
    assert blocking("gce", GCE_HOLDS, modes) == gce
    assert blocking("k8s", ("inventory_incomplete", "budget_exceeded"), modes) == k8s


def test_a_rule_turned_off_in_the_config_unblocks_its_holds() -> None:
    modes = effective_modes(settings(rules={"heartbeat_stale": "report"}), Phase.ENFORCEMENT)
    assert blocking("gce", GCE_HOLDS, modes) == ("inventory_incomplete",)


def test_the_policy_marks_the_blocking_holds_of_each_scope() -> None:
    stale = [inst(hb_age=D) for _ in range(4)]
    for phase, blocked in ((Phase.ENFORCEMENT, ["budget_exceeded"]), (Phase.REPORT_ONLY, [])):
        (verdict,) = plan(stale, phase=phase).scopes
        assert verdict.holds == ("budget_exceeded",) and list(verdict.blocking) == blocked
        assert verdict.as_dict()["blocking"] == blocked


def test_the_holds_of_a_protected_project_block_nothing() -> None:
    """A project just added to gce.protected_projects still trips its budget and its writer hold
    (the verdict says so), but nothing is deleted there whatever they say: they must not page."""
    stale = [inst(hb_age=D) for _ in range(4)]
    (held,) = plan(stale, phase=Phase.ENFORCEMENT).scopes
    assert held.blocking == ("budget_exceeded",)
    config = settings(gce={"protected_projects": [held.scope]})
    (protected,) = plan(stale, config=config, phase=Phase.ENFORCEMENT).scopes
    assert protected.holds == ("protected_scope", "budget_exceeded") and protected.blocking == ()
    unhealthy = Evidence(writer_health=[WriterRecord("m1", held.scope, NOW - 60, True)])
    (writer,) = plan(stale, evidence=unhealthy, config=config, phase=Phase.ENFORCEMENT).scopes
    assert "writer_unhealthy" in writer.holds and writer.blocking == ()
    assert blocking("gce", ("protected_scope", *GCE_HOLDS), effective_modes(config, Phase.ENFORCEMENT)) == ()


def test_the_config_has_one_key_per_rule_of_the_table_defaulting_to_its_highest_preset() -> None:
    # reaper.rules is the one list of rules: the config's keys, their defaults and what they accept follow it.
    assert tuple(RulesConfig.model_fields) == tuple(rule.name for rule in rules.RULES)
    reference = {key: (kind, default) for key, kind, default, _ in rows()}
    for rule in rules.RULES:
        assert getattr(Settings().rules, rule.name) is rule.ceiling == max(rule.presets.values()), rule.name
        allowed = [mode for mode in Mode if mode <= rule.ceiling]
        shown = ", ".join(f'`"{m}"`' if m is Mode.OFF else f"`{m}`" for m in allowed).rsplit(", ", 1)
        assert reference[f"rules.{rule.name}"] == (" or ".join(shown), f"`{rule.ceiling}`"), rule.name
        for mode in Mode:
            if mode in allowed:
                assert getattr(settings(rules={rule.name: str(mode)}).rules, rule.name) is mode
            else:
                with pytest.raises(ConfigError, match=rf"rules\.{rule.name}: expected off or report"):
                    settings(rules={rule.name: str(mode)})


def test_the_heartbeat_holds_are_the_heartbeat_rules_own() -> None:
    # Those the listing's hold (every rule's) leaves: what makes a stale heartbeat no proof (docs/design.md §4).
    assert HEARTBEAT_HOLDS == ("writer_health_unknown", "writer_unhealthy", "budget_exceeded")
    gce = [rule for rule in rules.RULES if rule.target == "gce"]
    assert {rule.name for rule in gce if set(HEARTBEAT_HOLDS) & set(rule.held_by)} == {"heartbeat_stale"}
