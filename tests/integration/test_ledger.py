"""The ledger and the delete step under retries: fenced, acknowledged, idempotent, intent before delete."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from include.emulators.http import free_port
from reaper.config import LedgerConfig
from reaper.ledger import FENCE, Ledger
from reaper.sweep.factory import delete_batch
from tests.builders import inst
from tests.integration.conftest import Daemon, mongo_binary

IDS = {"dag_id": "reaper_gce_enforcement", "run_id": "manual__1"}


class FakeTarget:
    """Deletes by name and remembers every delete it was asked for (the adapters are tested elsewhere)."""

    name = "gce"

    def __init__(self, existing: set[str], crash_after: int | None = None) -> None:
        self.existing, self.calls, self.crash_after = existing, [], crash_after

    def delete(self, resources):  # type: ignore[no-untyped-def]
        out = []
        for r in resources:
            self.calls.append(r.name)
            result = "deleted" if r.name in self.existing else "already_gone"
            self.existing.discard(r.name)
            if self.crash_after is not None and len(self.calls) >= self.crash_after:
                raise RuntimeError("worker killed")  # after the delete, before any outcome is written
            out.append({"scope": r.scope, "uid": r.id, "name": r.name, "result": result, "detail": ""})
        return out


@pytest.fixture
def ledger(mongo) -> Ledger:
    client, db = mongo
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    return led


def test_fenced_writes_upsert_instead_of_duplicating(ledger, mongo) -> None:
    record = {**IDS, "target": "gce", "scope": "p1", "uid": "1", "action": "delete", "reason": "terminated"}
    assert ledger.write([record]) == 1
    ledger.write([{**record, "reason": "terminated (retried)"}])
    docs = list(ledger.records.find({}))
    assert len(docs) == 1 and docs[0]["reason"] == "terminated (retried)"
    assert ledger.records.write_concern.document == {"w": "majority", "j": True, "wtimeout": 10000}
    unique = ledger.records.index_information()["fence"]
    assert unique["unique"] and [k for k, _ in unique["key"]] == list(FENCE)
    assert ledger.records.index_information()["retention"]["expireAfterSeconds"] == 400 * 86400


def test_retry_after_a_crash_between_intent_and_delete(ledger) -> None:
    resources = [inst(name=f"vm-{i}") for i in range(3)]
    # The first try wrote its intents, then died before sending any delete.
    ledger.write(
        [{**IDS, "target": "gce", "scope": r.scope, "uid": r.id, "action": "delete_intent"} for r in resources]
    )
    target = FakeTarget({r.name for r in resources})
    assert delete_batch(ledger, target, IDS, resources) == {"deleted": 3}
    assert sorted(target.calls) == ["vm-0", "vm-1", "vm-2"]
    assert ledger.records.count_documents({"action": "delete_intent"}) == 3  # rewritten, not duplicated
    assert ledger.records.count_documents({"action": "outcome", "result": "deleted"}) == 3


def test_retry_after_a_crash_between_delete_and_outcome(ledger) -> None:
    resources = [inst(name=f"vm-{i}") for i in range(3)]
    target = FakeTarget({r.name for r in resources}, crash_after=2)
    with pytest.raises(RuntimeError):
        delete_batch(ledger, target, IDS, resources)
    assert ledger.records.count_documents({"action": "outcome"}) == 0
    target.crash_after = None
    assert delete_batch(ledger, target, IDS, resources) == {"already_gone": 2, "deleted": 1}
    # A third try (e.g. the task retried again) sends nothing: every outcome is recorded.
    assert delete_batch(ledger, target, IDS, resources) == {}
    assert target.calls.count("vm-0") == 2 and target.calls.count("vm-2") == 1
    assert ledger.records.count_documents({"action": "outcome"}) == 3


def test_no_delete_without_a_durable_intent() -> None:
    port = free_port()
    daemon = Daemon(
        [mongo_binary(), "--host", "127.0.0.1", "--port", str(port), "--storage-path", ":memory:"], port, "SecantusDB"
    )
    client = MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, socketTimeoutMS=1000)
    ledger = Ledger(client, LedgerConfig(database="reaper", timeout="1s"))
    ledger.ensure_indexes()
    target = FakeTarget({"vm-0"})
    daemon.stop()  # the ledger can no longer acknowledge the intent
    with pytest.raises(PyMongoError):
        delete_batch(ledger, target, IDS, [inst(name="vm-0")])
    assert target.calls == []


def test_sweep_lease(ledger) -> None:
    assert ledger.acquire("gce", "a", timedelta(minutes=5)) == ""
    assert ledger.acquire("gce", "b", timedelta(minutes=5)) is None
    assert ledger.acquire("gce", "a", timedelta(minutes=5)) == "a"  # re-entrant for the holder (task retries)
    ledger.locks.update_one({"_id": "gce"}, {"$set": {"expires_at": time.time() - 1}})
    assert ledger.acquire("gce", "b", timedelta(minutes=5)) == "a"  # an expired lease is taken over
    ledger.release("gce", "a")  # not the holder: no effect
    assert ledger.acquire("gce", "a", timedelta(minutes=5)) is None
    ledger.release("gce", "b")
    assert ledger.acquire("gce", "a", timedelta(minutes=5)) == ""
