"""Deleting planned instances: re-validated, rate-limited, fenced, bounded, every outcome returned as data.

For each planned instance, in this order (DESIGN.md section 6):

1. the project's rate-limit token, first: a wait happens before the re-read, never between it and the delete;
2. the durable intent;
3. the re-read, by numeric id: it must still be the planned VM (same id and name), carry the planned
   heartbeat label value (its manager has not come back), have the planned status class (a TERMINATED
   instance has not been restarted), match the selector, carry no opt-out label and have no deletion
   protection; otherwise ``changed_since_plan``;
4. the guard (the sweep lease, the deadline, a stop): the re-read may have spent its retries;
5. ``delete_unary`` by numeric id, which the Compute API takes in place of the name: a VM recreated under
   the same name after the re-read has another id and can never be the one deleted;
6. a wait on the zone operation (same client options: the SDK's poller would poll the real endpoint),
   cut short at the guard's deadline (``operation_pending``).

A 404 means already gone, or ``deleted`` when this sweep's own delete call may have caused it. 429, 5xx and
timeouts are retried with backoff, each retry guarded again; then that instance alone fails. A 409 or 412
is ``failed`` (``unconfirmed`` on a retry, which an earlier try may have caused): a delete by id has no
precondition, and a refusal that repeats every sweep must raise the failed-deletions alert.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from reaper.config import Settings
from reaper.fence import UNCONFIRMED, Halted, SendGuard
from reaper.gce.clients import ComputeClients, transient
from reaper.model import GceInstance, Outcome
from reaper.ratelimit import BucketsPerScope, round_robin
from reaper.retry import Backoff

GET_FIELD_MASK = "id,name,status,labels,deletionProtection"  # what re-validation compares
DELETED, ALREADY_GONE, CHANGED, FAILED = "deleted", "already_gone", "changed_since_plan", "failed"
OPERATION_PENDING = "operation_pending"  # the delete was accepted; its operation had not finished by the deadline
_DONE = compute_v1.Operation.Status.DONE
_POLL = 1.0  # seconds between operation polls once the server-side wait has returned


def status_class(status: str) -> str:
    """TERMINATED instances run nothing; every other status may be running a job."""
    return "terminated" if status == "TERMINATED" else "active"


class GceDeleter:
    def __init__(self, clients: ComputeClients, config: Settings, backoff: Backoff | None = None) -> None:
        gce = config.gce
        self.clients = clients
        self.heartbeat_label = gce.heartbeat_label
        self.selector = gce.selector
        self.opt_out = gce.opt_out_label
        self.concurrency = gce.delete_concurrency
        self.timeout = gce.request_timeout.total_seconds()
        self.operation_timeout = gce.operation_timeout.total_seconds()
        self.backoff = backoff or Backoff(gce.max_retries)
        self.buckets = BucketsPerScope(gce.delete_rate_per_project)

    def delete(self, planned: Sequence[GceInstance], guard: SendGuard | None = None) -> list[Outcome]:
        """Delete every planned instance that is still what the plan saw; one outcome each, in order.

        Work is interleaved across projects: plans come project by project, and workers that all
        took the same project would queue on its rate limit while the others sit idle.
        """
        guard = guard or SendGuard()
        order = round_robin(range(len(planned)), key=lambda i: planned[i].project)

        def one(i: int) -> Outcome:
            outcome = self._delete_one(planned[i], guard)
            guard.record(planned[i], outcome.result, outcome.detail)
            return outcome

        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="gce-delete") as pool:
            done = dict(zip(order, pool.map(one, order), strict=True))
        return [done[i] for i in range(len(planned))]

    def _gone(self, inst: GceInstance, guard: SendGuard, where: str, sent: bool) -> Outcome:
        """A 404: this sweep's own doing when its delete call (now or in an earlier try) went out."""
        if sent or inst.id in guard.sent_before:
            return Outcome(inst, DELETED, f"404 on {where} after this sweep's delete call")
        return Outcome(inst, ALREADY_GONE, f"404 on {where}")

    def _delete_one(self, inst: GceInstance, guard: SendGuard) -> Outcome:
        why = guard.check(lease=False)  # no token waited for past the deadline
        if why:
            return Outcome(inst, guard.unsent(inst), why)
        self.buckets.acquire(inst.project)  # before the re-read: no wait between it and the delete
        why = guard.before_send(inst, lease=False)  # the durable intent, before the re-read too
        if why:
            return Outcome(inst, guard.unsent(inst), why)
        # By id: a VM recreated under the name is another instance, and this one is gone.
        target = {"project": inst.project, "zone": inst.zone, "instance": inst.id}
        try:
            current = self.backoff.call(
                lambda: self.clients.instances.get(
                    **target, retry=None, timeout=self.timeout, metadata=[("x-goog-fieldmask", GET_FIELD_MASK)]
                ),
                transient,
            )
        except gexc.NotFound:
            return self._gone(inst, guard, "get", sent=False)
        except Exception as exc:
            return Outcome(inst, FAILED, f"get: {type(exc).__name__}: {exc}")
        changes = self._changes(inst, current)
        if changes:
            return Outcome(inst, CHANGED, "; ".join(changes))
        why = guard.check()  # the lease and the deadline right before the send: the re-read may have taken retries
        if why:
            return Outcome(inst, guard.unsent(inst), why)
        attempts = 0

        def send() -> compute_v1.Operation:
            nonlocal attempts
            if attempts:
                guard.retry(inst)
            attempts += 1
            return self.clients.instances.delete_unary(**target, retry=None, timeout=self.timeout)

        try:
            op = self.backoff.call(send, transient)
        except gexc.NotFound:
            # A 404 after an earlier attempt of this call timed out or failed is this call's own work.
            return self._gone(inst, guard, "delete", sent=attempts > 1)
        except (gexc.Conflict, gexc.PreconditionFailed) as exc:
            if attempts > 1:  # an earlier try's answer was lost: it may have been applied, and be the conflict
                return Outcome(inst, UNCONFIRMED, f"delete: {exc.code} on a retry of a delete that may have gone")
            # A delete by id carries no precondition: a refusal is a failure, which alerts if it repeats.
            return Outcome(inst, FAILED, f"delete: {exc.code} {type(exc).__name__}: {exc.message}")
        except Halted as exc:
            return Outcome(inst, UNCONFIRMED, f"the delete call's answer was lost and no retry was sent: {exc}")
        except Exception as exc:
            return Outcome(inst, FAILED, f"delete: {type(exc).__name__}: {exc}")
        guard.sent(inst)
        return self._wait(inst, op, guard)

    def _changes(self, planned: GceInstance, current: compute_v1.Instance) -> list[str]:
        """Everything that makes the instance now a different one from what the plan decided on."""
        changes = []
        if str(current.id) != planned.id or current.name != planned.name:
            changes.append(f"{planned.name} ({planned.id}) is now {current.name} ({current.id})")
        labels = current.labels
        now_beat = labels.get(self.heartbeat_label)
        if now_beat != planned.labels.get(self.heartbeat_label):
            changes.append(f"heartbeat {planned.labels.get(self.heartbeat_label)} -> {now_beat}")
        if status_class(current.status) != status_class(planned.status):
            changes.append(f"status {planned.status} -> {current.status}")
        if any(labels.get(key) != value for key, value in self.selector.items()):
            changes.append("no longer matches the selector")
        if self.opt_out[0] in labels:  # with any value: another one is reported by the policy, never deleted
            changes.append(f"opt-out label {self.opt_out[0]}={labels[self.opt_out[0]]}")
        if current.deletion_protection:
            changes.append("deletion protection set")
        return changes

    def _wait(self, inst: GceInstance, op: compute_v1.Operation, guard: SendGuard) -> Outcome:
        """Wait for the operation until it is done, its own timeout, or the guard's deadline or stop."""
        give_up = time.monotonic() + self.operation_timeout
        name = op.name
        try:
            while op.status != _DONE:
                why = guard.check(lease=False)
                if why:
                    return Outcome(inst, OPERATION_PENDING, f"operation {name} not done: {why}")
                if time.monotonic() > give_up:
                    return Outcome(inst, FAILED, f"operation {name} not done after {self.operation_timeout:.0f}s")
                op = self.backoff.call(
                    lambda: self.clients.operations.wait(
                        project=inst.project, zone=inst.zone, operation=name, retry=None, timeout=self.timeout
                    ),
                    transient,
                )
                if op.status != _DONE:
                    time.sleep(_POLL)
        except Exception as exc:
            return Outcome(inst, FAILED, f"operation {name}: {type(exc).__name__}: {exc}")
        if "error" in op and op.error.errors:
            errors = ", ".join(f"{e.code}: {e.message}" for e in op.error.errors)
            return Outcome(inst, FAILED, f"operation {name} failed: {errors}")
        return Outcome(inst, DELETED)
