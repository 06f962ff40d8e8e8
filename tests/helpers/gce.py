"""Seeding the GCE emulator with instances shaped like the runner managers', relative to the wall clock."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from include.emulators.gce import Fleet
from include.emulators.gce.manager import ManagerSimulator, manager_clients
from include.emulators.http import free_port
from include.emulators.shapes import gcloud_instance
from tests.builders import HB
from tests.integration.prometheus import Prometheus

# The wall clock when the tests started: the emulated instances' heartbeats and creation times are
# relative to it (unlike tests.builders.NOW, the fixed instant of the policy tests).
STARTED = time.time()


def add_instance(
    fleet: Fleet,
    project: str,
    zone: str,
    name: str,
    heartbeat_age: float | None = 60,
    status: str = "RUNNING",
    instance_id: int | None = None,
    labels: dict[str, str] | None = None,
    created_age: float = 86400,
) -> dict[str, Any]:
    all_labels = {"ci_ephemeral": "true", **(labels or {})}
    if heartbeat_age is not None:
        all_labels[HB] = str(int(STARTED - heartbeat_age))
    inst = gcloud_instance(
        project,
        zone,
        name,
        instance_id or abs(hash((project, name))) % 10**18,
        status,
        all_labels,
        STARTED - created_age,
    )
    fleet.add(inst)
    return inst


@contextmanager
def healthy_writers(projects: list[str], folder: Path) -> Iterator[str]:
    """A heartbeat writer per project passing every half second, scraped by a real Prometheus: its URL.

    The writers track no instance: the tests seed heartbeat labels themselves, relative to ``STARTED``.
    """
    managers = [ManagerSimulator(f"m-{p}", p, manager_clients(), [], interval=0.5) for p in projects]
    ports = [m.serve_metrics(free_port()) for m in managers]
    for m in managers:
        m.start()
    prom = Prometheus(folder, [f"127.0.0.1:{port}" for port in ports])
    try:
        prom.wait_for_writers(len(projects))
        yield prom.url
    finally:
        prom.stop()
        for m in managers:
            m.kill()


def busiest_second(events: Iterable[tuple[str, float]]) -> dict[str, int]:
    """Per scope, the most of ``(scope, time)`` events within any one second: how a delete rate is checked."""
    times: dict[str, list[float]] = defaultdict(list)
    for scope, at in events:
        times[scope].append(at)
    most: dict[str, int] = {}
    for scope, ts in times.items():
        ts.sort()
        j = most[scope] = 0
        for i, t in enumerate(ts):
            while ts[j] < t - 1.0:
                j += 1
            most[scope] = max(most[scope], i - j + 1)
    return most


_IDS = itertools.count(10_000)  # ids of seeded stopped VMs, unique across tests sharing a fleet


def seed_terminated(fleet: Fleet, count: int, prefix: str) -> None:
    """``count`` stopped VMs in ``p``, each its own id (the same id twice would make the listing incomplete)."""
    for i in range(count):
        add_instance(fleet, "p", "us-east1-b", f"{prefix}-{i:03d}", status="TERMINATED", instance_id=next(_IDS))


def slow_deletes(fleet: Fleet, seconds: float) -> list[float]:
    """Each delete operation takes ``seconds``; returns the wall-clock times delete calls arrive at."""
    fleet.clear_hooks()
    arrivals: list[float] = []
    fleet.on("before", "delete", lambda _: arrivals.append(time.time()), times=None)
    fleet.on("before", "operation_wait", lambda _: time.sleep(seconds), times=None)
    return arrivals
