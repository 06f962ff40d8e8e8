"""The sweep under Airflow's own machinery (issue 18): a real api-server, scheduler and dag-processor with the
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

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import requests
from pymongo import MongoClient

from include.emulators.gce import Emulator, Fleet
from include.emulators.http import ApiError, free_port, wait_until
from tests.helpers import POSTGRES_DSN, ROOT
from tests.helpers.gce import add_instance

DAG = "reaper_gce_terminated_cleanup"
RUN_TIMEOUT = 34.0  # seconds; deletes stop 3s + 3s + 5s (request, ledger, slack) before it
MARGIN = 11.0
USER, PASSWORD = "admin", "reaper-test"
IDS = itertools.count(10_000)


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
        "airflow": {
            "gce_schedule": 0,
            "run_timeout": f"{run_timeout:.0f}s",
            "retries": 0,
            "sweep_store": f"file://{home}/sweeps",
            "lease_wait": "1s",
        },
    }


class Airflow:
    """The running components and a REST client of an admin user."""

    def __init__(self, base: str, config: Path, home: Path, fleet: Fleet, mongo: MongoClient) -> None:
        self.base, self.config, self.home, self.fleet, self.mongo = base, config, home, fleet, mongo
        self.http = requests.Session()
        token = self.http.post(f"{base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=10)
        token.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def configure(self, **config: object) -> None:
        """A new reaper config, read by the dag-processor (its refresh interval) and every task after."""
        self.config.write_text(json.dumps(reaper_config(self.home, **config)))  # type: ignore[arg-type]
        time.sleep(6)

    def api(self, method: str, path: str, **body: object) -> dict[str, object]:
        response = self.http.request(method, f"{self.base}/api/v2{path}", json=body or None, timeout=10)
        response.raise_for_status()
        return response.json()

    def trigger(self) -> str:
        return str(self.api("POST", f"/dags/{DAG}/dagRuns", logical_date=None)["dag_run_id"])

    def run(self, run_id: str) -> dict[str, object]:
        return self.api("GET", f"/dags/{DAG}/dagRuns/{quote(run_id, safe='')}")

    def wait(self, run_id: str, timeout: float = 120) -> dict[str, object]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            run = self.run(run_id)
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(1)
        raise TimeoutError(f"{run_id} not finished after {timeout:.0f}s")

    @property
    def ledger(self):  # type: ignore[no-untyped-def]
        return self.mongo["reaper"]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory, mongo_server) -> Iterator[Airflow]:  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("airflow-scheduler")
    database = f"reaper_sched_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    emulator = Emulator().start()
    emulator.fleet.add_zone("p", "us-east1-b")
    config = home / "reaper.yaml"
    config.write_text(json.dumps(reaper_config(home)))
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    port = free_port()
    bin_dir = Path(sys.executable).parent
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": POSTGRES_DSN.replace("postgresql", "postgresql+psycopg").rsplit("/", 1)[
            0
        ]
        + f"/{database}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(
            {"conn_type": "google_cloud_platform", "extra": {"api_endpoint": emulator.endpoint, "anonymous": True}}
        ),
        "AIRFLOW_CONN_MONGO_DEFAULT": json.dumps(
            {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port}
        ),
        "REAPER_CONFIG": str(config),
    }
    airflow_bin = str(bin_dir / "airflow")
    subprocess.run([airflow_bin, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    pools = ROOT / "include" / "airflow" / "pools.json"
    subprocess.run([airflow_bin, "pools", "import", str(pools)], env=env, check=True, capture_output=True, timeout=120)
    processes = []
    for component in (["api-server", "-p", str(port)], ["scheduler"], ["dag-processor"]):
        log = open(home / f"{component[0]}.log", "w")  # noqa: SIM115 - closed with its process
        processes.append((subprocess.Popen([airflow_bin, *component], env=env, stdout=log, stderr=log), log))
    try:
        wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2).ok, "api", 120)
        client = Airflow(
            f"http://127.0.0.1:{port}",
            config,
            home,
            emulator.fleet,
            MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/"),
        )
        wait_until(lambda: client.api("GET", f"/dags/{DAG}"), "the GCE DAGs parsed", 120)
        yield client
    finally:
        for process, _ in processes:
            process.terminate()
        for process, log in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
        emulator.close()
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def seed_terminated(fleet: Fleet, count: int, prefix: str) -> None:
    """``count`` stopped VMs, each its own id (the same id twice would make the listing incomplete)."""
    for i in range(count):
        add_instance(fleet, "p", "us-east1-b", f"{prefix}-{i:03d}", status="TERMINATED", instance_id=next(IDS))


def slow_deletes(fleet: Fleet, seconds: float) -> list[float]:
    """Each delete operation takes ``seconds``; returns the wall-clock times delete calls arrive at."""
    fleet.clear_hooks()
    arrivals: list[float] = []
    fleet.on("before", "delete", lambda _: arrivals.append(time.time()), times=None)
    fleet.on("before", "operation_wait", lambda _: time.sleep(seconds), times=None)
    return arrivals


def one_outcome_per_intent(ledger, run_id: str) -> Counter[str]:  # type: ignore[no-untyped-def]
    intents = Counter(r["uid"] for r in ledger.ledger.find({"run_id": run_id, "action": "delete_intent"}))
    outcomes = list(ledger.ledger.find({"run_id": run_id, "action": "outcome"}))
    per_uid = Counter(r["uid"] for r in outcomes)
    assert all(per_uid[uid] == 1 for uid in intents), "an intent without exactly one outcome"
    return Counter(r["result"] for r in outcomes)


def test_deletes_that_outlast_the_run_stop_before_its_timeout_and_every_outcome_is_kept(airflow) -> None:
    seed_terminated(airflow.fleet, 60, "term")
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
    assert results["deleted"] == len(airflow.fleet.deleted_ids) == len(arrivals)
    assert results["not_attempted"] > 0 and results["deleted"] + results["not_attempted"] == 60
    deleted = {r["uid"] for r in airflow.ledger.ledger.find({"run_id": run_id, "result": "deleted"})}
    assert deleted == set(airflow.fleet.deleted_ids)
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
