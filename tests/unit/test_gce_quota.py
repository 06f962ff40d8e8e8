"""The GCE emulator's rate quotas as pure logic, on a fixed clock: windows, groups, projects, refusals, callers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from include.emulators.gce.quota import DOCUMENTED_LIMIT, GROUPS, RateQuotas, Usage, caller
from include.emulators.http import ApiError

T = datetime(2025, 1, 6, 10, 0, 15, tzinfo=UTC).timestamp()  # 10:00:15, the docs' example


def quotas(now: list[float], **limits: int) -> RateQuotas:
    q = RateQuotas(clock=lambda: now[0])
    q.limits.update(limits)
    return q


def refused(q: RateQuotas, kind: str = "get", project: str = "p", who: str = "reaper") -> bool:
    try:
        q.admit(kind, project, who)
    except ApiError as exc:
        assert (exc.code, exc.reason, exc.domain) == (403, "rateLimitExceeded", "usageLimits")
        return True
    return False


def test_a_quota_used_up_at_10_00_15_refills_at_10_01_00_not_a_minute_later() -> None:
    now = [T]
    q = quotas(now, read_requests=2)
    assert not refused(q) and not refused(q)
    assert refused(q)
    now[0] = T + 44.9  # 10:00:59.9: the same synchronized minute
    assert refused(q)
    now[0] = T + 45  # 10:01:00
    assert not refused(q)


def test_each_group_and_each_project_is_counted_apart() -> None:
    now = [T]
    q = quotas(now, read_requests=1, mutation_requests=1)
    assert not refused(q, "get")
    assert refused(q, "get")
    assert not refused(q, "delete") and refused(q, "set_labels") and refused(q, "insert")  # one mutation group
    assert not refused(q, "get", project="other")
    assert not refused(q, "aggregated_list") and not refused(q, "operation_wait")  # no limit: unlimited


def test_a_refused_request_spends_nothing_and_is_accounted_to_its_caller() -> None:
    now = [T]
    q = quotas(now, read_requests=3)
    assert not refused(q, who="runner-manager") and not refused(q, who="runner-manager")
    assert not refused(q, who="reaper")
    assert refused(q, who="reaper") and refused(q, who="runner-manager") and refused(q, who="reaper")
    start = q.window_start()
    assert q.usage() == [
        Usage(start, "p", "read_requests", "reaper", admitted=1, refused=2),
        Usage(start, "p", "read_requests", "runner-manager", admitted=2, refused=1),
    ]
    now[0] = T + 45
    assert not refused(q) and not refused(q) and not refused(q)  # the refusals did not eat the next minute


def test_a_project_may_have_limits_of_its_own() -> None:
    now = [T]
    q = quotas(now, read_requests=1)
    q.configure({"projects": {"big": {"read_requests": 2}}})
    assert not refused(q, project="big") and not refused(q, project="big") and refused(q, project="big")
    assert not refused(q, project="small") and refused(q, project="small")


def test_quotas_are_off_until_configured_and_the_documented_ones_are_1500_a_minute_in_every_group() -> None:
    now = [T]
    q = quotas(now)
    assert not any(refused(q, kind) for kind in GROUPS for _ in range(2000))
    q.configure({"documented": True})
    assert q.window == 60 and set(q.limits.values()) == {DOCUMENTED_LIMIT}
    assert set(q.limits) == set(GROUPS.values())
    now[0] = T + 45  # a fresh minute
    assert [refused(q, "list") for _ in range(DOCUMENTED_LIMIT + 1)].count(True) == 1


def test_windows_are_aligned_on_the_epoch_whatever_their_length() -> None:
    now = [1000.25]
    q = quotas(now, operation_read_requests=1)
    q.configure({"window": 0.5})
    assert q.window_start() == 1000.0
    assert not refused(q, "operation_get") and refused(q, "operation_wait")
    now[0] = 1000.5
    assert not refused(q, "operation_get")


def test_a_route_of_no_group_is_neither_limited_nor_accounted() -> None:
    q = quotas([T], read_requests=0)
    q.admit("emulator_faults", "p", "tool")
    assert q.usage() == []


def test_an_unknown_group_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown quota group 'reads'.*read_requests"):
        RateQuotas().configure({"limits": {"reads": 5}})


@pytest.mark.parametrize(
    ("headers", "who"),
    [
        ({"x-goog-api-client": "reaper/0.1.0 gl-python/3.11.7", "User-Agent": "python-requests/2"}, "reaper"),
        ({"x-goog-api-client": "runner-manager/0.1.0"}, "runner-manager"),
        ({"User-Agent": "gcloud/500.0.0 command/gcloud.compute.instances.list"}, "gcloud"),
        ({}, "unknown"),
    ],
)
def test_the_caller_is_the_first_product_of_x_goog_api_client_else_of_the_user_agent(headers, who) -> None:
    assert caller(headers) == who
