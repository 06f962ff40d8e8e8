"""The source design's incident at CI scale, under the Compute API's rate quotas, through the real GCE enforcement DAG.

Two projects, each with a live runner manager that keeps its machines' heartbeats fresh and keeps
creating machines, and the VMs that crashed managers abandoned. Every request counts against the
project's rate quotas as the Compute API counts them (the emulator's, per group and synchronized
window, a used-up one answered 403 ``rateLimitExceeded``), the managers' and the reaper's alike. The
recovery (an operator's override of the budget hold, naming both projects) must spend at most the
reaper's share of each group in every window, never cost the live managers a machine creation,
reap every abandoned VM across as many sweeps as the share needs, and keep every live one.

The emulator's window is four seconds and the reaper is told so (``$REAPER_EMULATOR_QUOTA_WINDOW``): a
faster clock, the same rules as the API's minute.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from include.emulators.gce.manager import ManagerSimulator, manager_clients
from include.emulators.http import free_port
from reaper.config import QUOTA_WINDOW_ENV
from tests.helpers.gce import add_instance
from tests.integration.prometheus import Prometheus

pytestmark = pytest.mark.slow(55)  # seconds, about: the heaviest modules start first (tests/conftest.py)

PROJECTS = ["ci-a", "ci-b"]
ZONE = "us-east1-b"
WINDOW = 4.0  # seconds: the quotas' synchronized "minute", for the emulator and the reaper
LIMIT = 90  # requests per window, per project and group
SHARE = 0.2  # the reaper's: 18 of each group a window
LIVE, CREATED, ABANDONED = 8, 10, 110  # per project
ABANDONED_AGE = 5 * 3600  # past the quarantine (3 h + 1 h)
REASON = "INC-24: two runner managers crashed and abandoned their VMs"


@pytest.fixture
def fleet_under_quota(gce, tmp_path) -> Iterator[tuple[object, set[str], set[str], list[ManagerSimulator]]]:
    """The fleet, its quotas on, and a live manager per project passing every 2 s and creating machines."""
    fleet, clients = gce
    fleet.quotas.configure({"limits": dict.fromkeys(QUOTA_GROUPS, LIMIT), "window": WINDOW})
    live: set[str] = set()
    abandoned: set[str] = set()
    managers = []
    for project in PROJECTS:
        tracked = []
        for i in range(LIVE):
            live.add(str(add_instance(fleet, project, ZONE, f"{project}-live-{i}", heartbeat_age=30)["name"]))
            tracked.append((ZONE, f"{project}-live-{i}"))
        for i in range(ABANDONED):
            name = f"{project}-gone-{i}"
            abandoned.add(str(add_instance(fleet, project, ZONE, name, heartbeat_age=ABANDONED_AGE)["name"]))
        managers.append(ManagerSimulator(f"mgr-{project}", project, manager_clients(clients.host), tracked, 2.0))
    ports = [m.serve_metrics(free_port()) for m in managers]
    for m in managers:
        m.start()
    stop = threading.Event()

    def autoscale(manager: ManagerSimulator) -> None:  # machines for queued jobs, as docker+machine makes them
        for _ in range(CREATED):
            if stop.wait(0.5):
                return
            manager.create_machine(ZONE)

    scalers = [threading.Thread(target=autoscale, args=(m,), daemon=True) for m in managers]
    for t in scalers:
        t.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{port}" for port in ports])
    try:
        prom.wait_for_writers(len(PROJECTS))  # both series of each manager, as writer health reads them
        fleet.prometheus_url = prom.url
        yield fleet, live, abandoned, managers
    finally:
        stop.set()
        prom.stop()
        for m in managers:
            m.kill()


QUOTA_GROUPS = ("list_requests", "read_requests", "mutation_requests", "operation_read_requests")


def test_a_recovery_under_quota_spends_its_share_and_never_costs_the_managers_a_creation(
    fleet_under_quota, gce, sweeper, mongo_server, monkeypatch
) -> None:
    fleet, live, abandoned, managers = fleet_under_quota
    monkeypatch.setenv(QUOTA_WINDOW_ENV, str(WINDOW))  # the emulator's faster minute, which the reaper is told
    _, clients = gce
    sweeper.connect_gce(clients.host)
    gce_config = {
        "projects": PROJECTS,
        "writer_health": {"prometheus_url": fleet.prometheus_url},
        "quota": {"limits": dict.fromkeys(QUOTA_GROUPS, LIMIT), "share": SHARE},
        "request_timeout": "2s",
        "delete_concurrency": 4,
    }
    sweeper.configure(
        {
            "gce": gce_config,
            "k8s": {"enabled": False},
            "ledger": {"timeout": "2s"},
            "rollout": {"gce": "enforcement"},
            # A run can send about 15 to 20 s of deletes: at the share's 4.5 a second per project, not all 110.
            "airflow": {"shards": 1, "run_timeout": "30s"},
        }
    )
    db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]

    scheduled = sweeper.run("reaper_gce_enforcement")
    assert scheduled.state == "success"
    holds = {s["scope"]: s["holds"] for s in db.sweeps.find_one({"run_id": scheduled.run_id})["scopes"]}
    assert holds == {p: ["budget_exceeded"] for p in PROJECTS}  # most of each project went stale at once

    recoveries = []
    for _ in range(4):
        run = sweeper.run(
            "reaper_gce_enforcement", override_budget=True, override_scopes=PROJECTS, override_reason=REASON
        )
        assert run.state == "success"
        recoveries.append(db.sweeps.find_one({"run_id": run.run_id}))
        if not abandoned & all_names(fleet):
            break
    remaining = all_names(fleet)
    assert not abandoned & remaining, f"{len(abandoned & remaining)} abandoned VMs left after {len(recoveries)} runs"
    assert live <= remaining, "a live VM was deleted"
    created = {n for m in managers for _, n in m.instances} - live
    assert len(created) == len(PROJECTS) * CREATED and created <= remaining  # the managers' new machines stay
    assert len(recoveries) >= 2, "the share allows about 80 deletes a run here: the recovery takes several"

    share = int(LIMIT * SHARE)
    spent: dict[tuple[float, str, str], int] = {}
    for use in fleet.quota_usage():
        if use.caller == "reaper":
            spent[use.window, use.project, use.group] = use.admitted
            assert use.refused == 0, use  # the reaper never met a used-up quota: it kept to its share
        elif use.caller == "runner-manager":
            assert use.refused == 0, f"the managers were refused {use}"
    assert spent and max(spent.values()) <= share, max(spent.items(), key=lambda item: item[1])
    assert {group for _, _, group in spent} == set(QUOTA_GROUPS)  # every kind of call counted
    busiest = max(n for (_, _, group), n in spent.items() if group == "mutation_requests")
    assert busiest >= share - 2, "the recovery ran at its share, not far below it"
    assert all(m.creation_failed._value.get() == 0 for m in managers)  # no creation refused, by anyone
    for summary in recoveries:  # the sweep records what it spent, per project (the metrics' source)
        assert set(summary["quota"]) == set(PROJECTS)
        assert all(use["requests"]["mutation_requests"] > 0 for use in summary["quota"].values())
        assert summary["override"]["scopes"] == PROJECTS


def all_names(fleet) -> set[str]:
    return set().union(*(fleet.names(p) for p in PROJECTS))
