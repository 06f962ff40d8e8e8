"""The reaper's share of a project's rate quotas: paced on a grid of slots, never more than its allowance a window."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from google.api_core import exceptions as gexc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reaper.config import QUOTA_WINDOW_ENV, QuotaConfig, QuotaLimits
from reaper.gce.quota import ProjectQuota, QuotaGroup
from reaper.model import QuotaUse, merge_use
from reaper.retry import GaveUp

WINDOW = 60.0  # the API's minute (the suite's emulators run a faster clock: unset here)


@pytest.fixture(autouse=True)
def the_apis_minute(monkeypatch) -> None:
    monkeypatch.delenv(QUOTA_WINDOW_ENV, raising=False)


BASE = 16_666 * WINDOW  # a window boundary


class Clock:
    """A clock that only moves when something sleeps (or the test moves it)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.calls: list[float] = []

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def quota(clock: Clock, limit: int = 50, share: float = 0.2) -> ProjectQuota:
    limits = QuotaLimits(
        list_requests=limit, read_requests=limit, mutation_requests=limit, operation_read_requests=limit
    )
    return ProjectQuota(QuotaConfig(limits=limits, share=share), clock=lambda: clock.now, sleep=clock.sleep)


def per_window(times: list[float]) -> Counter[int]:
    return Counter(math.floor(t / WINDOW) for t in times)


def test_calls_are_paced_to_the_share_and_the_first_goes_at_once() -> None:
    clock = Clock(BASE + 12.3)  # 10 allowed a window: one slot every 60 / 11 s, the last at 49.1 s
    q = quota(clock)
    times = []
    for _ in range(25):
        q.take("p", QuotaGroup.MUTATION)
        times.append(clock.now)
    step = WINDOW / 11
    assert times[0] == BASE + 12.3  # the slot whose time has just passed (at 10.9 s): no wait
    assert max(per_window(times).values()) <= 10
    assert times[1:4] == pytest.approx([BASE + 3 * step, BASE + 4 * step, BASE + 5 * step])  # on the grid
    assert times[8] == pytest.approx(BASE + WINDOW)  # after the 10th slot, 49.1 s: the next window's first
    assert q.drain() == {"p": QuotaUse({"mutation_requests": 25})}
    assert q.drain() == {}  # each task reports its own


def test_groups_and_projects_have_their_own_slots() -> None:
    clock = Clock(BASE + 22.0)
    q = quota(clock)
    q.take("p", QuotaGroup.READ, QuotaGroup.MUTATION)
    q.take("q", QuotaGroup.READ, QuotaGroup.MUTATION)  # another project: no wait
    q.take("p", QuotaGroup.LIST)  # another group: no wait
    assert clock.now == BASE + 22.0
    q.take("p", QuotaGroup.READ)
    assert clock.now == pytest.approx(BASE + 5 * WINDOW / 11)  # the first took the slot at 21.8 s, just passed
    assert q.drain()["p"].requests == {"list_requests": 1, "mutation_requests": 1, "read_requests": 2}


def test_a_slot_after_the_stop_gives_up_without_spending_or_sleeping() -> None:
    clock = Clock(BASE)
    q = quota(clock)
    q.take("p", QuotaGroup.MUTATION)
    with pytest.raises(GaveUp, match="deadline"):
        q.take("p", QuotaGroup.MUTATION, stop=lambda at: "deadline reached" if at > BASE + 3.0 else None)
    assert clock.now == BASE
    assert q.drain()["p"].requests == {"mutation_requests": 1}
    q.take("p", QuotaGroup.MUTATION)  # the slot refused above is still free
    assert clock.now == pytest.approx(BASE + WINDOW / 11)


@settings(max_examples=300, deadline=None)
@example(start=0.0, gaps=[0.5] * 20, switch=5, pause=0.2)  # a second task in the window the first used
@given(
    start=st.floats(0, 3 * WINDOW),
    gaps=st.lists(st.floats(0, 8), min_size=1, max_size=60),
    switch=st.integers(0, 60),
    pause=st.floats(0.2, 30),
)
def test_two_tasks_one_after_another_never_exceed_the_allowance_of_a_window(
    start: float, gaps: list[float], switch: int, pause: float
) -> None:
    """The property the pacing exists for: sequential processes, sharing nothing, stay within the share.

    The second task starts at least a slot interval after the first one's last call (0.2 s at the
    documented defaults, 5.5 s at this test's allowance of 10 a window): what an Airflow task start
    guarantees.
    """
    clock = Clock(BASE + start)
    calls: list[float] = []
    tasks = [quota(clock)]
    for i, gap in enumerate(gaps):
        if i == switch:  # the next task: a new process, nothing shared but the clock
            clock.now += WINDOW / 11 + pause
            tasks.append(quota(clock))
        clock.now += gap
        tasks[-1].take("p", QuotaGroup.MUTATION)
        calls.append(clock.now)
    assert max(per_window(calls).values()) <= 10


def test_a_used_up_quota_is_retried_at_the_next_window_and_counted() -> None:
    clock = Clock(BASE + 45.0)
    q = quota(clock)
    used_up = gexc.Forbidden("Rate Limit Exceeded", errors=[{"domain": "usageLimits", "reason": "rateLimitExceeded"}])
    classify = q.retryable("p")
    wait = classify(used_up)
    assert isinstance(wait, float) and 15.0 <= wait <= 16.2
    q.waited("p")(used_up, wait)
    assert classify(gexc.Forbidden("Required 'compute.instances.delete' permission")) is False
    assert classify(gexc.ServiceUnavailable("backend")) is True
    assert classify(gexc.TooManyRequests("slow down")) > 0
    assert q.drain() == {"p": QuotaUse({}, throttled=2, waited=round(wait, 3))}


def test_quota_uses_sum_per_scope() -> None:
    a = {"p": QuotaUse({"list_requests": 2}, 1, 3.0)}
    b = {"p": QuotaUse({"list_requests": 1, "read_requests": 4}), "q": QuotaUse({"read_requests": 1})}
    assert merge_use(a, b) == {
        "p": QuotaUse({"list_requests": 3, "read_requests": 4}, 1, 3.0),
        "q": QuotaUse({"read_requests": 1}),
    }
