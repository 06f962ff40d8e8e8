"""``python -m include.emulators.runs``: what it writes is what the reaper's own stores read back, for the
K8s emulator's ``--generate``d runs (the deployment guide's evidence)."""

from __future__ import annotations

import asyncio

from include.emulators.runs import generated_runs, put_nats_leases, write_mongo_leases, write_runs
from reaper.config import MongoLeaseConfig, MongoRunStoreConfig, NatsLeaseConfig
from reaper.stores.mongo import MongoLeases, MongoRunStore
from reaper.stores.nats import NatsLeases


def test_runs_cycle_through_live_finished_vanished_crashed() -> None:
    runs = generated_runs(6)
    assert runs.status == {
        "run-000000": "running",
        "run-000001": "running",
        "run-000002": "succeeded",
        "run-000003": None,
        "run-000004": "running",
        "run-000005": "running",
    }
    assert runs.leased == ["run-000000", "run-000001", "run-000005"]


def test_mongo_run_records_and_leases_read_back(mongo) -> None:
    client, database = mongo
    runs = generated_runs(10)
    for _ in range(2):  # a second seeding replaces the first
        write_runs(client, runs, database)
        write_mongo_leases(client, runs, database)
    records = MongoRunStore(client, MongoRunStoreConfig(database=database)).read(list(runs.status))
    assert records.known == {run: status for run, status in runs.status.items() if status}
    assert not records.failed
    leases = MongoLeases(client, MongoLeaseConfig(database=database)).read(list(runs.status))
    assert leases.known == dict.fromkeys(runs.leased)  # held, no expiry


def test_nats_leases_read_back_and_an_existing_bucket_is_kept(nats_server) -> None:
    url = f"nats://127.0.0.1:{nats_server.port}"
    asyncio.run(put_nats_leases(url, generated_runs(5)))  # creates run_leases
    asyncio.run(put_nats_leases(url, generated_runs(10)))  # finds it
    leases = NatsLeases(url, NatsLeaseConfig()).read()
    assert leases is not None and leases.known == dict.fromkeys(generated_runs(10).leased)
