"""The reaper's share of each project's Compute API rate quotas (docs/design.md §6, quotas).

The Compute API meters requests per project and quota group (list requests, read requests,
mutation requests, operation reads), per synchronized minute, and answers a used-up quota with
HTTP 403 ``rateLimitExceeded`` until the next minute begins (Compute Engine docs, "Rate quotas").
The runner managers of a project spend the same quotas: their heartbeat label writes and machine
creations are mutations. A reaper that took them during an incident would stop autoscaling exactly
when the fleet needs it, so it spends at most ``gce.quota.share`` of each group, and counts every
list page, get, delete and operation poll it makes.

Pacing rather than counting: the calls of one (project, group) go on a grid of slots, ``allowance``
per window, aligned on the epoch as the API's minutes are; a slot is used at most once and never
before its time. Within a process that holds by construction. Across processes (the tasks of one
sweep run one after another, and sweeps of one target never overlap) it holds without sharing any
state, because a task takes no slot earlier than the one whose time has just passed: a task before
it could only have used that slot by calling within the last slot interval (a fifth of a second at
the defaults) before this task's first call, and starting an Airflow task takes longer than that.

A used-up quota is throttling, never a permission failure: the call is retried once the next
window begins, while that still fits before the run's deadline (:meth:`ProjectQuota.retryable`).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from enum import StrEnum

from reaper.config import QuotaConfig, quota_window
from reaper.gce.clients import throttled, transient
from reaper.model import QuotaUse
from reaper.retry import GaveUp, Retryable, Stop, Waited


class QuotaGroup(StrEnum):
    """The Compute API's rate-quota groups the reaper's calls count in (the config's ``gce.quota.limits`` keys)."""

    LIST = "list_requests"  # aggregatedList of instances and of instance group managers
    READ = "read_requests"  # instances.get (the re-read before each delete), projects.get
    MUTATION = "mutation_requests"  # instances.delete
    OPERATION_READ = "operation_read_requests"  # zoneOperations.wait and get


class ProjectQuota:
    """Slots of every (project, group) for this process, and the account of what was spent since the last drain."""

    def __init__(
        self,
        config: QuotaConfig,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.window = quota_window()
        self.allowance = {group: config.allowance(group) for group in QuotaGroup}
        self.clock, self.sleep = clock, sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._next: dict[tuple[str, QuotaGroup], tuple[int, int]] = {}  # (window index, slot) not yet used
        self._requests: dict[tuple[str, QuotaGroup], int] = {}
        self._throttled: dict[str, int] = {}
        self._waited: dict[str, float] = {}

    def take(self, project: str, *groups: QuotaGroup, stop: Stop | None = None) -> float:
        """Wait for a slot of each of ``groups`` in ``project``, all in one window; all are spent at once.

        Returns the end of that window: a call made later counts in the next window, whose slots are
        other calls', so the caller takes its slots again rather than make it (:class:`GaveUp`,
        nothing spent, nothing slept, when the latest slot comes at a time ``stop`` refuses: the call
        cannot be made before the run must stop).
        """
        with self._lock:
            now = self.clock()
            slots = {
                group: max(self._slot_at(now, group), self._next.get((project, group), (0, 0))) for group in groups
            }
            for _ in range(3):  # every slot in the window of the latest: a slot spent later counts there
                at = max(self._time(group, slot) for group, slot in slots.items())
                aligned = {group: max(slot, self._slot_at(at, group)) for group, slot in slots.items()}
                if aligned == slots:
                    break
                slots = aligned
            at = max(self._time(group, slot) for group, slot in slots.items())
            why = stop(at) if stop else None
            if why:
                raise GaveUp(f"{why} (the reaper's share of the project's rate quota is spent until then)")
            for group, (window, slot) in slots.items():
                following = (window + 1, 0) if slot + 1 >= self.allowance[group] else (window, slot + 1)
                self._next[(project, group)] = following
                self._requests[(project, group)] = self._requests.get((project, group), 0) + 1
            ends = (max(window for window, _ in slots.values()) + 1) * self.window
        if at > now:
            self.sleep(at - now)
        return ends

    def _slot_at(self, now: float, group: QuotaGroup) -> tuple[int, int]:
        """The slot whose time has just passed (or is now); past a window's last slot, the next window's first."""
        window = math.floor(now / self.window)
        slot = math.floor((now - window * self.window) / self._interval(group))
        return (window, slot) if slot < self.allowance[group] else (window + 1, 0)

    def _interval(self, group: QuotaGroup) -> float:
        """Slots are spaced ``window / (allowance + 1)``: the last one leaves two intervals before the window ends,
        so that a call made a little after its slot (an intent written, the re-read) still counts in its window."""
        return self.window / (self.allowance[group] + 1)

    def _time(self, group: QuotaGroup, slot: tuple[int, int]) -> float:
        window, index = slot
        return window * self.window + index * self._interval(group)

    def until_next_window(self) -> float:
        """Seconds until the API refills its quotas: the next window boundary, with a little jitter so that
        callers throttled together do not all come back in the same instant."""
        now = self.clock()
        boundary = (math.floor(now / self.window) + 1) * self.window
        return boundary - now + self._rng.uniform(0, min(1.0, self.window / 50))

    def retryable(self, project: str) -> Retryable:
        """How ``project``'s calls are retried: a throttled answer (its quota used up, by the managers or anyone)
        after the next window boundary, and counted; server errors and timeouts with backoff; nothing else."""

        def classify(exc: BaseException) -> bool | float:
            if throttled(exc):
                self.count_throttled(project)
                return self.until_next_window()
            return transient(exc)

        return classify

    def count_throttled(self, project: str) -> None:
        """One more throttled answer in ``project`` (a used-up quota, a 429)."""
        with self._lock:
            self._throttled[project] = self._throttled.get(project, 0) + 1

    def waited(self, project: str) -> Waited:
        """Counts the time ``project``'s calls waited for throttled answers (not backoff after errors)."""

        def count(exc: BaseException, seconds: float) -> None:
            if throttled(exc):
                with self._lock:
                    self._waited[project] = self._waited.get(project, 0.0) + seconds

        return count

    def drain(self) -> dict[str, QuotaUse]:
        """What was spent since the last drain, per project (each task reports its own); the slots stay."""
        with self._lock:
            requests, throttled_, waited = self._requests, self._throttled, self._waited
            self._requests, self._throttled, self._waited = {}, {}, {}
        projects = {p for p, _ in requests} | throttled_.keys() | waited.keys()
        return {
            project: QuotaUse(
                {str(g): n for (p, g), n in sorted(requests.items()) if p == project},
                throttled_.get(project, 0),
                round(waited.get(project, 0.0), 3),
            )
            for project in sorted(projects)
        }
