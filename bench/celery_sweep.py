"""Whole sweeps on the CeleryExecutor (``python bench/sweep.py --executor celery --workers N``).

The fleets of ``bench/sweep.py`` (100,000 GCE instances, 20,000 Kubernetes runs), swept by a real Airflow
(api-server, scheduler, dag-processor; :mod:`include.airflow_components`) with ``N`` Celery workers of one
task slot each, the sweep files on ``gs://`` (gcp-storage-emulator). Prints, per sweep: the wall time of
the run, the listing's span (first ``list_inventory`` start to last end, from the task instances), the
workers the shards ran on, the API calls against their lower bounds, the GCE sweep's ledger round trips
(read from SecantusDB's own ``serverStatus`` counters: the tasks run in the workers' processes) against the
bounds of ``bench/sweep.py``, and the time between task instances (no task of the run running: the
scheduler, the broker, the workers picking tasks up), which is Airflow's alone. The listing has one shard
per worker (``airflow.shards``): more would queue on the same workers, each a task start.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from pymongo import MongoClient

from bench.gce_sweep import start_emulator
from bench.k8s_sweep import start_world
from include.airflow_components import SWEEP_STORE, redis_argv, storage_emulator_argv, sweep_store_settings
from include.emulators.http import Daemon, free_port
from reaper.gce.inventory import PAGE_SIZE as GCE_PAGE
from reaper.k8s.inventory import PAGE_SIZE as K8S_PAGE
from tests.helpers.airflow import Rest, airflow_site
from tests.integration.prometheus import Prometheus


def _ts(text: object) -> float:
    return datetime.fromisoformat(str(text)).timestamp()


def sweep(rest: Rest, dag_id: str) -> tuple[str, float, list[dict]]:
    """Trigger ``dag_id`` and wait for it: its state, wall time (start to end) and task instances."""
    run_id = rest.trigger_dag(dag_id)
    run = rest.wait_for(dag_id, run_id, timeout=1800)
    return str(run["state"]), _ts(run["end_date"]) - _ts(run["start_date"]), rest.task_instances(dag_id, run_id)


def listing(tis: list[dict]) -> tuple[float, Counter[str]]:
    """The listing's span in seconds, and how many shards each worker ran."""
    shards = [ti for ti in tis if ti["task_id"] == "list_inventory"]
    span = max(_ts(t["end_date"]) for t in shards) - min(_ts(t["start_date"]) for t in shards)
    return span, Counter(str(t["hostname"]) for t in shards)


def idle(tis: list[dict], wall: float) -> float:
    """Seconds of the run in which none of its task instances was running: Airflow's alone."""
    spans = sorted((_ts(t["start_date"]), _ts(t["end_date"])) for t in tis if t["start_date"] and t["end_date"])
    busy, reach = 0.0, float("-inf")
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return wall - busy


def mongo_ops(port: int) -> Counter[str]:
    """SecantusDB's command counters (``serverStatus.opcounters``: find is ``query``; update and
    findAndModify are ``update``), for every client of the server, whatever process."""
    client: MongoClient[dict[str, Any]]
    with MongoClient("127.0.0.1", port, directConnection=True) as client:
        return Counter(client.admin.command("serverStatus")["opcounters"])


def report(title: str, state: str, wall: float, tis: list[dict], calls: list[tuple[str, int, int]]) -> None:
    span, hosts = listing(tis)
    tasks = Counter(str(t["task_id"]) for t in tis)
    print(f"\n## {title}: {state}")
    print(f"  run (start to end) {wall:8.2f} s, {len(tis)} task instances ({tasks['delete']} delete)")
    between = idle(tis, wall)
    print(f"  between tasks      {between:8.2f} s  {100 * between / wall:5.1f} % (no task running: Airflow's alone)")
    took: defaultdict[str, float] = defaultdict(float)
    for t in tis:
        if t["start_date"] and t["end_date"]:
            took[str(t["task_id"])] += _ts(t["end_date"]) - _ts(t["start_date"])
    print("  task instances     " + ", ".join(f"{task} {seconds:.1f} s" for task, seconds in took.items()))
    print(f"  listing span       {span:8.2f} s  shards per worker: {dict(sorted(hosts.items()))}")
    print(f"  {'calls':24s} {'made':>8s} {'lower bound':>12s}")
    for name, made, bound in calls:
        print(f"  {name:24s} {made:8d} {bound:12d}{'' if made == bound else '  <-'}")


def main(args: argparse.Namespace, home: Path, writers: Callable[[list[str]], int]) -> None:
    """Both sweeps on ``args.workers`` Celery workers (the fleet arguments are bench/sweep.py's; ``writers``
    serves the managers' writer health for Prometheus)."""
    runs = [f"run-{r:06d}" for r in range(args.runs)]
    orphans = set(runs[:: round(1 / args.k8s_orphaned)])
    projects = [f"ci-project-{p:03d}" for p in range(args.projects)]
    redis_port, store_port = free_port(), free_port()
    started: list[Daemon] = []
    world = start_world(runs, orphans, args.k8s_latency)
    emulator, endpoint = start_emulator(args)
    (home / "prometheus").mkdir()
    prometheus = Prometheus(home / "prometheus", [f"127.0.0.1:{writers(projects)}"])
    try:
        started.append(Daemon(redis_argv(redis_port), redis_port, "redis"))
        started.append(Daemon(storage_emulator_argv(store_port), store_port, "gcp-storage-emulator"))
        prometheus.wait_for_writers(len(projects))
        config = home / "reaper.yaml"
        config.write_text(
            json.dumps(
                {
                    "gce": {"projects": projects, "writer_health": {"prometheus_url": prometheus.url}},
                    "k8s": {"clusters": ["bench_cluster"], "delete_rate_per_cluster": 1000.0},
                    "max_deletions_per_sweep": 100_000,
                    "rollout": {"gce": "enforcement", "k8s": "enforcement"},  # the swept phase is the active one
                    "airflow": {
                        "gce_schedule": 0,
                        "k8s_schedule": 0,
                        "sweep_store": SWEEP_STORE,
                        "retries": 0,
                        "run_timeout": "10m",
                        "shards": args.workers,
                    },
                }
            )
        )
        compute = {"api_endpoint": endpoint, "anonymous": True}
        connections = {
            "google_cloud_default": {"conn_type": "google_cloud_platform", "extra": compute},
            "bench_cluster": {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(world.kubeconfig())}},
            "nats_default": {"conn_type": "generic", "host": "127.0.0.1", "port": world.nats_port},
            "mongo_default": {"conn_type": "mongo", "host": "127.0.0.1", "port": world.mongo_port},
        }
        settings = {f"AIRFLOW_CONN_{k.upper()}": json.dumps(v) for k, v in connections.items()}
        settings |= sweep_store_settings(store_port) | {"AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}
        broker = f"redis://127.0.0.1:{redis_port}/0"
        with airflow_site(home, config, "reaper_k8s_enforcement", broker_url=broker, settings=settings) as site:
            site.use("CeleryExecutor", workers=args.workers)
            rest = Rest(site.deployment.base_url)
            ops_before = mongo_ops(world.mongo_port)
            gce_state, gce_wall, gce_tis = sweep(rest, "reaper_gce_enforcement")
            gce_calls = requests.get(f"{endpoint}/_emulator/stats", timeout=30).json()["counters"]
            gce_ops = mongo_ops(world.mongo_port) - ops_before
            if not args.gce_only:
                k8s_state, k8s_wall, k8s_tis = sweep(rest, "reaper_k8s_enforcement")
                k8s_calls = world.api_calls()
    finally:
        for daemon in reversed(started):
            daemon.stop(timeout=30)
        prometheus.stop()
        emulator.terminate()
        world.stop()

    print(f"# CeleryExecutor, {args.workers} worker(s) of one task slot each, on this machine's cores")
    reaped = gce_calls.get("delete", 0)
    batches = sum(1 for t in gce_tis if t["task_id"] == "delete")
    # The bounds of bench/sweep.py: finds 3 + 2 per delete task + 1 per delete + 1; updates 1 + 3 per delete
    # + 1, and the lease's findAndModify.
    report(
        f"reaper_gce_enforcement: {args.projects * args.per_project:,} instances, {args.projects} projects",
        gce_state,
        gce_wall,
        gce_tis,
        [
            (
                "aggregated_list",
                gce_calls.get("aggregated_list", 0),
                args.projects * math.ceil(args.per_project / GCE_PAGE),
            ),
            ("get", gce_calls.get("get", 0), reaped),
            ("delete", reaped, reaped),
            ("ledger find commands", gce_ops["query"], 3 + 2 * batches + reaped + 1),
            ("ledger update + findAndModify", gce_ops["update"], 1 + 3 * reaped + 1 + 1),
            ("getMore commands", gce_ops["getmore"], 0),
        ],
    )
    if args.gce_only:
        return
    per_kind = {"Pod": args.runs, "Secret": 2 * args.runs, "NetworkPolicy": args.runs}
    report(
        f"reaper_k8s_enforcement: {args.runs:,} runs ({4 * args.runs:,} objects)",
        k8s_state,
        k8s_wall,
        k8s_tis,
        [
            ("list", k8s_calls.get("list", 0), sum(math.ceil(n / K8S_PAGE) for n in per_kind.values()) + len(orphans)),
            ("delete", k8s_calls.get("delete", 0), 4 * len(orphans)),
        ],
    )
