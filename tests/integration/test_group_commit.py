"""Group commits on the delete path, against the Compute emulator and SecantusDB, eight deletes at a time.

Concurrent deletes share the ledger's round trips (``reaper.commits``); what each delete depends on
stays durable before it: no send without its intent acknowledged, an outage stops every send, and the
retry leaves every intent with exactly one outcome.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient, monitoring

from include.emulators.http import start_secantusdb
from reaper.config import LedgerConfig, parse_settings
from reaper.ledger import Ledger
from reaper.sweep.deletes import SendTerms, SweepHalted, delete_batch
from reaper.sweep.targets import GceTarget
from tests.helpers.gce import add_instance
from tests.integration.test_races_gce import HOLDER, IDS, ZONE, plan_batches

ORPHANS = 48


class Commands(monitoring.CommandListener):
    """Every command the ledger's client sends, by name: the round trips the server sees."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.counts[event.command_name] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...

    def failed(self, event: monitoring.CommandFailedEvent) -> None: ...


def seeded(fleet) -> None:
    for i in range(ORPHANS):
        add_instance(fleet, "p", ZONE, f"orphan-{i}", heartbeat_age=6 * 3600, instance_id=1000 + i)
    for i in range(ORPHANS):  # as many live: the budget (more than half stale holds a project) lets all go
        add_instance(fleet, "p", ZONE, f"live-{i}", heartbeat_age=60, instance_id=9000 + i)


def setup(gce, port: int, listener: Commands | None = None):
    fleet, clients = gce
    seeded(fleet)
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/",
        serverSelectionTimeoutMS=1000,
        socketTimeoutMS=2000,
        event_listeners=[listener] if listener else [],
    )
    ledger = Ledger(client, LedgerConfig(database="reaper", timeout=timedelta(seconds=2)))
    ledger.ensure_indexes()
    cfg = parse_settings({"gce": {"delete_rate_per_project": 1000.0, "delete_concurrency": 8}}, "group commit")
    target = GceTarget(cfg)
    target.__dict__["clients"] = clients
    lease = ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=10))
    resources = [r for batch in plan_batches(clients, cfg, fleet, lambda: None, "none") for r in batch]
    assert len(resources) == ORPHANS
    return fleet, ledger, target, SendTerms(IDS, HOLDER, str(lease["token"]), None), resources


def test_eight_concurrent_deletes_share_round_trips_about_one_per_delete_not_four(gce, tmp_path) -> None:
    daemon = start_secantusdb(storage=tmp_path / "db")
    listener = Commands()
    try:
        assert daemon.port is not None  # start_secantusdb picks one
        fleet, ledger, target, fence, resources = setup(gce, daemon.port, listener)
        listener.counts.clear()
        assert delete_batch(ledger, target, fence, resources) == {"deleted": ORPHANS}
        # One at a time, each delete was four: its intent, its lease read, its sent mark and its outcome.
        per_delete = {name: n / ORPHANS for name, n in listener.counts.items()}
        writes, reads = listener.counts["update"], listener.counts["find"]
        # About 0.9 here (bench/sweep.py counts it at scale); the bound leaves room for a loaded machine.
        assert (writes + reads) / ORPHANS <= 1.5, per_delete
        outcomes = Counter(r["result"] for r in ledger.records.find({"action": "outcome"}))
        assert outcomes == {"deleted": ORPHANS}
        assert ledger.records.count_documents({"action": "delete_intent", "sent": True}) == ORPHANS
        assert sorted(fleet.deleted_ids) == sorted(r.id for r in resources)
    finally:
        daemon.stop()


def test_an_outage_mid_group_stops_every_send_and_no_send_went_without_its_intent(gce, tmp_path) -> None:
    daemon = start_secantusdb(storage=tmp_path / "db")
    try:
        assert daemon.port is not None  # start_secantusdb picks one
        fleet, ledger, target, fence, resources = setup(gce, daemon.port)
        sends = Counter[str]()

        def outage(_: tuple[str, ...]) -> None:
            sends["delete"] += 1
            if sends["delete"] == 10:  # the ledger goes away as the tenth delete is applied
                daemon.stop()

        fleet.on("after", "delete", outage, times=None)
        with pytest.raises(SweepHalted, match="ledger"):
            delete_batch(ledger, target, fence, resources)
        sent_first = list(fleet.deleted_ids)
        # At once: only the deletes already past their last check (at most one per thread) went after it.
        assert 10 <= len(sent_first) <= 10 + 8, len(sent_first)
        daemon = start_secantusdb(daemon.port, storage=tmp_path / "db")
        intents = {r["uid"] for r in ledger.records.find({"action": "delete_intent"})}
        assert set(sent_first) <= intents, "a delete was sent before its intent was durable"
        marked = {r["uid"] for r in ledger.records.find({"action": "delete_intent", "sent": True})}
        delete_batch(ledger, target, fence, resources)
        records = list(ledger.records.find({"action": "outcome"}))
        assert Counter(r["uid"] for r in records) == Counter({r.id: 1 for r in resources})  # one outcome each
        # A 404 is this execution's own delete where its call is on record; a call that went out as the ledger
        # went down, its sent mark lost, is told as already gone (as it was before group commits).
        lost = set(sent_first) - marked
        assert len(lost) <= 8
        assert {r["uid"]: r["result"] for r in records} == {
            r.id: "already_gone" if r.id in lost else "deleted" for r in resources
        }
        assert sorted(fleet.deleted_ids) == sorted(r.id for r in resources)  # each once, no live one
    finally:
        daemon.stop()
