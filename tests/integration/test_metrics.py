"""Sweep metrics pushed to a real Pushgateway (Debian's prometheus-pushgateway); a failed push fails nothing."""

from __future__ import annotations

import requests

from include.emulators.http import free_port
from reaper.metrics import push_sweep
from reaper.model import Phase
from tests.builders import D, M, inst, plan


def _summary() -> dict[str, object]:
    import msgspec

    from reaper.sweep.deletes import PlanRef
    from reaper.sweep.steps import SweepInput, summarize

    fleet = [inst(hb_age=M), inst(hb_age=D), inst(hb_age=D), inst(hb_age=D), inst(hb_age=M, project="p2")]
    fleet.append(inst(status="TERMINATED", stop_age=D, hb_age=M, project="p2"))
    read = SweepInput(path="", as_of=0.0, tokens=["t"], incomplete={}, hygiene={}, warnings=[])
    made = PlanRef(0, "t", "c")
    return msgspec.to_builtins(summarize(plan(fleet, phase=Phase.ENFORCEMENT), made, read, None, "sre", False, False))


def test_sweep_metrics_reach_the_pushgateway(pushgateway) -> None:
    failures = push_sweep(pushgateway.url, "reaper_gce_enforcement", "gce", _summary(), {"deleted": 1}, 1.8e9, 5)
    assert failures == 0
    text = requests.get(f"{pushgateway.url}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if line.startswith("reaper_")]

    def value(prefix: str) -> float:
        matches = [line for line in lines if line.startswith(prefix)]
        assert len(matches) == 1, (prefix, matches)
        return float(matches[0].rsplit(" ", 1)[1])

    p1 = 'dag_id="reaper_gce_enforcement",instance="",job="reaper",scope="p1"'
    assert value(f'reaper_budget_hold{{{p1},target="gce"}}') == 1.0  # 3 stale of 4 labeled
    stale = 'dag_id="reaper_gce_enforcement",finding="heartbeat_stale",instance="",job="reaper",scope="p1"'
    assert value(f'reaper_findings{{{stale},target="gce"}}') == 3
    assert value(f'reaper_heartbeat_age_seconds_count{{{p1},target="gce"}}') == 4
    assert value(f'reaper_resources{{{p1},status="RUNNING",target="gce"}}') == 4
    all_ = 'dag_id="reaper_gce_enforcement",instance="",job="reaper",scope="_all"'
    assert value(f'reaper_last_success_timestamp_seconds{{{all_},target="gce"}}') == 1.8e9
    deleted = 'dag_id="reaper_gce_enforcement",instance="",job="reaper",outcome="deleted",scope="_all"'
    assert value(f'reaper_deletions{{{deleted},target="gce"}}') == 1


def test_a_failed_push_is_counted_not_raised() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert push_sweep(url, "reaper_gce_enforcement", "gce", _summary(), {}, 1.8e9, 1) == 3  # 2 scopes + _all
