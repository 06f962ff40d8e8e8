"""The manager simulator: heartbeat writes through setLabels with fingerprints, kill, and failing writes."""

from __future__ import annotations

import time

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from include.emulators.gce.manager import ManagerSimulator
from tests.builders import HB
from tests.helpers.gce import add_instance


def _beat(fleet, name: str) -> int:
    with fleet.lock:
        return int(fleet.instance("p", "us-east1-b", name)["labels"][HB])


def test_a_pass_refreshes_every_tracked_instance_and_only_those(gce) -> None:
    fleet, clients = gce
    for name in ("a", "b", "untracked"):
        add_instance(fleet, "p", "us-east1-b", name, heartbeat_age=3600, labels={"keep": "me"})
    before = {n: _beat(fleet, n) for n in ("a", "b", "untracked")}
    manager = ManagerSimulator("m1", "p", clients, [("us-east1-b", "a"), ("us-east1-b", "b")])
    assert manager.run_pass()
    assert _beat(fleet, "a") > before["a"] + 3000 and _beat(fleet, "b") > before["b"] + 3000
    assert _beat(fleet, "untracked") == before["untracked"]
    with fleet.lock:
        assert fleet.instance("p", "us-east1-b", "a")["labels"]["keep"] == "me"  # other labels survive
    assert manager.last_pass._value.get() == pytest.approx(time.time(), abs=5)
    assert manager.passes._value.get() == 1 and manager.failed_passes._value.get() == 0
    assert fleet.counters["set_labels"] == 2


def test_a_stale_fingerprint_is_refused(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a")
    request = compute_v1.InstancesSetLabelsRequest(labels={"x": "y"}, label_fingerprint="stale")
    with pytest.raises(gexc.PreconditionFailed):
        clients.instances.set_labels_unary(
            project="p", zone="us-east1-b", instance="a", instances_set_labels_request_resource=request
        )


def test_failing_writes_leave_the_label_alone_and_count_a_failed_pass(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a", heartbeat_age=3600)
    before = _beat(fleet, "a")
    fleet.faults.deny_set_labels.add("p")  # lost IAM: the manager keeps running and reporting
    manager = ManagerSimulator("m1", "p", clients, [("us-east1-b", "a")])
    assert manager.run_pass() is False
    assert _beat(fleet, "a") == before
    assert manager.failed_passes._value.get() == 1 and manager.last_pass._value.get() == 0
    assert manager.passes._value.get() == 1  # the alerts' denominator counts failed passes too


def test_killed_manager_stops_refreshing(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a", heartbeat_age=3600)
    manager = ManagerSimulator("m1", "p", clients, [("us-east1-b", "a")], interval=0.2).start()
    deadline = time.time() + 5
    while fleet.counters["set_labels"] < 2 and time.time() < deadline:
        time.sleep(0.05)
    manager.kill()
    writes = fleet.counters["set_labels"]
    assert writes >= 2
    time.sleep(0.6)
    assert fleet.counters["set_labels"] == writes
