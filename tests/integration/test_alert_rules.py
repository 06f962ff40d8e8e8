"""The Prometheus alert rules: generated from the config, valid (promtool check rules) and firing as
intended (promtool test rules)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from reaper.alert_rules import rules
from reaper.cli import main
from reaper.config import DEFAULT_CONFIG
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
    assert "SUCCESS: 14 rules found" in result.stdout


def test_the_committed_rules_are_those_of_the_default_config() -> None:
    """``reaper alert-rules`` for include/reaper.yaml: edit the config and generate, never the file."""
    out = io.StringIO()
    assert main(["alert-rules", "--config", str(DEFAULT_CONFIG.relative_to(ROOT))], out) == 0
    assert out.getvalue() == RULES.read_text()


def _by_alert(config) -> dict[str, list[dict[str, object]]]:  # type: ignore[no-untyped-def]
    found: dict[str, list[dict[str, object]]] = {}
    for rule in rules(config)["groups"][0]["rules"]:  # type: ignore[index]
        found.setdefault(rule["alert"], []).append(rule)
    return found


def test_thresholds_follow_the_configured_schedules_and_writer_window() -> None:
    config = settings(
        airflow={"gce_schedule": "5m", "k8s_schedule": "2m"}, gce={"writer_stale_after": "45m", "projects": ["p"]}
    )
    found = _by_alert(config)
    late = {r["labels"]["target"]: r["expr"] for r in found["ReaperNotSweeping"]}
    assert late["gce"].endswith("> 900") and late["k8s"].endswith("> 360")
    assert {r["labels"]["target"]: r["for"] for r in found["ReaperNotReporting"]} == {"gce": "15m", "k8s": "6m"}
    assert (
        "> 2700" in found["HeartbeatWriterStale"][0]["expr"] and "[45m]" in found["HeartbeatWriterFailing"][0]["expr"]
    )


def test_a_disabled_or_manual_target_has_no_sweep_time_alert() -> None:
    found = _by_alert(settings(k8s={"enabled": False}, airflow={"gce_schedule": 0}, gce={"projects": ["p"]}))
    assert "ReaperNotSweeping" not in found and "ReaperNotReporting" not in found
    assert all(r["labels"].get("target") != "k8s" for rules_ in found.values() for r in rules_)
    assert [r["for"] for r in found["ReaperInventoryIncomplete"]] == ["30m"]  # no schedule: a fixed wait
    text = yaml.safe_dump(rules(settings(gce={"enabled": False})))
    assert "HeartbeatWriter" not in text and 'target="gce"' not in text


def test_rule_unit_tests_pass() -> None:
    tests = RULES.with_name("reaper-rules.test.yml")
    result = subprocess.run([promtool(), "test", "rules", str(tests)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_runbook_paragraph() -> None:
    alerts = re.findall(r"- alert: (\w+)", RULES.read_text())
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    for alert in alerts:
        assert f"## {alert}" in runbook, f"docs/runbook.md has no section for {alert}"
        anchor = re.search(rf"alert: {alert}\n(?:.*\n)*?\s+runbook: docs/runbook.md#(\w+)", RULES.read_text())
        assert anchor and anchor.group(1) in {a.lower() for a in alerts}
