"""The GCE emulator as the real compute_v1 clients meet it: rate quotas (the 403 as the SDK parses it, the refill
at the window's boundary, per-caller accounting shared with the manager simulator), operations that take
time, slow answers, and the same settings through ``/_emulator/faults`` and the command line."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TypedDict

import pytest
import requests
from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from include.emulators.gce import Fleet
from include.emulators.gce.manager import ManagerSimulator, manager_clients
from include.emulators.http import free_port, wait_until
from reaper.gce.clients import ComputeClients, throttled
from tests.helpers import ROOT
from tests.helpers.gce import add_instance

ZONE = "us-east1-b"


class InstanceName(TypedDict):
    """The keyword arguments naming one instance to the compute client's calls."""

    project: str
    zone: str
    instance: str


VM: InstanceName = {"project": "p", "zone": ZONE, "instance": "vm"}


def get(clients: ComputeClients) -> compute_v1.Instance:
    return clients.instances.get(**VM, retry=None, timeout=10)


def fresh_window(fleet: Fleet) -> None:
    """Wait for the start of the next window, so that what a test does next happens within one."""
    time.sleep(fleet.quotas.window_start() + fleet.quotas.window - time.time() + 0.01)


@pytest.fixture
def quota(gce) -> tuple[Fleet, ComputeClients]:
    """The emulator with a read quota of 2 a project per one-second window, and one instance."""
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    fleet.quotas.limits["read_requests"] = 2
    fleet.quotas.window = 1.0
    return fleet, clients


def test_a_used_up_quota_is_a_403_rate_limit_exceeded_as_the_sdk_parses_it(quota) -> None:
    fleet, clients = quota
    fresh_window(fleet)
    get(clients), get(clients)
    with pytest.raises(gexc.Forbidden) as raised:
        get(clients)
    exc = raised.value
    assert exc.code == 403 and exc.errors[0]["reason"] == "rateLimitExceeded"
    assert exc.errors[0]["domain"] == "usageLimits"
    assert "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'" in exc.message
    assert throttled(exc)  # the reaper reads it as throttling, not as a missing permission
    clients.instances.list(project="p", zone=ZONE, retry=None, timeout=10)  # another group: still open


def test_the_quota_refills_at_the_next_window_boundary_and_not_before(quota) -> None:
    fleet, clients = quota
    fresh_window(fleet)
    boundary = fleet.quotas.window_start() + fleet.quotas.window
    time.sleep(0.5)  # used up mid-window: a quota counted from its first request would refill half a second late
    get(clients), get(clients)
    while time.time() < boundary - 0.1:
        with pytest.raises(gexc.Forbidden):
            get(clients)
        time.sleep(0.1)
    time.sleep(max(0.0, boundary - time.time()) + 0.02)
    assert get(clients).name == "vm"


def test_the_reaper_and_the_managers_spend_one_project_quota_told_apart_by_caller(quota) -> None:
    fleet, clients = quota
    fleet.quotas.limits["mutation_requests"] = 1
    manager = ManagerSimulator("m1", "p", manager_clients(clients.host), [(ZONE, "vm")])
    fresh_window(fleet)
    assert manager.run_pass()  # a read and a label write
    get(clients)  # the project's second read this window
    with pytest.raises(gexc.Forbidden):
        get(clients)
    assert not manager.create_machine(ZONE)  # refused: the label write spent the mutations
    assert manager.creation_failed._value.get() == 1 and manager.created._value.get() == 0
    usage = {(u.group, u.caller): (u.admitted, u.refused) for u in fleet.quota_usage()}
    assert usage == {
        ("read_requests", "runner-manager"): (1, 0),
        ("mutation_requests", "runner-manager"): (1, 1),
        ("read_requests", "reaper"): (1, 1),
    }
    stats = requests.get(f"{clients.host}/_emulator/stats", timeout=5).json()["quota_usage"]
    assert {(u["group"], u["caller"], u["admitted"], u["refused"]) for u in stats} == {
        (g, c, a, r) for (g, c), (a, r) in usage.items()
    }


def test_quotas_set_through_the_faults_endpoint(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    body = {"quotas": {"limits": {"read_requests": 1}, "projects": {"big": {"read_requests": 5}}, "window": 30}}
    assert requests.post(f"{clients.host}/_emulator/faults", json=body, timeout=5).json() == {"ok": True}
    assert fleet.quotas.limit("p", "read_requests") == 1 and fleet.quotas.limit("big", "read_requests") == 5
    assert fleet.quotas.window == 30
    bad = requests.post(f"{clients.host}/_emulator/faults", json={"quotas": {"limits": {"reads": 1}}}, timeout=5)
    assert bad.status_code == 400 and "unknown quota group" in bad.json()["error"]["message"]


def test_an_operation_takes_its_time_and_wait_returns_at_its_cap_with_the_operation_as_it_stands(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    fleet.faults.operation_seconds["delete"] = 0.8
    fleet.faults.operation_wait_cap = 0.2
    op = clients.instances.delete_unary(**VM, retry=None, timeout=10)
    assert op.status == compute_v1.Operation.Status.PENDING
    where = {"project": "p", "zone": ZONE, "operation": op.name, "retry": None, "timeout": 10}
    started = time.monotonic()
    waited = clients.operations.wait(**where)
    assert 0.15 < time.monotonic() - started < 0.6
    assert waited.status == compute_v1.Operation.Status.RUNNING  # not DONE: the caller must ask again
    assert clients.operations.get(**where).status == compute_v1.Operation.Status.RUNNING
    assert get(clients).status == "STOPPING"  # still there until the operation is DONE
    fleet.faults.operation_wait_cap = 5.0
    done = clients.operations.wait(**where)
    assert done.status == compute_v1.Operation.Status.DONE and 0.7 < time.monotonic() - started < 2.0
    with pytest.raises(gexc.NotFound):
        get(clients)


def test_a_deleted_instance_is_gone_at_done_though_nobody_polls(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    add_instance(fleet, "p", ZONE, "slow")
    fleet.faults.operation_seconds["delete"] = 5.0
    fleet.faults.instance_operation_seconds["vm"] = 0.3  # by instance, over the type's
    clients.instances.delete_unary(**VM, retry=None, timeout=10)
    clients.instances.delete_unary(**{**VM, "instance": "slow"}, retry=None, timeout=10)
    requests_before = len(fleet.requests)

    def zone() -> set[str]:  # the state itself, read without any request that would settle it
        with fleet.lock:
            return set(fleet.projects["p"][ZONE])

    assert zone() == {"vm", "slow"}
    wait_until(lambda: zone() == {"slow"}, "the delete to take effect", timeout=3)
    assert len(fleet.requests) == requests_before


def test_operations_of_no_duration_are_done_when_first_read_as_before(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    op = clients.instances.delete_unary(**VM, retry=None, timeout=10)
    assert op.status == compute_v1.Operation.Status.PENDING  # the call's answer: the operation as created
    read = clients.operations.get(project="p", zone=ZONE, operation=op.name, retry=None, timeout=10)
    assert read.status == compute_v1.Operation.Status.DONE and read.progress == 100
    assert fleet.names("p") == set()


def test_a_slow_kind_answers_late_and_the_others_do_not(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    fleet.faults.slow["get"] = 0.4
    started = time.monotonic()
    get(clients)
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    clients.instances.list(project="p", zone=ZONE, retry=None, timeout=10)
    assert time.monotonic() - started < 0.3


def test_the_command_line_sets_quotas_durations_and_slow_kinds(tmp_path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "include.emulators.gce", "--port", str(port), "--generate", "1", "1", "1"]
    argv += ["--quota", "read_requests=1", "--quota-window", "3600", "--operation-seconds", "delete=7"]
    argv += ["--slow", "get=0.01", "--operation-wait-cap", "9"]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert "GCE emulator on" in (process.stdout.readline() if process.stdout else "")
        url = f"http://127.0.0.1:{port}/compute/v1/projects/ci-project-000/zones/us-east1-b/instances/runner-000-000000"
        assert requests.get(url, timeout=5).status_code == 200
        refused = requests.get(url, timeout=5)
        assert refused.status_code == 403 and refused.json()["error"]["errors"][0]["reason"] == "rateLimitExceeded"
        op = requests.delete(url, timeout=5).json()
        read = requests.get(op["selfLink"].replace("https://www.googleapis.com", f"http://127.0.0.1:{port}"), timeout=5)
        assert read.json()["status"] == "RUNNING"  # 7 s to go
        bad = subprocess.run([*argv[:3], "--quota", "reads"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "--quota 'reads': expected NAME=NUMBER" in bad.stderr
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_an_emulator_without_quotas_configured_limits_nothing(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", ZONE, "vm")
    for _ in range(30):
        get(clients)
    assert [(u.caller, u.admitted, u.refused) for u in fleet.quota_usage()] == [("reaper", 30, 0)]
    assert Fleet().quotas.limits == {}
