"""Bounded retries with exponential backoff and full jitter, shared by every adapter that mutates.

Bounded on purpose: a sweep must finish inside its interval, and a resource that
keeps failing is reported as failed and retried next sweep, never retried forever.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """``max_retries`` retries after the first try; delay ``min(cap, base * 2**attempt)`` with full jitter."""

    def __init__(
        self,
        max_retries: int,
        base: float = 0.2,
        cap: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.max_retries, self.base, self.cap, self.sleep = max_retries, base, cap, sleep
        self._rng = rng or random.Random()

    def call(self, fn: Callable[[], T], retryable: Callable[[BaseException], bool]) -> T:
        """Run ``fn``; retry it while it raises something ``retryable``; re-raise the last error."""
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if attempt >= self.max_retries or not retryable(exc):
                    raise
                self.sleep(self._rng.uniform(0, min(self.cap, self.base * 2**attempt)))
                attempt += 1
