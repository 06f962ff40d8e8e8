"""The GCE design's verification, end to end: live managers stamp heartbeats, a real Prometheus scrapes them,
the enforcement DAG sweeps. The quarantine is seconds long so the scenario runs in a test."""

from __future__ import annotations

import time
from typing import Any

import requests
from pymongo import MongoClient
from pymongo.database import Database

from include.emulators.gce.manager import ManagerSimulator, manager_clients
from include.emulators.http import free_port
from tests.helpers.gce import add_instance
from tests.integration.prometheus import Prometheus

ZONE = "us-east1-b"


def test_killed_manager_is_reaped_and_a_failing_writer_holds_everything(
    gce, sweeper, mongo_server, pushgateway, tmp_path
) -> None:
    fleet, clients = gce
    tracked = {f"m{m}": [(ZONE, f"vm-m{m}-{i}") for i in range(3)] for m in (1, 2)}
    tracked["m3"] = [(ZONE, f"vm-m3-{i}") for i in range(4)]
    for manager, instances in tracked.items():
        project = "ci-b" if manager == "m3" else "ci-a"
        for _, name in instances:
            add_instance(fleet, project, ZONE, name, heartbeat_age=0, labels={"manager": manager})
    managers = {
        m: ManagerSimulator(m, "ci-b" if m == "m3" else "ci-a", manager_clients(clients.host), instances, interval=0.5)
        for m, instances in tracked.items()
    }
    ports = [m.serve_metrics(free_port()) for m in managers.values()]
    for m in managers.values():
        m.start()
    (tmp_path / "prom").mkdir()
    prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{p}" for p in ports])
    try:
        prom.wait_for_writers(3)
        sweeper.connect_gce(clients.instances._transport._host)
        sweeper.configure(
            {
                "gce": {
                    "projects": ["ci-a", "ci-b"],
                    "max_job_timeout": "2s",
                    "slack": "1s",
                    "writer_health": {"prometheus_url": prom.url, "failing_window": "1m"},
                },
                "k8s": {"enabled": False},
                "metrics": {"pushgateway_url": pushgateway.url},
                "rollout": {"gce": "enforcement"},
            }
        )

        # m1 dies; ci-b's writer loses its permission but keeps running and reporting.
        managers["m1"].kill()
        fleet.faults.deny_set_labels.add("ci-b")
        prom.wait_for("runner_manager_heartbeat_last_pass_timestamp_seconds", lambda r: len(r) == 2)  # m1 gone
        prom.wait_for("increase(runner_manager_heartbeat_failed_passes_total[1m]) > 0", lambda r: len(r) == 1)
        time.sleep(3.5)  # past the quarantine of m1's last beat

        run = sweeper.run("reaper_gce_enforcement")
        assert run.state == "success"
        assert fleet.names("ci-a") == {name for _, name in tracked["m2"]}  # m1's VMs reaped, m2's untouched
        assert fleet.names("ci-b") == {name for _, name in tracked["m3"]}  # held: nothing deleted there

        db: Database[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")["reaper"]
        summary = db.sweeps.find_one({"run_id": run.run_id})
        ci_b = next(s for s in summary["scopes"] if s["scope"] == "ci-b")
        assert ci_b["holds"] == ["writer_unhealthy", "budget_exceeded"]
        reasons = {r["reason"] for r in db.ledger.find({"run_id": run.run_id, "scope": "ci-b", "action": "report"})}
        assert reasons == {"writer_unhealthy"}
        text = requests.get(f"{pushgateway.url}/metrics", timeout=5).text
        for hold in ("budget_exceeded", "writer_unhealthy"):
            ci_b = f'blocks_deletes="true",hold="{hold}",instance="",job="reaper",scope="ci-b",target="gce"'
            assert f"reaper_scope_hold{{{ci_b}}} 1" in text
        assert 'scope="ci-a"' in text and not any(
            line.startswith("reaper_scope_hold") and 'scope="ci-a"' in line for line in text.splitlines()
        )  # no hold there
    finally:
        for m in managers.values():
            m.kill()
        prom.stop()
