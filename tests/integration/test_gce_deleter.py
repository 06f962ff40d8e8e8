"""The deletion executor through the real compute_v1 client against the GCE emulator."""

from __future__ import annotations

import time
from typing import cast

import msgspec
import pytest

from include.emulators.shapes import rfc3339
from reaper.config import parse_settings
from reaper.gce.deleter import GceDeleter
from reaper.gce.inventory import list_project
from reaper.model import GceInstance
from tests.builders import HB
from tests.helpers import fast_backoff
from tests.helpers.gce import add_instance

SELECTOR = {"ci_ephemeral": "true"}


def planned(clients, project: str = "p") -> dict[str, GceInstance]:
    """The instances as the plan saw them (listed through the same adapter)."""
    return {
        i.name: i
        for i in cast(list[GceInstance], list_project(clients, project, SELECTOR, fast_backoff(), 10).resources)
    }


def deleter(clients, **gce) -> GceDeleter:
    config = parse_settings({"gce": {"delete_rate_per_project": 1000.0, **gce}}, "test")
    return GceDeleter(clients, config, fast_backoff())


def results(outcomes) -> dict[str, str]:
    return {o.name: o.result for o in outcomes}


def test_stale_instances_are_deleted_when_the_operation_is_done(gce) -> None:
    fleet, clients = gce
    for i in range(5):
        add_instance(fleet, "p", "us-east1-b", f"stale-{i}", heartbeat_age=86400)
    seen = planned(clients)
    outcomes = deleter(clients).delete(list(seen.values()))
    assert results(outcomes) == dict.fromkeys(seen, "deleted")
    assert fleet.names("p") == set()
    assert fleet.counters["get"] == 5 and fleet.counters["delete"] == 5 and fleet.counters["operation_wait"] == 5


def test_404_on_get_or_delete_is_already_gone(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "gone-before-get", heartbeat_age=86400)
    add_instance(fleet, "p", "us-east1-b", "gone-before-delete", heartbeat_age=86400)
    seen = planned(clients)
    with fleet.lock:
        fleet.projects["p"]["us-east1-b"].pop("gone-before-get")
    fleet.faults.fail_next["delete"] = ["404"]
    outcomes = {o.name: o for o in deleter(clients).delete([seen["gone-before-get"], seen["gone-before-delete"]])}
    assert (outcomes["gone-before-get"].result, outcomes["gone-before-get"].detail) == ("already_gone", "404 on get")
    assert (outcomes["gone-before-delete"].result, outcomes["gone-before-delete"].detail) == (
        "already_gone",
        "404 on delete",
    )


def test_429_and_503_are_retried_then_succeed(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    fleet.faults.fail_next.update({"get": ["503"], "delete": ["429", "503"], "operation_wait": ["429"]})
    assert results(deleter(clients).delete(list(planned(clients).values()))) == {"vm": "deleted"}
    # Every send that did not go through (the 429: refused; the 503: unanswered, maybe applied) is made again
    # only after its wait and a new re-read: one get before each of the three delete calls, one retried.
    assert fleet.counters["delete"] == 3 and fleet.counters["get"] == 4 and fleet.counters["operation_wait"] == 2


def test_retries_are_bounded_and_only_that_instance_fails(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a", heartbeat_age=86400)
    add_instance(fleet, "p", "us-east1-b", "b", heartbeat_age=86400)
    seen = planned(clients)
    fleet.faults.fail_next["delete"] = ["503"] * 5  # first try + 4 retries of the first delete
    out = {o.name: o for o in deleter(clients, delete_concurrency=1).delete([seen["a"], seen["b"]])}
    assert out["a"].result == "failed" and "ServiceUnavailable" in out["a"].detail
    assert out["b"].result == "deleted"
    assert fleet.names("p") == {"a"}


def test_recreated_instance_with_a_new_id_is_not_deleted(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400, instance_id=111)
    seen = planned(clients)
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400, instance_id=222)  # same name, new VM
    outcome = deleter(clients).delete([seen["vm"]])[0]
    # Re-read by id: the planned VM (111) is gone; the new one (222) is another instance.
    assert (outcome.result, outcome.detail) == ("already_gone", "404 on get")
    assert fleet.counters["delete"] == 0 and fleet.names("p") == {"vm"}


def test_refreshed_heartbeat_is_not_deleted(gce) -> None:
    fleet, clients = gce
    inst = add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    seen = planned(clients)
    with fleet.lock:
        inst["labels"] = {**inst["labels"], HB: str(int(time.time()))}  # its manager came back
    outcome = deleter(clients).delete([seen["vm"]])[0]
    assert outcome.result == "changed_since_plan" and outcome.detail.startswith("heartbeat ")
    assert fleet.counters["delete"] == 0


def test_restarted_terminated_instance_is_not_deleted(gce) -> None:
    fleet, clients = gce
    inst = add_instance(fleet, "p", "us-east1-b", "vm", status="TERMINATED")
    seen = planned(clients)
    with fleet.lock:
        inst["status"] = "RUNNING"
    outcome = deleter(clients).delete([seen["vm"]])[0]
    assert outcome.result == "changed_since_plan" and "status TERMINATED -> RUNNING" in outcome.detail


def test_a_suspended_instance_resumed_since_the_listing_is_not_deleted(gce) -> None:
    fleet, clients = gce
    inst = add_instance(fleet, "p", "us-east1-b", "vm", status="SUSPENDED", heartbeat_age=86400)
    seen = planned(clients)
    with fleet.lock:
        inst["status"] = "RUNNING"
    outcome = deleter(clients).delete([seen["vm"]])[0]
    assert outcome.result == "changed_since_plan" and "status SUSPENDED -> RUNNING" in outcome.detail
    assert fleet.counters["delete"] == 0


@pytest.mark.parametrize(
    ("status", "field"), [("TERMINATED", "lastStopTimestamp"), ("SUSPENDED", "lastSuspendedTimestamp")]
)
def test_an_instance_stopped_or_suspended_again_since_the_listing_is_not_deleted(gce, status: str, field: str) -> None:
    """Started and stopped again, or resumed, used and suspended again (the fourth review), between the listing and
    the delete: in the status planned, no label written; only the time the Compute API sets at each stop or suspend
    moved."""
    fleet, clients = gce
    inst = add_instance(fleet, "p", "us-east1-b", "vm", status=status, heartbeat_age=86400)
    inst[field] = rfc3339(time.time() - 86400)
    seen = planned(clients)
    assert seen["vm"].last_stop if field == "lastStopTimestamp" else seen["vm"].last_suspended
    with fleet.lock:
        inst[field] = rfc3339(time.time())
    outcome = deleter(clients).delete([seen["vm"]])[0]
    assert outcome.result == "changed_since_plan" and field in outcome.detail
    assert fleet.counters["delete"] == 0
    with fleet.lock:
        inst[field] = "yesterday"  # unreadable: nothing proves it has not stopped or been suspended since
    assert deleter(clients).delete([seen["vm"]])[0].result == "changed_since_plan"
    assert fleet.counters["delete"] == 0


def test_operation_finishing_with_an_error_is_a_failed_delete(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    fleet.faults.failing_operations.add("vm")
    outcome = deleter(clients).delete(list(planned(clients).values()))[0]
    assert outcome.result == "failed" and "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" in outcome.detail
    assert fleet.names("p") == {"vm"}


def test_rate_limit_per_project_and_bounded_concurrency(gce) -> None:
    fleet, clients = gce
    for project in ("p1", "p2"):
        for i in range(12):
            add_instance(fleet, project, "us-east1-b", f"{project}-{i}", heartbeat_age=86400)
    seen = [*planned(clients, "p1").values(), *planned(clients, "p2").values()]
    fleet.faults.latency = 0.05
    config = parse_settings({"gce": {"delete_rate_per_project": 5.0, "delete_concurrency": 4}}, "test")
    started = time.monotonic()
    outcomes = GceDeleter(clients, config, fast_backoff()).delete(seen)
    elapsed = time.monotonic() - started
    assert {o.result for o in outcomes} == {"deleted"}
    for project in ("p1", "p2"):
        times = sorted(t for t, p, kind in fleet.mutations if p == project and kind == "delete")
        assert len(times) == 12
        worst = max(sum(1 for u in times if t <= u <= t + 1.0) for t in times)
        assert worst <= 5 + 1, f"{project}: {worst} deletes in one second"  # rate 5/s, a bucket of one
    assert elapsed >= 11 / 5  # 12 deletes in a project at 5/s need at least 2.2 s
    stats = fleet.stats()["max_inflight"]
    assert 2 <= max(stats.values()) <= 4


def test_nothing_is_sent_when_the_re_read_outlasts_the_deadline_or_the_lease(gce) -> None:
    # Review finding: the guard was checked before the re-read only; a retried re-read (up to 5 tries of
    # request_timeout) could carry the delete past the deadline, or past a lease taken over meanwhile.
    from reaper.fence import SendGuard

    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "stale", heartbeat_age=86400)
    now = [1000.0]
    lost: list[int] = []
    late = SendGuard(deadline=1010.0, clock=lambda: now[0])
    fleet.on("after", "get", lambda _: now.__setitem__(0, 2000.0))
    taken = SendGuard(lease=lambda: "the sweep lease is held by another execution" if lost else None)
    for guard, lose in ((late, lambda: None), (taken, lambda: fleet.on("after", "get", lambda _: lost.append(1)))):
        lose()
        (outcome,) = deleter(clients).delete(list(planned(clients).values()), guard)
        assert outcome.result == "not_attempted"
    assert fleet.counters["delete"] == 0 and fleet.names("p") == {"stale"}


def test_a_refused_delete_is_failed_and_a_refused_retry_unconfirmed(gce) -> None:
    # A delete by id carries no precondition: a 409/412 is the API refusing it (failed, so that a refusal
    # repeating every sweep alerts); after an earlier try whose answer was lost, it may be that try's doing.
    from include.emulators.http import ApiError

    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "refused", heartbeat_age=86400)
    fleet.faults.fail_next["delete"] = ["412"]
    assert results(deleter(clients).delete(list(planned(clients).values()))) == {"refused": "failed"}

    def applied_but_lost(_: tuple[str, ...]) -> None:
        fleet.faults.fail_next["delete"] = ["409"]  # the retry: the instance is being deleted
        raise ApiError(503, "backendError", "the answer is lost")

    fleet.on("after", "delete", applied_but_lost)
    fleet.faults.operation_seconds["delete"] = 30.0  # the applied delete is still under way at the re-read
    assert results(deleter(clients).delete(list(planned(clients).values()))) == {"refused": "unconfirmed"}
    assert len(fleet.deleted_ids) == 1  # the first try's, applied once


def test_a_send_that_went_unanswered_is_re_read_before_it_is_made_again(gce) -> None:
    """A 503 on the delete may or may not have been applied; the retry is a new send, so the VM is read again
    first (docs/design.md §6): an opt-out put on meanwhile keeps it, and one already gone was this sweep's."""
    from include.emulators.http import ApiError

    fleet, clients = gce
    inst = add_instance(fleet, "p", "us-east1-b", "opted-out-meanwhile", heartbeat_age=86400)
    add_instance(fleet, "p", "us-east1-b", "applied-but-lost", heartbeat_age=86400)
    seen = planned(clients)
    ids = {v.id: k for k, v in seen.items()}

    faulted: set[str] = set()

    def unanswered(args: tuple[str, ...]) -> None:
        if ids[args[2]] == "opted-out-meanwhile" and "opted" not in faulted:
            faulted.add("opted")
            with fleet.lock:
                inst["labels"] = {**inst["labels"], "reaper_keep": "true"}  # an operator opts it out meanwhile
            raise ApiError(503, "backendError", "Internal error. Please try again.")

    def applied_then_lost(args: tuple[str, ...]) -> None:
        if ids[args[2]] == "applied-but-lost" and "applied" not in faulted:
            faulted.add("applied")
            raise ApiError(503, "backendError", "the answer is lost")

    fleet.on("before", "delete", unanswered, times=None)
    fleet.on("after", "delete", applied_then_lost, times=None)
    outcomes = {o.name: o for o in deleter(clients, delete_concurrency=1).delete(list(seen.values()))}
    assert fleet.names("p") == {"opted-out-meanwhile"}
    kept = outcomes["opted-out-meanwhile"]
    assert kept.result == "unconfirmed" and "opt-out label reaper_keep=true" in kept.detail
    assert outcomes["applied-but-lost"].result == "deleted"  # its 404 on the re-read: this sweep's own delete


def test_a_vm_planned_without_a_label_fingerprint_is_never_deleted(gce) -> None:
    """A listing without labelFingerprint (a field mask edited, a proxy, a recorded listing) proves nothing
    unchanged: the Compute API returns it on every Instance, so its absence is a change."""
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    seen = planned(clients)
    (outcome,) = deleter(clients).delete([msgspec.structs.replace(seen["vm"], label_fingerprint="")])
    assert outcome.result == "changed_since_plan" and "(none)" in outcome.detail
    assert fleet.names("p") == {"vm"}


def test_a_label_written_since_the_listing_keeps_the_vm(gce) -> None:
    """A manager may stamp a label of another name (the configured one wrong or renamed), which changes no value
    the re-read compares but the labelFingerprint: on a VM planned by unlabeled_age, and on one planned by
    heartbeat_stale whose old label is frozen since the rename. Any label written since the listing keeps the VM;
    an untouched one is deleted as ever."""
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "renamed", heartbeat_age=None, created_age=4 * 86400)
    add_instance(fleet, "p", "us-east1-b", "untouched", heartbeat_age=None, created_age=4 * 86400)
    add_instance(fleet, "p", "us-east1-b", "stale", heartbeat_age=86400)
    add_instance(fleet, "p", "us-east1-b", "stale-untouched", heartbeat_age=86400)
    seen = planned(clients)
    for name in ("renamed", "stale"):
        current = fleet.instance("p", "us-east1-b", name)
        labels = {**current["labels"], "runner_heartbeat_v2": str(int(time.time()))}
        fleet.set_labels("p", "us-east1-b", name, {"labels": labels, "labelFingerprint": current["labelFingerprint"]})
    outcomes = {o.name: o for o in deleter(clients).delete(list(seen.values()))}
    assert {n: o.result for n, o in outcomes.items()} == {
        "renamed": "changed_since_plan",
        "untouched": "deleted",
        "stale": "changed_since_plan",
        "stale-untouched": "deleted",
    }
    assert all("labelFingerprint" in outcomes[n].detail for n in ("renamed", "stale"))
    assert fleet.names("p") == {"renamed", "stale"}
