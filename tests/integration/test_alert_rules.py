"""The Prometheus alert rules: valid (promtool check rules) and firing as intended (promtool test rules)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

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
    assert "SUCCESS: 7 rules found" in result.stdout


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
