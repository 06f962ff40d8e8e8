"""The Compute API as it throttles and as it is slow: a used-up quota, slow re-reads and operations near the deadline.

Through the real compute_v1 clients against the GCE emulator. A used-up rate quota is answered as
the Compute API answers it (403, reason ``rateLimitExceeded``, domain ``usageLimits``); the quota
window is one second here (an emulator's faster clock), so that "wait for the next minute" is a wait
for the next second.
"""

from __future__ import annotations

import time

from include.emulators.http import ApiError
from reaper.config import QUOTA_WINDOW_ENV, parse_settings
from reaper.fence import SendGuard
from reaper.gce.deleter import GceDeleter
from reaper.gce.inventory import list_project
from reaper.gce.quota import ProjectQuota
from tests.builders import HB
from tests.helpers import fast_backoff
from tests.helpers.gce import add_instance

SELECTOR = {"ci_ephemeral": "true"}
ZONE = "us-east1-b"


def config(**gce: object):
    return parse_settings({"gce": {"delete_rate_per_project": 1000.0, **gce}}, "test")


def used_up(_: tuple[str, ...]) -> None:
    """The project's rate quota, spent by someone else (its runner managers) until the next window."""
    raise ApiError(403, "rateLimitExceeded", "Rate Limit Exceeded")


def planned(clients):
    return list_project(clients, "p", SELECTOR, fast_backoff(), 10).resources


def test_a_used_up_quota_on_the_re_read_is_waited_for_not_a_permission_failure(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "stale", heartbeat_age=86400)
    seen = planned(clients)
    fleet.on("before", "get", used_up, times=2)
    quota = ProjectQuota(config().gce.quota)
    (outcome,) = GceDeleter(clients, config(), fast_backoff(), quota).delete(seen)
    assert outcome.result == "deleted"
    assert fleet.counters["get"] == 3 and fleet.counters["delete"] == 1
    use = quota.drain()["p"]
    assert use.throttled == 2 and use.waited > 0  # counted as throttling, with the time it waited
    assert use.requests == {"mutation_requests": 1, "operation_read_requests": 1, "read_requests": 3}


def test_a_delete_refused_by_the_quota_is_re_validated_after_the_wait(gce) -> None:
    """The wait for the quota came between the re-read and the send: the VM is read again before it, and a
    manager that came back meanwhile keeps it."""
    fleet, clients = gce
    inst = add_instance(fleet, "p", ZONE, "comes-back", heartbeat_age=86400)
    add_instance(fleet, "p", ZONE, "stays-dead", heartbeat_age=86400)
    seen = {i.name: i for i in planned(clients)}

    def refused_and_heartbeat(args: tuple[str, ...]) -> None:
        if args[2] == seen["comes-back"].id:
            with fleet.lock:
                inst["labels"] = {**inst["labels"], HB: str(int(time.time()))}  # its manager stamps it meanwhile
        used_up(args)

    fleet.on("before", "delete", refused_and_heartbeat, times=2)
    outcomes = {o.name: o for o in GceDeleter(clients, config(), fast_backoff()).delete(list(seen.values()))}
    assert outcomes["comes-back"].result == "changed_since_plan" and "heartbeat" in outcomes["comes-back"].detail
    assert outcomes["stays-dead"].result == "deleted"
    assert fleet.names("p") == {"comes-back"}
    assert fleet.counters["get"] == 4  # each read again after its refusal


def test_a_permission_403_is_final_and_fails_the_delete(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm", heartbeat_age=86400)
    seen = planned(clients)

    def forbidden(_: tuple[str, ...]) -> None:
        raise ApiError(403, "forbidden", "Required 'compute.instances.delete' permission for 'projects/p'")

    fleet.on("before", "delete", forbidden)
    (outcome,) = GceDeleter(clients, config(), fast_backoff()).delete(seen)
    assert outcome.result == "failed" and "Forbidden" in outcome.detail
    assert fleet.counters["delete"] == 1  # not retried


def test_a_quota_that_refills_after_the_deadline_leaves_the_delete_for_the_next_sweep_at_once(gce, monkeypatch) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm", heartbeat_age=86400)
    seen = planned(clients)
    fleet.on("before", "get", used_up, times=None)
    monkeypatch.delenv(QUOTA_WINDOW_ENV)  # the API's minute
    slow = parse_settings({}, "test")
    guard = SendGuard(deadline=time.time() + 5.0)
    started = time.monotonic()
    (outcome,) = GceDeleter(clients, slow, fast_backoff()).delete(seen, guard)
    assert outcome.result == "not_attempted" and "deadline" in outcome.detail
    # Nothing slept toward a refill that comes too late: that sleep would end at the deadline (5 s) at the
    # earliest. Its throttled tries take about 2 s alone, and up to 4 s beside the whole suite on 2 cores.
    assert time.monotonic() - started < 4.5
    assert fleet.counters["delete"] == 0


def test_a_slow_operation_near_the_deadline_is_pending_and_the_task_ends_within_one_request_timeout(gce) -> None:
    """zoneOperations.wait returns at DONE or after its own deadline with the operation as it stands; an operation
    still running when the run must stop was accepted: ``operation_pending``, never ``failed``."""
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "slow", heartbeat_age=86400)
    seen = planned(clients)

    def still_running(body: object) -> object:
        time.sleep(4.0)  # the server holds the wait, longer than a request timeout (it may, up to 2 minutes)
        return {**body, "status": "RUNNING"}  # type: ignore[dict-item]  # JSON data typed object: its shape is this code's own

    fleet.rewrites["operation_wait"] = still_running
    request_timeout = 1.0
    guard = SendGuard(deadline=time.time() + 1.5)
    started = time.time()
    (outcome,) = GceDeleter(clients, config(request_timeout="1s"), fast_backoff()).delete(seen, guard)
    ended = time.time()
    assert outcome.result == "operation_pending" and "deadline" in outcome.detail
    assert fleet.counters["delete"] == 1
    # The wait's read timeout ended by the deadline plus one request timeout: what the send margin allows.
    assert guard.deadline is not None
    assert ended <= guard.deadline + request_timeout + 0.5, ended - started


def test_a_failing_re_read_stops_retrying_at_the_deadline(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm", heartbeat_age=86400)
    seen = planned(clients)

    def unavailable(_: tuple[str, ...]) -> None:
        time.sleep(0.4)
        raise ApiError(503, "backendError", "the server is slow and failing")

    fleet.on("before", "get", unavailable, times=None)
    deadline = time.time() + 1.0
    guard = SendGuard(deadline=deadline)
    from reaper.retry import Backoff

    (outcome,) = GceDeleter(clients, config(max_retries=10), Backoff(10, base=0.3, cap=0.3)).delete(seen, guard)
    assert outcome.result == "not_attempted" and "deadline" in outcome.detail
    assert time.time() <= deadline + 0.4 + 0.5  # one request after the deadline at most, then nothing
    assert fleet.counters["delete"] == 0


def test_a_throttled_listing_page_is_waited_for_or_makes_the_listing_incomplete(gce, monkeypatch) -> None:
    fleet, clients = gce
    for i in range(3):
        add_instance(fleet, "p", ZONE, f"vm-{i}")
    fleet.on("before", "aggregated_list", used_up, times=1)
    quota = ProjectQuota(config().gce.quota)
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10, quota)
    assert listing.complete and len(listing.resources) == 3
    assert quota.drain()["p"].throttled == 1
    fleet.on("before", "aggregated_list", used_up, times=None)
    late = SendGuard(deadline=time.time() + 5.0).stop_at
    monkeypatch.delenv(QUOTA_WINDOW_ENV)
    slow = ProjectQuota(parse_settings({}, "test").gce.quota)  # the API's minute: the refill comes too late
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10, slow, late)
    assert not listing.complete and "deadline" in listing.problems[0]
