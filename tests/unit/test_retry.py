"""Bounded retries: exponential backoff, a server's own wait believed, and no wait past the run's end."""

from __future__ import annotations

import pytest

from reaper.retry import Backoff, GaveUp


class Flaky:
    """Fails with ``errors`` in order, then answers ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def backoff(retries: int = 4, now: float = 1000.0) -> tuple[Backoff, list[float]]:
    slept: list[float] = []
    clock = [now]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    return Backoff(retries, base=1.0, cap=8.0, sleep=sleep, clock=lambda: clock[0]), slept


def test_retries_what_is_retryable_with_bounded_jittered_backoff() -> None:
    retry, slept = backoff()
    fn = Flaky(OSError("a"), OSError("b"), OSError("c"))
    assert retry.call(fn, lambda exc: True) == "ok"
    assert fn.calls == 4
    assert [s <= bound for s, bound in zip(slept, (1.0, 2.0, 4.0), strict=True)] == [True] * 3


def test_gives_up_after_max_retries_and_at_once_on_what_is_not_retryable() -> None:
    retry, _ = backoff(retries=2)
    fn = Flaky(OSError("1"), OSError("2"), OSError("3"))
    with pytest.raises(OSError, match="3"):
        retry.call(fn, lambda exc: True)
    assert fn.calls == 3
    fn = Flaky(ValueError("final"))
    with pytest.raises(ValueError):
        retry.call(fn, lambda exc: False)
    assert fn.calls == 1


def test_a_wait_the_server_asks_for_is_believed_and_reported() -> None:
    retry, slept = backoff()
    seen: list[tuple[str, float]] = []
    fn = Flaky(OSError("throttled"))
    assert retry.call(fn, lambda exc: 42.5, waited=lambda exc, s: seen.append((str(exc), s))) == "ok"
    assert slept == [42.5] and seen == [("throttled", 42.5)]


def test_no_retry_is_made_that_would_start_past_the_stop() -> None:
    retry, slept = backoff(now=1000.0)
    fn = Flaky(OSError("throttled"), OSError("again"))
    stops: list[float] = []

    def stop(at: float) -> str | None:
        stops.append(at)
        return "deadline reached" if at >= 1030.0 else None

    with pytest.raises(GaveUp) as raised:
        retry.call(fn, lambda exc: 45.0, stop=stop)
    assert slept == [] and fn.calls == 1  # nothing slept: the wait would end past the deadline
    assert stops == [1045.0]
    assert raised.value.why == "deadline reached" and isinstance(raised.value.__cause__, OSError)
    fn = Flaky(OSError("throttled"))
    assert retry.call(fn, lambda exc: 20.0, stop=stop) == "ok"  # a wait that fits is made
    assert slept == [20.0]
