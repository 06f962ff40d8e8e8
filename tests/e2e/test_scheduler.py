"""The sweep under Airflow's own machinery: a real api-server, scheduler and dag-processor with the
LocalExecutor and a PostgreSQL metadata DB; the Compute emulator and SecantusDB (the ledger) serve from here.

- A run whose deletes cannot all fit its timeout stops sending a margin before it (and before its sweep
  lease expires), records an outcome for every intent, and ends in time with its summary (18.1).
- An operator stopping the delete task (marked failed: the run's teardown releases the sweep lease and
  the supervisor sends SIGTERM) stops every send at once; what was seen is recorded, and the summary
  says the execution failed (18.1).
- Clearing the delete task of an old run, as an operator does in the UI, after the target was locked
  down, never runs the old plan: the re-execution deletes nothing and says why (18.2).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pymongo import MongoClient

from include.emulators.gce import Emulator, Fleet
from include.emulators.http import ApiError, wait_until
from tests.helpers import one_outcome_per_intent
from tests.helpers.airflow import Rest, airflow_site
from tests.helpers.gce import seed_terminated, slow_deletes

pytestmark = pytest.mark.slow(220)  # seconds, about: the heaviest modules start first (tests/conftest.py)

DAG = "reaper_gce_terminated_cleanup"
# The run's timeout in seconds; deletes stop 3s + 3s + 5s (request, ledger, slack) before it. The five tasks
# before the first delete start as processes: 25 s here beside `make test`'s other worker (the first one pays
# the worker's imports), over 39 s on a loaded CI machine. 80 s leaves deletes time to start there too.
RUN_TIMEOUT = 80.0
MARGIN = 11.0
# At one delete a second, more VMs than any run's delete window can take.
OUTLASTING = 100


def reaper_config(home: Path, run_timeout: float = RUN_TIMEOUT, **gce: object) -> dict[str, object]:
    return {
        "gce": {
            "projects": ["p"],
            "writer_health": {"source": "none"},
            "request_timeout": "3s",
            "delete_concurrency": 1,
            "delete_rate_per_project": 1000.0,
            "max_retries": 1,
            **gce,
        },
        "k8s": {"enabled": False},
        "ledger": {"timeout": "3s"},
        "rollout": {"gce": "terminated-cleanup"},  # DAG is the active phase: a manual run of it deletes
        "airflow": {
            "gce_schedule": 0,
            "run_timeout": f"{run_timeout:.0f}s",
            "retries": 0,
            "sweep_store": f"file://{home}/sweeps",
            "lease_wait": "1s",
        },
    }


class Airflow(Rest):
    """The running components, the fleet, the ledger, and a REST client of an admin user."""

    def __init__(self, base: str, config: Path, home: Path, fleet: Fleet, mongo: MongoClient) -> None:
        super().__init__(base)
        self.config, self.home, self.fleet, self.mongo = config, home, fleet, mongo

    def configure(self, **config: object) -> None:
        """A new reaper config, read by the dag-processor (its refresh interval) and every task after."""
        self.config.write_text(json.dumps(reaper_config(self.home, **config)))  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name
        time.sleep(6)

    def trigger(self) -> str:
        return self.trigger_dag(DAG)

    def run(self, run_id: str) -> dict[str, object]:
        return self.dag_run(DAG, run_id)

    def wait(self, run_id: str, timeout: float = 120) -> dict[str, object]:
        return self.wait_for(DAG, run_id, timeout)

    @property
    def ledger(self):
        return self.mongo["reaper"]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, mongo_server) -> Iterator[Airflow]:
    home = tmp_path_factory.mktemp("airflow-scheduler")
    emulator = Emulator().start()
    emulator.fleet.add_zone("p", "us-east1-b")
    config = home / "reaper.yaml"
    config.write_text(json.dumps(reaper_config(home)))
    settings = {
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"api_endpoint": emulator.endpoint, "anonymous": True}}
        ),
        "AIRFLOW_CONN_MONGO_DEFAULT": json.dumps(
            {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port}
        ),
    }
    try:
        with airflow_site(home, config, DAG, settings=settings) as site:
            site.use("LocalExecutor")
            mongo: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
            yield Airflow(site.deployment.base_url, config, home, emulator.fleet, mongo)
    finally:
        emulator.close()


def test_deletes_that_outlast_the_run_stop_before_its_timeout_and_every_outcome_is_kept(airflow) -> None:
    seed_terminated(airflow.fleet, OUTLASTING, "term")
    arrivals = slow_deletes(airflow.fleet, 1.0)
    run_id = airflow.trigger()
    expiry: list[float] = []
    while airflow.run(run_id)["state"] not in ("success", "failed"):
        lock = airflow.ledger.sweep_locks.find_one({"_id": "gce"})
        if lock:
            expiry.append(float(lock["expires_at"]))
        time.sleep(0.5)
    run = airflow.run(run_id)
    assert run["state"] == "success", "the run should end in time by itself, not be timed out"
    started = _ts(run["start_date"])
    assert _ts(run["end_date"]) - started < RUN_TIMEOUT
    assert arrivals and expiry, "nothing was deleted, or the lease was never seen"
    assert max(arrivals) < min(started + RUN_TIMEOUT, min(expiry)) - MARGIN + 1.0, "a delete was sent too late"
    results = one_outcome_per_intent(airflow.ledger, run_id)
    # Every call that went out is recorded as sent: deleted, or its operation still pending at the deadline
    # (a send in the last second before it waits on a 1 s operation across it); nothing else was sent.
    assert set(results) <= {"deleted", "operation_pending", "not_attempted"}, results
    sent = {
        r["uid"]
        for r in airflow.ledger.ledger.find({"run_id": run_id, "result": {"$in": ["deleted", "operation_pending"]}})
    }
    assert sent == set(airflow.fleet.deleted_ids) and len(sent) == len(arrivals)
    assert results["not_attempted"] > 0 and sum(results.values()) == OUTLASTING
    assert airflow.ledger.sweeps.find_one({"run_id": run_id})["state"] == "success"


def test_a_stopped_delete_task_stops_sending_at_once_and_records_what_it_saw(airflow) -> None:
    airflow.configure(run_timeout=120)  # the stop, not the deadline, ends this task
    before = len(airflow.fleet.deleted_ids)
    seed_terminated(airflow.fleet, 60, "sig")
    arrivals = slow_deletes(airflow.fleet, 1.5)
    run_id = airflow.trigger()
    wait_until(lambda: len(arrivals) >= 2, "the first deletes", 60)
    task = f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/delete/0"
    airflow.api("PATCH", task, new_state="failed")  # as from the UI: the supervisor sends SIGTERM
    run = airflow.wait(run_id)
    # Whichever comes first stops the sends: the supervisor's SIGTERM at its next heartbeat, or the lease,
    # released by the run's teardown as soon as the task counts as failed. The task records which.
    stop = {"run_id": run_id, "action": "outcome", "detail": {"$regex": "SIGTERM|lease was released"}}
    # The run ends with its teardown, as soon as the task counts as failed; the stopped task's process
    # outlives it (the supervisor waits 5 s between SIGTERM and SIGKILL), still recording what it saw.
    wait_until(lambda: airflow.ledger.ledger.find_one(stop), "the stopped task's record of why it stopped", 20)
    halted = [r["at"].replace(tzinfo=UTC).timestamp() for r in airflow.ledger.ledger.find(stop)]
    seen = Counter(
        str(r.get("detail", ""))[:60] for r in airflow.ledger.ledger.find({"run_id": run_id, "action": "outcome"})
    )
    assert halted, f"the task did not record why it stopped: {dict(seen)}"
    late = [t for t in arrivals if t > min(halted)]
    assert late == [], f"{len(late)} deletes sent after the task was told to stop"

    looked: list[set[str]] = [set()]

    def every_intent_answered() -> bool:  # the stopped process records the rest of what it saw in its last seconds
        # Until its SIGTERM, a thread may still queue an intent after the released lease (each then answered
        # not_attempted in its cycle): answered once no new intent came since the last look, a second ago.
        intents = {r["uid"] for r in airflow.ledger.ledger.find({"run_id": run_id, "action": "delete_intent"})}
        answered = {r["uid"] for r in airflow.ledger.ledger.find({"run_id": run_id, "action": "outcome"})}
        settled, looked[0] = intents == looked[0], intents
        time.sleep(1.0)
        return settled and intents <= answered

    wait_until(every_intent_answered, "an outcome for every intent the stopped task wrote", 20)
    results = one_outcome_per_intent(airflow.ledger, run_id)
    assert results["deleted"] == len(airflow.fleet.deleted_ids) - before > 0
    assert run["state"] == "failed"
    assert airflow.ledger.sweeps.find_one({"run_id": run_id})["state"] == "failed"


def test_clearing_an_old_runs_delete_task_never_runs_its_plan(airflow) -> None:
    airflow.configure()
    seed_terminated(airflow.fleet, 10, "old")
    airflow.fleet.clear_hooks()

    def refused(_: tuple[str, ...]) -> None:
        raise ApiError(403, "forbidden", "Required 'compute.instances.get' permission")

    airflow.fleet.on("before", "get", refused, times=None)  # run 1's deletes all fail
    run_id = airflow.trigger()
    assert airflow.wait(run_id)["state"] == "success"
    left = airflow.fleet.names("p")
    assert {f"old-{i:03d}" for i in range(10)} <= left
    assert one_outcome_per_intent(airflow.ledger, run_id)["failed"] > 0
    airflow.fleet.clear_hooks()  # from now on a delete would go through: only the fence stops the old plan
    # The operator locks the target down, then clears the old run's delete task as in the UI.
    airflow.configure(protected_projects=["p"])
    airflow.api(
        "POST",
        f"/dags/{DAG}/clearTaskInstances",
        dag_run_id=run_id,
        task_ids=["delete"],
        include_downstream=True,  # and the summary after it
        dry_run=False,
        only_failed=False,
        reset_dag_runs=True,
    )
    assert airflow.wait(run_id)["state"] in ("success", "failed")
    assert airflow.fleet.names("p") == left, "the old plan deleted under the locked-down config"
    summaries = list(airflow.ledger.sweeps.find({"run_id": run_id}).sort("at"))
    assert len(summaries) == 2 and summaries[-1]["stale_plan"] > 0


def _ts(text: object) -> float:
    return datetime.fromisoformat(str(text)).timestamp()
