"""A token bucket per scope: deletions share the scope's API quota with the system being cleaned.

GCE mutations count against the project's operation quota, which autoscaling
needs to create instances; the reaper must never starve it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from itertools import zip_longest
from typing import TypeVar

from reaper.retry import GaveUp, Stop

T = TypeVar("T")


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked. ``acquire`` blocks until a token is free."""

    def __init__(
        self,
        rate: float,
        burst: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate, self.burst, self._clock, self._sleep = rate, burst, clock, sleep
        self._tokens = burst
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self, stop: Stop | None = None) -> None:
        """Wait for a token; :class:`GaveUp` (no token taken) when the wait would end at a time ``stop`` refuses:
        a low rate (a small quota share) must not keep the task asleep past its deadline."""
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.rate
            why = stop(time.time() + wait) if stop else None
            if why:
                raise GaveUp(f"{why} (the next delete of this scope's rate would come later)")
            self._sleep(wait)


class BucketsPerScope:
    """One :class:`TokenBucket` per scope, created on first use."""

    def __init__(self, rate: float, burst: float = 1.0) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def acquire(self, scope: str, stop: Stop | None = None) -> None:
        with self._lock:
            bucket = self._buckets.get(scope) or self._buckets.setdefault(scope, TokenBucket(self.rate, self.burst))
        bucket.acquire(stop)


def round_robin(items: Iterable[T], key: Callable[[T], Hashable]) -> list[T]:
    """The first item of each group (by ``key``, a scope), then the second of each, and so on.

    Work comes scope by scope; taken in that order, workers would all queue on one scope's
    bucket while the other scopes' buckets sit idle.
    """
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return [item for row in zip_longest(*groups.values()) for item in row if item is not None]
