"""An approval against the GCE emulator: a label written after the review (a heartbeat) keeps the VM."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from reaper.approvals import Approval, ApprovedItem
from reaper.config import parse_settings
from reaper.gce.deleter import GceDeleter
from reaper.gce.inventory import list_project
from reaper.model import Evidence, GceInstance, Phase, WriterRecord
from reaper.policy import evaluate
from tests.builders import HB
from tests.helpers import fast_backoff
from tests.helpers.gce import add_instance

SELECTOR = {"ci_ephemeral": "true"}
CONFIG = parse_settings({"gce": {"projects": ["p"], "delete_rate_per_project": 1000.0}}, "test")


def listed(clients) -> dict[str, GceInstance]:
    return {
        i.name: i for i in cast(list[GceInstance], list_project(clients, "p", SELECTOR, fast_backoff(), 10).resources)
    }


def approval_of(*instances: GceInstance) -> Approval:
    now = datetime.now(UTC).timestamp()
    items = [
        ApprovedItem(i.project, i.id, i.label_fingerprint, i.name, i.kind, rule="heartbeat_stale", status=i.status)
        for i in instances
    ]
    return Approval("apr-g", "gce", "reaper_gce_enforcement", "scheduled__1", "alice", "INC-1", now, now + 3600, items)


def stamp(fleet, name: str, labels: dict[str, str]) -> None:
    """What a runner manager does: read the instance, write its labels with the fingerprint it read."""
    current = fleet.instance("p", "us-east1-b", name)
    fleet.set_labels("p", "us-east1-b", name, {"labels": labels, "labelFingerprint": current["labelFingerprint"]})


def plan_under(approval: Approval, clients):
    now = datetime.now(UTC)
    evidence = Evidence(
        writer_health=[WriterRecord("m", "p", now.timestamp() - 10, False)], swept=frozenset({("gce", "p")})
    )
    return evaluate(list(listed(clients).values()), evidence, CONFIG, Phase.ENFORCEMENT, now, approval=approval)


def test_the_listing_carries_the_fingerprint_and_a_label_write_changes_it(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    before = listed(clients)["vm"]
    assert before.label_fingerprint
    stamp(fleet, "vm", {**before.labels, HB: str(int(before.labels[HB]) + 1)})  # a heartbeat, one second on
    assert listed(clients)["vm"].label_fingerprint not in ("", before.label_fingerprint)


def test_a_heartbeat_stamped_between_the_approval_and_the_run_keeps_the_vm(gce) -> None:
    fleet, clients = gce
    for i in range(4):  # four stale of four: the budget holds them all
        add_instance(fleet, "p", "us-east1-b", f"vm-{i}", heartbeat_age=86400)
    seen = listed(clients)
    approval = approval_of(*seen.values())
    # vm-0's manager came back after the review and stamped a heartbeat restored from its store: still stale,
    # so only its state (the fingerprint) tells it is not what was reviewed.
    stamp(fleet, "vm-0", {**seen["vm-0"].labels, HB: str(int(seen["vm-0"].labels[HB]) + 1)})
    plan = plan_under(approval, clients)
    by_name = {d.resource.name: d for d in plan.decisions}
    assert by_name["vm-0"].reason == "approval_changed"
    assert {d.resource.name for d in plan.deletes()} == {"vm-1", "vm-2", "vm-3"}
    outcomes = GceDeleter(clients, CONFIG, fast_backoff()).delete([d.resource for d in plan.deletes()])
    assert {o.name: o.result for o in outcomes} == dict.fromkeys(("vm-1", "vm-2", "vm-3"), "deleted")
    assert fleet.names("p") == {"vm-0"}


def test_a_label_written_between_the_plan_and_the_delete_is_changed_since_plan_under_an_approval(gce) -> None:
    fleet, clients = gce
    add_instance(fleet, "p", "us-east1-b", "vm", heartbeat_age=86400)
    add_instance(fleet, "p", "us-east1-b", "other", heartbeat_age=86400)
    seen = listed(clients)
    for name in seen:  # same heartbeat value, another label: only the fingerprint tells
        stamp(fleet, name, {**seen[name].labels, "touched": "yes"})
    assert seen["vm"].labels[HB] == fleet.instance("p", "us-east1-b", "vm")["labels"][HB]
    pinned = GceDeleter(clients, CONFIG, fast_backoff()).delete([seen["vm"]])
    assert (pinned[0].result, "labelFingerprint" in pinned[0].detail) == ("changed_since_plan", True)
    # Listed again, with the label in its fingerprint, it goes.
    again = GceDeleter(clients, CONFIG, fast_backoff()).delete([listed(clients)["other"]])
    assert again[0].result == "deleted"
    assert fleet.names("p") == {"vm"}
