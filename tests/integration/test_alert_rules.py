"""The Prometheus alert rules: generated from the config, valid (promtool check rules) and firing as
intended (promtool test rules)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from reaper.alert_rules import Rule, rules
from reaper.cli import main
from reaper.config import DEFAULT_CONFIG, ConfigError, load_config
from tests.builders import settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "include" / "prometheus" / "reaper-rules.yml"


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        raise RuntimeError("promtool is not installed: run scripts/bootstrap.sh (make test does)")
    return binary


def test_rules_are_valid() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(rules(load_config(DEFAULT_CONFIG))["groups"][0]["rules"])
    assert count > 20 and f"SUCCESS: {count} rules found" in result.stdout


def test_the_committed_rules_are_those_of_the_default_config() -> None:
    """``reaper alert-rules`` for include/reaper.yaml: edit the config and generate, never the file."""
    out = io.StringIO()
    assert main(["alert-rules", "--config", str(DEFAULT_CONFIG.relative_to(ROOT))], out) == 0
    assert out.getvalue() == RULES.read_text()


def _by_alert(config) -> dict[str, list[Rule]]:
    found: dict[str, list[Rule]] = {}
    for rule in rules(config)["groups"][0]["rules"]:
        found.setdefault(rule["alert"], []).append(rule)
    return found


def test_thresholds_follow_the_configured_schedules_and_writer_window() -> None:
    config = settings(
        airflow={"gce_schedule": "10m", "k8s_schedule": "2m"},
        gce={"writer_stale_after": "45m", "projects": ["p"], "writer_health": {"failing_window": "20m"}},
    )
    found = _by_alert(config)
    late = {r["labels"]["target"]: r["expr"] for r in found["ReaperNotSweeping"]}
    # Three missed sweeps: four intervals from the last success's end, plus 5m; never under 15m.
    assert "[45m])) > 2700 or " in late["gce"] and "[15m])) > 900 or " in late["k8s"]
    stale = {r["labels"]["target"]: r["expr"] for r in found["ReaperStaleScope"]}
    assert stale["gce"].endswith(">= 2700") and stale["k8s"].endswith(">= 900")  # three sweeps without its push
    assert {r["labels"]["target"]: r["for"] for r in found["ReaperNotReporting"]} == {"gce": "45m", "k8s": "15m"}
    assert (
        "> 2700" in found["HeartbeatWriterStale"][0]["expr"] and "[20m]" in found["HeartbeatWriterFailing"][0]["expr"]
    )


def test_the_writer_alerts_read_what_the_reaper_reads_for_the_swept_projects_only() -> None:
    health = {
        "last_pass_metric": "fleet_last_pass",
        "failed_passes_metric": "fleet_failed_total",
        "passes_metric": "fleet_passes_total",
        "manager_label": "runner",
        "project_label": "gcp_project",
    }
    found = _by_alert(settings(gce={"projects": ["ci-a", "odd.name"], "writer_health": health}))
    stale, failing = found["HeartbeatWriterStale"][0], found["HeartbeatWriterFailing"][0]
    assert 'fleet_last_pass{gcp_project=~"ci-a|odd\\\\.name"}' in str(stale["expr"])
    assert "by (runner, gcp_project)" in str(stale["expr"]) and "{{ $labels.runner }}" in str(stale["annotations"])
    assert "fleet_failed_total{" in str(failing["expr"]) and "fleet_passes_total{" in str(failing["expr"])
    none = _by_alert(settings(gce={"projects": ["p"], "writer_health": {"source": "none"}}))
    assert "HeartbeatWriterStale" not in none and "ReaperWriterHold" not in none


def test_every_scope_alert_but_the_stale_one_leaves_out_the_stale_scope_groups() -> None:
    """A removed project's group the retirement could not delete must stop paging on its last
    values, whatever the alert: each rule by scope carries the same ``unless`` (ReaperStaleScope says why)."""
    every = rules(load_config(DEFAULT_CONFIG))["groups"][0]["rules"]
    by_scope = [r for r in every if "scope)" in r["expr"] and r["alert"] != "ReaperStaleScope"]
    assert {r["alert"] for r in by_scope} >= {"ReaperBudgetHold", "ReaperWriterHold", "ReaperOrphansHeld"}
    stale = {r["labels"]["target"]: r["expr"] for r in every if r["alert"] == "ReaperStaleScope"}
    for rule in by_scope:
        target = rule["labels"].get("target", "gce")
        assert rule["expr"].endswith(f") unless on (target, scope) ({stale[target]})"), rule["alert"]


def test_a_disabled_or_manual_target_has_no_sweep_time_alert_and_never_pages() -> None:
    found = _by_alert(settings(k8s={"enabled": False}, airflow={"gce_schedule": 0}, gce={"projects": ["p"]}))
    assert "ReaperNotSweeping" not in found and "ReaperNotReporting" not in found
    assert all(r["labels"].get("target") != "k8s" for rules_ in found.values() for r in rules_)
    assert [r["for"] for r in found["ReaperInventoryIncomplete"]] == ["30m"]  # no schedule: a fixed wait
    reaper = [r for name, rules_ in found.items() if name.startswith("Reaper") for r in rules_]
    assert {r["labels"]["severity"] for r in reaper} == {"ticket"}  # the last values stand until the next run
    text = yaml.safe_dump(rules(settings(gce={"enabled": False})))
    assert "HeartbeatWriter" not in text and 'target="gce"' not in text


def test_rule_unit_tests_pass() -> None:
    tests = RULES.with_name("reaper-rules.test.yml")
    result = subprocess.run([promtool(), "test", "rules", str(tests)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_incident_replay_raises_the_cause_alerts_hours_before_quota_saturation() -> None:
    """The quota incident of docs/design.md §10 (include/prometheus/incident-replay.test.yml): crash loop at t0+3m,
    machine_creation within its fast window, the budget hold after the quarantine, nothing for the healthy project."""
    replay = RULES.with_name("incident-replay.test.yml")
    result = subprocess.run([promtool(), "test", "rules", str(replay)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cause_alerts_follow_the_one_selector_and_the_configured_thresholds() -> None:
    causes = {
        "runner_managers": {"cluster": "rm-.*", "env": 'g"prd\\d'},
        "manager_pods": {"container": "gitlab-runner", "namespace": "ci-.*"},
        "crash_loop_restarts": 5,
        "crash_loop_window": "1h",
        "machine_creation": {
            "objective": 0.999,
            "group_by": ["shard", "zone"],
            "fast": {"window": "2h", "burn_rate": 10},
        },
    }
    found = _by_alert(settings(cause_alerts=causes))
    selector = 'cluster=~"rm-.*",env=~"g\\"prd\\\\d"'  # the regex g"prd\d as a PromQL string
    [crash] = found["RunnerManagerCrashLooping"]
    pods = 'container=~"gitlab-runner",namespace=~"ci-.*"'  # the managers' containers only, not a logging agent's
    assert crash["expr"] == f"increase(kube_pod_container_status_restarts_total{{{selector},{pods}}}[1h]) >= 5"
    fast, slow = found["MachineCreationBudgetBurn"]
    assert (fast["labels"], slow["labels"]) == (
        {"severity": "page", "window": "fast"},
        {"severity": "ticket", "window": "slow"},
    )
    failed = f'gitlab_runner_autoscaling_actions_total{{{selector},executor="docker+machine",action="creation-failed"}}'
    assert f"sum by (shard, zone) (rate({failed}[2h]))" in str(fast["expr"])
    assert f"sum by (shard, zone) (rate({failed}[10m]))" in str(fast["expr"])  # the short window: a twelfth
    assert str(fast["expr"]).count("> 0.01)") == 2  # 10 x the 0.1% budget, on both windows
    assert "[6h]" in str(slow["expr"]) and "[30m]" in str(slow["expr"]) and "> 0.006)" in str(slow["expr"])
    # The floor: as many attempts over the long window as one failure alone takes above the threshold.
    tried = 'executor="docker+machine",action=~"created|creation-failed"'
    attempts = f"increase(gitlab_runner_autoscaling_actions_total{{{selector},{tried}}}"
    assert str(fast["expr"]).endswith(f"and (sum by (shard, zone) ({attempts}[2h])) >= 100)")
    assert str(slow["expr"]).endswith(f"and (sum by (shard, zone) ({attempts}[6h])) >= 167)")
    assert "RunnerManagerCrashLooping" not in _by_alert(settings(cause_alerts={"enabled": False}))


def test_the_runbook_url_has_the_configured_base() -> None:
    """Alerting tools link the ``runbook_url`` annotation; a path inside the repository is no link."""
    base = "https://git.example.com/sre/reaper/-/blob/main/docs/runbook.md"
    every = [r for g in rules(settings(metrics={"runbook_url": base}))["groups"] for r in g["rules"]]
    assert every and all(r["annotations"]["runbook_url"] == f"{base}#{r['alert'].lower()}" for r in every)
    assert all("runbook" not in r["annotations"] for r in every)


@pytest.mark.parametrize(
    ("causes", "message"),
    [
        ({"runner_managers": {}}, "cause_alerts.runner_managers: expected a non-empty value"),
        ({"runner_managers": {"9cluster": "x"}}, "expected Prometheus label names as keys, got '9cluster'"),
        ({"runner_managers": {"cluster": "(runner"}}, "expected a valid regex for label cluster, got '(runner'"),
        ({"machine_creation": {"group_by": ["shard-name"]}}, "cause_alerts.machine_creation.group_by.0"),
        ({"machine_creation": {"objective": 1}}, "cause_alerts.machine_creation.objective"),
        ({"machine_creation": {"fast": {"burn_rate": 10}}}, "machine_creation.fast.window: expected this key"),
        ({"crash_loop_restarts": 0}, "cause_alerts.crash_loop_restarts"),
        ({"manager_pods": {}}, "cause_alerts.manager_pods: expected a non-empty value"),
        ({"manager_pods": {"container": "[runner"}}, "expected a valid regex for label container, got '[runner'"),
    ],
)
def test_a_bad_cause_alert_key_is_refused_naming_it(causes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings(cause_alerts=causes)
