"""GCE projects by canonical id (docs/design.md §4), through the sweep's steps against the GCE emulator.

The Compute API takes a project's number wherever it takes its id and names the id in its URLs. A
sweep resolves each configured project to its id before sharding, and keys every hold, protection
and metric by it. Each sweep here runs the steps as the DAG wires them (``resolve_scopes`` ->
``list_inventory`` -> ``gather_evidence`` -> ``evaluate_policy`` -> ``delete``) with a real
``GceTarget``, a SecantusDB ledger and the emulator; writer health is off, so the VMs stopped for
a day (``terminated``) are the only deletes.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import googleapiclient
import msgspec
import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from include.emulators.http import ApiError
from include.emulators.shapes import COMPUTE, gcloud_instance
from reaper.config import LedgerConfig
from reaper.ledger import Ledger
from reaper.metrics import PushedSweep
from reaper.model import Phase
from reaper.records import summary_of
from reaper.sweep import steps
from reaper.sweep.targets import GceTarget
from tests.builders import settings
from tests.helpers.gce import STARTED, add_instance

NUMBER = "123456789012"  # ci-a's project number
ZONES = ("us-east1-b", "us-east1-c")
STOPPED = {f"{p}-{z[-1]}-stopped" for p in ("ci-a", "ci-b") for z in ZONES}
DISCOVERY = Path(googleapiclient.__file__).parent / "discovery_cache/documents/compute.v1.json"


class Execution(steps.Execution):
    def ledger(self) -> Ledger:
        return self._ledger  # type: ignore[attr-defined]  # set on the instance by the test


@pytest.fixture
def world(gce, mongo, tmp_path):
    """Two projects, ci-a (number ``NUMBER``) and ci-b, each with a VM stopped for a day and a live one per zone."""
    fleet, clients = gce
    fleet.numbers["ci-a"] = NUMBER
    for project in ("ci-a", "ci-b"):
        for zone in ZONES:
            add_instance(fleet, project, zone, f"{project}-{zone[-1]}-stopped", status="TERMINATED")
            add_instance(fleet, project, zone, f"{project}-{zone[-1]}-live")
    client, database = mongo
    ledger = Ledger(client, LedgerConfig(database=database))
    ledger.ensure_indexes()
    return fleet, clients, ledger, tmp_path


def sweep(world, projects: list[str], **gce: object) -> tuple[steps.Summary, set[str], Execution]:
    """One enforcement sweep of ``projects``, its deletes sent: its summary, the VMs it deleted, the sweep."""
    fleet, clients, ledger, tmp_path = world
    config = settings(
        gce={"projects": projects, "writer_health": {"source": "none"}, "max_retries": 0, **gce},
        k8s={"enabled": False},
        airflow={"sweep_store": f"file://{tmp_path}", "lease_wait": "0s", "shards": 2},
        rollout={"gce": "enforcement"},  # the swept phase is the active one: no what-if (docs/design.md §8)
    )
    target = GceTarget(config)
    target.__dict__["clients"] = clients
    s = Execution(config, target, Phase.ENFORCEMENT, steps.Ids("reaper_gce_enforcement", f"manual__{uuid.uuid4()}", 0))
    object.__setattr__(s, "_ledger", ledger)
    before = fleet.names()
    setup = steps.resolve_scopes(s, {})
    shards = [steps.list_inventory(s, shard, i, setup.lease) for i, shard in enumerate(setup.shards)]
    planned = steps.evaluate_policy(s, steps.gather_evidence(s, shards, setup.lease), {}, "sre", setup.lease)
    for batch in planned.batches:
        steps.delete(s, batch, setup.lease, None)
    steps.release_lease(s)
    return planned.summary, before - fleet.names(), s


def holds(summary: steps.Summary) -> dict[str, list[str]]:
    """Each swept scope's holds but the one writer health being off puts everywhere."""
    return {v.scope: [h for h in v.holds if h != "writer_health_unknown"] for v in summary.scopes}


def listings_of(fleet, name: str) -> int:
    """How many listing pages were asked for by the project name ``name``."""
    return sum(1 for _, path in fleet.requests if path.startswith(f"/compute/v1/projects/{name}/aggregated/instances"))


@pytest.mark.parametrize("denied", [False, True], ids=["projects.get", "projects.get denied"])
def test_a_project_configured_by_its_number_with_a_zone_unreachable_loses_nothing(world, denied: bool) -> None:
    fleet = world[0]
    fleet.faults.unreachable.add(("ci-a", "us-east1-c"))
    if denied:
        fleet.faults.deny_project_get.add("ci-a")
    summary, deleted, _ = sweep(world, [NUMBER, "ci-b"])
    assert deleted == {"ci-b-b-stopped", "ci-b-c-stopped"}
    assert holds(summary) == {"ci-a": ["inventory_incomplete"], "ci-b": []}
    assert summary.incomplete == {"ci-a": ["zones/us-east1-c: UNREACHABLE: Zone us-east1-c is unreachable"]}
    (a,) = (r for r in summary.resolution if r.scope == "ci-a")
    assert a.configured == (NUMBER,) and a.numbers == (NUMBER,)
    assert a.how.startswith("first listing page (projects.get failed: Forbidden" if denied else "projects.get")


@pytest.mark.parametrize(
    ("projects", "protected"),
    [([NUMBER, "ci-b"], ["ci-a"]), (["ci-a", "ci-b"], [NUMBER]), ([NUMBER, "ci-b"], [NUMBER])],
    ids=["configured by number, protected by id", "configured by id, protected by number", "both by number"],
)
def test_a_protected_project_loses_nothing_whichever_of_its_names_the_config_uses(
    world, projects: list[str], protected: list[str]
) -> None:
    summary, deleted, _ = sweep(world, projects, protected_projects=protected)
    assert deleted == {"ci-b-b-stopped", "ci-b-c-stopped"}
    assert holds(summary) == {"ci-a": ["protected_scope"], "ci-b": []}


def test_an_instance_whose_self_link_names_another_project_makes_the_listing_incomplete(world) -> None:
    fleet = world[0]
    stray = gcloud_instance("ci-a", ZONES[0], "stray", 77, "TERMINATED", {"ci_ephemeral": "true"}, STARTED - 86400)
    stray["selfLink"] = str(stray["selfLink"]).replace("/projects/ci-a/", "/projects/ci-x/")
    fleet.add(stray)  # filed under ci-a by its zone URL, its selfLink naming ci-x
    summary, deleted, _ = sweep(world, ["ci-a", "ci-b"])
    assert deleted == {"ci-b-b-stopped", "ci-b-c-stopped"}
    assert holds(summary) == {"ci-a": ["inventory_incomplete"], "ci-b": []}  # ci-x is no scope
    assert summary.incomplete == {"ci-a": ["instance 77 (stray): its selfLink names project ci-x, not ci-a"]}


def test_without_projects_get_a_number_is_resolved_by_the_first_instance_its_listing_answers(world) -> None:
    fleet = world[0]
    fleet.faults.deny_project_get |= {"ci-a", "ci-b"}
    summary, deleted, _ = sweep(world, [NUMBER, "ci-b"])
    assert deleted == STOPPED and holds(summary) == {"ci-a": [], "ci-b": []}
    resolution = {r.scope: r for r in summary.resolution}
    assert resolution["ci-a"].configured == (NUMBER,) and resolution["ci-a"].numbers == (NUMBER,)
    assert resolution["ci-b"].how.startswith("as configured: an id (projects.get failed: Forbidden: 403")
    assert resolution["ci-b"].numbers == ()  # unknown: a protected number would hold ci-b
    assert listings_of(fleet, NUMBER) == 1 and listings_of(fleet, "ci-a") == 1  # the probe, then the listing


def test_an_unknown_project_number_is_an_incomplete_listing(world) -> None:
    summary, deleted, _ = sweep(world, ["999999999999", "ci-b"])
    assert deleted == {"ci-b-b-stopped", "ci-b-c-stopped"}
    assert holds(summary) == {"999999999999": ["inventory_incomplete"], "ci-b": []}
    assert summary.incomplete["999999999999"] == ["projects.get: there is no project 999999999999"]
    assert listings_of(world[0], "999999999999") == 0


def test_a_number_neither_projects_get_nor_a_page_resolves_is_an_incomplete_listing(world) -> None:
    fleet = world[0]
    fleet.faults.rates["project_get"] = {"503": 1.0}
    fleet.faults.failing_pages.add(("ci-a", 0))
    summary, deleted, _ = sweep(world, [NUMBER, "ci-b"])
    assert deleted == {"ci-b-b-stopped", "ci-b-c-stopped"}  # ci-b is an id: it names itself
    assert holds(summary) == {NUMBER: ["inventory_incomplete"], "ci-b": []}
    (problem,) = summary.incomplete[NUMBER]
    assert problem.startswith("projects.get failed: ServiceUnavailable") and "no instance names its id" in problem


@pytest.mark.parametrize("denied", [False, True], ids=["projects.get", "projects.get denied"])
def test_an_id_and_its_number_both_configured_are_one_scope_listed_once(world, denied: bool) -> None:
    fleet = world[0]
    if denied:
        fleet.faults.deny_project_get.add("ci-a")
    summary, deleted, _ = sweep(world, ["ci-a", NUMBER])
    assert deleted == {"ci-a-b-stopped", "ci-a-c-stopped"} and holds(summary) == {"ci-a": []}
    (a,) = summary.resolution
    assert a.scope == "ci-a" and set(a.configured) == {"ci-a", NUMBER} and a.numbers == (NUMBER,)
    assert listings_of(fleet, "ci-a") == 1


def test_metrics_name_the_id_and_a_sweep_of_every_configured_name_is_full(world, monkeypatch) -> None:
    summary, _, s = sweep(world, [NUMBER, "ci-b"])
    pushed: list[tuple[PushedSweep, set[str]]] = []
    monkeypatch.setattr("reaper.metrics.push_sweep", lambda url, sweep, timeout, keep: pushed.append((sweep, keep)))
    stored = json.loads(json.dumps({**s.ids.fields(), **msgspec.to_builtins(summary)}))  # as the ledger holds it
    steps.push_metrics(s, summary_of(stored), {}, True, None)
    ((metrics, keep),) = pushed
    assert metrics.full and keep == {"ci-a", "ci-b"}  # ci-a's groups stay; one named 123456789012 is retired


# --- the emulator: a project number wherever an id goes ---------------------------------------------------


def test_the_emulator_takes_a_number_wherever_it_takes_an_id_and_answers_with_the_id(gce) -> None:
    fleet, clients = gce
    fleet.numbers["ci-a"] = NUMBER
    add_instance(fleet, "ci-a", ZONES[0], "vm", instance_id=42)
    by_number = clients.instances.get(project=NUMBER, zone=ZONES[0], instance="vm")
    assert by_number.self_link == f"{COMPUTE}/projects/ci-a/zones/{ZONES[0]}/instances/vm"
    assert by_number.zone == f"{COMPUTE}/projects/ci-a/zones/{ZONES[0]}"
    pages = clients.instances.aggregated_list(project=NUMBER)
    assert [i.name for _, scoped in pages for i in scoped.instances] == ["vm"]
    with pytest.raises(gexc.NotFound, match="projects/999999999999"):
        clients.instances.get(project="999999999999", zone=ZONES[0], instance="vm")


def test_the_emulators_projects_get_answers_the_discovery_documents_project(gce) -> None:
    fleet, clients = gce
    fleet.numbers["ci-a"] = NUMBER
    add_instance(fleet, "ci-a", ZONES[0], "vm")
    schema = json.loads(DISCOVERY.read_text())["schemas"]["Project"]["properties"]
    by_id = requests.get(f"{clients.host}/compute/v1/projects/ci-a", timeout=5).json()
    by_number = requests.get(f"{clients.host}/compute/v1/projects/{NUMBER}", timeout=5).json()
    assert by_id == by_number and set(by_id) <= set(schema)
    assert all(isinstance(by_id[k], str) for k, v in schema.items() if v.get("type") == "string" and k in by_id)
    assert by_id["kind"] == "compute#project" and by_id["name"] == "ci-a" and by_id["id"] != NUMBER
    assert by_id["selfLink"] == f"{COMPUTE}/projects/ci-a"
    assert by_id["defaultServiceAccount"] == f"{NUMBER}-compute@developer.gserviceaccount.com"
    sdk = compute_v1.ProjectsClient(
        credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=clients.host), transport="rest"
    )
    assert sdk.get(project=NUMBER).name == "ci-a"
    with pytest.raises(gexc.NotFound):
        sdk.get(project="ci-nope")
    fleet.faults.deny_project_get.add("ci-a")
    with pytest.raises(gexc.Forbidden, match=r"compute\.projects\.get"):
        sdk.get(project=NUMBER)


def test_resolving_under_a_used_up_read_quota_stops_when_the_run_must(gce, monkeypatch) -> None:
    """During an incident the managers use up the read quota, and projects.get is throttled: each name waits a
    window per retry, list_concurrency at a time. Resolution stops when told to (resolve_scopes gives it a
    quarter of the run's time); an id then names itself, as after any other failure of projects.get."""
    from reaper.config import QUOTA_WINDOW_ENV, parse_settings
    from reaper.fence import SendGuard
    from reaper.gce.projects import resolve_projects
    from reaper.gce.quota import ProjectQuota
    from reaper.retry import Backoff

    monkeypatch.setenv(QUOTA_WINDOW_ENV, "1")
    fleet, clients = gce
    projects = [f"p{i:02d}" for i in range(16)]
    for p in projects:
        add_instance(fleet, p, ZONES[0], "vm")

    def used_up(_: tuple[str, ...]) -> None:
        raise ApiError(403, "rateLimitExceeded", "Rate Limit Exceeded")

    fleet.on("before", "project_get", used_up, times=None)
    quota = ProjectQuota(parse_settings({}, "test").gce.quota)
    stop = SendGuard(deadline=time.time() + 1.5).stop_at
    started = time.monotonic()
    found = resolve_projects(clients, projects, {"ci_ephemeral": "true"}, 8, Backoff(4), 10, quota, stop)
    assert time.monotonic() - started < 3.0
    assert [r.scope for r in found] == projects and not any(r.problem for r in found)
    assert all(r.how.startswith("as configured: an id") for r in found)
