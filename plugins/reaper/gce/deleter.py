"""Deleting planned instances: re-validated, rate-limited, bounded, and every outcome returned as data.

Immediately before each delete the instance is read again and must still have
the planned ``id`` (not a new VM under the same name), the planned heartbeat
label value (its manager has not come back) and the planned status class
(a TERMINATED instance has not been restarted); otherwise it is skipped as
``changed_since_plan``. Deletes are ``delete_unary`` plus a wait on the zone
operation with the same client options (the SDK's extended-operation poller
would poll the real endpoint). A 404 means already gone; 429, 5xx and timeouts
are retried with backoff, then that instance alone fails and the sweep goes on.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import zip_longest
from typing import TypeVar

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from reaper.config import Settings
from reaper.gce.clients import ComputeClients, transient
from reaper.model import GceInstance
from reaper.ratelimit import BucketsPerScope
from reaper.retry import Backoff

T = TypeVar("T")
GET_FIELD_MASK = "id,name,status,labels"  # what re-validation compares
DELETED, ALREADY_GONE, CHANGED, FAILED = "deleted", "already_gone", "changed_since_plan", "failed"
_DONE = compute_v1.Operation.Status.DONE


@dataclass(frozen=True)
class Outcome:
    """What happened to one planned delete. ``detail`` says why for anything but ``deleted``."""

    project: str
    zone: str
    name: str
    id: str
    result: str
    detail: str = ""


def interleave(items: Iterable[T], key: Callable[[T], str]) -> list[T]:
    """Round-robin over the groups of ``items`` (by ``key``), each group in its own order."""
    groups: dict[str, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return [item for row in zip_longest(*groups.values()) for item in row if item is not None]


def status_class(status: str) -> str:
    """TERMINATED instances run nothing; every other status may be running a job."""
    return "terminated" if status == "TERMINATED" else "active"


class GceDeleter:
    def __init__(self, clients: ComputeClients, config: Settings, backoff: Backoff | None = None) -> None:
        gce = config.gce
        self.clients = clients
        self.heartbeat_label = gce.heartbeat_label
        self.concurrency = gce.delete_concurrency
        self.timeout = gce.request_timeout.total_seconds()
        self.operation_timeout = gce.operation_timeout.total_seconds()
        self.backoff = backoff or Backoff(gce.max_retries)
        self.buckets = BucketsPerScope(gce.delete_rate_per_project)

    def delete(self, planned: Sequence[GceInstance]) -> list[Outcome]:
        """Delete every planned instance that is still what the plan saw; one outcome each, in order.

        Work is interleaved across projects: plans come project by project, and workers that all
        took the same project would queue on its rate limit while the others sit idle.
        """
        order = interleave(range(len(planned)), key=lambda i: planned[i].project)
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="gce-delete") as pool:
            done = dict(zip(order, pool.map(lambda i: self._delete_one(planned[i]), order), strict=True))
        return [done[i] for i in range(len(planned))]

    def _outcome(self, inst: GceInstance, result: str, detail: str = "") -> Outcome:
        return Outcome(inst.project, inst.zone, inst.name, inst.id, result, detail)

    def _delete_one(self, inst: GceInstance) -> Outcome:
        target = {"project": inst.project, "zone": inst.zone, "instance": inst.name}
        try:
            current = self.backoff.call(
                lambda: self.clients.instances.get(
                    **target, retry=None, timeout=self.timeout, metadata=[("x-goog-fieldmask", GET_FIELD_MASK)]
                ),
                transient,
            )
        except gexc.NotFound:
            return self._outcome(inst, ALREADY_GONE, "404 on get")
        except Exception as exc:
            return self._outcome(inst, FAILED, f"get: {type(exc).__name__}: {exc}")
        changes = self._changes(inst, current)
        if changes:
            return self._outcome(inst, CHANGED, "; ".join(changes))
        self.buckets.acquire(inst.project)
        try:
            op = self.backoff.call(
                lambda: self.clients.instances.delete_unary(**target, retry=None, timeout=self.timeout), transient
            )
        except gexc.NotFound:
            return self._outcome(inst, ALREADY_GONE, "404 on delete")
        except Exception as exc:
            return self._outcome(inst, FAILED, f"delete: {type(exc).__name__}: {exc}")
        return self._wait(inst, op)

    def _changes(self, planned: GceInstance, current: compute_v1.Instance) -> list[str]:
        changes = []
        if str(current.id) != planned.id:
            changes.append(f"id {planned.id} -> {current.id} (recreated under the same name)")
        now_beat = current.labels.get(self.heartbeat_label)
        if now_beat != planned.labels.get(self.heartbeat_label):
            changes.append(f"heartbeat {planned.labels.get(self.heartbeat_label)} -> {now_beat}")
        if status_class(current.status) != status_class(planned.status):
            changes.append(f"status {planned.status} -> {current.status}")
        return changes

    def _wait(self, inst: GceInstance, op: compute_v1.Operation) -> Outcome:
        deadline = time.monotonic() + self.operation_timeout
        name = op.name
        try:
            while op.status != _DONE:
                if time.monotonic() > deadline:
                    return self._outcome(inst, FAILED, f"operation {name} not done after {self.operation_timeout:.0f}s")
                op = self.backoff.call(
                    lambda: self.clients.operations.wait(
                        project=inst.project, zone=inst.zone, operation=name, retry=None, timeout=self.timeout
                    ),
                    transient,
                )
        except Exception as exc:
            return self._outcome(inst, FAILED, f"operation {name}: {type(exc).__name__}: {exc}")
        if "error" in op and op.error.errors:
            errors = ", ".join(f"{e.code}: {e.message}" for e in op.error.errors)
            return self._outcome(inst, FAILED, f"operation {name} failed: {errors}")
        return self._outcome(inst, DELETED)
