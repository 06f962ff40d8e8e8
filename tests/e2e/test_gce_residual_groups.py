"""Residual fleeting groups through the enforcement DAG: emulator, SecantusDB ledger, real Prometheus writer health."""

from __future__ import annotations

import time

import requests

from include.emulators.shapes import gcloud_instance
from reaper.report.rows import ledger_rows
from reaper.rules import RESIDUAL_GROUP
from tests.e2e.test_gce_dags import ledger, prometheus  # noqa: F401  (prometheus: the module's writers, m-p1 live)
from tests.helpers.gce import STARTED

QUARANTINE = {"max_job_timeout": "2s", "slack": "1s"}  # Q = 3s: the managers' history covers it within seconds
METRIC = "runner_manager_heartbeat_last_pass_timestamp_seconds"


def members(prefix: str, count: int, first_id: int) -> list[dict[str, object]]:
    """Instances as a fleeting group's template makes them: selected, no heartbeat, ten days old."""
    labels = {"ci_ephemeral": "true"}
    created = STARTED - 10 * 86400
    return [
        gcloud_instance("p1", "us-east1-b", f"{prefix}-{i}", first_id + i, "RUNNING", labels, created)
        for i in range(count)
    ]


def wait_for_history(url: str, seconds: int = 3, timeout: float = 20) -> None:
    """Until Prometheus holds a writer's report older than the quarantine (else no group is residual yet)."""
    query = f"count(last_over_time({METRIC}[{seconds}s] offset {seconds}s))"
    deadline = time.monotonic() + timeout
    while not requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]:
        assert time.monotonic() < deadline, f"no writer-health history {seconds}s old"
        time.sleep(0.5)


def test_a_residual_group_is_reported_and_nothing_of_any_group_is_deleted(
    gce,
    sweeper,
    mongo_server,
    prometheus,  # noqa: F811
) -> None:
    fleet, clients = gce
    fleet.add_group("p1", "zones/us-east1-b", "fleeting-m-p1", 101, members("live", 2, 7000))  # its manager reports
    fleet.add_group("p1", "zones/us-east1-b", "fleeting-m-gone", 102, members("gone", 3, 7100))  # decommissioned
    fleet.add_group("p1", "zones/us-east1-b", "fleeting-m-idle", 103, [])  # holds nothing
    fleet.add_group("p1", "zones/us-east1-b", "web-frontend", 104, [])  # not a fleeting group
    before = fleet.names("p1")
    sweeper.connect_gce(clients.instances._transport._host)
    sweeper.configure(
        {
            "gce": {
                "projects": ["p1"],
                "group_selector": "fleeting-(?P<manager>.+)",
                "writer_health": {"prometheus_url": prometheus},
                **QUARANTINE,
            },
            "k8s": {"enabled": False},
        }
    )
    wait_for_history(prometheus)
    run = sweeper.run("reaper_gce_enforcement")
    assert run.state == "success"
    assert fleet.names("p1") == before and len(before) == 5  # no member of any group deleted (all unlabeled, old)
    db = ledger(mongo_server)
    records = list(db.ledger.find({"run_id": run.run_id}))
    assert {(r["name"], r["action"], r["reason"], r["resource_kind"]) for r in records} == {
        ("fleeting-m-gone", "report", "residual_group", "InstanceGroupManager")
    }
    (record,) = records
    assert record["location"] == "us-east1-b" and record["uid"] == "igm/102"
    assert record["evidence"]["manager"] == "m-gone" and record["evidence"]["instances"] == 3
    (row,) = ledger_rows(records, [])  # the audit view's row of it
    assert (row.kind, row.name, row.action, row.reason) == (
        "InstanceGroupManager",
        "fleeting-m-gone",
        "report",
        RESIDUAL_GROUP.name,
    )
    assert "m-gone" in row.why and "3 instances" in row.why
    summary = db.sweeps.find_one({"run_id": run.run_id})
    census = summary["census"]["gce"]["p1"]
    assert census["groups"] == {"listed": 3, "residual": 1, "residual_instances": 3}
    assert census["by_finding"]["group_member"] == 5 and summary["kept"]["group_member"] == 5
