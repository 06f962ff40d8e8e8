"""docs/runbook.md, "Routing, grouping and silences", against a real Alertmanager (Debian's
prometheus-alertmanager): the suggested route gives one cause one notification however many
projects it trips, and the recovery silence mutes the held projects' alerts and nothing else."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from include.emulators.http import Daemon, free_port, server_binary
from reaper.alert_rules import rules
from reaper.config import DEFAULT_CONFIG, load_config

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "runbook.md").read_text().split("## Routing, grouping and silences", 1)[1]
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", SECTION, flags=re.S | re.M)
[ROUTE] = [body for kind, body in BLOCKS if kind == "yaml"]
[SILENCE] = [body for kind, body in BLOCKS if kind == "" and body.startswith("amtool silence add")]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Daemon]:
    """An Alertmanager of this test's own with the runbook's configuration, no cluster peers."""
    config = tmp_path / "alertmanager.yml"
    config.write_text(ROUTE)
    port = free_port()
    argv = [
        server_binary("prometheus-alertmanager"),
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    daemon = Daemon(argv, port, "alertmanager")
    yield daemon
    daemon.stop()


def _fire(url: str, *alerts: dict[str, str]) -> None:
    body = [{"labels": labels, "annotations": {"summary": "x"}} for labels in alerts]
    requests.post(f"{url}/api/v2/alerts", json=body, timeout=5).raise_for_status()


def _alerts(url: str) -> list[dict[str, Any]]:
    return requests.get(f"{url}/api/v2/alerts", timeout=5).json()


def test_the_route_is_valid_and_groups_on_labels_every_reaper_alert_carries(tmp_path: Path) -> None:
    config = tmp_path / "alertmanager.yml"
    config.write_text(ROUTE)
    amtool = server_binary("amtool")
    checked = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [reaper_route] = [r for r in yaml.safe_load(ROUTE)["route"]["routes"] if "Reaper" in r["matchers"][0]]
    assert "scope" not in reaper_route["group_by"]
    for rule in rules(load_config(DEFAULT_CONFIG))["groups"][0]["rules"]:
        if rule["alert"].startswith("Reaper"):
            by = re.findall(r"by \(([^)]*)\)", rule["expr"])[:1]  # the outer aggregation's labels, if any
            carried = {"alertname", *rule["labels"], *(label for labels in by for label in labels.split(", "))}
            assert set(reaper_route["group_by"]) <= carried, rule["alert"]
    routed = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={config}", "alertname=ReaperBudgetHold", "severity=page"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert routed.stdout.split() == ["reaper-pager"], routed.stdout + routed.stderr


def test_one_cause_in_200_projects_is_one_group_and_the_held_orphans_are_inhibited(alertmanager: Daemon) -> None:
    held = [
        {"alertname": "ReaperBudgetHold", "severity": "page", "target": "gce", "scope": f"p{i}"} for i in range(200)
    ]
    orphans = [{**a, "alertname": "ReaperOrphansHeld", "severity": "ticket"} for a in held]
    _fire(alertmanager.url, *held, *orphans)
    groups = requests.get(f"{alertmanager.url}/api/v2/alerts/groups", timeout=5).json()
    pages = [g for g in groups if g["labels"].get("alertname") == "ReaperBudgetHold"]
    assert len(pages) == 1 and len(pages[0]["alerts"]) == 200 and pages[0]["receiver"]["name"] == "reaper-pager"
    states = {a["labels"]["alertname"]: a["status"]["state"] for a in _alerts(alertmanager.url)}
    assert states == {"ReaperBudgetHold": "active", "ReaperOrphansHeld": "suppressed"}


def test_the_recovery_silence_mutes_the_held_projects_only(alertmanager: Daemon) -> None:
    page = {"severity": "page", "target": "gce"}
    _fire(
        alertmanager.url,
        *(
            {"alertname": "ReaperBudgetHold", **page, "scope": s}
            for s in ("ci-runners-a", "ci-runners-b", "ci-runners-c")
        ),
        {"alertname": "ReaperOrphansHeld", "severity": "ticket", "target": "gce", "scope": "ci-runners-b"},
        {"alertname": "ReaperNotSweeping", **page},
    )
    argv = shlex.split(SILENCE.replace("\\\n", " "))
    argv = [
        server_binary("amtool"),
        *(f"--alertmanager.url={alertmanager.url}" if a.startswith("--alertmanager.url") else a for a in argv[1:]),
    ]
    added = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert added.returncode == 0 and re.fullmatch(r"[0-9a-f-]{36}\n", added.stdout), added.stdout + added.stderr
    muted = {
        (a["labels"]["alertname"], a["labels"].get("scope")): bool(a["status"]["silencedBy"])
        for a in _alerts(alertmanager.url)
    }
    assert muted == {
        ("ReaperBudgetHold", "ci-runners-a"): True,
        ("ReaperBudgetHold", "ci-runners-b"): True,
        ("ReaperBudgetHold", "ci-runners-c"): False,  # a project the recovery does not name still pages
        ("ReaperOrphansHeld", "ci-runners-b"): True,
        ("ReaperNotSweeping", None): False,
    }
