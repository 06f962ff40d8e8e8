"""Benchmark of a GCE sweep against the emulator (``python bench/gce_sweep.py``; ``make bench``).

100,000 instances in 200 projects, 2% orphaned, 20 ms injected latency per
request: list every project through the real compute_v1 client, evaluate the
enforcement policy, delete the orphans. Prints API calls by kind against the
lower bound (list pages = sum of ceil(instances/500); one get and one delete
plus the operation wait per reaped instance; nothing per kept instance) and the
wall time against the larger of two lower bounds measured from the same run's
parameters: (list pages x latency / list concurrency) + (delete-path calls x
latency / delete concurrency), and the time the per-project rate limit forces.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

from include.emulators.http import free_port  # noqa: E402
from reaper.config import parse_settings  # noqa: E402
from reaper.gce.clients import compute_clients  # noqa: E402
from reaper.gce.deleter import GceDeleter  # noqa: E402
from reaper.gce.inventory import PAGE_SIZE, list_projects  # noqa: E402
from reaper.model import Evidence, GceInstance, Phase, WriterRecord, incomplete_scopes  # noqa: E402
from reaper.policy import evaluate  # noqa: E402
from reaper.retry import Backoff  # noqa: E402


def start_emulator(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    """The emulator in its own process, so its JSON work does not share this process's GIL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "include.emulators.gce",
        "--port",
        str(port),
        "--latency",
        str(args.latency),
        "--generate",
        str(args.projects),
        str(args.zones),
        str(args.per_project),
        "--orphaned",
        str(args.orphaned),
    ]
    process = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if "GCE emulator on" not in line:
        process.kill()
        raise RuntimeError(f"emulator did not start: {line!r}")
    return process, line.split()[3]


def fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """The emulated fleet's shape (``start_emulator`` reads these)."""
    parser.add_argument("--projects", type=int, default=200)
    parser.add_argument("--per-project", type=int, default=500)
    parser.add_argument("--zones", type=int, default=3)
    parser.add_argument("--orphaned", type=float, default=0.02)
    parser.add_argument("--latency", type=float, default=0.020)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fleet_arguments(parser)
    args = parser.parse_args()

    config = parse_settings({"max_deletions_per_sweep": 100_000}, "bench")
    gce = config.gce
    projects = [f"ci-project-{p:03d}" for p in range(args.projects)]
    emulator, endpoint = start_emulator(args)
    try:
        clients = compute_clients(api_endpoint=endpoint)
        now = time.time()
        started = time.perf_counter()
        listings = list_projects(clients, projects, gce.selector, gce.list_concurrency, Backoff(gce.max_retries), 60)
        listed = time.perf_counter()
        instances = [i for listing in listings for i in listing.resources]
        writers = [WriterRecord(f"mgr-{p}", p, now - 60, False) for p in projects]
        evidence = Evidence(writer_health=writers, incomplete=incomplete_scopes(listings))
        plan = evaluate(instances, evidence, config, Phase.ENFORCEMENT, datetime.fromtimestamp(now, UTC))
        evaluated = time.perf_counter()
        doomed = cast("list[GceInstance]", [d.resource for d in plan.deletes()])  # a fleet of instances only
        outcomes = GceDeleter(clients, config).delete(doomed)
        deleted = time.perf_counter()
        counts = requests.get(f"{endpoint}/_emulator/stats", timeout=10).json()["counters"]
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)

    reaped = sum(1 for o in outcomes if o.result == "deleted")
    per_project = Counter(i.project for i in doomed)
    pages_bound = args.projects * math.ceil(args.per_project / PAGE_SIZE)
    bound = {"aggregated_list": pages_bound, "get": reaped, "delete": reaped, "operation_wait": reaped}
    delete_path_calls = bound["get"] + bound["delete"] + bound["operation_wait"]
    io_bound = (
        pages_bound * args.latency / gce.list_concurrency + delete_path_calls * args.latency / gce.delete_concurrency
    )
    rate_bound = max((n - 1) / gce.delete_rate for n in per_project.values())  # the quota share may lower it
    lower = max(io_bound, rate_bound)
    wall = deleted - started

    print(
        f"# {len(instances):,} instances listed in {args.projects} projects, {len(doomed):,} orphaned, "
        f"{args.latency * 1000:.0f} ms latency; list concurrency {gce.list_concurrency}, delete concurrency "
        f"{gce.delete_concurrency}, {gce.delete_rate:g} deletes/s per project"
    )
    print(f"{'API calls':16s} {'made':>8s} {'lower bound':>12s}")
    for kind in ("aggregated_list", "get", "delete", "operation_wait", "operation_get", "list", "set_labels"):
        print(f"{kind:16s} {counts.get(kind, 0):8d} {bound.get(kind, 0):12d}")
    results = dict(Counter(str(o.result) for o in outcomes))
    complete = sum(1 for x in listings if x.complete)
    print(f"outcomes: {results}; complete listings: {complete}/{len(listings)}")
    print(
        f"wall: list {listed - started:.2f} s, evaluate {evaluated - listed:.2f} s, "
        f"delete {deleted - evaluated:.2f} s, total {wall:.2f} s"
    )
    print(
        f"lower bounds: I/O {io_bound:.2f} s, rate limit {rate_bound:.2f} s -> {lower:.2f} s; "
        f"ratio {wall / lower:.2f} (target <= 1.5)"
    )


if __name__ == "__main__":
    main()
