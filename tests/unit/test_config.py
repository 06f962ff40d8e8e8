"""Config: documented defaults, and one clear message (file, key, expectation) for each kind of bad config."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from reaper.config import DEFAULT_CONFIG, ConfigError, load_config, parse_settings
from reaper.model import Mode


def test_defaults_match_design() -> None:
    s = parse_settings({}, "x")
    assert s.gce.selector == {"ci_ephemeral": "true"}
    assert s.gce.heartbeat_label == "runner_manager_heartbeat"
    assert s.gce.quarantine == timedelta(hours=4)
    assert s.gce.clock_skew == timedelta(minutes=5)
    assert s.gce.terminated_grace == timedelta(minutes=10)
    assert s.gce.unlabeled_max_age == timedelta(days=3)
    assert s.gce.writer_stale_after == timedelta(minutes=30)
    assert s.gce.opt_out_label == ("reaper_keep", "true")
    assert s.gce.protected_projects == []
    assert s.k8s.selector == {"iterion.io/managed": "true"}
    assert s.k8s.run_label == "iterion.io/run-id"
    assert s.k8s.terminal_statuses == ["succeeded", "failed", "cancelled"]
    assert s.k8s.min_age == timedelta(minutes=5)
    assert s.k8s.results_sidecar == "results-egress"
    assert s.k8s.opt_out_label == ("reaper.io/keep", "true")
    assert s.k8s.protected_namespaces == ["kube-system"]
    assert s.k8s.lease_source == "nats"
    assert (s.budget.min_stale, s.budget.max_stale_fraction) == (3, 0.5)
    assert s.max_deletions_per_sweep == 500
    assert all(getattr(s.rules, r) is Mode.DELETE for r in ("terminated", "heartbeat_stale", "unlabeled_age"))


def test_gce_labels_as_the_api_takes_them_are_valid_and_kubernetes_keeps_its_own_syntax() -> None:
    s = parse_settings(
        {
            "gce": {"selector": {"ci_ephemeral": "", "équipe": "ci-2"}, "heartbeat_label": "b" * 63},
            "k8s": {"selector": {"iterion.io/managed": "true"}},
        },
        "reaper.yaml",
    )
    assert s.gce.selector == {"ci_ephemeral": "", "équipe": "ci-2"} and s.k8s.selector == {"iterion.io/managed": "true"}


def test_bundled_config_is_valid() -> None:
    assert load_config(DEFAULT_CONFIG).gce.projects


def test_reaper_config_env_overrides_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gce: {slack: 2h}\n")
    monkeypatch.setenv("REAPER_CONFIG", str(path))
    assert load_config().gce.slack == timedelta(hours=2)


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "reaper.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gce: {heartbeat_lable: x}\n", "gce.heartbeat_lable: unknown key"),
        ("colour: blue\n", "colour: unknown key"),
        ("gce: {selector: {}}\n", "gce.selector: expected a non-empty value"),
        ("gce: {selector: {ci_ephemeral: true}}\n", "gce.selector.ci_ephemeral: expected a string"),
        ("gce: {slack: -3h}\n", "gce.slack: expected a non-negative duration"),
        ("gce: {slack: 3600}\n", "gce.slack: expected a duration such as 90s"),
        ("k8s: {min_age: soon}\n", "k8s.min_age: expected a duration such as 90s"),
        ("budget: {max_stale_fraction: 1.5}\n", "budget.max_stale_fraction: expected"),
        ("budget: {max_stale_fraction: -0.1}\n", "budget.max_stale_fraction: expected"),
        ("budget: {min_stale: '3'}\n", "budget.min_stale: expected an integer"),
        ("max_deletions_per_sweep: -1\n", "max_deletions_per_sweep: expected"),
        ("rules: {terminated: maybe}\n", "rules.terminated: expected one of off, report, delete"),
        ("gce: {opt_out_label: reaper_keep}\n", "gce.opt_out_label: expected a label as key=value"),
        # Labels no instance can carry (Google Cloud's label requirements): a selector of them matches nothing, an
        # opt-out of them can never be set (review finding: they validated, and the sweep saw an empty fleet).
        ("gce: {selector: {CI_Ephemeral: 'true'}}\n", "gce.selector: expected a GCE label key (1 to 63 lowercase"),
        ("gce: {selector: {iterion.io/managed: 'true'}}\n", "got 'iterion.io/managed'"),
        ("gce: {selector: {ci_ephemeral: 'True'}}\n", "gce.selector: expected a GCE label value (at most 63"),
        ("gce: {opt_out_label: Reaper.Keep=true}\n", "gce.opt_out_label: expected a GCE label key"),
        ("gce: {opt_out_label: reaper_keep=yes!}\n", "gce.opt_out_label: expected a GCE label value"),
        ("gce: {heartbeat_label: Runner-Manager/Heartbeat}\n", "gce.heartbeat_label: expected a GCE label key"),
        ("gce: {heartbeat_label: 1beat}\n", "gce.heartbeat_label: expected a GCE label key"),
        ("gce: {heartbeat_label: " + "b" * 64 + "}\n", "gce.heartbeat_label: expected a GCE label key"),
        ("k8s: {lease_source: redis}\n", "k8s.lease_source: expected 'nats', 'mongo' or 'none'"),
        ("k8s: {lease_source: none}\n", "rules.sandbox_orphan: expected report or off while k8s.lease_source is none"),
        ("gce: [1, 2]\n", "gce: expected a mapping"),
        ("- a\n- b\n", "(top level): expected a mapping"),
        ("gce: {slack: [\n", "not valid YAML at line"),
        (
            "gce:\n\tslack: 1h\n",
            "not valid YAML at line 2, column 1: while scanning for the next token, found character '\\t'",
        ),
        ("gce: {slack: 99999999999d}\n", "gce.slack: expected a duration of at most 24855d"),
        ("ledger: {retention: P99999999999D}\n", "ledger.retention: expected a duration of at most 24855d"),
        ("[" * 5000 + "]" * 5000 + "\n", "(top level): nested too deeply"),
        ("gce: {slack: 1h}\x00\n", "not valid YAML: unacceptable character #x0000"),
        # A run too short to delete in: deletes stop request_timeout + ledger.timeout + 5 s before its end.
        ("airflow: {run_timeout: 80s}\n", "airflow.run_timeout: expected at least 0:01:30 with gce.request_timeout"),
        ("airflow: {k8s_schedule: 50s}\n", "airflow.k8s_schedule: expected at least 0:00:55.555"),
    ],
)
def test_bad_config_names_file_key_and_expectation(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_lease_source_none_is_fine_when_the_rule_only_reports(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("k8s: {lease_source: none}\nrules: {sandbox_orphan: report}\n")
    assert load_config(path).rules.sandbox_orphan is Mode.REPORT


def test_lease_source_none_is_fine_when_k8s_is_disabled(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("k8s: {enabled: false, lease_source: none}\n")
    assert load_config(path).k8s.enabled is False


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read the file"):
        load_config(tmp_path / "nope.yaml")


def test_empty_file_means_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert load_config(path).max_deletions_per_sweep == 500


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gce: {slack: 1h}\ngce: {slack: 2h}\n", "gce: duplicate key at line 2 (first at line 1)"),
        (
            "gce:\n  slack: 1h\n  max_job_timeout: 3h\n  slack: 2h\n",
            "gce.slack: duplicate key at line 4 (first at line 2)",
        ),
        (
            "gce:\n  writer_health:\n    timeout: 1s\n    timeout: 2s\n",
            "gce.writer_health.timeout: duplicate key at line 4 (first at line 3)",
        ),
        ("k8s: {selector: {a: x, b: y, a: z}}\n", "k8s.selector.a: duplicate key at line 1 (first at line 1)"),
        ("k8s: {clusters: [{a: 1, a: 2}]}\n", "k8s.clusters.0.a: duplicate key at line 1"),
    ],
)
def test_duplicate_keys_are_refused_with_path_and_line(tmp_path: Path, text: str, expected: str) -> None:
    # YAML parsers keep the last of two equal keys: the value a reviewer read may not be the one in force.
    assert expected in _error(tmp_path, text)


def test_every_duplicate_key_is_named(tmp_path: Path) -> None:
    message = _error(tmp_path, "rules: {terminated: off, terminated: delete}\nbudget: {min_stale: 1, min_stale: 9}\n")
    assert "rules.terminated: duplicate key at line 1" in message
    assert "budget.min_stale: duplicate key at line 2" in message


def test_a_merge_key_overridden_in_place_is_not_a_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gce: {<<: {slack: 1h, clock_skew: 1m}, slack: 2h}\n")
    gce = load_config(path).gce
    assert (gce.slack, gce.clock_skew) == (timedelta(hours=2), timedelta(minutes=1))


def test_a_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"gce: {slack: \xff1h}\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: \(top level\): expected UTF-8 text, byte 13 is not"):
        load_config(path)


def test_the_shortest_run_timeout_leaves_a_margin_of_room_to_delete(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("airflow: {run_timeout: 90s}\n")
    config = load_config(path)
    assert config.run_timeout("gce") == 2 * config.send_margin("gce") == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "k8s: {lease_source: none}\n",
            "rules.sandbox_orphan: expected report or off while k8s.lease_source is none "
            "(no liveness authority: an in-flight run's sandbox could be reaped)",
        ),
        (
            "airflow: {run_timeout: 80s}\n",
            "airflow.run_timeout: expected at least 0:01:30 with gce.request_timeout 0:00:30 and ledger.timeout "
            "0:00:10: deletes stop 0:00:45 before the run's timeout",
        ),
    ],
)
def test_a_check_across_keys_blames_the_key_to_change(tmp_path: Path, text: str, message: str) -> None:
    # Raised inside pydantic's model validation, where pydantic itself would blame the whole model
    # ("(top level)"): the whole message is the file, the key path to change and what was expected.
    assert _error(tmp_path, text) == f"invalid config {tmp_path / 'reaper.yaml'}: {message}"


def test_a_run_waits_for_the_lease_at_most_a_third_of_its_timeout() -> None:
    """A wait longer than the run's timeout (the defaults: 1m against Kubernetes' 54 s) timed the run out,
    a failure that pages, where it should have ended as skipped."""
    config = parse_settings({}, "test")
    assert config.lease_wait("k8s") == timedelta(seconds=18) and config.run_timeout("k8s") == timedelta(seconds=54)
    assert config.lease_wait("gce") == timedelta(minutes=1)
    assert parse_settings({"airflow": {"lease_wait": "10s"}}, "test").lease_wait("k8s") == timedelta(seconds=10)


# --- lower bounds: a duration whose zero (or a tiny value) would remove a safety margin silently --------

TIMEOUTS = [
    "gce.request_timeout",
    "gce.writer_health.timeout",
    "k8s.request_timeout",
    "k8s.mongo_run_store.timeout",
    "k8s.mongo_leases.timeout",
    "k8s.nats_leases.timeout",
    "k8s.postgres_step_store.timeout",
    "ledger.timeout",
    "metrics.timeout",
]
BOUNDED = {
    **dict.fromkeys(TIMEOUTS, ("0.5s", "at least 1s (every call is bounded by it")),
    "gce.operation_timeout": ("1m", "at least 2m (zoneOperations.wait alone may take two minutes)"),
    "gce.max_job_timeout": ("0s", "more than 0s (a dead manager's last job may run this long)"),
    "gce.slack": ("0s", "more than 0s (a live manager's beats are a heartbeat interval apart"),
    "gce.terminated_grace": ("0s", "more than 0s (a VM just seen stopped"),
    "gce.writer_health.failing_window": ("30s", "at least 1m (a failed pass counts only with two scrapes"),
    "k8s.min_age": ("59s", "at least 1m (a sandbox younger may not have its lease or run record yet)"),
    "ledger.rerun_window": ("23h", "at least 1d (a run may be cleared at least the day it ran)"),
    "cause_alerts.crash_loop_window": ("0s", "at least 1m (a restart counts only with two scrapes"),
    "cause_alerts.machine_creation.fast.window": ("30s", "at least 1m (a twelfth of it must still hold two scrapes"),
}


def _nested(key: str, value: str) -> dict[str, object]:
    *path, last = key.split(".")
    data: dict[str, object] = {last: value}
    for part in reversed(path):
        data = {part: data}
    if key.startswith("cause_alerts.machine_creation.fast"):
        data["cause_alerts"]["machine_creation"]["fast"]["burn_rate"] = 14.4
    return data


@pytest.mark.parametrize("key", BOUNDED)
def test_a_duration_below_its_safety_floor_is_refused_naming_file_key_and_bound(key: str) -> None:
    value, expected = BOUNDED[key]
    with pytest.raises(ConfigError) as info:
        parse_settings(_nested(key, value), "reaper.yaml")
    message = str(info.value)
    assert message.startswith(f"invalid config reaper.yaml: {key}: expected ")
    assert expected in message and message.endswith(f"got {value}")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gce.clock_skew", "0s"),  # stricter: more anomalies and unhealthy writers, never fewer
        ("gce.writer_stale_after", "0s"),  # stricter: every writer stale, every heartbeat delete held
        ("k8s.lease_clock_skew", "0s"),  # the lease writers' clocks are the reaper's (NTP)
        ("k8s.pod_gone_timeout", "0s"),  # no wait: the run's Secrets wait for a sweep that finds the Pod gone
        ("airflow.lease_wait", "0s"),  # no wait for another sweep: skipped
        ("airflow.retry_delay", "0s"),
        ("gce.request_timeout", "1s"),
        ("k8s.min_age", "1m"),
        ("gce.max_job_timeout", "2s"),  # short clocks for tests and the demo stay possible
    ],
)
def test_a_zero_or_short_value_that_keeps_every_margin_is_accepted(key: str, value: str) -> None:
    parse_settings(_nested(key, value), "reaper.yaml")


def test_unlabeled_max_age_is_at_least_the_quarantine() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"gce": {"unlabeled_max_age": "3h"}}, "reaper.yaml")
    assert str(info.value) == (
        "invalid config reaper.yaml: gce.unlabeled_max_age: expected at least the quarantine 4h "
        "(gce.max_job_timeout + gce.slack): an unlabeled VM may still run a job"
    )
    assert parse_settings({"gce": {"unlabeled_max_age": "4h"}}, "reaper.yaml").gce.unlabeled_max_age == timedelta(
        hours=4
    )
    parse_settings({"gce": {"enabled": False, "unlabeled_max_age": "1h"}}, "reaper.yaml")  # no GCE sweep: no bound


def test_ledger_retention_outlives_the_longest_run_and_the_rerun_window() -> None:
    # retention: 0s validated, and the ledger forgot intents, outcomes and summaries within a minute.
    with pytest.raises(ConfigError) as info:
        parse_settings({"ledger": {"retention": "0s"}}, "reaper.yaml")
    assert str(info.value).startswith(
        "invalid config reaper.yaml: ledger.retention: expected at least 7d 9m (the longest run timeout 9m + "
        "ledger.rerun_window 7d), got 0s"
    )
    # The longest run: the manual-only target's hour, or an explicit run_timeout; the window is configurable.
    manual = {"airflow": {"gce_schedule": 0}, "ledger": {"retention": "P7DT30M"}}
    with pytest.raises(ConfigError, match="expected at least 7d 1h"):
        parse_settings(manual, "reaper.yaml")
    # An approval (up to 7 days of expiry) must outlive the run that uses it: the retention index counts from its
    # recording, so a shorter retention could delete one a run still holds.
    with pytest.raises(ConfigError, match=r"expected at least 7d 9m \(an approval's longest expiry 7d"):
        parse_settings({"ledger": {"retention": "P2DT9M", "rerun_window": "2d"}}, "reaper.yaml")
    config = parse_settings({"ledger": {"retention": "P7DT9M", "rerun_window": "2d"}}, "reaper.yaml")
    assert config.ledger.retention == timedelta(days=7, minutes=9)


def test_the_quota_share_is_at_most_half_and_the_window_is_no_config_key(monkeypatch) -> None:
    """A share of the whole quota leaves the runner managers nothing; a shorter window than the API's minute would
    multiply the reaper's spend of it (only an emulator's environment may shorten it)."""
    with pytest.raises(ConfigError, match=r"gce\.quota\.share: expected .*0\.5"):
        parse_settings({"gce": {"quota": {"share": 0.6}}}, "reaper.yaml")
    with pytest.raises(ConfigError, match=r"gce\.quota\.window: unknown key"):
        parse_settings({"gce": {"quota": {"window": "10s"}}}, "reaper.yaml")
    monkeypatch.delenv("REAPER_EMULATOR_QUOTA_WINDOW", raising=False)  # the API's minute
    assert parse_settings({}, "reaper.yaml").gce.quota.deletes_per_second == 5.0  # 300 a minute


def test_each_kind_of_ledger_document_has_a_collection_of_its_own() -> None:
    # Review finding: one name for two kinds validated, then collided on a unique index at every sweep.
    with pytest.raises(ConfigError, match=r"ledger\.states_collection: expected a collection of its own, got "
                       r"'transitions', which is ledger\.transitions_collection"):  # fmt: skip
        parse_settings({"ledger": {"states_collection": "transitions"}}, "x.yaml")
    assert parse_settings({"ledger": {"states_collection": "states"}}, "x.yaml").ledger.states_collection == "states"


def test_approvals_have_a_collection_of_their_own() -> None:
    # An approval beside the sweep summaries would be read as one (and collide on their unique index).
    with pytest.raises(ConfigError, match=r"ledger\.approvals_collection: expected a collection of its own, got "
                       r"'sweeps', which is ledger\.sweeps_collection"):  # fmt: skip
        parse_settings({"ledger": {"approvals_collection": "sweeps"}}, "x.yaml")
    assert parse_settings({}, "x.yaml").ledger.approvals_collection == "approvals"
