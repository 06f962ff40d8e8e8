"""Every row of docs/design.md §4, with its boundaries."""

from __future__ import annotations

from typing import cast

import msgspec
import pytest

from reaper.model import Evidence, Override, Phase, WriterRecord
from reaper.vocabulary import Reason
from tests.builders import HB, NOW, D, H, M, by_name, healthy, inst, plan, settings

Q = 4 * H  # default max_job_timeout 3h + slack 1h


def one(i, **kwargs) -> tuple[str, str | None, str]:
    """The decision of ``i`` in a project whose managers stamp the heartbeat label (a fresh VM beside it: where no
    VM carries the label, its absence proves nothing, :func:`test_a_project_where_no_vm_carries_the_label_...`)."""
    return by_name(plan([i, inst(hb_age=M, project=i.project)], **kwargs))[i.name]


# --- heartbeat ------------------------------------------------------------------------------


def test_stale_heartbeat_is_deleted_in_enforcement() -> None:
    assert one(inst(hb_age=Q + 1)) == ("delete", "heartbeat_stale", "heartbeat_stale")


def test_heartbeat_exactly_at_quarantine_is_fresh() -> None:
    assert one(inst(hb_age=Q)) == ("keep", None, "fresh")


def test_quarantine_is_measured_on_the_label_not_instance_age() -> None:
    # A week-old instance with a fresh label is tracked; a young one with an old label is not.
    assert one(inst(hb_age=10 * M, created_age=7 * D))[0] == "keep"
    assert one(inst(hb_age=Q + 60, created_age=Q + 120))[0] == "delete"


def test_quarantine_follows_config() -> None:
    cfg = settings(gce={"max_job_timeout": "1h", "slack": "30m"})
    assert one(inst(hb_age=91 * M), config=cfg)[0] == "delete"
    assert one(inst(hb_age=90 * M), config=cfg)[0] == "keep"


def test_heartbeat_beyond_clock_skew_in_future_is_an_anomaly_never_deleted() -> None:
    i = inst(hb_age=-(5 * M + 1), created_age=30 * D)
    assert one(i) == ("report", "heartbeat_stale", "heartbeat_in_future")


def test_heartbeat_within_clock_skew_in_future_is_fresh() -> None:
    assert one(inst(hb_age=-5 * M)) == ("keep", None, "fresh")


def test_future_heartbeat_still_allows_terminated() -> None:
    i = inst(hb_age=-2 * H, status="TERMINATED", stop_age=1 * H)
    assert one(i) == ("delete", "terminated", "terminated")


def test_heartbeat_stamped_while_the_sweep_was_reading_is_fresh_not_in_future() -> None:
    # Ages are measured from the start of the listing (NOW); a label read 10 minutes later may carry
    # a beat newer than NOW + skew: in the future only relative to when it was read.
    ev = Evidence(writer_health=healthy("p1"), observed_until=NOW + 10 * M)
    assert one(inst(hb_age=-(10 * M + 5 * M)), evidence=ev) == ("keep", None, "fresh")
    assert one(inst(hb_age=-(10 * M + 5 * M + 1)), evidence=ev)[2] == "heartbeat_in_future"


def test_observed_until_never_ages_anything() -> None:
    ev = Evidence(writer_health=healthy("p1"), observed_until=NOW + 2 * H)
    assert one(inst(hb_age=Q), evidence=ev) == ("keep", None, "fresh")  # still measured at NOW


@pytest.mark.parametrize("raw", ["yesterday", "-5", "12.5", "", " 123", "0x1f", "١٢٣"])
def test_malformed_heartbeat_is_reported(raw: str) -> None:
    assert one(inst(hb=raw, created_age=1 * D)) == ("report", "heartbeat_stale", "heartbeat_malformed")


def test_malformed_heartbeat_counts_as_unlabeled_for_age() -> None:
    assert one(inst(hb="soon", created_age=3 * D + 1)) == ("delete", "unlabeled_age", "unlabeled_age")


def test_zero_heartbeat_is_older_than_any_instance() -> None:
    assert one(inst(hb="0")) == ("report", "heartbeat_stale", "heartbeat_before_creation")


# --- contradictory timestamps (docs/design.md §4, surprising evidence) -----------------------


def test_instance_created_in_the_future_with_a_stale_label_is_reported_not_deleted() -> None:
    assert one(inst(hb_age=Q + H, created_age=-2 * H)) == ("report", "heartbeat_stale", "created_in_future")


def test_unlabeled_instance_created_in_the_future_is_reported_under_the_age_rule() -> None:
    assert one(inst(created_age=-2 * H)) == ("report", "unlabeled_age", "created_in_future")


def test_creation_within_clock_skew_in_the_future_is_not_an_anomaly() -> None:
    assert one(inst(hb_age=-4 * M, created_age=-5 * M)) == ("keep", None, "fresh")


def test_terminated_instance_created_in_the_future_waits_out_its_grace_from_creation() -> None:
    assert one(inst(status="TERMINATED", stop_age=D, created_age=-2 * H))[0] == "report"
    assert one(inst(status="TERMINATED", stop_age=D, created_age=-2 * H, hb_age=H))[2] == "created_in_future"


def test_heartbeat_older_than_the_instance_is_an_anomaly_not_a_stale_heartbeat() -> None:
    # Created ten minutes ago, carrying a five-hour-old label: no job on it can be that old.
    assert one(inst(hb_age=5 * H, created_age=10 * M)) == ("report", "heartbeat_stale", "heartbeat_before_creation")


def test_heartbeat_before_creation_within_clock_skew_is_valid() -> None:
    assert one(inst(hb_age=Q + 1, created_age=Q + 1 - 5 * M)) == ("delete", "heartbeat_stale", "heartbeat_stale")


def test_heartbeat_before_creation_counts_as_unlabeled_for_age() -> None:
    assert one(inst(hb_age=5 * D, created_age=3 * D + 1)) == ("delete", "unlabeled_age", "unlabeled_age")


def test_heartbeat_before_creation_is_not_counted_by_the_budget() -> None:
    fleet = [inst(project="p1", hb_age=5 * H, created_age=10 * M) for _ in range(5)] + [inst(hb_age=Q + 1)]
    p = plan(fleet)
    assert p.scopes[0].details["labeled"] == 1 and p.scopes[0].holds == ()


def test_terminated_grace_runs_from_creation_when_the_stop_time_is_before_it() -> None:
    # Created two minutes ago, stopped "a day ago": the stop time is wrong; the grace runs from creation.
    assert one(inst(status="TERMINATED", stop_age=D, created_age=2 * M)) == ("keep", None, "no_finding")
    assert one(inst(status="TERMINATED", stop_age=D, created_age=11 * M))[0] == "delete"


# --- deletion protection and duplicates --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"hb_age": Q + 1}, "heartbeat_stale"),
        ({"status": "TERMINATED", "stop_age": H}, "terminated"),
        ({"created_age": 4 * D}, "unlabeled_age"),
    ],
)
def test_deletion_protected_instance_is_reported_instead_of_deleted(kwargs: dict, rule: str) -> None:
    i = inst(deletion_protection=True, **kwargs)
    assert one(i) == ("report", rule, "deletion_protected")
    assert plan([i]).decisions[0].evidence["deletion_protection"] is True


@pytest.mark.parametrize("value", ["false", "yes", "1", ""])
def test_an_opt_out_label_with_another_value_is_reported_not_deleted(value: str) -> None:
    i = inst(hb_age=Q + 1, labels={"reaper_keep": value})
    assert one(i) == ("report", "heartbeat_stale", "opt_out_malformed")
    assert one(inst(hb_age=M, labels={"reaper_keep": value})) == ("keep", None, "fresh")


def test_deletion_protection_without_a_finding_is_a_plain_keep() -> None:
    assert one(inst(hb_age=M, deletion_protection=True)) == ("keep", None, "fresh")


def test_the_same_instance_listed_twice_makes_the_listing_incomplete() -> None:
    stale = inst(hb_age=Q + 1, instance_id="42")
    p = plan([stale, stale, inst(hb_age=M)])
    assert [d.action.value for d in p.decisions if d.resource.id == "42"] == ["report", "report"]
    assert {d.reason for d in p.decisions if d.resource.id == "42"} == {"inventory_incomplete"}
    assert p.scopes[0].holds == ("inventory_incomplete",)
    assert p.deletes() == []


# --- absent label and age ---------------------------------------------------------------------


def test_unlabeled_young_instance_is_kept() -> None:
    assert one(inst(created_age=3 * D)) == ("keep", None, "no_finding")


def test_unlabeled_past_max_age_is_deleted() -> None:
    assert one(inst(created_age=3 * D + 1)) == ("delete", "unlabeled_age", "unlabeled_age")


def test_a_project_where_no_vm_carries_the_label_holds_its_unlabeled_age_deletes() -> None:
    """gce.heartbeat_label naming a label the managers never stamp (a typo, a renamed label): every VM reads as
    unlabeled. Its absence proves nothing then: reported, held by heartbeat_label_unseen, in that project only;
    TERMINATED VMs are still reaped (their rule reads no label)."""
    cfg = settings(gce={"heartbeat_label": "runner_heartbeat"})  # the managers stamp runner_manager_heartbeat
    old = [inst(hb_age=2 * D, created_age=4 * D) for _ in range(3)]  # under the stamped name, stale: no proof
    stopped = inst(status="TERMINATED", stop_age=D, created_age=4 * D)
    p = plan([*old, stopped], config=cfg)
    got = by_name(p)
    assert {got[i.name] for i in old} == {("report", "unlabeled_age", "heartbeat_label_unseen")}
    assert got[stopped.name] == ("delete", "terminated", "terminated")
    (verdict,) = p.scopes
    assert verdict.holds == (Reason.HEARTBEAT_LABEL_UNSEEN,)
    # One VM of the project carrying the configured label makes the others' lack of it evidence again.
    labeled = inst(hb=str(int(NOW) - 60), labels={"runner_heartbeat": str(int(NOW) - 60)})
    assert by_name(plan([*old, labeled], config=cfg))[old[0].name] == ("delete", "unlabeled_age", "unlabeled_age")


@pytest.mark.parametrize(
    ("labels", "rule", "reported"),
    [
        pytest.param({}, "unlabeled_age", ("unlabeled_age", "heartbeat_elsewhere"), id="no configured label"),
        pytest.param(
            {HB: "pending"}, "unlabeled_age", ("heartbeat_stale", "heartbeat_malformed"), id="a malformed label"
        ),
        pytest.param(
            {HB: str(int(NOW - 2 * D))},
            "heartbeat_stale",
            ("heartbeat_stale", "heartbeat_elsewhere"),
            id="a stale configured label",
        ),
    ],
)
def test_a_fresh_beat_under_another_label_is_a_heartbeat_all_the_same(labels, rule, reported) -> None:
    """A manager stamping another label name (renamed in its config or in ours) keeps its VMs alive under that
    name: a unix time within the quarantine under any label is something alive writing it, so neither the age nor
    the heartbeat finding is proof on that VM, even where other VMs carry the configured label fresh (which lifts
    heartbeat_label_unseen). Reported, never deleted; a TERMINATED one still goes."""
    beat = {"runner_heartbeat": str(int(NOW - 60))}
    vm = inst(created_age=4 * D, labels={**labels, **beat})
    assert one(vm) == ("report", *reported)
    (decision,) = [d for d in plan([vm, inst(hb_age=M)]).decisions if d.resource.name == vm.name]
    assert decision.evidence["heartbeat_elsewhere"] == "runner_heartbeat"
    assert Reason.HEARTBEAT_ELSEWHERE in cast(list[str], decision.evidence["findings"])
    # A stale value under the other name, or one older than the VM, is no beat: the finding stands.
    for stale in (str(int(NOW - Q - 60)), str(int(NOW - 5 * D))):
        assert one(inst(created_age=4 * D, labels={**labels, "runner_heartbeat": stale}))[2] == rule
    stopped = inst(created_age=4 * D, status="TERMINATED", stop_age=D, labels={**labels, **beat})
    assert one(stopped) == ("delete", "terminated", "terminated")


def test_vms_beating_elsewhere_still_count_as_stale_for_the_budget() -> None:
    """A rename that reached 7 of 10 VMs: all 10 carry the old label frozen, 3 carry no new one yet (the real API
    refuses a 65th label). The 7 are reported heartbeat_elsewhere, and still count in the budget's S: 10 of 10
    stale is writer breakage, so the 3 are held, not deleted."""
    beat = {"runner_heartbeat": str(int(NOW - M))}
    moved = [inst(hb_age=6 * H, labels=beat) for _ in range(7)]
    lagging = [inst(hb_age=6 * H) for _ in range(3)]
    got = by_name(plan([*moved, *lagging]))
    assert {got[i.name] for i in moved} == {("report", "heartbeat_stale", "heartbeat_elsewhere")}
    assert {got[i.name] for i in lagging} == {("report", "heartbeat_stale", "budget_exceeded")}


@pytest.mark.parametrize(
    ("value", "elsewhere"),
    [
        pytest.param(str(int(NOW - M) * 1000), True, id="milliseconds"),
        pytest.param(str(int(NOW - M) * 10**6), True, id="microseconds"),
        pytest.param(str(int(NOW - M) * 10**9), True, id="nanoseconds"),
        pytest.param(str(int(NOW + H)), True, id="an hour ahead: a clock ahead"),
        pytest.param("0" + str(int(NOW - M)), True, id="a leading zero"),
        pytest.param(str(int(NOW + 2 * D)), False, id="two days ahead: no time of a beat"),
        pytest.param("8123456789", False, id="a job id: the year 2227"),
        pytest.param("1" * 5000, False, id="five thousand digits"),
    ],
)
def test_what_reads_as_a_beat_under_another_label(value, elsewhere) -> None:
    """What another writer means by its number is unknown: seconds or milliseconds, up to a day ahead, count."""
    expected = ("report", "heartbeat_elsewhere") if elsewhere else ("delete", "heartbeat_stale")
    assert one(inst(hb_age=6 * H, labels={"other": value})) == (expected[0], "heartbeat_stale", expected[1])


def test_a_configured_label_too_long_to_be_a_time_is_malformed_not_a_crash() -> None:
    assert one(inst(hb="1" * 5000, created_age=1 * D)) == ("report", "heartbeat_stale", "heartbeat_malformed")
    assert one(inst(hb="1" * 21, created_age=4 * D)) == ("delete", "unlabeled_age", "unlabeled_age")


@pytest.mark.parametrize(
    "witness",
    [
        pytest.param(lambda: inst(hb_age=Q + H), id="a stale leftover of a renamed label"),
        pytest.param(lambda: inst(hb=""), id="an empty placeholder"),
        pytest.param(lambda: inst(hb="pending"), id="a malformed value"),
        pytest.param(lambda: inst(hb=str(int(NOW) + 2 * D)), id="a beat in the future"),
        pytest.param(lambda: inst(hb_age=M, labels={"reaper_keep": "true"}), id="an opted-out VM's fresh beat"),
        pytest.param(lambda: inst(hb_age=M, labels={"reaper_keep": "yes"}), id="a fresh beat beside an odd opt-out"),
    ],
)
def test_only_a_fresh_beat_on_a_vm_not_opted_out_shows_the_label_is_stamped(witness) -> None:
    """The label renamed on the managers leaves the old key on old VMs, with old values: the key's presence is no
    writer. Only a fresh valid heartbeat on a VM not opted out makes the others' lack of the label evidence."""
    old = inst(created_age=4 * D)  # live under the renamed label, which the config does not name
    p = plan([old, witness()])
    assert by_name(p)[old.name] == ("report", "unlabeled_age", "heartbeat_label_unseen")
    assert Reason.HEARTBEAT_LABEL_UNSEEN in p.scopes[0].holds
    assert by_name(plan([old, witness(), inst(hb_age=M)]))[old.name] == ("delete", "unlabeled_age", "unlabeled_age")
    # A group member's fresh beat is a stamp of the configured label all the same.
    stamped = plan([old, witness(), inst(hb_age=M, group_member=True)])
    assert by_name(stamped)[old.name] == ("delete", "unlabeled_age", "unlabeled_age")


def test_a_fresh_beat_shows_the_label_is_stamped_whatever_else_its_vm_has() -> None:
    """A VM stopped since its manager stamped it a minute ago is a witness of the label as much as a running one, and
    as a group member is: a VM's other findings never decide whether another VM's missing label is evidence."""
    old = inst(created_age=4 * D)
    stopped = inst(hb_age=M, status="TERMINATED", stop_age=H, created_age=2 * H)
    got = by_name(plan([old, stopped]))
    assert got[old.name] == ("delete", "unlabeled_age", "unlabeled_age")
    assert got[stopped.name] == ("delete", "terminated", "terminated")
    as_member = by_name(plan([old, msgspec.structs.replace(stopped, group_member=True)]))
    assert as_member[old.name] == got[old.name]


def test_the_label_unseen_hold_is_per_project_and_only_where_an_unlabeled_vm_is_old() -> None:
    young = inst(project="p2", created_age=1 * D)  # unlabeled, young: no finding, so nothing to hold
    old = inst(project="p1", created_age=4 * D)
    p = plan([old, young, inst(hb_age=M, project="p3")])
    holds = {v.scope: v.holds for v in p.scopes}
    assert holds == {"p1": (Reason.HEARTBEAT_LABEL_UNSEEN,), "p2": (), "p3": ()}


def test_labeled_old_instance_is_not_aged_out() -> None:
    assert one(inst(hb_age=M, created_age=30 * D))[0] == "keep"


# --- TERMINATED -------------------------------------------------------------------------------


def test_terminated_past_grace_since_last_stop() -> None:
    assert one(inst(status="TERMINATED", stop_age=10 * M + 1, hb_age=M)) == ("delete", "terminated", "terminated")


def test_terminated_exactly_at_grace_is_kept() -> None:
    assert one(inst(status="TERMINATED", stop_age=10 * M, hb_age=M))[0] == "keep"


def test_terminated_without_last_stop_measures_from_creation() -> None:
    assert one(inst(status="TERMINATED", created_age=11 * M, hb_age=M))[0] == "delete"
    assert one(inst(status="TERMINATED", created_age=9 * M, hb_age=M))[0] == "keep"


@pytest.mark.parametrize("status", ["STOPPING", "SUSPENDED", "STOPPED", "PROVISIONING", "REPAIRING"])
def test_other_statuses_are_not_terminated(status: str) -> None:
    assert one(inst(status=status, stop_age=D, hb_age=M))[0] == "keep"


# --- scope, opt-out, protection -------------------------------------------------------------


def test_instances_outside_the_selector_are_not_in_the_plan() -> None:
    p = plan([inst(selector=False, status="TERMINATED", stop_age=D)])
    assert p.decisions == []


def test_selector_requires_every_equality() -> None:
    cfg = settings(gce={"selector": {"ci_ephemeral": "true", "fleet": "x"}})
    p = plan([inst(hb_age=Q + 1), inst(hb_age=Q + 1, labels={"fleet": "x"})], config=cfg)
    assert len(p.decisions) == 1


def test_opt_out_label_keeps_everything() -> None:
    i = inst(status="TERMINATED", stop_age=D, hb_age=D, labels={"reaper_keep": "true"})
    assert one(i) == ("keep", None, "opt_out")


def test_protected_project_is_kept() -> None:
    cfg = settings(gce={"protected_projects": ["p1"]})
    p = plan([inst(status="TERMINATED", stop_age=D)], config=cfg)
    assert by_name(p) and all(r == ("keep", None, "protected_scope") for r in by_name(p).values())
    assert p.scopes[0].holds == ("protected_scope",)


# --- writer health ----------------------------------------------------------------------------


def _evidence(records: list[WriterRecord] | None) -> Evidence:
    return Evidence(writer_health=records)


def test_failing_writer_holds_heartbeat_deletes() -> None:
    ev = _evidence([WriterRecord("m1", "p1", NOW - 60, False), WriterRecord("m2", "p1", NOW - 60, True)])
    p = plan([i := inst(hb_age=D)], evidence=ev)
    assert by_name(p)[i.name] == ("report", "heartbeat_stale", "writer_unhealthy")
    assert p.scopes[0].verdict == "writer_unhealthy"
    assert p.scopes[0].details["unhealthy_writers"] == [{"manager": "m2", "problem": "failing"}]


def test_stale_writer_holds_heartbeat_deletes() -> None:
    ev = _evidence([WriterRecord("m1", "p1", NOW - 30 * M - 1, False)])
    assert one(inst(hb_age=D), evidence=ev) == ("report", "heartbeat_stale", "writer_unhealthy")


def test_writer_exactly_at_stale_after_is_healthy() -> None:
    ev = _evidence([WriterRecord("m1", "p1", NOW - 30 * M, False)])
    assert one(inst(hb_age=D), evidence=ev)[0] == "delete"


def test_writer_last_pass_in_future_is_unhealthy() -> None:
    ev = _evidence([WriterRecord("m1", "p1", NOW + 6 * M, False)])
    assert one(inst(hb_age=D), evidence=ev)[2] == "writer_unhealthy"


def test_writer_health_is_judged_when_it_was_read() -> None:
    # A pass that ended after the listing began but before the reports were read is healthy...
    ev = Evidence(writer_health=[WriterRecord("m1", "p1", NOW + 20 * M, False)], observed_until=NOW + 20 * M)
    assert one(inst(hb_age=D), evidence=ev)[0] == "delete"
    # ...and staleness counts up to the read, never back to the listing: later means stricter.
    ev = Evidence(writer_health=[WriterRecord("m1", "p1", NOW - 60, False)], observed_until=NOW + 30 * M)
    assert one(inst(hb_age=D), evidence=ev)[2] == "writer_unhealthy"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_writer_report_makes_the_project_unknown(value: float) -> None:
    records = [*healthy("p1"), WriterRecord("m-odd", "p1", value, False)]
    p = plan([inst(hb_age=Q + 1)], evidence=Evidence(writer_health=records))
    assert by_name(p).popitem()[1] == ("report", "heartbeat_stale", "writer_health_unknown")
    assert p.scopes[0].details["unhealthy_writers"] == [{"manager": "m-odd", "problem": "unreadable"}]


def test_unreadable_writer_health_holds() -> None:
    p = plan([i := inst(hb_age=D)], evidence=_evidence(None))
    assert by_name(p)[i.name] == ("report", "heartbeat_stale", "writer_health_unknown")
    assert "could not be read" in p.scopes[0].details["unknown_evidence"][0]


def test_a_dead_manager_beside_one_that_reports_is_reaped() -> None:
    # m1 stopped reporting while m2 of its project still does: the source answers for the project,
    # so m1's silence is its death, and its stale instances are what the reaper is for.
    ev = _evidence([WriterRecord("m2", "p1", NOW - 60, False), *healthy("other")])
    p = plan([i := inst(hb_age=D)], evidence=ev)
    assert by_name(p)[i.name] == ("delete", "heartbeat_stale", "heartbeat_stale")
    assert p.scopes[0].holds == () and "unknown_evidence" not in p.scopes[0].details


def test_no_series_for_a_project_with_instances_is_unknown_never_every_manager_dead() -> None:
    # A wrong project label, or a metric whose series name other projects only: silence proves no death.
    ev = _evidence([WriterRecord("m1", "other", NOW - 60, False)])
    p = plan([i := inst(hb_age=D), t := inst(status="TERMINATED", stop_age=D)], evidence=ev)
    assert by_name(p)[i.name] == ("report", "heartbeat_stale", "writer_health_unknown")
    assert by_name(p)[t.name][0] == "delete"  # the rules independent of the heartbeat still act
    assert "no series for this project (it did for 1 others)" in p.scopes[0].details["unknown_evidence"][0]


def test_an_answer_with_no_series_at_all_is_unknown_in_every_project() -> None:
    # A wrong metric name or Prometheus URL answers an empty vector: exactly this.
    p = plan([a := inst(hb_age=D, project="p1"), b := inst(hb_age=D, project="p2")], evidence=_evidence([]))
    assert by_name(p)[a.name][2] == by_name(p)[b.name][2] == "writer_health_unknown"
    assert [v.holds for v in p.scopes] == [("writer_health_unknown",)] * 2
    assert all("no series at all" in v.details["unknown_evidence"][0] for v in p.scopes)


def test_no_series_for_a_project_without_a_valid_heartbeat_holds_nothing() -> None:
    # No heartbeat delete there to hold: no writer hold, and its other rules act as ever: terminated deletes, and
    # unlabeled_age is held by its own hold (no fresh beat in the project shows the label's name is stamped).
    fleet = [
        t := inst(status="TERMINATED", stop_age=D),
        u := inst(created_age=4 * D),
        m := inst(hb="x", created_age=4 * D),
    ]
    p = plan(fleet, evidence=_evidence([]))
    assert p.scopes[0].holds == (Reason.HEARTBEAT_LABEL_UNSEEN,) and "unknown_evidence" not in p.scopes[0].details
    assert by_name(p)[t.name][0] == "delete"
    assert by_name(p)[u.name] == ("report", "unlabeled_age", "heartbeat_label_unseen")
    assert by_name(p)[m.name][0] == "report"


def test_writer_health_of_one_project_does_not_hold_another() -> None:
    ev = _evidence([WriterRecord("m1", "p1", NOW - 60, True), *healthy("p2")])
    p = plan([a := inst(hb_age=D, project="p1"), b := inst(hb_age=D, project="p2")], evidence=ev)
    assert by_name(p)[a.name][0] == "report" and by_name(p)[b.name][0] == "delete"


@pytest.mark.parametrize("records", [None, [WriterRecord("m", "p1", NOW, True)]])
def test_writer_holds_do_not_hold_terminated_or_age(records: list[WriterRecord] | None) -> None:
    fleet = [t := inst(status="TERMINATED", stop_age=D), u := inst(created_age=4 * D), inst(hb_age=M)]
    p = plan(fleet, evidence=_evidence(records))
    assert by_name(p)[t.name][0] == "delete" and by_name(p)[u.name][0] == "delete"


# --- budget -----------------------------------------------------------------------------------


P1 = frozenset({("gce", "p1")})  # an override naming project p1


def _fleet(stale: int, fresh: int, project: str = "p1") -> list:
    return [inst(hb_age=D, project=project) for _ in range(stale)] + [
        inst(hb_age=M, project=project) for _ in range(fresh)
    ]


def test_budget_trips_over_the_fraction() -> None:
    p = plan(_fleet(3, 2))
    assert {d.reason for d in p.decisions if d.action.value == "report"} == {"budget_exceeded"}
    assert not p.deletes()
    assert p.scopes[0].holds == ("budget_exceeded",)
    assert p.scopes[0].details["stale"] == 3 and p.scopes[0].details["labeled"] == 5


def test_budget_exactly_at_the_fraction_does_not_trip() -> None:
    assert len(plan(_fleet(3, 3)).deletes()) == 3


def test_budget_below_min_stale_does_not_trip() -> None:
    assert len(plan(_fleet(2, 0)).deletes()) == 2


def test_budget_counts_only_valid_labels() -> None:
    # 3 stale of 5 labeled trips; unlabeled instances do not dilute the fraction.
    fleet = _fleet(3, 2) + [inst(created_age=D) for _ in range(10)]
    assert not plan(fleet).deletes()


def test_budget_hold_is_per_project() -> None:
    p = plan(_fleet(3, 1, "p1") + _fleet(1, 3, "p2"))
    assert {d.resource.project for d in p.deletes()} == {"p2"}


def test_budget_does_not_hold_terminated() -> None:
    fleet = [*_fleet(3, 1), (t := inst(status="TERMINATED", stop_age=D, hb_age=M))]
    assert [d.resource.name for d in plan(fleet).deletes()] == [t.name]


def test_override_lifts_the_budget_hold_only() -> None:
    p = plan(_fleet(3, 1), override=Override("known writer outage fixed", "alice", P1))
    assert len(p.deletes()) == 3
    assert p.scopes[0].overridden == ("budget_exceeded",) and p.scopes[0].holds == ()
    ev = _evidence([WriterRecord("m", "p1", NOW, True)])
    held = plan(_fleet(3, 1), evidence=ev, override=Override("x", "alice", P1))
    assert not held.deletes()


def test_override_lifts_the_budget_hold_only_in_the_projects_it_names() -> None:
    # Both projects trip their budget; the operator reviewed p1 only: p2's hold stands (docs/design.md §6).
    p = plan(_fleet(3, 1, "p1") + _fleet(4, 1, "p2"), override=Override("INC-42: p1's manager crashed", "alice", P1))
    assert {d.resource.project for d in p.deletes()} == {"p1"} and len(p.deletes()) == 3
    verdicts = {v.scope: v for v in p.scopes}
    assert verdicts["p1"].overridden == ("budget_exceeded",) and verdicts["p1"].holds == ()
    assert verdicts["p2"].holds == ("budget_exceeded",) and verdicts["p2"].overridden == ()
    reported = {d.reason for d in p.decisions if d.resource.project == "p2" and d.action.value == "report"}
    assert reported == {"budget_exceeded"}


def test_override_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="override_reason"):
        Override("  ", "alice", P1)


def test_budget_thresholds_follow_config() -> None:
    cfg = settings(budget={"min_stale": 1, "max_stale_fraction": 0.2})
    assert not plan(_fleet(1, 3), config=cfg).deletes()


# --- incomplete listing -----------------------------------------------------------------------


def test_incomplete_listing_holds_every_delete_in_the_project() -> None:
    ev = Evidence(writer_health=healthy("p1", "p2"), incomplete=frozenset({("gce", "p1")}))
    fleet = [
        inst(status="TERMINATED", stop_age=D),
        inst(hb_age=D),
        inst(created_age=5 * D),
        inst(hb_age=D, project="p2"),
    ]
    p = plan(fleet, evidence=ev)
    assert [d.resource.project for d in p.deletes()] == ["p2"]
    assert {d.reason for d in p.decisions if d.resource.project == "p1"} == {"inventory_incomplete"}


def test_swept_project_without_instances_gets_a_verdict_and_a_zero_census() -> None:
    ev = Evidence(writer_health=healthy("p1"), swept=frozenset({("gce", "p1"), ("gce", "empty")}))
    p = plan([inst(hb_age=M)], evidence=ev)
    assert [v.scope for v in p.scopes] == ["empty", "p1"]
    assert p.scopes[0].holds == () and p.census["gce"]["empty"]["instances"] == 0


def test_swept_empty_project_with_an_incomplete_listing_shows_its_hold() -> None:
    ev = Evidence(writer_health=[], swept=frozenset({("gce", "p1")}), incomplete=frozenset({("gce", "p1")}))
    assert plan([], evidence=ev).scopes[0].holds == ("inventory_incomplete",)


# --- modes --------------------------------------------------------------------------------------


def test_report_only_reports_heartbeat_and_age_but_deletes_terminated() -> None:
    fleet = [s := inst(hb_age=D), t := inst(status="TERMINATED", stop_age=D), u := inst(created_age=5 * D)]
    got = by_name(plan(fleet, phase=Phase.REPORT_ONLY))
    assert got[s.name] == ("report", "heartbeat_stale", "heartbeat_stale")
    assert got[t.name] == ("delete", "terminated", "terminated")
    assert got[u.name] == ("report", "unlabeled_age", "unlabeled_age")


def test_terminated_cleanup_touches_only_terminated() -> None:
    fleet = [s := inst(hb_age=D), t := inst(status="TERMINATED", stop_age=D), f := inst(hb_age=-D)]
    got = by_name(plan(fleet, phase=Phase.TERMINATED_CLEANUP))
    assert got[t.name][0] == "delete"
    assert got[s.name] == ("keep", "heartbeat_stale", "rule_off")
    assert got[f.name] == ("keep", "heartbeat_stale", "rule_off")  # anomaly of an off rule: not reported


def test_telemetry_keeps_everything_but_still_counts() -> None:
    fleet = [inst(hb_age=D), inst(status="TERMINATED", stop_age=D, hb_age=D), inst(hb_age=M), inst(hb="x")]
    p = plan(fleet, phase=Phase.TELEMETRY)
    assert {d.action.value for d in p.decisions} == {"keep"}
    census = p.census["gce"]["p1"]
    assert census["instances"] == 4
    assert census["by_status"] == {"RUNNING": 3, "TERMINATED": 1}
    assert census["by_finding"]["heartbeat_stale"] == 2
    assert census["by_finding"]["terminated"] == 1
    assert census["by_finding"]["heartbeat_malformed"] == 1
    hist = census["heartbeat_age_seconds"]
    assert hist["count"] == 3 and hist["buckets"]["600"] == 1 and hist["buckets"]["28800"] == 1
    assert hist["buckets"]["86400"] == 3  # le buckets are inclusive: an age of exactly 1d counts here
    assert hist["buckets"]["+Inf"] == 3


def test_configured_mode_restricts_the_phase() -> None:
    cfg = settings(rules={"terminated": "report"})
    assert one(inst(status="TERMINATED", stop_age=D), config=cfg) == ("report", "terminated", "terminated")


def test_terminated_rule_off_falls_back_to_heartbeat() -> None:
    cfg = settings(rules={"terminated": "off"})
    assert one(inst(status="TERMINATED", stop_age=D, hb_age=D), config=cfg)[:2] == ("delete", "heartbeat_stale")


# --- global cap -------------------------------------------------------------------------------


def test_global_cap_exceeded_reports_everything() -> None:
    cfg = settings(max_deletions_per_sweep=2)
    fleet = [inst(status="TERMINATED", stop_age=D, hb_age=M, project=f"p{i}") for i in range(3)]
    p = plan(fleet, config=cfg, evidence=Evidence(writer_health=[]))
    assert not p.deletes()
    assert {d.reason for d in p.decisions} == {"max_deletions_exceeded"}
    assert p.capped == {"gce": 3}
    assert p.decisions[0].evidence["finding"] == "terminated"


def test_global_cap_exactly_reached_still_deletes() -> None:
    cfg = settings(max_deletions_per_sweep=3)
    fleet = [inst(status="TERMINATED", stop_age=D, hb_age=M) for _ in range(3)]
    assert len(plan(fleet, config=cfg).deletes()) == 3


def test_decisions_carry_their_evidence() -> None:
    d = plan([inst(hb_age=D)]).decisions[0]
    assert d.evidence["heartbeat"] == str(int(NOW - D))
    assert d.evidence["heartbeat_age_s"] == D
    assert d.evidence["findings"] == ["heartbeat_stale"]


def test_heartbeat_label_name_follows_config() -> None:
    cfg = settings(gce={"heartbeat_label": "hb"})
    i = inst(labels={"hb": str(int(NOW - D))})
    assert HB not in i.labels
    assert one(i, config=cfg)[0] == "delete"
