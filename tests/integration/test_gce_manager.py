"""The manager simulator: heartbeat writes through setLabels with fingerprints, kill, failing writes, machine
creation and crash loops, and the metrics endpoint the alerts read."""

from __future__ import annotations

import time

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from prometheus_client.parser import text_string_to_metric_families

from include.emulators.gce.manager import ManagerSimulator
from include.emulators.http import free_port, wait_until
from reaper import alert_rules
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


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The simulator's metrics endpoint as Prometheus reads it: (name, labels) -> value."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_crash_loop_restarts_until_killed_and_each_restart_loses_the_store(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a", heartbeat_age=3600)
    manager = ManagerSimulator("m1", "p", clients, [("us-east1-b", "a")])
    assert manager.run_pass()
    manager.crash_loop(0.05, "us-east1-b")
    try:
        wait_until(lambda: manager.restarts._value.get() >= 3, "three restarts", 10)
    finally:
        manager.kill()
    restarts = manager.restarts._value.get()
    time.sleep(0.2)
    assert manager.restarts._value.get() == restarts  # killed: the loop ended
    # Every restart re-created one idle machine, and lost the one the restart before had created.
    assert manager.created._value.get() == restarts and manager.creation_failed._value.get() == 0
    assert manager.instances == [("us-east1-b", f"m1-machine-{int(restarts)}")]
    assert fleet.names("p") == {"a"} | {f"m1-machine-{i}" for i in range(1, int(restarts) + 1)}


def test_the_metrics_endpoint_serves_restarts_and_creations_as_the_alerts_read_them(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a", heartbeat_age=3600)
    manager = ManagerSimulator("m1", "p", clients, [("us-east1-b", "a")], namespace="runners")
    port = manager.serve_metrics(free_port())
    try:
        manager.crash()
        manager.crash()
        assert manager.create_machine("us-east1-b")
        fleet.faults.instance_quota["p"] = 2  # "a" and the new machine: the quota is used up
        assert not manager.create_machine("us-east1-b")
        samples = _scrape(port)
    finally:
        manager.kill()
    pod = frozenset({"namespace": "runners", "pod": "m1", "container": "runner"}.items())
    assert samples[(alert_rules.RESTARTS, pod)] == 2
    action = "gitlab_runner_autoscaling_actions_total"
    assert action == alert_rules.ACTIONS
    assert samples[(action, frozenset({"executor": "docker+machine", "action": "created"}.items()))] == 1
    assert samples[(action, frozenset({"executor": "docker+machine", "action": "creation-failed"}.items()))] == 1


def test_a_created_machine_is_labelled_tracked_and_heartbeated_until_a_restart(gce) -> None:
    fleet, clients = gce
    fleet.add_zone("p", "us-east1-b")
    manager = ManagerSimulator("m1", "p", clients, [], clock=lambda: 1_000_000.0)
    assert manager.create_machine("us-east1-b")
    [(zone, name)] = manager.instances
    with fleet.lock:
        created = fleet.instance("p", zone, name)
        assert created["status"] == "RUNNING" and created["labels"] == {"ci_ephemeral": "true", HB: "1000000"}
    manager.clock = lambda: 2_000_000.0
    assert manager.run_pass() and _beat(fleet, name) == 2_000_000
    manager.crash()
    manager.clock = lambda: 3_000_000.0
    assert manager.run_pass() and _beat(fleet, name) == 2_000_000  # abandoned: no live manager tracks it
    with pytest.raises(gexc.Conflict):  # the API refuses a taken name
        clients.instances.insert_unary(
            project="p", zone=zone, instance_resource=compute_v1.Instance(name=name), retry=None, timeout=10
        )
