"""Inventory through the real compute_v1 client against the GCE emulator."""

from __future__ import annotations

import json
from collections import Counter
from typing import cast

import pytest

from reaper.config import parse_settings
from reaper.gce.clients import clients_from_connection
from reaper.gce.deleter import GceDeleter
from reaper.gce.inventory import label_filter, list_project, list_projects
from reaper.model import Evidence, GceInstance, Phase, WriterRecord, incomplete_scopes
from reaper.policy import evaluate
from tests.helpers import fast_backoff
from tests.helpers.gce import STARTED, add_instance

SELECTOR = {"ci_ephemeral": "true"}
ZONES = [f"us-east1-{z}" for z in "bcdefgh"]


def _seed_big(fleet) -> dict[str, set[str]]:
    """2,500 selected instances in 7 zones over 3 projects, plus unselected ones the filter must drop."""
    expected: dict[str, set[str]] = {}
    for project, count in (("proj-a", 1200), ("proj-b", 799), ("proj-c", 501)):
        expected[project] = set()
        for i in range(count):
            name = f"{project}-vm-{i:04d}"
            add_instance(fleet, project, ZONES[i % 7], name)
            expected[project].add(name)
        for i in range(40):
            add_instance(fleet, project, ZONES[i % 7], f"{project}-web-{i}", labels={"ci_ephemeral": "false"})
    return expected


def test_pagination_lists_every_instance_exactly_once_with_filter_pushdown(gce) -> None:
    fleet, clients = gce
    expected = _seed_big(fleet)
    listings = list_projects(clients, sorted(expected), SELECTOR, 3, fast_backoff(), 10)
    assert sum(len(x) for x in expected.values()) == 2500
    for listing in listings:
        names = [i.name for i in listing.resources]
        assert Counter(names).most_common(1)[0][1] == 1, "an instance was listed twice"
        assert set(names) == expected[listing.scope]
        assert listing.complete and listing.pages == -(-len(names) // 500)
        assert {i.zone for i in listing.resources} == set(ZONES)
        assert all(i.project == listing.scope for i in listing.resources)
    requests = [path for method, path in fleet.requests if "aggregated" in path]
    assert len(requests) == 3 + 2 + 2
    assert all("filter=labels.ci_ephemeral+%3D+%22true%22" in path and "maxResults=500" in path for path in requests)


def test_label_filter_joins_equalities_with_and() -> None:
    assert label_filter({"b": "2", "a": "x y"}) == 'labels.a = "x y" AND labels.b = "2"'


def test_multi_label_selector_is_pushed_down(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "both", labels={"fleet": "x"})
    add_instance(fleet, "p", "us-east1-b", "one")
    listing = list_project(clients, "p", {"ci_ephemeral": "true", "fleet": "x"}, fast_backoff(), 10)
    assert [i.name for i in listing.resources] == ["both"]


def test_normalized_instances_keep_what_the_rules_read(gce) -> None:
    fleet, clients = gce
    raw = add_instance(fleet, "p", "us-east1-c", "vm", status="TERMINATED", instance_id=7123456789012345678)
    inst = list_project(clients, "p", SELECTOR, fast_backoff(), 10).resources[0]
    assert (inst.project, inst.zone, inst.name, inst.id, inst.status) == (
        "p",
        "us-east1-c",
        "vm",
        "7123456789012345678",
        "TERMINATED",
    )
    assert inst.labels == raw["labels"]
    assert abs(inst.created - (STARTED - 86400)) < 1


def test_unreachable_zone_marks_the_project_incomplete(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "a")
    add_instance(fleet, "p", "us-east1-c", "b")
    fleet.faults.unreachable.add(("p", "us-east1-c"))
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10)
    assert not listing.complete
    assert listing.problems == ["zones/us-east1-c: UNREACHABLE: Zone us-east1-c is unreachable"]
    assert [i.name for i in listing.resources] == ["a"]


def test_a_page_that_keeps_failing_marks_the_project_incomplete(gce) -> None:
    fleet, clients = gce
    for i in range(1200):
        add_instance(fleet, "p", "us-east1-b", f"vm-{i:04d}")
    fleet.faults.failing_pages.add(("p", 1))
    listing = list_project(clients, "p", SELECTOR, fast_backoff(2), 10)
    assert not listing.complete and listing.pages == 1
    assert listing.problems[0].startswith("page 2: ServiceUnavailable")
    assert fleet.counters["aggregated_list"] == 1 + 3  # first page, then the second page tried 3 times


def test_transient_page_errors_are_retried(gce) -> None:
    fleet, clients = gce
    for i in range(1200):
        add_instance(fleet, "p", "us-east1-b", f"vm-{i:04d}")
    fleet.faults.fail_next["aggregated_list"] = ["429", "503", "timeout", "429"]
    # The read timeout must outlast a real 500-instance page on a busy machine (0.2 s did not, 1 run in 20).
    fleet.faults.timeout_delay = 2.5
    listing = list_project(clients, "p", SELECTOR, fast_backoff(4), 1.5)
    assert listing.complete and len(listing.resources) == 1200
    assert fleet.counters["aggregated_list"] == 3 + 4


def test_no_delete_is_sent_in_an_incompletely_listed_project(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "broken", "us-east1-b", "stale-1", heartbeat_age=86400)
    add_instance(fleet, "broken", "us-east1-b", "fresh-1")
    add_instance(fleet, "broken", "us-east1-c", "fresh-2")
    add_instance(fleet, "fine", "us-east1-b", "stale-2", heartbeat_age=86400)
    add_instance(fleet, "fine", "us-east1-b", "fresh-3")
    add_instance(fleet, "fine", "us-east1-b", "fresh-4")
    fleet.faults.unreachable.add(("broken", "us-east1-c"))
    config = parse_settings({}, "test")
    listings = list_projects(clients, ["broken", "fine"], SELECTOR, 2, fast_backoff(), 10)
    writers = [WriterRecord("m", p, STARTED - 60, False) for p in ("broken", "fine")]
    evidence = Evidence(writer_health=writers, incomplete=incomplete_scopes(listings))
    from datetime import UTC, datetime

    resources = [i for listing in listings for i in listing.resources]
    plan = evaluate(resources, evidence, config, Phase.ENFORCEMENT, datetime.fromtimestamp(STARTED, UTC))
    outcomes = GceDeleter(clients, config, fast_backoff()).delete(
        [cast(GceInstance, d.resource) for d in plan.deletes()]
    )
    assert [(o.name, o.result) for o in outcomes] == [("stale-2", "deleted")]
    assert "stale-1" in fleet.names("broken")
    assert not any("/projects/broken/" in path for method, path in fleet.requests if method == "DELETE")


def test_clients_come_from_the_airflow_connection(gce, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm")
    endpoint = clients.instances._transport._host
    extra = {"api_endpoint": endpoint, "anonymous": True}
    monkeypatch.setenv("AIRFLOW_CONN_GCE_EMULATOR", json.dumps({"conn_type": "google_cloud_platform", "extra": extra}))
    from_conn = clients_from_connection("gce_emulator")
    assert [i.name for i in list_project(from_conn, "p", SELECTOR, fast_backoff(), 10).resources] == ["vm"]


def test_an_answer_marked_partial_success_is_an_incomplete_listing(gce) -> None:
    # The field mask used to drop the top-level warning, so a listing with one zone's
    # stale VMs missing counted as complete and the budget saw 10 of 20 stale instead of 40 of 50.
    fleet, clients = gce
    for i in range(10):
        add_instance(fleet, "p", "us-east1-b", f"b-{i}")
        add_instance(fleet, "p", "us-east1-c", f"c-{i}", heartbeat_age=86400)
    fleet.faults.partial_zones.add(("p", "us-east1-c"))
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10)
    assert {i.zone for i in listing.resources} == {"us-east1-b"}
    assert not listing.complete and "PARTIAL_SUCCESS" in listing.problems[0]
    assert incomplete_scopes([listing]) == {("gce", "p")}


def test_an_instance_created_between_page_reads_repeats_one_and_marks_the_listing_incomplete(gce) -> None:
    # Offset-based pages shift when an instance sorting before the offset appears.
    fleet, clients = gce
    for i in range(600):
        add_instance(fleet, "p", "us-east1-c", f"vm-{i:04d}")
    fleet.on("after", "aggregated_list", lambda _: add_instance(fleet, "p", "us-east1-b", "new-vm"))
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10)
    names = Counter(i.name for i in listing.resources)
    assert names.most_common(1)[0][1] == 2, "the emulator did not shift the page"
    assert not listing.complete and any("listed twice" in p for p in listing.problems)


def test_deletion_protection_is_listed(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "guarded")["deletionProtection"] = True
    add_instance(fleet, "p", "us-east1-b", "plain")
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10)
    assert {i.name: i.deletion_protection for i in listing.resources} == {"guarded": True, "plain": False}
