"""Deleting planned instances: re-validated, rate-limited, within the quota share, fenced, bounded, every
outcome returned as data.

For each planned instance, in this order (docs/design.md §6):

1. the project's rate-limit token and its quota slots (a read for the re-read, a mutation for the delete),
   first: a wait happens before the re-read, never between it and the delete;
2. the intent, queued for the ledger's next group commit (its write overlaps the re-read);
3. the re-read, by numeric id: it must still be the planned VM (same id and name), carry the planned
   heartbeat label value (its manager has not come back), have the planned status (a TERMINATED
   instance has not been started, a SUSPENDED one not resumed), match the selector, carry no opt-out label and
   have no deletion protection, the planned ``labelFingerprint`` (no label written since the listing: a manager stamping
   another name than the configured one writes labels all the same; under an approval, the listed fingerprint is
   the approved one) and the planned ``lastStopTimestamp`` and ``lastSuspendedTimestamp`` (not started and stopped
   again, nor resumed and suspended again, since); otherwise ``changed_since_plan``;
4. the guard: the intent acknowledged (durable), the sweep lease read now, the deadline, a stop (the re-read
   may have spent its retries);
5. ``delete_unary`` by numeric id, which the Compute API takes in place of the name: a VM recreated under
   the same name after the re-read has another id and can never be the one deleted;
6. waits on the zone operation (same client options: the SDK's poller would poll the real endpoint), as
   ``zoneOperations.wait`` is documented: each returns at DONE or after about two minutes, so it is called
   again while the guard allows; not DONE when the run must stop is ``operation_pending``, never ``failed``.

A 404 means already gone, or ``deleted`` when this sweep's own delete call may have caused it. A used-up
rate quota (403 ``rateLimitExceeded``, 429) is throttling: the call is made again once the quota refills
(the next minute), while that fits before the run's deadline; a delete refused so is re-validated again
after the wait (the wait came between the re-read and the send). 5xx and timeouts are retried with
backoff; every retry and every wait is refused past the guard's deadline (then the instance is
``not_attempted``, left for the next sweep). A 409 or 412 is ``failed`` (``unconfirmed`` on a retry, which
an earlier try may have caused): a delete by id has no precondition, and a refusal that repeats every
sweep must raise the failed-deletions alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from requests import exceptions as rexc

from reaper.config import Settings
from reaper.decoders import rfc3339
from reaper.fence import SendGuard
from reaper.gce.clients import ComputeClients, throttled, transient
from reaper.gce.quota import ProjectQuota, QuotaGroup
from reaper.model import GceInstance, Outcome
from reaper.ratelimit import BucketsPerScope, round_robin
from reaper.retry import Backoff, GaveUp
from reaper.vocabulary import Result

T = TypeVar("T")

# What re-validation compares.
GET_FIELD_MASK = "id,name,status,labels,labelFingerprint,lastStopTimestamp,lastSuspendedTimestamp,deletionProtection"
_DONE = compute_v1.Operation.Status.DONE
_POLL = 1.0  # seconds between operation waits that returned early (the API may answer at once when loaded)
# zoneOperations.wait returns at DONE or "after 2 minutes" (compute.v1.json, zoneOperations.wait): a call may
# take that long and still be healthy.
WAIT_CAP = 125.0


class GceDeleter:
    def __init__(
        self,
        clients: ComputeClients,
        config: Settings,
        backoff: Backoff | None = None,
        quota: ProjectQuota | None = None,
    ) -> None:
        gce = config.gce
        self.clients = clients
        self.heartbeat_label = gce.heartbeat_label
        self.selector = gce.selector
        self.opt_out = gce.opt_out_label
        self.concurrency = gce.delete_concurrency
        self.timeout = gce.request_timeout.total_seconds()
        self.operation_timeout = gce.operation_timeout.total_seconds()
        self.backoff = backoff or Backoff(gce.max_retries)
        self.quota = quota or ProjectQuota(gce.quota)
        self.buckets = BucketsPerScope(gce.delete_rate)

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
        if sent or guard.sent_earlier(inst):
            return Outcome(inst, Result.DELETED, f"404 on {where} after this sweep's delete call")
        return Outcome(inst, Result.ALREADY_GONE, f"404 on {where}")

    def _call(self, project: str, fn: Callable[[], T], guard: SendGuard) -> T:
        """``fn()`` with the project's retries: throttled answers after the quota refills, errors with backoff,
        none past the guard's deadline (:class:`GaveUp`)."""
        return self.backoff.call(
            fn, self.quota.retryable(project), stop=guard.stop_at, waited=self.quota.waited(project), pause=guard.pause
        )

    def _delete_one(self, inst: GceInstance, guard: SendGuard) -> Outcome:
        """Token, slots, intent; then re-read, compare and send, again after every send that did not go through.

        Every send comes right after a re-read (docs/design.md §6): a send refused (a used-up quota) or
        unanswered (a 5xx, a timeout: it may have been applied) is retried only after the wait it calls for,
        new slots, and a new re-read, so that an opt-out, a heartbeat or deletion protection set meanwhile
        keeps the VM. After a send that may have been applied, a 404 is this sweep's own delete.
        """
        why = guard.check(lease=False)  # no token waited for past the deadline
        if why:
            return Outcome(inst, guard.unsent(inst), why)
        try:  # the token and the slots before the re-read: no wait between it and the delete
            self.buckets.acquire(inst.project, guard.stop_at)
            window_ends = self._slots(inst, guard)
        except GaveUp as exc:
            return Outcome(inst, guard.unsent(inst), exc.why)
        why = guard.before_send(inst)  # the intent queued, before the re-read: durable by the send
        if why:
            return Outcome(inst, guard.unsent(inst), why)
        lost = False  # a delete call went out whose answer was lost: it may have been applied
        last: BaseException | None = None
        tries = self.backoff.max_retries + 1
        for attempt in range(tries):
            try:
                if attempt or time.time() >= window_ends:  # after a wait, or slots that would count in the next window
                    window_ends = self._slots(inst, guard)
            except GaveUp as exc:
                return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), exc.why)
            read = self._reread(inst, guard, lost)
            if isinstance(read, Outcome):
                return read
            changes = self._changes(inst, read)
            if changes:
                if lost:  # an earlier call may still take effect: nobody can say what happens to it
                    return Outcome(
                        inst, Result.UNCONFIRMED, f"changed after a delete call whose answer was lost: {changes}"
                    )
                return Outcome(inst, Result.CHANGED_SINCE_PLAN, "; ".join(changes))
            why = guard.ready(inst)  # the intent durable, the lease and the deadline right before the send
            if why:
                return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), why)
            sent = self._send(inst, guard, lost)
            if isinstance(sent, compute_v1.Operation):
                guard.sent(inst)
                return self._wait(inst, sent, guard)
            if isinstance(sent, Outcome):
                return sent
            last, lost = sent.error, lost or sent.lost
            if sent.lost:
                guard.sent(inst)  # recorded as sent: a later 404 for it is this sweep's own delete
            if attempt + 1 < tries:
                why = self._pause_before_retry(inst, sent, attempt, guard)
                if why:
                    return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), why)
        if last is not None and throttled(last):
            return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), f"throttled on every try: {last}")
        return Outcome(inst, Result.FAILED, f"delete: {type(last).__name__}: {last}")

    def _slots(self, inst: GceInstance, guard: SendGuard) -> float:
        """A read slot (the re-read) and a mutation slot (the delete) of the project's quota share, in one window;
        when that window ends (after it, the delete would count in the next window's share)."""
        return self.quota.take(inst.project, QuotaGroup.READ, QuotaGroup.MUTATION, stop=guard.stop_at)

    def _pause_before_retry(self, inst: GceInstance, sent: _Retry, attempt: int, guard: SendGuard) -> str | None:
        """Sleep as long as the failed send calls for (the next quota window, or the backoff); or why not (it would
        end past the guard's deadline)."""
        if throttled(sent.error):
            self.quota.count_throttled(inst.project)
            seconds = self.quota.until_next_window()
        else:
            seconds = self.backoff.delay(attempt)
        why = guard.stop_at(time.time() + seconds)
        if why:
            return f"delete: {type(sent.error).__name__} ({sent.error}); {why}"
        if throttled(sent.error):
            self.quota.waited(inst.project)(sent.error, seconds)
        guard.pause(seconds)
        return guard.stop_at(time.time())

    def _reread(self, inst: GceInstance, guard: SendGuard, lost: bool) -> compute_v1.Instance | Outcome:
        """The instance as it is now, by id; or the outcome that ends its delete (gone, unreadable, out of time)."""
        tries = 0

        def get() -> compute_v1.Instance:
            nonlocal tries
            if tries:  # every try is a read request: the first one's slot was taken with the delete's
                self.quota.take(inst.project, QuotaGroup.READ, stop=guard.stop_at)
            tries += 1
            metadata = [("x-goog-fieldmask", GET_FIELD_MASK)]
            return self.clients.instances.get(
                project=inst.project,
                zone=inst.zone,
                instance=inst.id,
                retry=None,
                timeout=self.timeout,
                metadata=metadata,
            )

        try:
            return self._call(inst.project, get, guard)
        except gexc.NotFound:
            return self._gone(inst, guard, "get", sent=lost)
        except GaveUp as exc:
            return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), exc.why)
        except Exception as exc:
            if throttled(exc):  # every try throttled: no permission problem, the quota is used up
                return Outcome(inst, Result.UNCONFIRMED if lost else guard.unsent(inst), f"get throttled: {exc}")
            return Outcome(inst, Result.FAILED, f"get: {type(exc).__name__}: {exc}")

    def _send(self, inst: GceInstance, guard: SendGuard, lost: bool) -> compute_v1.Operation | Outcome | _Retry:
        """One delete call by id: its operation, the outcome it ends in, or :class:`_Retry` (refused by a used-up
        quota, or unanswered: a 5xx, a timeout, a dropped connection) for the caller to re-validate and retry."""
        try:
            return self.clients.instances.delete_unary(
                project=inst.project, zone=inst.zone, instance=inst.id, retry=None, timeout=self.timeout
            )
        except gexc.NotFound:
            return self._gone(inst, guard, "delete", sent=lost)
        except (gexc.Conflict, gexc.PreconditionFailed) as exc:
            if lost:  # an earlier try's answer was lost: it may have been applied, and be the conflict
                return Outcome(
                    inst, Result.UNCONFIRMED, f"delete: {exc.code} on a retry of a delete that may have gone"
                )
            # A delete by id carries no precondition: a refusal is a failure, which alerts if it repeats.
            return Outcome(inst, Result.FAILED, f"delete: {exc.code} {type(exc).__name__}: {exc.message}")
        except Exception as exc:
            if throttled(exc):  # refused, not applied
                return _Retry(exc, lost=False)
            if transient(exc):  # unanswered: it may have been applied
                return _Retry(exc, lost=True)
            if lost:
                return Outcome(inst, Result.UNCONFIRMED, f"delete: {type(exc).__name__}: {exc} after a lost answer")
            return Outcome(inst, Result.FAILED, f"delete: {type(exc).__name__}: {exc}")

    def _changes(self, planned: GceInstance, current: compute_v1.Instance) -> list[str]:
        """Everything that makes the instance now a different one from what the plan decided on."""
        changes = []
        if str(current.id) != planned.id or current.name != planned.name:
            changes.append(f"{planned.name} ({planned.id}) is now {current.name} ({current.id})")
        labels = current.labels
        now_beat = labels.get(self.heartbeat_label)
        if now_beat != planned.labels.get(self.heartbeat_label):
            changes.append(f"heartbeat {planned.labels.get(self.heartbeat_label)} -> {now_beat}")
        if current.status != planned.status:  # started, stopped, suspended or resumed since the listing
            changes.append(f"status {planned.status} -> {current.status}")
        if any(labels.get(key) != value for key, value in self.selector.items()):
            changes.append("no longer matches the selector")
        if self.opt_out[0] in labels:  # with any value: another one is reported by the policy, never deleted
            changes.append(f"opt-out label {self.opt_out[0]}={labels[self.opt_out[0]]}")
        if current.deletion_protection:
            changes.append("deletion protection set")
        # A manager that stamps another label than the configured one (renamed, or the config's name wrong) is seen
        # by nothing above: it writes labels all the same, so any label written since the listing counts. Under an
        # approval the policy planned only VMs listed with their approved fingerprint (docs/design.md §6).
        # No fingerprint on either side (a listing or read without the field) proves nothing unchanged.
        if not planned.label_fingerprint or current.label_fingerprint != planned.label_fingerprint:
            was, now = planned.label_fingerprint or "(none)", current.label_fingerprint or "(none)"
            changes.append(f"labelFingerprint {was} -> {now}: labels written since the listing")
        # Stopped or suspended since the listing (started and stopped again, resumed and suspended again: the
        # status and the labels as they were). "[Output Only] Last stop timestamp in RFC3339 text format", "Last
        # suspended timestamp" alike (compute.v1.json, Instance: lastStopTimestamp, lastSuspendedTimestamp).
        for field, listed, read in (
            ("lastStopTimestamp", planned.last_stop, current.last_stop_timestamp),
            ("lastSuspendedTimestamp", planned.last_suspended, current.last_suspended_timestamp),
        ):
            try:
                at = rfc3339(read, field) if read else None
            except ValueError:
                at = float("nan")  # unreadable: nothing proves it has not stopped or been suspended since
            if at != listed:
                changes.append(f"{field} {listed} -> {read or '(none)'}: stopped or suspended since the listing")
        return changes

    def _wait(self, inst: GceInstance, op: compute_v1.Operation, guard: SendGuard) -> Outcome:
        """Wait for the delete's operation until it is DONE, its own timeout, or the guard's deadline or stop.

        ``zoneOperations.wait`` returns at DONE or after about two minutes, best effort, possibly at once
        (compute.v1.json): it is called again while the operation is not DONE. Each call's read timeout
        ends by the deadline plus one request timeout (the send margin); a call that times out, or whose
        retries are spent, leaves the operation pending, as does the deadline: the delete was accepted,
        and the next sweep's re-read settles it.
        """
        give_up = time.monotonic() + self.operation_timeout
        name = op.name

        def wait() -> compute_v1.Operation:
            self.quota.take(inst.project, QuotaGroup.OPERATION_READ, stop=guard.stop_at)
            try:
                return self.clients.operations.wait(
                    project=inst.project, zone=inst.zone, operation=name, retry=None, timeout=self._wait_timeout(guard)
                )
            except rexc.Timeout:
                return op  # not answered within its timeout: still pending, as far as anyone knows

        while op.status != _DONE:
            why = guard.check(lease=False)
            if why:
                return Outcome(inst, Result.OPERATION_PENDING, f"operation {name} not done: {why}")
            if time.monotonic() > give_up:
                return Outcome(inst, Result.FAILED, f"operation {name} not done after {self.operation_timeout:.0f}s")
            try:
                op = self._call(inst.project, wait, guard)
            except GaveUp as exc:
                return Outcome(inst, Result.OPERATION_PENDING, f"operation {name} not done: {exc.why}")
            except Exception as exc:
                if throttled(exc) or transient(exc):  # retries spent on the wait, not on the delete
                    return Outcome(inst, Result.OPERATION_PENDING, f"operation {name}: {type(exc).__name__}: {exc}")
                return Outcome(inst, Result.FAILED, f"operation {name}: {type(exc).__name__}: {exc}")
            if op.status != _DONE and not guard.stop_at(time.time() + _POLL):
                guard.pause(_POLL)
        if "error" in op and op.error.errors:
            errors = ", ".join(f"{e.code}: {e.message}" for e in op.error.errors)
            return Outcome(inst, Result.FAILED, f"operation {name} failed: {errors}")
        return Outcome(inst, Result.DELETED)

    def _wait_timeout(self, guard: SendGuard) -> float:
        """A wait call's read timeout: as long as the API may take (about two minutes), but ending by the guard's
        deadline plus one request timeout, which the send margin allows for."""
        if guard.deadline is None:
            return WAIT_CAP
        return max(1.0, min(WAIT_CAP, guard.deadline - guard.clock() + self.timeout))


class _Retry:
    """A delete call to make again after a wait and a new re-read: ``error`` what it met; ``lost``: it may have
    been applied (a 5xx, a timeout), or it surely was not (a used-up quota)."""

    __slots__ = ("error", "lost")

    def __init__(self, error: BaseException, lost: bool) -> None:
        self.error, self.lost = error, lost
