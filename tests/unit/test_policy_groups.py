"""Residual fleeting groups (docs/design.md §10): each row of reaper.policy.groups, the modes, the selector,
and that neither a group nor a group's member instance is ever deleted."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.config import ConfigError
from reaper.model import Action, Evidence, GceGroup, GceInstance, Mode, Phase
from reaper.policy.modes import effective_modes
from tests.builders import FLEETING, NOW, D, H, by_name, group, healthy, inst, plan, settings
from tests.unit.test_properties import PROPS, instances, phases, writer_health

CONFIG = settings(gce={"group_selector": FLEETING})
LIVE = frozenset({("m-live", "p1")})  # the (manager, project) pairs with a report within the quarantine


def decide(g: GceGroup, reporting=LIVE, config=CONFIG, phase=Phase.REPORT_ONLY) -> tuple[str, str | None, str]:
    evidence = Evidence(writer_health=healthy("p1"), reporting=reporting, swept=frozenset({("gce", g.project)}))
    return by_name(plan([g], evidence, config, phase))[g.name]


def test_row5_a_group_whose_manager_reported_nothing_within_the_quarantine_is_reported() -> None:
    assert decide(group("m-gone")) == ("report", "residual_group", "residual_group")


def test_row5_the_report_names_the_manager_and_what_the_group_holds() -> None:
    (decision,) = plan([group("m-gone", instances=7)], Evidence(reporting=LIVE), CONFIG, Phase.REPORT_ONLY).recorded
    assert decision.evidence == {"manager": "m-gone", "instances": 7, "quarantine_s": 4 * H}
    assert decision.resource.kind == "InstanceGroupManager" and decision.resource.uid.startswith("igm/")


def test_row4_a_manager_with_fresh_writer_health_reports_nothing() -> None:
    assert decide(group("m-live")) == ("keep", None, "manager_reporting")


def test_row4_the_manager_is_looked_up_in_the_groups_own_project() -> None:
    assert decide(group("m-live", project="p2")) == ("report", "residual_group", "residual_group")


def test_row3_unknown_writer_health_reports_nothing() -> None:
    assert decide(group("m-gone"), reporting=None) == ("keep", None, "writer_health_unknown")


def test_row2_a_group_holding_no_instance_reports_nothing() -> None:
    assert decide(group("m-gone", instances=0)) == ("keep", None, "group_empty")


def test_row1_a_protected_project_reports_nothing() -> None:
    config = settings(gce={"group_selector": FLEETING, "protected_projects": ["p1"]})
    assert decide(group("m-gone"), config=config) == ("keep", None, "protected_scope")


def test_a_group_the_selector_does_not_match_is_not_decided_at_all() -> None:
    g = group(name="web-frontend")
    p = plan([g], Evidence(reporting=frozenset(), swept=frozenset({("gce", "p1")})), CONFIG, Phase.ENFORCEMENT)
    assert p.decisions == [] and p.census["gce"]["p1"]["groups"]["listed"] == 0


def test_without_a_selector_no_group_is_decided_and_the_census_has_no_groups() -> None:
    p = plan([group("m-gone")], Evidence(reporting=frozenset(), swept=frozenset({("gce", "p1")})))
    assert p.decisions == [] and "groups" not in p.census["gce"]["p1"]


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (Phase.TELEMETRY, ("keep", None, "rule_off")),
        (Phase.TERMINATED_CLEANUP, ("keep", None, "rule_off")),
        (Phase.REPORT_ONLY, ("report", "residual_group", "residual_group")),
        (Phase.ENFORCEMENT, ("report", "residual_group", "residual_group")),
    ],
)
def test_the_rule_reports_from_report_only_on_and_is_counted_in_every_phase(phase: Phase, expected) -> None:
    g = group("m-gone", instances=4)
    evidence = Evidence(reporting=LIVE, swept=frozenset({("gce", "p1")}))
    p = plan([g, group("m-live")], evidence, CONFIG, phase)
    assert by_name(p)[g.name] == expected
    assert p.census["gce"]["p1"]["groups"] == {"listed": 2, "residual": 1, "residual_instances": 4}


def test_configured_off_reports_nothing() -> None:
    config = settings(gce={"group_selector": FLEETING}, rules={"residual_group": "off"})
    assert decide(group("m-gone"), config=config, phase=Phase.ENFORCEMENT) == ("keep", None, "rule_off")


def test_the_rules_mode_is_report_at_most_in_every_phase() -> None:
    assert {effective_modes(settings(), phase)["residual_group"] for phase in Phase} == {Mode.OFF, Mode.REPORT}


# --- config: the selector is the group -> manager mapping --------------------------------------


def test_the_selector_maps_a_whole_group_name_to_its_manager() -> None:
    gce = CONFIG.gce
    assert gce.group_manager("fleeting-runner-7") == "runner-7"
    assert gce.group_manager("xfleeting-runner-7") is None  # the whole name must match
    assert gce.group_manager("fleeting-") is None  # no manager, no fleeting group
    assert settings().gce.group_manager("fleeting-runner-7") is None  # no selector: nothing is selected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("fleeting-(.+)", "named group (?P<manager>...)"), ("fleeting-(?P<manager>", "expected a valid regex"), (5, "")],
)
def test_a_bad_selector_is_one_clear_error_naming_the_key(selector: object, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"gce\.group_selector") as error:
        settings(gce={"group_selector": selector})
    assert expected in str(error.value)


def test_delete_is_refused_for_the_rule() -> None:
    with pytest.raises(ConfigError, match=r"rules\.residual_group: expected off or report"):
        settings(rules={"residual_group": "delete"})


# --- group members are no instance rule's business ---------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": "TERMINATED", "stop_age": D},
        {"hb_age": 10 * H},
        {"created_age": 10 * D},
        {"hb": "garbage", "created_age": 10 * D},
    ],
)
def test_a_group_member_is_kept_whatever_an_instance_rule_would_find(kwargs) -> None:
    member = inst(group_member=True, **kwargs)
    assert one_decision(member) == ("keep", None, "group_member")
    assert one_decision(msgspec.structs.replace(member, group_member=False))[0] == "delete"


def one_decision(i: GceInstance) -> tuple[str, str | None, str]:
    """The decision of ``i`` beside a fresh VM: its project's managers stamp the heartbeat label."""
    return by_name(plan([i, inst(hb_age=60)], config=CONFIG))[i.name]


def test_group_members_count_in_the_budget_as_before() -> None:
    # Three stale members and one fresh non-member: 3 of 4 stale trips the budget for the stale non-member too.
    members = [inst(hb_age=10 * H, group_member=True) for _ in range(3)]
    stale = inst(hb_age=10 * H)
    p = plan([*members, stale, inst(hb_age=60)], config=CONFIG)
    assert by_name(p)[stale.name] == ("report", "heartbeat_stale", "budget_exceeded")
    assert p.census["gce"]["p1"]["by_finding"]["group_member"] == 3


# --- properties --------------------------------------------------------------------------------

groups = st.builds(
    GceGroup,
    project=st.sampled_from(["p1", "p2", "p3"]),
    location=st.just("us-east1-b"),
    name=st.sampled_from(["fleeting-m1", "fleeting-m2", "fleeting-", "web", "fleeting-m3"]),
    id=st.integers(1, 10**18).map(str),
    instances=st.integers(-1, 50),
)
reporting = st.one_of(
    st.none(),
    st.frozensets(st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.sampled_from(["p1", "p2", "p3"]))),
)


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(
    fleet=st.lists(st.one_of(instances(), groups), max_size=30),
    members=st.lists(st.booleans(), min_size=30, max_size=30),
    health=writer_health,
    seen=reporting,
    phase=phases,
    rule=st.sampled_from(["off", "report"]),
)
def test_no_input_deletes_a_group_or_a_group_member(fleet, members, health, seen, phase, rule) -> None:
    config = settings(
        gce={"group_selector": FLEETING},
        rules={"residual_group": rule},
        max_deletions_per_sweep=10**6,  # the cap counts deletes: a member no longer deleted may lift it
    )
    # Unique instance names: the decisions of the two plans are matched by name.
    rename = msgspec.structs.replace
    fleet = [rename(r, name=f"vm-{i}") if isinstance(r, GceInstance) else r for i, r in enumerate(fleet)]
    flagged = [
        msgspec.structs.replace(r, group_member=m) if isinstance(r, GceInstance) else r
        for r, m in zip(fleet, members, strict=False)
    ]
    evidence = Evidence(writer_health=health, reporting=seen, swept=frozenset({("gce", "p1")}))
    decided = plan(flagged, evidence, config, phase)
    unflagged = {d.resource.name: d for d in plan(fleet, evidence, config, phase).decisions}
    for d in decided.decisions:
        if isinstance(d.resource, GceGroup) or d.resource.group_member:
            assert d.action is not Action.DELETE, d
        else:  # an instance that is no member is decided exactly as if no instance were a member
            assert (d.action, d.reason) == (unflagged[d.resource.name].action, unflagged[d.resource.name].reason)
    reported = [d for d in decided.recorded if isinstance(d.resource, GceGroup)]
    assert all(d.action is Action.REPORT and d.reason == "residual_group" for d in reported)
    if seen is None or rule == "off" or phase in (Phase.TELEMETRY, Phase.TERMINATED_CLEANUP):
        assert reported == []


# --- where members and groups surface: a gcloud export, the metrics ------------------------------


def test_a_gcloud_export_marks_members_by_the_created_by_key() -> None:
    from include.emulators.shapes import gcloud_instance
    from reaper.decoders import RawInstance, gce_instance

    raw = gcloud_instance("p1", "us-east1-b", "m1-0", 7, "RUNNING", {"ci_ephemeral": "true"}, NOW)
    plain = msgspec.json.decode(msgspec.json.encode(raw), type=RawInstance)
    raw["metadata"] = {"items": [{"key": "startup-script", "value": "#!/bin/sh"}, {"key": "created-by", "value": "x"}]}
    member = msgspec.json.decode(msgspec.json.encode(raw), type=RawInstance)
    assert (gce_instance(plain).group_member, gce_instance(member).group_member) == (False, True)


def test_the_group_census_is_a_scope_gauge_by_state() -> None:
    from reaper.metrics import PushedSweep, scope_metrics
    from reaper.records import summary_of

    census = {"gce": {"p1": {"groups": {"listed": 3, "residual": 1, "residual_instances": 4}}}}
    summary = summary_of({"dag_id": "d", "run_id": "r", "census": census})
    sweep = PushedSweep("gce", summary, {}, (), full=True, completed=True, started_at=0, finished_at=1)
    (gauge,) = [m for m in scope_metrics(sweep, "p1") if m.name == "reaper_last_sweep_groups"]
    assert {s.labels["state"]: s.value for s in gauge.samples} == {"listed": 3, "residual": 1, "residual_instances": 4}
    empty = summary_of({"dag_id": "d", "run_id": "r", "census": {"gce": {"p1": {}}}})
    bare = PushedSweep("gce", empty, {}, (), full=True, completed=True, started_at=0, finished_at=1)
    assert "reaper_last_sweep_groups" not in {m.name for m in scope_metrics(bare, "p1")}
