"""Fleeting groups and their members through the real compute_v1 clients against the GCE emulator."""

from __future__ import annotations

import pytest

from include.emulators.shapes import gcloud_instance
from reaper.config import parse_settings
from reaper.gce import groups as groups_module
from reaper.gce.groups import INCOMPLETE, add_groups, list_groups
from reaper.gce.inventory import list_project
from reaper.model import GceGroup
from tests.helpers import fast_backoff
from tests.helpers.gce import STARTED, add_instance

GCE = parse_settings({"gce": {"group_selector": "fleeting-(?P<manager>.+)"}}, "test").gce


def members(project: str, zone: str, prefix: str, count: int, first_id: int) -> list[dict[str, object]]:
    """Instances as a group's template makes them: the reaper's selector labels, no heartbeat."""
    return [
        gcloud_instance(project, zone, f"{prefix}-{i}", first_id + i, "RUNNING", {"ci_ephemeral": "true"}, STARTED)
        for i in range(count)
    ]


def test_every_page_is_read_and_only_selected_groups_are_kept(gce, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet, clients = gce
    monkeypatch.setattr(groups_module, "PAGE_SIZE", 2)  # 7 groups: 4 pages through the real client's paging
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m1", 101, members("p", "us-east1-b", "m1", 3, 9000))
    fleet.add_group("p", "zones/us-east1-c", "fleeting-m2", 102, [], target_size=0)
    fleet.add_group("p", "regions/us-east1", "fleeting-m3", 103, members("p", "us-east1-d", "m3", 2, 9100))
    for i in range(4):
        fleet.add_group("p", "zones/us-east1-b", f"web-{i}", 200 + i, [])  # not fleeting: not selected
    listing = list_groups(clients, "p", GCE, fast_backoff(), 10)
    assert listing.complete and listing.pages == 4
    assert sorted(listing.resources, key=lambda g: g.name) == [
        GceGroup("p", "us-east1-b", "fleeting-m1", "101", 3),
        GceGroup("p", "us-east1-c", "fleeting-m2", "102", 0),
        GceGroup("p", "us-east1", "fleeting-m3", "103", 2),
    ]
    pages = [path for _, path in fleet.requests if "instanceGroupManagers" in path]
    assert len(pages) == 4 and all("maxResults=2" in path for path in pages)


def test_a_group_holds_its_members_still_there_or_its_target_size(gce) -> None:
    fleet, clients = gce
    # Scaled to 0, its instances not deleted yet: what it holds is what is there, not its target size.
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m1", 101, members("p", "us-east1-b", "m1", 3, 9000), 0)
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m2", 102, [], target_size=2)  # being created
    with fleet.lock:
        del fleet.projects["p"]["us-east1-b"]["m1-0"]
    found = {g.name: g.instances for g in list_groups(clients, "p", GCE, fast_backoff(), 10).resources}
    assert found == {"fleeting-m1": 2, "fleeting-m2": 2}


def test_members_are_marked_by_their_created_by_metadata_in_the_instance_listing(gce) -> None:
    fleet, clients = gce
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m1", 101, members("p", "us-east1-b", "m1", 2, 9000))
    add_instance(fleet, "p", "us-east1-b", "docker-machine-vm")
    listing = list_project(clients, "p", {"ci_ephemeral": "true"}, fast_backoff(), 10)
    assert listing.complete
    assert {i.name: i.group_member for i in listing.resources} == {
        "m1-0": True,
        "m1-1": True,
        "docker-machine-vm": False,
    }
    # Only the metadata keys were asked for: a startup script's value never travels.
    (path,) = [p for _, p in fleet.requests if "aggregated/instances" in p]
    assert "metadata" not in path  # the mask goes in the header, not the URL


def test_a_failed_group_page_never_holds_the_instance_listing(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "docker-machine-vm")
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m1", 101, members("p", "us-east1-b", "m1", 1, 9000))
    listings = [list_project(clients, "p", {"ci_ephemeral": "true"}, fast_backoff(), 10)]
    fleet.faults.fail_next["group_list"] = ["503"] * 10  # more than the retries
    add_groups(listings, clients, GCE, fast_backoff(), 10)
    (listing,) = listings
    assert listing.complete  # instance deletes in p go on
    assert listing.hygiene == {INCOMPLETE: 1}
    assert not [r for r in listing.resources if isinstance(r, GceGroup)]


def test_no_selector_lists_no_group(gce) -> None:
    fleet, clients = gce
    fleet.add_group("p", "zones/us-east1-b", "fleeting-m1", 101, [])
    listings = [list_project(clients, "p", {"ci_ephemeral": "true"}, fast_backoff(), 10)]
    add_groups(listings, clients, parse_settings({}, "test").gce, fast_backoff(), 10)
    assert listings[0].resources == [] and not [p for _, p in fleet.requests if "instanceGroupManagers" in p]


# --- which managers reported within the quarantine: the same source and strictness as writer health ---


@pytest.fixture
def prometheus():
    from tests.integration.fake_prometheus import FakePrometheus

    fake = FakePrometheus()
    yield fake
    fake.close()


def reporting(url: str):
    from datetime import timedelta

    from reaper.config import WriterHealthConfig
    from reaper.gce.writer_health import PrometheusWriterHealth

    return PrometheusWriterHealth(WriterHealthConfig(prometheus_url=url)).reporting(timedelta(hours=4))


def test_every_manager_with_a_sample_within_the_quarantine_is_reporting(prometheus) -> None:
    from tests.integration.fake_prometheus import series, vector

    # A sample whose value is unusable still shows the manager was there.
    prometheus.answer(vector(series("m1", "p1", "1700000000", STARTED), series("m2", "p1", "NaN", STARTED)), None)
    assert reporting(prometheus.url) == {("m1", "p1"), ("m2", "p1")}
    seen, history = prometheus.queries
    assert "last_over_time(runner_manager_heartbeat_last_pass_timestamp_seconds[14400s])" in seen
    assert "by (manager, project)" in seen and "offset 14400s" in history


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"status": "success", "data": {"resultType": "vector", "result": []}}, 200),  # no history that old
        ({"status": "success", "data": {"resultType": "vector", "result": []}, "warnings": ["partial"]}, 200),
        ({"status": "error", "error": "boom"}, 200),
        (b"{not json", 200),
        ({"status": "success", "data": {"resultType": "vector", "result": []}}, 503),
    ],
)
def test_anything_but_a_complete_answer_with_history_is_unknown(prometheus, body: object, code: int) -> None:
    prometheus.answer(body, None, codes=(code, 200))
    assert reporting(prometheus.url) is None


def test_no_manager_reporting_at_all_is_unknown_not_every_manager_gone(prometheus) -> None:
    from tests.integration.fake_prometheus import vector

    # History older than the quarantine, nothing within it: a scrape or Prometheus outage that long
    # looks the same as every manager gone at once, and surprising evidence keeps.
    prometheus.answer(vector(), None)
    prometheus.past = (200, vector({"metric": {}, "value": [STARTED, "3"]}))
    assert reporting(prometheus.url) is None
    prometheus.answer(vector({"metric": {"manager": "m1", "project": "p1"}, "value": [STARTED, "1"]}), None)
    assert reporting(prometheus.url) == {("m1", "p1")}
