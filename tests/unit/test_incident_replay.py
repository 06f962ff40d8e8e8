"""The reaper's side of the incident replay (include/prometheus/incident-replay.test.yml), checked against the
policy itself: the replay's budget hold appears when the default config's sweeps would first push it.

Seed 004's shape, scaled down from 8,000 VMs: the managers of two projects stamped every heartbeat in the
heartbeat interval before t0, then crash-looped and stopped reporting; a third project stays healthy.
"""

from __future__ import annotations

import re
from pathlib import Path

from reaper.model import Evidence, GceInstance
from reaper.policy.budget import BUDGET_EXCEEDED
from tests.builders import M, healthy, inst, leases, plan, runs, settings

REPLAY = Path(__file__).resolve().parents[2] / "include" / "prometheus" / "incident-replay.test.yml"
T0 = 360  # minutes from the replay's start
CRASHED, HEALTHY = ("ci-runners-a", "ci-runners-b"), "ci-runners-c"
PER_PROJECT = 50
HEARTBEAT_INTERVAL = 5 * M
FIRST_SWEEP, SCHEDULE = 5, 10  # the replay's sweeps: t0+5m, then every 10 minutes (airflow.gce_schedule)


def fleet(minutes_after_t0: int) -> list[GceInstance]:
    """Each project's instances as a sweep at t0 + ``minutes_after_t0`` lists them."""
    spread = [HEARTBEAT_INTERVAL * i / PER_PROJECT for i in range(PER_PROJECT)]  # stamped within one interval
    crashed = [inst(project=p, hb_age=minutes_after_t0 * M + s) for p in CRASHED for s in spread]
    return crashed + [inst(project=HEALTHY, hb_age=s) for s in spread]


def budget_holds(minutes_after_t0: int) -> dict[str, bool]:
    """Project -> whether the enforcement sweep at t0 + ``minutes_after_t0`` holds it on its budget, with
    writer health as the replay has it: the crashing managers no longer report, the healthy one passes."""
    evidence = Evidence(writer_health=healthy(HEALTHY), leases=leases(), runs=runs())
    swept = plan(fleet(minutes_after_t0), evidence, settings(gce={"projects": [*CRASHED, HEALTHY]}))
    assert swept.deletes() == []  # never a mass delete: before Q nothing is stale, after it the budget holds
    return {v.scope: BUDGET_EXCEEDED in v.blocking for v in swept.scopes if v.target == "gce"}


def first_present_minute(values: str) -> int:
    """The first sample of a promtool series that is not missing (``_xN`` is N missing samples)."""
    minute = 0
    for token in values.split():
        if not token.startswith("_"):
            return minute
        minute += int(token.partition("x")[2] or 1)
    raise AssertionError(f"no sample in {values!r}")


def test_the_first_sweep_past_the_quarantine_holds_both_crashed_projects_and_no_other() -> None:
    sweeps = range(FIRST_SWEEP, 6 * 60, SCHEDULE)
    quarantine = int(settings().gce.quarantine.total_seconds()) // M  # 4h
    tripping = next(m for m in sweeps if any(budget_holds(m).values()))
    assert tripping == 245 and tripping - SCHEDULE < quarantine < tripping  # t0+4h5m: the first sweep after Q
    assert budget_holds(tripping) == {"ci-runners-a": True, "ci-runners-b": True, HEALTHY: False}
    assert not any(budget_holds(tripping - SCHEDULE).values())


def test_the_replay_pushes_the_hold_from_that_sweep_on() -> None:
    text = REPLAY.read_text()
    assert f"t0 = {T0}m" in text
    holds = re.findall(r'series: reaper_scope_hold\{[^}]*scope="([^"]+)"[^}]*\}\n\s+values: (.+)', text)
    assert {scope for scope, _ in holds} == set(CRASHED)
    # Scraped one evaluation (a minute) after the sweep that pushed it.
    assert {first_present_minute(v.split("#")[0]) for _, v in holds} == {T0 + 245 + 1}
