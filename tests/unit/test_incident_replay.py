"""The reaper's side of the incident replay (include/prometheus/incident-replay.test.yml), checked against the
policy itself: the replay's budget hold appears when the default config's sweeps would first push it.

The quota incident's shape, scaled down from 8,000 VMs: the managers of two projects (one each) stamped every heartbeat
in the heartbeat interval before t0, then crash-looped and stopped reporting; a third project stays healthy.
"""

from __future__ import annotations

import re
from pathlib import Path

from reaper.model import Evidence, GceInstance
from reaper.vocabulary import Reason
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


def blocking(minutes_after_t0: int) -> dict[str, tuple[str, ...]]:
    """Project -> the holds that block its deletes in the enforcement sweep at t0 + ``minutes_after_t0``, with
    writer health as the replay has it: the crashing managers (each its project's only one) no longer
    report, the healthy one passes."""
    evidence = Evidence(writer_health=healthy(HEALTHY), leases=leases(), runs=runs())
    swept = plan(fleet(minutes_after_t0), evidence, settings(gce={"projects": [*CRASHED, HEALTHY]}))
    assert swept.deletes() == []  # never a mass delete: before Q nothing is stale, after it the budget holds
    return {v.scope: v.blocking for v in swept.scopes if v.target == "gce"}


def budget_holds(minutes_after_t0: int) -> dict[str, bool]:
    """Project -> whether the enforcement sweep at t0 + ``minutes_after_t0`` holds it on its budget."""
    return {scope: Reason.BUDGET_EXCEEDED in holds for scope, holds in blocking(minutes_after_t0).items()}


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


def test_the_first_sweep_holds_the_crashed_projects_on_their_silent_writer_health() -> None:
    # No series answers for a project whose only manager died: unknown, never "dead", from the first sweep.
    first = blocking(FIRST_SWEEP)
    assert first == {**dict.fromkeys(CRASHED, ("writer_health_unknown",)), HEALTHY: ()}


def test_the_replay_pushes_the_holds_from_those_sweeps_on() -> None:
    text = REPLAY.read_text()
    assert f"t0 = {T0}m" in text
    series = r'series: reaper_scope_hold\{[^}]*scope="([^"]+)"[^}]*hold="([^"]+)"[^}]*\}\n\s+values: (.+)'
    holds = re.findall(series, text)
    assert {(scope, hold) for scope, hold, _ in holds} == {
        (scope, hold) for scope in CRASHED for hold in ("writer_health_unknown", Reason.BUDGET_EXCEEDED)
    }
    # Scraped one evaluation (a minute) after the sweep that pushed it.
    first = {hold: {first_present_minute(v.split("#")[0]) for _, h, v in holds if h == hold} for _, hold, _ in holds}
    assert first == {"writer_health_unknown": {T0 + FIRST_SWEEP + 1}, Reason.BUDGET_EXCEEDED: {T0 + 245 + 1}}
