"""The demo's world: an emulated GCE fleet with live and dead runner managers, and a Kubernetes cluster
with sandboxes of live and dead runs, their run records, leases and step results.

One process (``python -m include.demo.fleet --state DIR ...``) serves both emulators,
runs the simulated managers and the live runners' lease renewals, seeds MongoDB and
Postgres, and writes ``DIR/fleet.json`` (endpoints, metrics ports) once everything
is up. What each object is there to show is in ``EXPECTED`` below and in the README.

Ages: the reapable leftovers are seeded with old timestamps (hours or days in the past);
the live ones are kept fresh by their managers and runners. The demo config shortens the
quarantine to 30 s so that a manager that crash-loops from the start has the instances its
lost store abandoned reaped by the enforcement sweep a few minutes later.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import psycopg
from pymongo import MongoClient

from include.emulators.gce import Emulator, Fleet
from include.emulators.gce.manager import ManagerSimulator, manager_clients
from include.emulators.http import free_port
from include.emulators.k8s import RESOURCE_OF_KIND, K8sEmulator
from include.emulators.runs import Runs, write_runs
from include.emulators.shapes import gcloud_instance, kube_pod, kube_run
from include.local_postgres import server_url

log = logging.getLogger("demo.fleet")
HOUR, DAY = 3600.0, 86400.0
ZONES = ("us-east1-b", "us-central1-a")
HEARTBEAT = "runner_manager_heartbeat"
MANAGED = {"iterion.io/managed": "true"}
STEP = {"iterion.io/step": "build", "iterion.io/attempt": "1"}
# The quota incident (docs/design.md §10): the orphans used up ci-runners-b's instance quota, so every machine m4
# re-creates after a restart fails, and still does once the reaper has freed m4's orphans (m3's four live VMs fill it).
INSTANCE_QUOTA = {"ci-runners-b": 4}
CRASH_EVERY = 2.0  # seconds between m4's restarts (a kubelet backs off from 10 s to 5 min)
RUNNER_MANAGERS = "runner-managers-demo"  # the cluster Prometheus labels the managers with (cause_alerts)
LEASE_TTL = 20.0  # seconds: a runner that stops renewing loses its lease this long after
RENEW_EVERY = 5.0

# Managers: name -> (project, instances tracked, how it behaves).
MANAGERS = {
    "m1": ("ci-runners-a", 4, "live"),
    "m2": ("ci-runners-a", 4, "live"),
    "m3": ("ci-runners-b", 4, "live"),
    "m4": ("ci-runners-b", 3, "crash-loops"),  # OOM restarts from its first pass on, each losing its store
    "m5": ("ci-runners-c", 4, "writes-denied"),  # lost its IAM binding: keeps running, every write fails
}

# K8s runs: run id -> (status in the run store or None, lease, what else).
RUNS: dict[str, tuple[str | None, str | None, dict[str, Any]]] = {
    "live-1": ("running", "renewed", {}),
    "live-2": ("running", "renewed", {}),
    "crashed-3": ("running", "expires", {}),  # runner died mid-run; the run is not marked yet
    "done-4": ("succeeded", None, {}),
    "failed-5": ("failed", None, {}),
    "vanished-6": (None, None, {}),  # no run record at all
    "uploading-7": ("succeeded", None, {"sidecar": "results-egress", "sidecar_terminated": False}),
}


def seed_gce(fleet: Fleet, now: float) -> dict[str, list[tuple[str, str]]]:
    """The instances; returns what each manager tracks as (zone, name)."""

    def add(project: str, name: str, zone: str, status: str = "RUNNING", heartbeat: float | None = None, **kw):
        labels = {"ci_ephemeral": "true", **kw.pop("labels", {})}
        if heartbeat is not None:
            labels[HEARTBEAT] = str(int(heartbeat))
        created = kw.pop("created", now - 2 * HOUR)
        fleet.add(
            gcloud_instance(
                project, zone, name, zlib.crc32(f"{project}/{name}".encode()) + 10**15, status, labels, created, **kw
            )
        )

    tracked: dict[str, list[tuple[str, str]]] = {}
    for manager, (project, count, _) in MANAGERS.items():
        tracked[manager] = [(ZONES[i % 2], f"{manager}-runner-{i}") for i in range(count)]
        for zone, name in tracked[manager]:
            add(project, name, zone, heartbeat=now, labels={"manager": manager})
    # Leftovers of a manager that died hours ago: stale under any quarantine. Created before their last
    # heartbeat, as real ones are (a label older than its instance is an anomaly, never reaped).
    old = now - 8 * HOUR
    add("ci-runners-a", "gone-runner-0", ZONES[0], heartbeat=now - 6 * HOUR, created=old)
    add("ci-runners-a", "gone-runner-1", ZONES[1], heartbeat=now - 6 * HOUR, created=old)
    pinned = {"reaper_keep": "true"}
    add("ci-runners-a", "pinned-runner", ZONES[0], heartbeat=now - 6 * HOUR, created=old, labels=pinned)
    add("ci-runners-a", "stopped-runner", ZONES[0], "TERMINATED", created=now - 3 * HOUR, last_stop=now - 2 * HOUR)
    add("ci-runners-a", "unlabeled-runner", ZONES[1], created=now - 4 * DAY)
    add("ci-runners-c", "gone-runner-2", ZONES[0], heartbeat=now - 6 * HOUR, created=old)
    return tracked


def seed_k8s(emulator: K8sEmulator, now: float) -> None:
    cluster = emulator.cluster
    for run, (_, _, pod_options) in RUNS.items():
        for obj in kube_run(run, "ci", now - HOUR, MANAGED, **pod_options):
            cluster.create(RESOURCE_OF_KIND[obj["kind"]], "ci", obj)
    # A step pod whose results row is not durable yet (docs/design.md §5, row 6), and a run younger than min_age.
    labels = {**MANAGED, "iterion.io/run-id": "stepped-8", **STEP}
    cluster.create("pods", "ci", kube_pod("step-stepped-8-build", "ci", "stepped-8-pod", labels, now - HOUR))
    for obj in kube_run("young-9", "ci", now - 60, MANAGED):
        cluster.create(RESOURCE_OF_KIND[obj["kind"]], "ci", obj)


def seed_stores(mongo_url: str, postgres_dsn: str) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, serverSelectionTimeoutMS=10_000)
    status = {run: status for run, (status, _, _) in RUNS.items()}
    write_runs(client, Runs({**status, "stepped-8": "succeeded"}, leased=[]))  # vanished-6: no record
    client.close()
    with psycopg.connect(postgres_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("DROP TABLE IF EXISTS step_runs")
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        conn.execute("INSERT INTO step_runs VALUES ('stepped-8', 'build', 1, 'succeeded', NULL)")


class Runners:
    """The live runners: renew their run leases in a NATS KV bucket whose TTL expires dead runners' keys."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.stop = threading.Event()

    async def _loop(self) -> None:
        import nats
        from nats.js.api import KeyValueConfig

        client = await nats.connect(self.nats_url, connect_timeout=10)
        js = client.jetstream(timeout=10)
        kv = await js.create_key_value(KeyValueConfig(bucket="run_leases", ttl=LEASE_TTL))
        for run, (_, lease, _) in RUNS.items():
            if lease:
                await kv.put(run, b"runner")  # "expires": put once, never renewed
        while not self.stop.is_set():
            await asyncio.sleep(RENEW_EVERY)
            for run, (_, lease, _) in RUNS.items():
                if lease == "renewed":
                    await kv.put(run, b"runner")
        await client.close()

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._loop()), name="runners", daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path, help="where fleet.json and the kubeconfig go")
    parser.add_argument("--mongo-url", required=True)
    # A database of the local server (include/local_postgres.py): its password never on a command line.
    parser.add_argument("--postgres-db", required=True, help="the step store's database on the local PostgreSQL")
    parser.add_argument("--nats-url", help="NATS with JetStream for run leases (else leases live in MongoDB)")
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    now = time.time()
    gce = Emulator(port=free_port()).start()
    tracked = seed_gce(gce.fleet, now)
    kube = K8sEmulator(port=free_port()).start()
    seed_k8s(kube, now)
    seed_stores(args.mongo_url, f"{server_url()}/{args.postgres_db}")
    if args.nats_url:
        Runners(args.nats_url).start()
    else:  # leases in MongoDB: a document per held lease, renewed by the same loop's logic
        _mongo_leases(args.mongo_url)

    clients = manager_clients(gce.endpoint)
    managers: dict[str, ManagerSimulator] = {}
    metrics: dict[str, int] = {}
    for name, (project, _, behaviour) in MANAGERS.items():
        if behaviour == "writes-denied":
            gce.fleet.faults.deny_set_labels.add(project)
        managers[name] = ManagerSimulator(name, project, clients, tracked[name], args.heartbeat_interval)
        metrics[name] = managers[name].serve_metrics(free_port())
        managers[name].run_pass()  # the first pass before anything sweeps
    gce.fleet.faults.instance_quota.update(INSTANCE_QUOTA)
    for name, manager in managers.items():
        if MANAGERS[name][2] == "crash-loops":
            manager.crash()  # before its heartbeat loop starts: no pass refreshes the abandoned instances
            manager.crash_loop(CRASH_EVERY, ZONES[0])
            log.info("manager %s crash-loops: its %d instances are now orphans", name, len(tracked[name]))
        manager.start()

    kubeconfig = args.state / "kubeconfig.json"
    kubeconfig.write_text(json.dumps(kube.kubeconfig("demo"), indent=2))
    info = {
        "gce_endpoint": gce.endpoint,
        "k8s_endpoint": kube.endpoint,
        "kubeconfig": str(kubeconfig),
        # What Prometheus scrapes, with the target labels a real scrape config gives the managers' series.
        "manager_metrics": [
            {"address": f"127.0.0.1:{port}", "labels": {"cluster": RUNNER_MANAGERS, "shard": MANAGERS[n][0]}}
            for n, port in metrics.items()
        ],
        "crashed_at": time.time(),
    }
    partial = args.state / "fleet.json.partial"
    partial.write_text(json.dumps(info, indent=2))
    partial.rename(args.state / "fleet.json")  # atomic: `up` reads it as soon as it exists
    log.info("fleet up: %s", json.dumps(info))

    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with contextlib.suppress(KeyboardInterrupt):
        stopped.wait()
    for manager in managers.values():
        manager.kill()
    gce.close()
    kube.close()


def _mongo_leases(mongo_url: str) -> None:
    """Without NATS: leases as MongoDB documents with an expiry, renewed for the live runners."""

    def loop() -> None:
        client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, serverSelectionTimeoutMS=10_000)
        leases = client["iterion"]["run_leases"]
        leases.delete_many({})
        first = True
        while True:
            for run, (_, lease, _) in RUNS.items():
                if lease == "renewed" or (lease and first):  # "expires": written once, never renewed
                    leases.replace_one({"_id": run}, {"_id": run, "expires_at": time.time() + LEASE_TTL}, upsert=True)
            first = False
            time.sleep(RENEW_EVERY)

    threading.Thread(target=loop, name="runners", daemon=True).start()


if __name__ == "__main__":
    main()
