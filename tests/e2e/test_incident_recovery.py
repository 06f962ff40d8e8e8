"""The quota incident (docs/design.md §10), scaled down, through the real GCE enforcement DAG.

Ten projects with live managers; the managers of two crash-looped, came back with empty machine
stores and abandoned their VMs (their writers pass again, tracking nothing). The enforcement sweep
holds those two projects on their budget and keeps enforcing the other eight; an operator recovers
from a manual trigger alone (``override_budget`` with its ``override_scopes``, ``override_reason``,
``max_deletions``, ``scopes``) without the run outliving its own timeout. The full-scale run
(8,000 VMs) is ``bench/incident.py``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from pymongo import MongoClient
from pymongo.database import Database

from tests.helpers.gce import add_instance, busiest_second, healthy_writers

pytestmark = pytest.mark.slow(65)  # seconds, about: the heaviest modules start first (tests/conftest.py)

PROJECTS = [f"proj-{i}" for i in range(10)]
CRASHED = PROJECTS[:2]
LIVE_PER_PROJECT = 10
ABANDONED_AGE = 5 * 3600  # past the quarantine: max_job_timeout 3 h + slack 1 h
CONCURRENCY = 8
ABANDONED = 200  # per crashed project; bench/incident.py abandons 4,000 each
REASON = "INC-13578: runner managers OOM crash-looped and abandoned their VMs"
# Projects whose rate quotas were raised for a fleet this size: the reaper's share (20%) then allows the
# rate these tests set (100 deletes a second per project), not the documented 1,500 a minute's 5.
RAISED_QUOTA = {
    "limits": dict.fromkeys(("list_requests", "read_requests", "mutation_requests", "operation_read_requests"), 30_000)
}


@pytest.fixture(scope="module")
def writers(tmp_path_factory) -> Iterator[str]:
    with healthy_writers(PROJECTS, tmp_path_factory.mktemp("prom")) as url:
        yield url


def seed(fleet, abandoned_per_project: int) -> tuple[set[str], set[str]]:
    """Live VMs everywhere, one ordinary orphan per healthy project, and the crashed managers' VMs."""
    live, abandoned = set(), set()
    for project in PROJECTS:
        for i in range(LIVE_PER_PROJECT):
            live.add(add_instance(fleet, project, "us-east1-b", f"{project}-live-{i}")["name"])
        orphans = abandoned_per_project if project in CRASHED else 1
        for i in range(orphans):
            abandoned.add(add_instance(fleet, project, "us-east1-c", f"{project}-gone-{i}", ABANDONED_AGE)["name"])
    return {str(n) for n in live}, {str(n) for n in abandoned}


def configure(sweeper, writers: str, endpoint: str, **more: Any) -> None:
    sweeper.connect_gce(endpoint)
    gce = {"projects": PROJECTS, "writer_health": {"prometheus_url": writers}, **more.pop("gce", {})}
    # Two listing shards: ten projects' worth of mapped tasks would only add task overhead here.
    sweeper.configure(
        {"gce": gce, "k8s": {"enabled": False}, **more, "airflow": {"shards": 2, **more.get("airflow", {})}}
    )


def recover(sweeper, max_deletions: int):
    """The operator's recovery from a manual trigger alone: the crashed projects, their budget overridden, a cap."""
    return sweeper.run(
        "reaper_gce_enforcement",
        override_budget=True,
        override_scopes=CRASHED,  # the audit view's held scopes
        override_reason=REASON,
        max_deletions=max_deletions,
        scopes=CRASHED,
    )


def names(fleet) -> set[str]:
    return set().union(*(fleet.names(p) for p in PROJECTS))


def deletes_received(fleet, since: float) -> list[tuple[str, float]]:
    """(project, time) of every delete the emulator received since ``since`` (monotonic).

    The deleter takes its token before the re-read; a call's way to the emulator can take a while,
    so a second may also see the calls of up to ``delete_concurrency`` earlier tokens arrive late.
    """
    return [(project, at) for at, project, kind in list(fleet.mutations) if kind == "delete" and at >= since]


def test_the_crashed_projects_are_held_and_an_operator_recovers_them_from_one_manual_run(
    gce, sweeper, mongo_server, writers, pushgateway
) -> None:
    fleet, clients = gce
    live, abandoned = seed(fleet, ABANDONED)
    rate = 100.0
    configure(
        sweeper,
        writers,
        clients.instances._transport._host,
        gce={"delete_rate_per_project": rate, "delete_concurrency": CONCURRENCY, "quota": RAISED_QUOTA},
        metrics={"pushgateway_url": pushgateway.url},
        max_deletions_per_sweep=100,  # the recovery needs more: max_deletions
        rollout={"gce": "enforcement"},
    )
    db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]

    # The scheduled sweep: the two crashed projects held on their budget, the eight others enforced.
    held = sweeper.run("reaper_gce_enforcement")
    assert held.state == "success"
    holds = {s["scope"]: s["holds"] for s in db.sweeps.find_one({"run_id": held.run_id})["scopes"]}
    assert {p for p, h in holds.items() if h} == set(CRASHED) and holds[CRASHED[0]] == ["budget_exceeded"]
    healthy_orphans = {f"{p}-gone-0" for p in PROJECTS[2:]}
    assert names(fleet) == (live | abandoned) - healthy_orphans
    pushed = requests.get(f"{pushgateway.url}/metrics", timeout=5).text
    for project in PROJECTS:  # the budget-hold alert's series names exactly the crashed projects
        series = f'hold="budget_exceeded",instance="",job="reaper",scope="{project}",target="gce"}} 1'
        assert (series in pushed) is (project in CRASHED), project

    # Above the cap only with a reason: refused before anything is read or deleted.
    assert sweeper.run("reaper_gce_enforcement", override_budget=True, max_deletions=5000).state == "failed"
    assert names(fleet) == (live | abandoned) - healthy_orphans

    # The recovery: one manual run, limited to the crashed projects, over the cap with a reason.
    started = time.monotonic()
    recovery = recover(sweeper, 2 * ABANDONED)
    assert recovery.state == "success"
    assert names(fleet) == live, "every abandoned VM gone, every live one kept"
    assert max(busiest_second(deletes_received(fleet, started)).values()) <= rate + 1 + CONCURRENCY  # one banked token
    summary = db.sweeps.find_one({"run_id": recovery.run_id})
    assert summary["override"] | {"user": "?"} == {
        "reason": REASON,
        "user": "?",
        "budget": True,
        "scopes": CRASHED,
        "max_deletions": 2 * ABANDONED,
        "applied": True,
    }
    assert summary["override"]["user"] and summary["max_deletions"] == 2 * ABANDONED and summary["left"] == 0
    assert summary["outcomes"] == {"deleted": 2 * ABANDONED} and summary["branch"] == "delete"
    decisions = {r["uid"]: r for r in db.ledger.find({"run_id": recovery.run_id, "action": "delete"})}
    deleted = [r for r in db.ledger.find({"run_id": recovery.run_id, "action": "outcome", "result": "deleted"})]
    assert len(deleted) == 2 * ABANDONED and {decisions[r["uid"]]["override"]["reason"] for r in deleted} == {REASON}


def test_a_recovery_that_cannot_finish_before_its_deadline_stops_in_time_and_leaves_the_rest_recorded(
    gce, sweeper, mongo_server, writers
) -> None:
    fleet, clients = gce
    live, abandoned = seed(fleet, 100)  # 100 per crashed project
    endpoint = clients.instances._transport._host
    # 200 deletes at 5/s per project need 20 s; the run has 30 s, less a 9 s send margin, less its listing.
    timeouts = {"request_timeout": "2s", "delete_rate_per_project": 5, "delete_concurrency": CONCURRENCY}
    configure(sweeper, writers, endpoint, gce=timeouts, ledger={"timeout": "2s"}, airflow={"run_timeout": "30s"})
    db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]
    recovery = recover(sweeper, 2 * ABANDONED)
    assert recovery.state == "success"
    assert recovery.end_date - recovery.start_date < timedelta(seconds=30), "the run outlived its own timeout"
    outcomes = {r["name"]: r for r in db.ledger.find({"run_id": recovery.run_id, "action": "outcome"})}
    crashed = {n for n in abandoned if n.startswith(tuple(CRASHED))}
    assert set(outcomes) == crashed, "every planned delete has exactly one outcome"
    results = Counter(r["result"] for r in outcomes.values())
    assert results["deleted"] > 0 and results["not_attempted"] > 0, results
    # A delete sent in the last moments whose operation was not DONE when the run had to stop is pending, never
    # failed (docs/design.md §6): at most the calls in flight then. On a busy machine the deadline meets some.
    assert set(results) <= {"deleted", "not_attempted", "operation_pending"}, results
    assert results["operation_pending"] <= CONCURRENCY, results
    left = {n for n, r in outcomes.items() if r["result"] == "not_attempted"}
    pending = {n for n, r in outcomes.items() if r["result"] == "operation_pending"}
    assert all("left for the next sweep" in r["detail"] for n, r in outcomes.items() if n in left)
    kept = live | left | (abandoned - crashed)
    assert kept <= names(fleet) <= kept | pending  # a pending delete's VM may be gone already, or not yet
    # Left at planning (no intent), or by the batch under way when the deadline came (its intent, no call).
    calls = {"run_id": recovery.run_id, "action": "delete_intent", "sent": True, "name": {"$in": sorted(left)}}
    assert db.ledger.count_documents(calls) == 0
    summary = db.sweeps.find_one({"run_id": recovery.run_id})
    # Left when planned (what the rate could not send in the time left), or by the batch the deadline stopped.
    assert summary["outcomes"] == dict(results) and summary["state"] == "success" and summary["left"] <= len(left)

    # The next run, with its own override (the budget still trips on what is left), takes the rest.
    configure(sweeper, writers, endpoint, gce={**timeouts, "delete_rate_per_project": 100, "quota": RAISED_QUOTA})
    rest = recover(sweeper, 2 * ABANDONED)
    assert rest.state == "success" and names(fleet) == live | (abandoned - crashed)
