"""Seeding the GCE emulator with instances shaped like the runner managers', relative to the wall clock."""

from __future__ import annotations

import time

from include.emulators.gce import Fleet
from include.emulators.shapes import gcloud_instance
from tests.builders import HB

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
) -> dict[str, object]:
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
