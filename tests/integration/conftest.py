"""Fixtures that start emulators and real servers for the integration tests."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from include.emulators.gce import Emulator, Fleet
from include.emulators.shapes import gcloud_instance
from reaper.gce.clients import ComputeClients, compute_clients
from reaper.retry import Backoff

NOW = time.time()
HB = "runner_manager_heartbeat"


@pytest.fixture
def gce() -> Iterator[tuple[Fleet, ComputeClients]]:
    """A running GCE emulator and real ``compute_v1`` clients pointed at it."""
    with Emulator() as emulator:
        yield emulator.fleet, compute_clients(api_endpoint=emulator.endpoint)


def fast_backoff(retries: int = 4) -> Backoff:
    return Backoff(retries, base=0.01, cap=0.05)


def add_instance(
    fleet: Fleet,
    project: str,
    zone: str,
    name: str,
    heartbeat_age: float | None = 60,
    status: str = "RUNNING",
    instance_id: int | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, object]:
    all_labels = {"ci_ephemeral": "true", **(labels or {})}
    if heartbeat_age is not None:
        all_labels[HB] = str(int(NOW - heartbeat_age))
    inst = gcloud_instance(
        project, zone, name, instance_id or abs(hash((project, name))) % 10**18, status, all_labels, NOW - 86400
    )
    fleet.add(inst)
    return inst
