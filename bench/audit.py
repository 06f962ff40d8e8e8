"""Benchmark of the audit view at scale (``python bench/audit.py``; ``make bench``).

A ledger in SecantusDB (the MongoDB wire-protocol server the tests use) holding one sweep of
100,000 decisions (1% of them deleted: an intent and an outcome each) and 14 days of sweep
summaries every 10 minutes (2,016, three scopes each). Through the audit view's FastAPI app
(auth swapped for a user who may read the DAG), it times the pages a user opens: the first page
of the big sweep's detail, a filtered and a deep page, the overview of the 14 days, a resource's
history, and the CSV export of the whole sweep. Each figure comes with the ledger round trips it
made and, as the lower bound measured in the same run, that many round trips of a ``ping``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

from fastapi.testclient import TestClient  # noqa: E402
from pymongo import MongoClient, monitoring  # noqa: E402

from include.emulators.http import start_secantusdb  # noqa: E402
from reaper.audit import READ_RUNS, app, ledger, limits, readable_dags, settings  # noqa: E402
from reaper.config import LedgerConfig, Settings  # noqa: E402
from reaper.ledger import ROW_ORDER, Ledger  # noqa: E402
from reaper.model import Evidence, GceInstance, Phase, Plan, Resource  # noqa: E402
from reaper.report.reasons import Limits  # noqa: E402

DAG = "reaper_gce_enforcement"
RUN = "scheduled__2026-11-30T12:00:00+00:00"
SCOPES = ("ci-runners-a", "ci-runners-b", "ci-runners-c")


class RoundTrips(monitoring.CommandListener):
    """Commands the client sent: one per round trip to the server."""

    def __init__(self) -> None:
        self.count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.count += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def fill(led: Ledger, decisions: int, days: int, every: timedelta) -> None:
    """The big sweep's records and the summaries, shaped as the sweep writes them (bulk-inserted: setup only)."""
    now = datetime.now(UTC)
    ids = {"dag_id": DAG, "run_id": RUN, "execution": 0, "lease": "t", "target": "gce"}
    records = []
    for i in range(decisions):
        scope = SCOPES[i % len(SCOPES)]
        deleted = i % 100 == 0
        base = {**ids, "scope": scope, "uid": str(7_000_000_000 + i), "at": now}
        records.append(
            {
                **base,
                "action": "delete" if deleted else "report",
                "kind": "decision",
                "rule": "heartbeat_stale",
                "reason": "heartbeat_stale" if deleted else "budget_exceeded",
                "name": f"runner-{i:06d}",
                "location": "us-east1-b",
                "resource_kind": "instance",
                "evidence": {"status": "RUNNING", "heartbeat": "1", "heartbeat_age_s": 18000 + i, "holds": []},
            }
        )
        if deleted:
            records.append(
                {**base, "action": "delete_intent", "kind": "intent", "name": f"runner-{i:06d}", "sent": True}
            )
            records.append(
                {
                    **base,
                    "action": "outcome",
                    "kind": "outcome",
                    "name": f"runner-{i:06d}",
                    "result": "deleted",
                    "detail": "",
                }
            )
    for start in range(0, len(records), 10_000):
        led.records.insert_many(records[start : start + 10_000], ordered=False)
    sweeps = []
    count = int(timedelta(days=days) / every)
    for n in range(count):
        at = now - every * (count - n)
        stale = n % 7
        sweeps.append(
            {
                **ids,
                "run_id": f"scheduled__{at.isoformat()}",
                "lease": f"l{n}",
                "at": at,
                "phase": "enforcement",
                "active_phase": "enforcement",
                "branch": "delete",
                "why": f"{stale} deletes within the cap (500)",
                "state": "success",
                "outcomes": {"deleted": stale},
                "census": {
                    "gce": {
                        s: {
                            "instances": 500,
                            "by_status": {"RUNNING": 500 - stale, "TERMINATED": stale},
                            "by_finding": {"heartbeat_stale": stale},
                        }
                        for s in SCOPES
                    }
                },
                "decisions": [
                    {
                        "target": "gce",
                        "scope": s,
                        "rule": "heartbeat_stale",
                        "reason": "heartbeat_stale",
                        "action": "delete",
                        "count": stale,
                    }
                    for s in SCOPES
                ],
                "scopes": [
                    {
                        "target": "gce",
                        "scope": s,
                        "holds": ["budget_exceeded"] if n % 50 == 0 else [],
                        "labeled": 500,
                        "stale": stale,
                    }
                    for s in SCOPES
                ],
                "kept": {"fresh": 1490},
            }
        )
    led.sweeps.insert_many(sweeps, ordered=False)


def timed(http: TestClient, trips: RoundTrips, path: str, repeat: int) -> tuple[float, int, int]:
    """Median seconds of ``repeat`` GETs of ``path``, the round trips of one, and the response's size."""
    times = []
    for _ in range(repeat):
        before = trips.count
        started = time.perf_counter()
        response = http.get(path)
        times.append(time.perf_counter() - started)
        response.raise_for_status()
        made = trips.count - before
    return statistics.median(times), made, len(response.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=100_000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scopes", type=int, default=200, help="scopes of the sweeps whose transitions are recorded")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise

    daemon = start_secantusdb()
    trips = RoundTrips()
    client: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{daemon.port}/", event_listeners=[trips])
    try:
        led = Ledger(client, LedgerConfig(database="bench_audit"))
        started = time.perf_counter()
        fill(led, args.decisions, args.days, timedelta(minutes=10))
        led.ensure_indexes()  # built once over the data: the sweeps maintain them as they write
        print(
            f"# setup: {args.decisions:,} decisions and {args.days} days of sweeps every 10 min in "
            f"{time.perf_counter() - started:.0f} s (SecantusDB on 127.0.0.1)"
        )
        ping = statistics.median(_ping(client) for _ in range(50))
        print(f"# one round trip (ping): {ping * 1000:.2f} ms")
        app.dependency_overrides.update(
            {
                ledger: lambda: led,
                READ_RUNS: lambda: None,
                readable_dags: lambda: frozenset({DAG}),
                limits: lambda: Limits.of(Settings()),
                settings: Settings,
            }
        )
        http = TestClient(app)
        sweep = f"/sweeps/{DAG}/{RUN}"
        pages = [
            ("sweep detail, first page (50 rows)", sweep, args.repeat),
            (
                "sweep detail, filtered (scope, outcome deleted)",
                f"{sweep}?scope=ci-runners-b&outcome=deleted",
                args.repeat,
            ),
            ("sweep detail, sorted by name descending", f"{sweep}?order=-name", args.repeat),
            ("sweep detail, the last page", f"{sweep}?page={args.decisions // 50}", args.repeat),
            (f"overview, {args.days} days ({args.days * 144:,} sweeps)", f"/?days={args.days}", args.repeat),
            ("resource history (by name)", "/history?q=runner-050000", args.repeat),
            ("resource history (by a name prefix: 50 of many)", "/history?q=runner-05", args.repeat),
            (f"CSV export, all {args.decisions:,} rows", f"{sweep}/rows.csv", 1),
        ]
        print(f"{'page':<52} {'median':>9} {'round trips':>12} {'lower bound':>12} {'size':>10}")
        for title, path, repeat in pages:
            seconds, made, size = timed(http, trips, path, repeat)
            print(f"{title:<52} {seconds:>8.3f}s {made:>12} {made * ping:>11.3f}s {size / 1024:>8.0f} KB")
        transitions(led, trips, ping, args.decisions, args.scopes)
        for title, cursor in (
            ("page query, default order", led.records.find(_page_query()).sort([(f, 1) for f in ROW_ORDER]).limit(50)),
            ("page's intents and outcomes", led.records.find({"uid": {"$in": ["7000000000", "7000000100"]}})),
            ("overview window", led.sweeps.find({"dag_id": {"$in": [DAG]}, "at": {"$gte": datetime.now(UTC)}})),
        ):
            print(f"# plan of the {title}: {_stages(cursor.explain()['queryPlanner']['winningPlan'])}")
    finally:
        app.dependency_overrides.clear()
        client.close()
        daemon.stop()


def transitions(led: Ledger, trips: RoundTrips, ping: float, resources: int, scopes: int) -> None:
    """Recording each resource's transitions at scale: a first sweep (every resource first seen), a sweep that
    changes nothing (what nearly every sweep is), and one where 1% changed state."""
    now = time.time()
    fleet: list[Resource] = [
        GceInstance(f"p-{i % scopes:03d}", "us-east1-b", f"vm-{i:06d}", str(9_000_000_000 + i), "RUNNING", {}, now)
        for i in range(resources)
    ]
    evidence = Evidence(swept=frozenset(("gce", f"p-{i:03d}") for i in range(scopes)))

    def plan(changed: int) -> Plan:
        return Plan(
            Phase.ENFORCEMENT, now, [], [("gce", "stale", fleet[:changed]), ("gce", "fresh", fleet[changed:])], [], {}
        )

    ids = {"dag_id": DAG, "execution": 0, "lease": "t", "target": "gce"}
    heading = f"transitions, {resources:,} resources in {scopes} scopes"
    print(f"{heading:<52} {'seconds':>9} {'round trips':>12} {'lower bound':>12} {'written':>10}")
    for n, (title, changed) in enumerate(
        (
            ("first sweep: every resource first seen", 0),
            ("a sweep that changes nothing", 0),
            ("a sweep where 1% changed", resources // 100),
        )
    ):
        before, started = trips.count, time.perf_counter()
        written = led.record_transitions({**ids, "run_id": f"scheduled__t{n}"}, plan(changed), evidence, "run")
        seconds, made = time.perf_counter() - started, trips.count - before
        print(f"{title:<52} {seconds:>8.3f}s {made:>12} {made * ping:>11.3f}s {written:>10,}")


def _page_query() -> dict[str, object]:
    return {"dag_id": DAG, "run_id": RUN, "kind": "decision"}


def _stages(plan: dict[str, object]) -> str:
    """A winning plan as its chain of stages, e.g. ``LIMIT <- FETCH <- IXSCAN sweep_rows``."""
    chain = []
    while plan:
        chain.append(f"{plan['stage']} {plan.get('indexName', '')}".strip())
        plan = plan.get("inputStage") or {}  # type: ignore[assignment]  # JSON data typed object: its shape is this code's own
    return " <- ".join(chain)


def _ping(client: MongoClient) -> float:
    started = time.perf_counter()
    client.admin.command("ping")
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
