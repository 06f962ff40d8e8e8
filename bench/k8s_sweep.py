"""Benchmark of a Kubernetes sweep (``python bench/k8s_sweep.py``; ``make bench``).

20,000 runs (80,000 objects) in the emulator (its own process, 10 ms latency),
5% orphaned: their lease is absent from a real NATS KV bucket and their run is
``failed`` in a real MongoDB-protocol store (SecantusDB); the rest hold a lease.
Lists through the real ``kubernetes`` client, gathers evidence, evaluates the
enforcement policy and deletes. Prints API calls by kind against the lower bound
(list pages per kind; exactly one delete per reaped object), store and lease
round trips, and wall time against the I/O and rate-limit lower bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import nats  # noqa: E402
import requests  # noqa: E402
from kubernetes import config as kconfig  # noqa: E402
from pymongo import MongoClient, monitoring  # noqa: E402

from include.emulators.http import Daemon, free_port, listening, server_binary, start_secantusdb, wait_until  # noqa: E402
from include.emulators.k8s.cluster import K8sFaults  # noqa: E402
from reaper.config import parse_settings  # noqa: E402
from reaper.k8s.deleter import K8sDeleter  # noqa: E402
from reaper.k8s.evidence import gather  # noqa: E402
from reaper.k8s.inventory import PAGE_SIZE, list_cluster  # noqa: E402
from reaper.model import K8sObject, Phase, incomplete_scopes  # noqa: E402
from reaper.policy import evaluate  # noqa: E402
from reaper.retry import Backoff  # noqa: E402
from reaper.stores.mongo import MongoRunStore  # noqa: E402
from reaper.stores.nats import NatsLeases  # noqa: E402


class Finds(monitoring.CommandListener):
    count = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("find", "getMore"):
            Finds.count += 1

    def succeeded(self, event: object) -> None:
        pass

    def failed(self, event: object) -> None:
        pass


async def put_leases(url: str, keys: list[str]) -> None:
    client = await nats.connect(url)
    kv = await client.jetstream().create_key_value(bucket="run_leases")
    for start in range(0, len(keys), 500):
        await asyncio.gather(*(kv.put(k, b"runner") for k in keys[start : start + 500]))
    await client.close()


@dataclass
class World:
    """The emulator (its own process), SecantusDB and NATS, seeded with runs, leases and run records."""

    procs: list[subprocess.Popen[bytes]]
    work: Path
    k8s_port: int
    mongo_port: int
    nats_port: int
    nats_monitor: int

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def kubeconfig(self) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "e",
            "clusters": [{"name": "e", "cluster": {"server": f"http://127.0.0.1:{self.k8s_port}"}}],
            "users": [{"name": "e", "user": {"token": "x"}}],
            "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e"}}],
        }

    def nats_messages(self) -> int:
        return int(requests.get(f"http://127.0.0.1:{self.nats_monitor}/varz", timeout=5).json()["in_msgs"])

    def api_calls(self) -> dict[str, int]:
        return requests.get(f"http://127.0.0.1:{self.k8s_port}/_emulator/stats", timeout=10).json()["counters"]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        shutil.rmtree(self.work, ignore_errors=True)


def start_world(runs: list[str], orphans: set[str], latency: float) -> World:
    """Orphaned runs have no lease and a ``failed`` record; the others hold a lease and are ``running``."""
    work = Path(tempfile.mkdtemp(prefix="reaper-bench-"))
    world = World([], work, free_port(), free_port(), free_port(), free_port())
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    emulator = [sys.executable, "-m", "include.emulators.k8s", "--port", str(world.k8s_port)]
    emulator += ["--generate", str(len(runs)), "--latency", str(latency)]
    nats_argv = [server_binary("nats-server"), "-a", "127.0.0.1", "-p", str(world.nats_port)]
    nats_argv += ["-m", str(world.nats_monitor), "-js", "-sd", str(work / "js")]
    world.procs.append(subprocess.Popen(emulator, cwd=ROOT, **quiet))  # type: ignore[call-overload]  # **quiet (stdout, stderr: DEVNULL) is typed dict[str, int]
    try:  # the emulator generates its runs meanwhile
        world.procs.append(start_secantusdb(world.mongo_port, timeout=60).process)
        world.procs.append(Daemon(nats_argv, world.nats_port, "nats-server", timeout=60).process)
        wait_until(lambda: listening(world.k8s_port), f"the emulator on port {world.k8s_port}", 60)
        asyncio.run(put_leases(world.nats_url, [r for r in runs if r not in orphans]))
        docs = [{"_id": r, "status": "failed" if r in orphans else "running"} for r in runs]
        runs_store: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{world.mongo_port}/")
        runs_store["iterion"]["runs"].insert_many(docs)
    except BaseException:
        world.stop()
        raise
    return world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--orphaned", type=float, default=0.05)
    parser.add_argument("--latency", type=float, default=0.010)
    parser.add_argument("--rate", type=float, default=1000.0, help="deletes/s per cluster for this run")
    args = parser.parse_args()
    runs = [f"run-{r:06d}" for r in range(args.runs)]
    orphans = set(runs[:: round(1 / args.orphaned)])
    config = parse_settings(
        {"k8s": {"delete_rate_per_cluster": args.rate}, "max_deletions_per_sweep": 100_000}, "bench"
    )
    world = start_world(runs, orphans, args.latency)
    try:
        mongo: MongoClient[dict[str, Any]] = MongoClient(
            f"mongodb://127.0.0.1:{world.mongo_port}/", event_listeners=[Finds()]
        )
        api = kconfig.new_client_from_config_dict(world.kubeconfig())
        nats_url = world.nats_url
        finds_before, nats_before = Finds.count, world.nats_messages()

        started = time.perf_counter()
        listing = list_cluster(api, "c1", config.k8s.selector, Backoff(4), 60)
        listed = time.perf_counter()
        leases = NatsLeases(nats_url, config.k8s.nats_leases)
        store = MongoRunStore(mongo, config.k8s.mongo_run_store)
        spent: dict[str, float] = {}

        def timed(name, read):
            def run(keys):
                t = time.perf_counter()
                try:
                    return read(keys)
                finally:
                    spent[name] = time.perf_counter() - t

            return run

        objects = cast("list[K8sObject]", listing.resources)  # a cluster's listing holds only its objects
        evidence = gather(
            objects,
            config,
            timed("NATS leases", leases.read),
            timed("run store", store.read),
            None,
            incomplete_scopes([listing]),
        )
        gathered = time.perf_counter()
        plan = evaluate(objects, evidence, config, Phase.ENFORCEMENT, datetime.now(UTC))
        evaluated = time.perf_counter()
        outcomes = K8sDeleter(lambda _: api, config).delete(
            cast("list[K8sObject]", [d.resource for d in plan.deletes()])
        )
        deleted = time.perf_counter()
        finds = Finds.count - finds_before
        nats_msgs = world.nats_messages() - nats_before
        counts = world.api_calls()
    finally:
        world.stop()

    per_kind = {"Pod": args.runs, "Secret": 2 * args.runs, "NetworkPolicy": args.runs}
    pages = sum(math.ceil(n / PAGE_SIZE) for n in per_kind.values())
    reaped = sum(1 for o in outcomes if o.result == "deleted")
    runs_reaped = len(orphans)
    # Per reaped run, one after the other: its 4 objects read again, the Pod's delete, at least one read
    # of the terminating Pod after the emulated kubelet's shutdown, its Pods listed and its 3 other
    # objects read again, their 3 deletes.
    per_run = 4 + 1 + 1 + 1 + 3 + 3
    POD_SHUTDOWN = K8sFaults.pod_shutdown
    io_bound = (
        pages * args.latency + runs_reaped * (per_run * args.latency + POD_SHUTDOWN) / config.k8s.delete_concurrency
    )
    rate_bound = max(0, reaped - 1) / args.rate
    lower = max(io_bound, rate_bound)
    wall = deleted - started
    print(
        f"# {args.runs:,} runs ({len(listing.resources):,} objects), {len(orphans):,} orphaned runs, "
        f"{args.latency * 1000:.0f} ms latency; delete concurrency {config.k8s.delete_concurrency}, "
        f"{args.rate:g} deletes/s per cluster"
    )
    print(f"{'API calls':10s} {'made':>8s} {'lower bound':>12s}")
    print(f"{'list':10s} {counts.get('list', 0):8d} {pages + runs_reaped:12d}")
    print(f"{'list_named':10s} {counts.get('list_named', 0):8d} {8 * runs_reaped:12d}")  # re-reads by name
    print(f"{'delete':10s} {counts.get('delete', 0):8d} {4 * runs_reaped:12d}")
    print(
        f"run store: {finds} find commands for {args.runs:,} runs (lower bound {math.ceil(args.runs / 1000) + 1}: "
        "its proof, then one per 1,000); "
        f"NATS: {nats_msgs} client messages for the lease listing"
    )
    results = sorted(Counter(str(o.result) for o in outcomes).items())
    print(f"outcomes: {results}; listing complete: {listing.complete}")
    print(
        f"wall: list {listed - started:.2f} s, evidence {gathered - listed:.2f} s, evaluate "
        f"{evaluated - gathered:.2f} s, delete {deleted - evaluated:.2f} s, total {wall:.2f} s"
    )
    print("evidence: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in spent.items()))
    print(
        f"lower bounds: I/O {io_bound:.2f} s, rate limit {rate_bound:.2f} s -> {lower:.2f} s; ratio {wall / lower:.2f}"
    )


if __name__ == "__main__":
    main()
