"""The sweeps on the CeleryExecutor, for real: an api-server, a scheduler, a dag-processor and
two Celery workers (Redis broker), each worker with its own ``AIRFLOW_HOME`` and ``TMPDIR`` so that a task
reading another task's local file would fail; the sweep files on ``gs://`` (the google provider's object
storage, gcsfs) against ``gcp-storage-emulator``; the Compute and Kubernetes emulators; SecantusDB for the
ledger, the run store and the leases.

- The GCE and Kubernetes enforcement sweeps of one fleet decide and delete exactly what the same fleet's
  sweeps decide and delete with every task on one machine (``dag.test()`` in this process: cheaper than a
  second scheduler under the LocalExecutor, and the same question: does anything depend on a shared
  disk or process?), and the mapped listing shards run on both workers.
- A worker killed with SIGKILL in the middle of a delete batch: the scheduler finds the task's heartbeat
  gone, the retry runs on the other worker, nothing is deleted twice, every intent has exactly one
  outcome, and the run's teardown releases the sweep lease.

Heavy: Airflow's processes start once for both tests, and most of the time is Airflow starting and
scheduling; the fleet is a handful of resources per scope (full-scale runs belong in ``bench/``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from include.airflow_components import SWEEP_STORE, redis_argv, storage_emulator_argv, sweep_store_settings
from include.emulators.gce import Emulator
from include.emulators.http import Daemon, free_port, wait_until
from include.emulators.k8s import K8sEmulator
from tests.helpers import one_outcome_per_intent
from tests.helpers.airflow import Rest, Site, airflow_site
from tests.helpers.gce import add_instance, seed_terminated, slow_deletes
from tests.helpers.k8s import seed_run

pytestmark = pytest.mark.slow(175)  # heavy: real Airflow processes; see the docstring

GCE, K8S = "reaper_gce_enforcement", "reaper_k8s_enforcement"
PROJECTS = ["p", "q", "r", "s"]  # in two listing shards; "p" is where test_scheduler's helpers seed
ZONE = "us-east1-b"
STORES = "reaper_celery_stores"  # run records and run leases (MongoDB)
LEDGER = "reaper_celery"
WORKERS = {"reaper-worker-1", "reaper-worker-2"}


def reaper_config() -> dict[str, object]:
    return {
        "gce": {
            "projects": PROJECTS,
            "writer_health": {"source": "none"},  # heartbeat deletes held; terminated and unlabeled ones go
            "request_timeout": "3s",
            "delete_concurrency": 1,
            "delete_rate_per_project": 1000.0,
            "max_retries": 1,
        },
        "k8s": {
            "clusters": ["kube_e2e"],
            "lease_source": "mongo",
            "mongo_leases": {"database": STORES},
            "mongo_run_store": {"database": STORES},
        },
        "ledger": {"database": LEDGER, "timeout": "3s"},
        "rollout": {"gce": "enforcement", "k8s": "enforcement"},  # the swept phase is the active one (no gate)
        "airflow": {
            "gce_schedule": 0,
            "k8s_schedule": 0,
            "shards": 2,
            "run_timeout": "120s",
            "retries": 1,
            "retry_delay": "1s",
            "sweep_store": SWEEP_STORE,
            "lease_wait": "1s",
        },
    }


@dataclass
class World:
    """One copy of the emulated fleet: a Compute emulator and a Kubernetes emulator, seeded alike."""

    gce: Emulator
    kube: K8sEmulator

    @classmethod
    def seeded(cls) -> World:
        world = cls(Emulator().start(), K8sEmulator().start())
        for n, project in enumerate(PROJECTS):
            world.gce.fleet.add_zone(project, ZONE)
            for i, (name, kind) in enumerate(
                [
                    ("live-0", {}),
                    ("live-1", {}),
                    ("stale", {"heartbeat_age": 6 * 3600}),  # held: writer health unknown
                    ("stopped", {"status": "TERMINATED", "heartbeat_age": None}),
                    ("unlabeled", {"heartbeat_age": None, "created_age": 4 * 86400}),
                    ("pinned", {"status": "TERMINATED", "labels": {"reaper_keep": "true"}}),
                ]
            ):
                add_instance(
                    world.gce.fleet,
                    project,
                    ZONE,
                    f"{project}-{name}",
                    instance_id=1000 * n + i + 1,
                    **cast("dict[str, Any]", kind),
                )
        for run in ("live", "dead", "done", "running-no-lease"):
            seed_run(world.kube.cluster, run)
        return world

    def connections(self) -> dict[str, str]:
        compute = {
            "conn_type": "google_cloud_platform",
            "extra": {"api_endpoint": self.gce.endpoint, "anonymous": True},
        }
        kube = {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(self.kube.kubeconfig())}}
        return {"AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(compute), "AIRFLOW_CONN_KUBE_E2E": json.dumps(kube)}

    def left(self) -> tuple[set[str], set[str]]:
        return self.gce.fleet.names(), self.kube.cluster.names()

    def close(self) -> None:
        self.gce.close()
        self.kube.close()


@dataclass
class Celery:
    site: Site
    rest: Rest
    ledger: Database[dict[str, Any]]  # the reaper's ledger database (pymongo)
    local: World  # swept in one process
    distributed: World  # swept on the Celery workers

    def sweep(self, *dag_ids: str) -> dict[str, str]:
        """Trigger the DAGs at once (they hold different sweep leases), wait for all; their run ids."""
        runs = {dag_id: self.rest.trigger_dag(dag_id) for dag_id in dag_ids}
        for dag_id, run_id in runs.items():
            assert self.rest.wait_for(dag_id, run_id)["state"] == "success", f"{dag_id} {run_id} failed"
        return runs


@pytest.fixture(scope="module")
def celery(tmp_path_factory, mongo_server) -> Iterator[Celery]:
    home = tmp_path_factory.mktemp("airflow-celery")
    config = home / "reaper.yaml"
    config.write_text(json.dumps(reaper_config()))
    mongo: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
    redis_port, store_port = free_port(), free_port()
    daemons: list[Daemon] = []
    worlds: list[World] = []
    try:
        stores = mongo[STORES]
        stores.runs.insert_many(
            [
                {"_id": "live", "status": "running"},
                {"_id": "dead", "status": "failed"},
                {"_id": "done", "status": "succeeded"},
                {"_id": "running-no-lease", "status": "running"},
            ]
        )
        stores.run_leases.insert_one({"_id": "live", "expires_at": None})  # no expiry: held while it exists
        daemons.append(Daemon(redis_argv(redis_port), redis_port, "redis"))
        daemons.append(Daemon(storage_emulator_argv(store_port), store_port, "gcp-storage-emulator"))
        for _ in ("local", "distributed"):
            worlds.append(World.seeded())
        local, distributed = worlds
        settings = {
            "AIRFLOW_CONN_MONGO_DEFAULT": json.dumps(
                {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port}
            ),
            **sweep_store_settings(store_port),
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            # a dead worker's task is found within seconds, not the default 5 minutes
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
            **distributed.connections(),  # the workers' world; the reference sweeps run in this process
        }
        broker = f"redis://127.0.0.1:{redis_port}/0"
        with airflow_site(home, config, GCE, executor="CeleryExecutor", broker_url=broker, settings=settings) as site:
            yield Celery(site, Rest(site.deployment.base_url), mongo[LEDGER], local, distributed)
    finally:
        for world in worlds:
            world.close()
        for daemon in daemons:
            daemon.stop()
        mongo.drop_database(STORES)
        mongo.drop_database(LEDGER)
        mongo.close()


def records(ledger, run_ids: dict[str, str]) -> Counter[tuple[str, ...]]:
    """Every decision, intent and outcome the runs wrote, without what differs from run to run."""
    found = ledger.ledger.find({"run_id": {"$in": list(run_ids.values())}})
    return Counter(
        (r["target"], r["scope"], r["name"], r["action"], str(r.get("reason") or r.get("result") or "")) for r in found
    )


def test_celery_workers_sweep_exactly_as_one_process_does_and_share_the_listing(
    celery: Celery, sweeper, monkeypatch
) -> None:
    # The reference: the same fleet swept in this process (dag.test(): every task on one machine, as under
    # the LocalExecutor), with the same config, connections and gs:// store as the workers.
    monkeypatch.setenv("REAPER_CONFIG", str(celery.site.deployment.reaper_config))
    for key, value in (celery.site.deployment.settings | celery.local.connections()).items():
        if key.startswith(("AIRFLOW_CONN_", "GCSFS_")):
            monkeypatch.setenv(key, value)
    before = celery.local.left()
    local_runs = {}
    for dag_id in (GCE, K8S):
        run = sweeper.run(dag_id)
        assert run.state == "success", f"{dag_id} failed in one process"
        local_runs[dag_id] = run.run_id
    celery.site.use("CeleryExecutor")
    celery_runs = celery.sweep(GCE, K8S)

    expected = records(celery.ledger, local_runs)
    assert records(celery.ledger, celery_runs) == expected
    assert celery.distributed.left() == celery.local.left()
    gce_gone, kube_gone = (b - a for b, a in zip(before, celery.local.left(), strict=True))
    assert gce_gone == {f"{p}-{name}" for p in PROJECTS for name in ("stopped", "unlabeled")}
    # a Pod and its NetworkPolicy share the run's name
    assert kube_gone == {f"sandbox-{run}{part}" for run in ("dead", "done") for part in ("", "-egress-ca", "-files")}
    assert sum(n for key, n in expected.items() if key[3] == "report") > 0  # held and reported ones too

    hosts: dict[str, set[str]] = {}
    for dag_id, run_id in celery_runs.items():
        for ti in celery.rest.task_instances(dag_id, run_id):
            if ti["state"] != "skipped":  # the branch not taken ran nowhere
                hosts.setdefault(str(ti["task_id"]), set()).add(str(ti["hostname"]))
    assert set().union(*hosts.values()) <= WORKERS, hosts  # every task ran on a worker
    assert hosts["list_inventory"] == WORKERS, "the listing shards did not spread over both workers"


def test_a_worker_killed_mid_batch_is_retried_on_the_other_without_a_double_delete(celery: Celery) -> None:
    dag_id = "reaper_gce_terminated_cleanup"
    celery.site.use("CeleryExecutor")
    fleet = celery.distributed.gce.fleet
    before = len(fleet.deleted_ids)
    seed_terminated(fleet, 8, "kill")
    killed = {str(fleet.instance("p", ZONE, f"kill-{i:03d}")["id"]) for i in range(8)}
    arrivals = slow_deletes(fleet, 0.5)
    # Not the active phase (enforcement): confirmed, as an operator runs another phase by hand.
    run_id = celery.rest.trigger_dag(dag_id, confirm_phase="terminated-cleanup", override_reason="worker-kill drill")
    wait_until(lambda: len(arrivals) >= 3, "the first deletes", 90)
    task = celery.rest.task_instances(dag_id, run_id)
    victim = next(str(ti["hostname"]) for ti in task if ti["task_id"] == "delete")
    celery.site.kill(victim)  # the worker and its task, as when its machine dies
    killed_at = len(arrivals)

    run = celery.rest.wait_for(dag_id, run_id, timeout=120)
    fleet.clear_hooks()
    deletes = [ti for ti in celery.rest.task_instances(dag_id, run_id) if ti["task_id"] == "delete"]
    assert run["state"] == "success"
    assert [(ti["try_number"], ti["hostname"]) for ti in deletes] == [(2, (WORKERS - {victim}).pop())]
    assert len(arrivals) > killed_at, "the retry sent no delete"
    calls = Counter(fleet.deleted_ids[before:])
    assert calls and max(calls.values()) == 1, "an instance was sent two deletes"
    results = one_outcome_per_intent(celery.ledger, run_id)
    assert killed <= {r["uid"] for r in celery.ledger.ledger.find({"run_id": run_id, "action": "outcome"})}
    # Recorded deleted: exactly the instances a delete call reached and that are gone (the one whose
    # operation the kill interrupted may still be there, stopping, and must not be recorded deleted).
    left = {str(fleet.instance(p, ZONE, name)["id"]) for p in PROJECTS for name in fleet.names(p)}
    deleted = {r["uid"] for r in celery.ledger.ledger.find({"run_id": run_id, "result": "deleted"})}
    assert deleted == set(calls) - left, results
    assert celery.ledger.sweep_locks.find_one({"_id": "gce"}) is None, "the sweep lease was not released"
