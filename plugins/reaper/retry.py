"""Bounded retries with exponential backoff and full jitter, shared by every adapter that calls out.

Bounded on purpose: a sweep must finish inside its interval, and a resource that
keeps failing is reported as failed and retried next sweep, never retried forever.

Two refinements (docs/design.md §6):

- A server that says when to come back is believed: the classifier returns the seconds it asked
  for (a Compute quota refilled at the next synchronized minute, a Kubernetes ``Retry-After``)
  instead of ``True`` (back off exponentially).
- A retry is never made that the run could not wait for: ``stop(at)`` says why nothing may be
  done at unix time ``at`` (the run's deadline, a SIGTERM), and then :class:`GaveUp` is raised
  with the last error as its cause, instead of sleeping past the deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# False: give up; True: retry after the exponential backoff; a number: retry after that many seconds.
Retryable = Callable[[BaseException], bool | float]
# Why nothing may be done at this unix time (the run must stop by then), or None.
Stop = Callable[[float], str | None]
# Told of every wait before it is made: the error that caused it and its length in seconds.
Waited = Callable[[BaseException, float], None]


class GaveUp(Exception):
    """A call or a retry was due, but the run must stop before it could be made.

    ``last``: the error that called for the retry (also ``__cause__``), or None when the call itself
    could not be made in time (its quota slot comes after the run's deadline).
    """

    def __init__(self, why: str, last: BaseException | None = None) -> None:
        super().__init__(f"{why} (last answer: {type(last).__name__}: {last})" if last else why)
        self.why, self.last = why, last


class Backoff:
    """``max_retries`` retries after the first try; delay ``min(cap, base * 2**attempt)`` with full jitter."""

    def __init__(
        self,
        max_retries: int,
        base: float = 0.2,
        cap: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_retries, self.base, self.cap, self.sleep, self.clock = max_retries, base, cap, sleep, clock
        self._rng = rng or random.Random()

    def delay(self, attempt: int) -> float:
        """The backoff before retry ``attempt + 1``: full jitter up to ``min(cap, base * 2**attempt)``."""
        return self._rng.uniform(0, min(self.cap, self.base * 2**attempt))

    def call(
        self,
        fn: Callable[[], T],
        retryable: Retryable,
        stop: Stop | None = None,
        waited: Waited | None = None,
        pause: Callable[[float], None] | None = None,
    ) -> T:
        """Run ``fn``; retry it while it raises something ``retryable``; re-raise the last error.

        ``stop``: checked with the time each retry would be made at, and again when the wait is over
        (a SIGTERM may have come meanwhile); when it objects, :class:`GaveUp` is raised at once.
        ``waited``: told of each wait before it is made. ``pause``: sleeps instead of the backoff's own
        sleep (a guard's, which a SIGTERM cuts short).
        """
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                verdict = retryable(exc) if attempt < self.max_retries else False
                if verdict is False:
                    raise
                delay = self.delay(attempt) if verdict is True else max(0.0, float(verdict))
                why = stop(self.clock() + delay) if stop else None
                if why:
                    raise GaveUp(why, exc) from exc
                if waited:
                    waited(exc, delay)
                (pause or self.sleep)(delay)
                why = stop(self.clock()) if stop else None
                if why:
                    raise GaveUp(why, exc) from exc
                attempt += 1
