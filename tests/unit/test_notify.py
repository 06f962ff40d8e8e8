"""The owners' notices (``reaper.notify``, docs/notifications.md): what each channel is told of a sweep, when it is
told again, and what a notice never quotes. Sending is tested against a local SMTP server
(tests/integration/test_notifications.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from reaper import notify
from reaper.config import ConfigError, NotificationsConfig, NotifyChannel, parse_settings
from reaper.model import Phase
from reaper.notifiers import as_html, slack_text
from reaper.notify import ChannelState, Event, Facts, Held, Row, Told
from reaper.records import PlanRef
from reaper.redact import text_for_log
from reaper.report.reasons import Limits, explain_hold
from reaper.sweep import steps
from reaper.sweep.notices import time_left
from reaper.sweep.overrides import Overrides
from reaper.sweep.targets import GceTarget
from tests.builders import NOW, D, H, M, inst, plan, settings

MAIL = NotifyChannel(kind="smtp", to=["owners@example.com"])
CONFIG = NotificationsConfig(channels=[MAIL], remind_after=timedelta(hours=6), max_listed=2)
RUN = "reaper_gce_enforcement run scheduled__1, execution 0, phase enforcement"
BUDGET = Held("p1", ("budget_exceeded",), ("budget_exceeded: 3 of 4 valid heartbeats are stale",), 3)


def facts(**fields: Any) -> Facts:
    swept = frozenset({"p1", "p2", notify.EVERY_SCOPE})
    return Facts(
        **{"target": "gce", "run": RUN, "key": "reaper_gce_enforcement/scheduled__1#0/tok", "swept": swept, **fields}
    )


def summary_of(resources: list, phase: Phase = Phase.ENFORCEMENT, cap: int = 500, **config: object) -> steps.Summary:
    """The summary ``evaluate_policy`` hands on, of a plan of ``resources`` (``tests.builders.plan``)."""
    p = plan(resources, config=settings(max_deletions_per_sweep=cap, **config), phase=phase)
    sweep_input = steps.SweepInput("", NOW, ["tok"], {}, {}, [])
    overrides = Overrides(None, cap, None)
    return steps.summarize(p, PlanRef(0, "tok", "cfg"), sweep_input, overrides, 0, "sre", False, False)


# --- what a sweep gives --------------------------------------------------------------------------


def test_a_budget_hold_is_a_held_scope_with_its_sides_in_words_and_the_deletes_it_held() -> None:
    stale = [inst(project="p1", hb_age=D) for _ in range(3)]
    summary = summary_of([*stale, inst(project="p1", hb_age=M), inst(project="p2", hb_age=D)])
    (held,) = notify.held_scopes(summary, Limits.of(settings()))
    assert (held.scope, held.holds, held.deletes) == ("p1", ("budget_exceeded",), 3)
    assert held.why == (
        "budget_exceeded: 3 of 4 valid heartbeats are stale, over the budget (over 50%, at least 3): "
        "more likely a broken writer than a broken fleet",
    )


@pytest.mark.parametrize(
    ("hold", "verdict", "expected"),
    [
        (
            "budget_exceeded",
            {"managed_runs": 4, "orphaned_runs": 3},
            "3 of 4 runs are orphans, over the budget (over 50%, at least 3): more likely a broken writer",
        ),
        (
            "writer_unhealthy",
            {"unhealthy_writers": [{"manager": "m1", "problem": "failing"}, {"manager": "m2", "problem": "stale"}]},
            "a heartbeat writer of the project is failing or stale (m1: failing, m2: stale), stale after 30 min",
        ),
        (
            "writer_health_unknown",
            {"unknown_evidence": ["writer health answered no series at all"], "unhealthy_writers": []},
            "the heartbeat writers' health is unknown: writer health answered no series at all",
        ),
        ("a_new_hold", {"token": "s3cr3t"}, "a_new_hold"),
    ],
)
def test_a_scope_hold_in_words_from_its_verdict(hold: str, verdict: dict[str, object], expected: str) -> None:
    assert explain_hold(hold, verdict, Limits.of(settings())).startswith(expected)


def test_an_incomplete_listing_says_why_in_the_apis_words_without_credentials() -> None:
    summary = summary_of([inst(project="p1", status="TERMINATED", stop_age=H)])
    problems = {"p1": ["page 2: ServiceUnavailable: GET https://u:pw@compute.example/zones?pageToken=T"]}
    summary = msgspec.structs.replace(summary, incomplete=problems)
    summary = msgspec.structs.replace(
        summary,
        scopes=[
            msgspec.structs.replace(
                summary.scopes[0], holds=["inventory_incomplete"], blocking=["inventory_incomplete"]
            )
        ],
    )
    (held,) = notify.held_scopes(summary, None)
    assert held.why == (
        "inventory_incomplete: the scope's listing was incomplete this sweep: nothing there is deleted "
        "(page 2: ServiceUnavailable: GET https://***@compute.example/zones)",
    )


def test_a_hold_on_a_rule_that_only_reports_tells_nobody() -> None:
    """``blocking`` holds only: in report-only, heartbeat_stale reports, so its budget hold stops no delete."""
    stale = [inst(project="p1", hb_age=D) for _ in range(3)]
    summary = summary_of([*stale, inst(project="p1", hb_age=M)], Phase.REPORT_ONLY)
    assert summary.scopes[0].holds == ["budget_exceeded"] and notify.held_scopes(summary, None) == ()


def test_a_plan_over_the_cap_is_a_hold_of_every_scope() -> None:
    summary = summary_of([inst(project="p1", status="TERMINATED", stop_age=H) for _ in range(3)], cap=2)
    (held,) = notify.held_scopes(summary, None)
    assert (held.scope, held.holds, held.deletes) == (notify.EVERY_SCOPE, ("max_deletions_exceeded",), 3)
    assert "planned 3 deletes, more than max_deletions_per_sweep (2): nothing was deleted" in held.why[0]


def test_a_row_names_the_resource_and_its_reason_in_words_never_evidence_it_was_not_written_for() -> None:
    outcome = {"scope": "c1", "uid": "u1", "result": "failed", "detail": "403 at https://bob:hunter2@api.example/x?t=1"}
    decision: dict[str, object] = {
        "resource_kind": "Pod",
        "location": "ci",
        "name": "sandbox-1",
        "reason": "sandbox_orphan",
    }
    decision["evidence"] = {"run": "r-7", "lease": "absent", "store": "terminal", "status": "succeeded"}
    r = notify.row(outcome, decision, None)
    assert (r.what, r.why) == (
        "Pod ci/sandbox-1",
        "run r-7: lease absent, run store says terminal (succeeded): an orphan",
    )
    assert "hunter2" not in r.detail and "t=1" not in r.detail and "***@api.example" in r.detail
    odd = notify.row(outcome, {**decision, "reason": "new_code", "evidence": {"token": "s3cr3t"}}, None)
    assert odd.why == "new_code"  # an unknown reason's raw evidence (a label value, a token) is not quoted
    assert notify.row({**outcome, "name": "Pod/ci/x"}, None, None).what == "Pod/ci/x"


def test_text_for_log_masks_credentials_in_urls_and_bare_userinfo() -> None:
    text = "GET https://u:p@h.example:8443/a?key=K failed; retry via admin:pw@10.0.0.1"
    assert text_for_log(text) == "GET https://***@h.example:8443/a failed; retry via ***@10.0.0.1"
    # Review findings: a password holding @, authorizations, secrets as key=value or JSON, a Slack webhook's
    # secret path; and an @ in a URL's path is no userinfo (RFC 3986: the authority ends at the first /).
    assert text_for_log("via u:p@ss@host") == "via ***@host"
    assert text_for_log("https://u:p%40ss@h/x") == "https://***@h/x"
    assert text_for_log("Authorization: Bearer abc.def") == "Authorization: Bearer ***"
    assert text_for_log("Authorization: Basic dXNlcjpwdw==") == "Authorization: Basic ***"
    assert text_for_log("host=db password=hunter2 user=x") == "host=db password=*** user=x"
    assert text_for_log('{"access_token": "ya29.abc", "x": 1}') == '{"access_token": "***", "x": 1}'
    iam = "https://iam.googleapis.com/v1/projects/p/serviceAccounts/r@p.iam.gserviceaccount.com:getIamPolicy"
    assert text_for_log(f"403 on {iam}") == f"403 on {iam}"  # which account was refused stays said
    assert text_for_log("GET https://k8s.example/a/b@ci") == "GET https://k8s.example/a/b@ci"
    assert text_for_log("POST https://hooks.slack.com/services/T0/B0/s3cr3t failed") == (
        "POST https://hooks.slack.com/*** failed"
    )
    assert text_for_log("503 Service Unavailable") == "503 Service Unavailable"


# --- held ----------------------------------------------------------------------------------------


def test_a_hold_is_told_when_it_starts_not_every_sweep_and_again_after_remind_after() -> None:
    quiet, (notice,) = notify.plan(MAIL, facts(held=(BUDGET,)), ChannelState(), NOW, CONFIG)
    assert notice.event is Event.HELD and notice.subject == "[reaper] gce: deletes held in p1"
    assert "p1: 3 deletes held this sweep\n  budget_exceeded: 3 of 4 valid heartbeats are stale" in notice.text
    assert RUN in notice.text and quiet == ChannelState()  # unsent, the channel's state stays as it was
    state = notify.told(quiet, notice)
    assert state.held == (Told("p1", ("budget_exceeded",), NOW),)
    assert notify.plan(MAIL, facts(held=(BUDGET,)), state, NOW + 5 * H, CONFIG)[1] == []
    (again,) = notify.plan(MAIL, facts(held=(BUDGET,)), state, NOW + 6 * H, CONFIG)[1]
    assert again.held == (Told("p1", ("budget_exceeded",), NOW + 6 * H),)


def test_a_hold_that_changes_is_told_at_once_and_one_that_ends_is_told_as_lifted() -> None:
    state = ChannelState(held=(Told("p1", ("budget_exceeded",), NOW), Told("p3", ("inventory_incomplete",), NOW)))
    writers = Held("p1", ("writer_unhealthy", "budget_exceeded"), ("writer_unhealthy: ...", "budget_exceeded: ..."), 3)
    (changed,) = notify.plan(MAIL, facts(held=(writers,)), state, NOW + M, CONFIG)[1]
    assert changed.subject == "[reaper] gce: deletes held in p1"
    # p3 was not swept this time (a run of some scopes only): its hold is not taken for lifted.
    assert changed.held is not None
    assert "No longer held" not in changed.text and Told("p3", ("inventory_incomplete",), NOW) in changed.held
    (lifted,) = notify.plan(MAIL, facts(swept=frozenset({"p1", "p3"})), state, NOW + M, CONFIG)[1]
    assert lifted.subject == "[reaper] gce: holds lifted in p1, p3"
    assert "No longer held: p1 (was budget_exceeded), p3 (was inventory_incomplete)" in lifted.text
    assert lifted.held == ()


# --- failed --------------------------------------------------------------------------------------

FAILED = (
    Row("p2", "instance us-east1-b/vm-a", "heartbeat 1 d old", "delete: 403 Forbidden"),
    Row("p2", "instance us-east1-b/vm-b", "heartbeat 1 d old", "delete: 403 Forbidden"),
    Row("p2", "instance us-east1-b/vm-c", "heartbeat 1 d old", ""),
)


def test_failed_deletes_are_told_per_scope_listing_at_most_max_listed_with_their_error() -> None:
    quiet, (notice,) = notify.plan(MAIL, facts(failed=FAILED), ChannelState(), NOW, CONFIG)
    assert notice.subject == "[reaper] gce: 3 deletes failed in p2"
    assert "- p2 instance us-east1-b/vm-a: heartbeat 1 d old\n  failed: delete: 403 Forbidden" in notice.text
    assert "vm-c" not in notice.text and "and 1 more (p2: 3 in all)" in notice.text
    state = notify.told(quiet, notice)
    assert notify.plan(MAIL, facts(failed=FAILED[:1]), state, NOW + H, CONFIG)[1] == []
    # A sweep of p2 without a failure ends it quietly: the next failure there is told at once.
    recovered, none = notify.plan(MAIL, facts(), state, NOW + H, CONFIG)
    assert none == [] and recovered.failing == ()
    assert notify.plan(MAIL, facts(failed=FAILED[:1]), recovered, NOW + 2 * H, CONFIG)[1]


def test_a_channel_is_told_only_the_events_it_asks_for() -> None:
    held_only = NotifyChannel(kind="slack", channel="#ci", events=["held"])
    _, notices = notify.plan(held_only, facts(held=(BUDGET,), failed=FAILED), ChannelState(), NOW, CONFIG)
    assert [n.event for n in notices] == [Event.HELD]


# --- the digest ----------------------------------------------------------------------------------


def test_the_digest_window_is_the_last_whole_period_then_from_where_the_last_one_ended() -> None:
    day = 86400.0
    midnight = NOW - NOW % day
    assert notify.digest_window(NOW, day, ChannelState()) == (midnight - day, midnight)
    assert notify.digest_window(NOW, day, ChannelState(digested_until=midnight)) is None
    assert notify.digest_window(NOW + 3 * day, day, ChannelState(digested_until=midnight)) == (
        midnight,
        midnight + 3 * day,
    )
    assert notify.digest_window(NOW, 0, ChannelState()) is None  # per sweep: no window


def test_the_digest_names_the_first_max_listed_counts_all_by_scope_and_says_the_window() -> None:
    why, at = "TERMINATED longer than the grace", "2026-11-28 03:00:00 UTC"
    rows = [Row("p1", f"instance z/vm-{i}", why, at=at) for i in range(2)]
    window = (NOW - D, NOW)
    deleted = notify.digest(["p1", "p1", "p1", "p2"], rows, window)
    quiet, (notice,) = notify.plan(MAIL, facts(), ChannelState(), NOW, CONFIG, deleted)
    assert notice.subject == "[reaper] gce: 4 resources deleted 2026-11-28 12:00:00 UTC to 2026-11-29 12:00:00 UTC"
    assert "By scope: p1 3, p2 1." in notice.text
    assert "- p1 instance z/vm-1: TERMINATED longer than the grace (deleted 2026-11-28 03:00:00 UTC)" in notice.text
    assert "and 2 more: the reaper audit view lists them." in notice.text
    assert quiet.digested_until is None and notify.told(quiet, notice).digested_until == NOW


def test_an_empty_digest_window_sends_nothing_and_counts_as_told() -> None:
    quiet, notices = notify.plan(MAIL, facts(), ChannelState(), NOW, CONFIG, notify.digest([], [], (NOW - D, NOW)))
    assert notices == [] and quiet.digested_until == NOW


def test_a_sweeps_own_digest_names_its_run() -> None:
    deleted = notify.digest(["p1"], [Row("p1", "instance z/vm-1", "TERMINATED longer than the grace")], None)
    (notice,) = notify.plan(MAIL, facts(), ChannelState(), NOW, CONFIG, deleted)[1]
    assert notice.subject == "[reaper] gce: 1 resource deleted" and f"Sweep: {RUN}." in notice.text
    state = notify.told(ChannelState(), notice)
    assert (state.digested_until, state.digested_sweep) == (None, facts().key)
    assert notify.plan(MAIL, facts(), state, NOW, CONFIG, deleted)[1] == []  # a retried record tells it once


# --- as sent -------------------------------------------------------------------------------------


def test_a_notice_is_escaped_for_mail_and_for_slack_so_a_name_is_never_markup() -> None:
    notice = notify.Notice(Event.DELETED, "[reaper] gce: <b>1</b> & more", "- p1 Pod ci/<!channel>: x")
    assert as_html(notice.text).endswith(">- p1 Pod ci/&lt;!channel&gt;: x</pre>")
    assert (
        slack_text(notice)
        == "*[reaper] gce: &lt;b&gt;1&lt;/b&gt; &amp; more*\n```\n- p1 Pod ci/&lt;!channel&gt;: x\n```"
    )


# --- config --------------------------------------------------------------------------------------


def test_notifications_are_off_by_default() -> None:
    off = parse_settings({}, "x").notifications
    assert off.channels == [] and off.remind_after == timedelta(hours=24) and off.digest_every == timedelta(hours=24)


@pytest.mark.parametrize(
    ("channel", "expected"),
    [
        ({"kind": "smtp"}, "notifications.channels.0: expected to, the addresses a kind smtp entry mails"),
        ({"kind": "smtp", "to": ["sre"]}, "notifications.channels.0: expected mail addresses (name@domain) in to"),
        ({"kind": "pager"}, "notifications.channels.0.kind: expected 'smtp', 'slack' or 'slack_webhook'"),
        ({"kind": "slack"}, "notifications.channels.0: expected channel, the Slack channel a kind slack entry posts"),
        ({"kind": "slack_webhook", "channel": "#x"}, "expected no channel for kind slack_webhook: its webhook posts"),
        ({"kind": "slack", "channel": "#x", "to": ["a@b.c"]}, "expected no to or from_email for kind slack"),
        ({"kind": "smtp", "to": ["a@b.c"], "events": ["paged"]}, "channels.0.events.0: expected 'held', 'failed' or"),
        ({"kind": "smtp", "to": ["a@b.c"], "targets": []}, "notifications.channels.0.targets: expected a non-empty"),
    ],
)
def test_a_bad_channel_names_file_key_and_expectation(channel: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_settings({"notifications": {"channels": [channel]}}, "reaper.yaml")
    assert str(error.value).startswith("invalid config reaper.yaml: ") and expected in str(error.value)


def test_a_channel_given_twice_and_a_reminder_every_sweep_are_refused() -> None:
    twice = {"channels": [{"kind": "smtp", "to": ["a@b.c"]}, {"kind": "smtp", "to": ["a@b.c"], "events": ["held"]}]}
    with pytest.raises(ConfigError) as error:
        parse_settings({"notifications": twice}, "x")
    assert "notifications.channels.1: expected each channel once: the same kind" in str(error.value)
    assert "as notifications.channels.0 (merge their events and targets)" in str(error.value)
    with pytest.raises(ConfigError) as error:
        parse_settings({"notifications": {"remind_after": "1m"}}, "x")
    assert "notifications.remind_after: expected at least 10m" in str(error.value)


def test_notices_never_wait_into_the_end_of_the_run_they_are_sent_in() -> None:
    """What the task writes after them (the channels' state, the summary: a ledger write each) must still fit."""
    config = settings()
    s = steps.Execution(config, GceTarget(config), Phase.ENFORCEMENT, steps.Ids("reaper_gce_enforcement", "r", 0))
    started = datetime.now(UTC) - config.run_timeout("gce") + timedelta(seconds=40)
    assert 40 - 25 - 1 < time_left(s, started) <= 40 - 25  # 2 x ledger.timeout 10s + 5s
    assert time_left(s, None) == float("inf")
