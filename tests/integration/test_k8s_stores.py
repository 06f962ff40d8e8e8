"""Evidence stores against real servers: SecantusDB (MongoDB wire protocol), NATS JetStream, PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import requests
from pymongo import MongoClient

from include.emulators.http import Daemon, free_port, server_binary, start_secantusdb
from reaper.config import (
    MongoLeaseConfig,
    MongoRunStoreConfig,
    NatsLeaseConfig,
    PostgresStepStoreConfig,
    parse_settings,
)
from reaper.model import Keyed, LeaseState, StoreState
from reaper.policy.k8s import lease_state, run_state, step_state
from reaper.stores.mongo import MongoLeases, MongoRunStore
from reaper.stores.nats import NatsLeases
from reaper.stores.postgres import PostgresStepStore
from tests.helpers import FindCounter
from tests.helpers.k8s import put_kv

TERMINAL = ["succeeded", "failed", "cancelled"]


# --- MongoDB run store -----------------------------------------------------------------------


def test_run_store_states_and_round_trips(mongo_server, mongo) -> None:
    client, db = mongo
    runs = client[db]["runs"]
    runs.insert_many([{"_id": f"run-{i:05d}", "status": TERMINAL[i % 3] if i % 2 else "running"} for i in range(5000)])
    counter = FindCounter()
    counted: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{mongo_server.port}/", event_listeners=[counter]
    )
    store = MongoRunStore(counted, MongoRunStoreConfig(database=db))
    keys = [f"run-{i:05d}" for i in range(0, 4998)] + ["run-gone-1", "run-gone-2"]  # 5,000 runs
    answer = store.read(keys)
    assert counter.commands == ["find"] + ["find"] * 5  # the store's proof, then one per batch of 1,000
    assert run_state("run-00001", answer, TERMINAL) == (StoreState.TERMINAL, "failed")
    assert run_state("run-00000", answer, TERMINAL) == (StoreState.ACTIVE, "running")
    assert run_state("run-gone-1", answer, TERMINAL) == (StoreState.NOT_FOUND, None)
    assert len(answer.known) == 4998 and not answer.failed


def test_run_store_custom_fields(mongo) -> None:
    client, db = mongo
    client[db]["jobs"].insert_one({"_id": 1, "run_key": "r1", "state": "Succeeded"})
    config = MongoRunStoreConfig(database=db, collection="jobs", key_field="run_key", status_field="state")
    answer = MongoRunStore(client, config).read(["r1", "r2"])
    assert run_state("r1", answer, TERMINAL)[0] is StoreState.TERMINAL
    assert run_state("r2", answer, TERMINAL)[0] is StoreState.NOT_FOUND


def test_undecodable_document_makes_its_key_unknown(mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_many([{"_id": "bad", "status": 7}, {"_id": "good", "status": "failed"}])
    config = MongoRunStoreConfig(database=db)  # one batch: the bad record spoils only its own key
    answer = MongoRunStore(client, config).read(["bad", "good", "missing"])
    assert run_state("bad", answer, TERMINAL)[0] is StoreState.UNKNOWN
    assert run_state("good", answer, TERMINAL)[0] is StoreState.TERMINAL
    assert run_state("missing", answer, TERMINAL)[0] is StoreState.NOT_FOUND


def test_mongo_down_makes_every_key_unknown(tmp_path) -> None:
    daemon = start_secantusdb()
    port = daemon.port
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, socketTimeoutMS=1000
    )
    client["iterion"]["runs"].insert_one({"_id": "r1", "status": "failed"})
    daemon.stop()
    store = MongoRunStore(client, MongoRunStoreConfig())
    answer = store.read(["r1", "r2"])  # down before the store could prove itself
    assert run_state("r1", answer, TERMINAL)[0] is run_state("r2", answer, TERMINAL)[0] is StoreState.UNKNOWN
    assert "iterion.runs did not answer (ServerSelectionTimeoutError" in answer.problem
    store.__dict__["problem"] = ""  # proven before it went down: its batch fails
    answer = store.read(["r1", "r2"])
    assert answer.failed == {"r1", "r2"}
    assert run_state("r1", answer, TERMINAL)[0] is StoreState.UNKNOWN


def test_mongo_leases(mongo) -> None:
    client, db = mongo
    now = datetime.now(UTC)
    client[db]["run_leases"].insert_many(
        [
            {"_id": "live", "expires_at": now + timedelta(seconds=60)},
            {"_id": "expired", "expires_at": now - timedelta(minutes=5)},
            {"_id": "unix", "expires_at": time.time() + 60},
            {"_id": "odd", "expires_at": "tomorrow"},
        ]
    )
    answer = MongoLeases(client, MongoLeaseConfig(database=db, batch_size=1)).read(
        ["live", "expired", "unix", "odd", "none"]
    )
    t = time.time()
    assert lease_state("live", answer, t, 30) is LeaseState.HELD
    assert lease_state("unix", answer, t, 30) is LeaseState.HELD
    assert lease_state("expired", answer, t, 30) is LeaseState.ABSENT
    assert lease_state("none", answer, t, 30) is LeaseState.ABSENT
    assert lease_state("odd", answer, t, 30) is LeaseState.UNKNOWN


# --- NATS KV leases ----------------------------------------------------------------------------


def test_nats_leases_one_listing_for_all_runs(tmp_path) -> None:
    port, monitor = free_port(), free_port()
    argv = [server_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)]
    daemon = Daemon([*argv, "-js", "-sd", str(tmp_path / "js")], port, "nats-server")
    try:
        url = f"nats://127.0.0.1:{port}"
        asyncio.run(put_kv(url, "small", ["lease.r1", "lease.r2", "other", "lease.r3"]))
        asyncio.run(put_kv(url, "large", [f"lease.run-{i}" for i in range(5001)]))
        cfg = NatsLeaseConfig(key_template="lease.{run}")

        def messages_for(bucket: str) -> tuple[Keyed[float | None] | None, int]:
            before = requests.get(f"http://127.0.0.1:{monitor}/varz", timeout=5).json()["in_msgs"]
            answer = NatsLeases(url, cfg.model_copy(update={"bucket": bucket})).read()
            return answer, requests.get(f"http://127.0.0.1:{monitor}/varz", timeout=5).json()["in_msgs"] - before

        small, small_msgs = messages_for("small")
        assert set(small.known) == {"r1", "r2"}  # r3 released; "other" is not a lease key
        assert lease_state("r1", small, time.time(), 30) is LeaseState.HELD
        assert lease_state("r3", small, time.time(), 30) is LeaseState.ABSENT
        large, large_msgs = messages_for("large")
        assert len(large.known) == 5000
        assert large_msgs == small_msgs, "requests grew with the number of runs"
    finally:
        daemon.stop()


def test_nats_down_or_missing_bucket_means_every_lease_unknown(nats_server) -> None:
    url = f"nats://127.0.0.1:{nats_server.port}"
    assert NatsLeases(url, NatsLeaseConfig(bucket="nope", timeout=timedelta(seconds=2))).read() is None
    asyncio.run(put_kv(url, "run_leases", ["r1", "r2"]))
    assert NatsLeases(url, NatsLeaseConfig(timeout=timedelta(seconds=2))).read() is not None
    nats_server.stop()
    assert NatsLeases(url, NatsLeaseConfig(timeout=timedelta(seconds=1))).read() is None


# --- Postgres step runs ------------------------------------------------------------------------


def test_step_store_states(postgres) -> None:
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        conn.execute(
            "INSERT INTO step_runs VALUES ('r1','build',1,'succeeded','{\"a\":1}'), ('r1','test',2,'succeeded',NULL),"
            " ('r2','build',1,'failed',NULL), ('r3','build',1,'running',NULL)"
        )
    store = PostgresStepStore(lambda: psycopg.connect(postgres), PostgresStepStoreConfig(batch_size=2))
    wanted = [("r1", "build", "1"), ("r1", "test", "2"), ("r2", "build", "1"), ("r3", "build", "1"), ("r4", "x", "1")]
    answer = store.read(wanted)
    config = parse_settings({}, "test")
    states = {f"{r}/{s}/{a}": step_state(f"{r}/{s}/{a}", answer, config) for r, s, a in wanted}
    assert states == {
        "r1/build/1": StoreState.TERMINAL,
        "r1/test/2": StoreState.ACTIVE,  # succeeded but its results are not durable yet
        "r2/build/1": StoreState.TERMINAL,  # failed: no results to wait for
        "r3/build/1": StoreState.ACTIVE,
        "r4/x/1": StoreState.NOT_FOUND,
    }


def test_step_store_errors_mean_unknown(postgres) -> None:
    store = PostgresStepStore(lambda: psycopg.connect(postgres), PostgresStepStoreConfig())
    answer = store.read([("r1", "build", "1")])  # no such table
    assert answer.failed == {"r1/build/1"}
    dead = PostgresStepStore(
        lambda: psycopg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout=1),
        PostgresStepStoreConfig(),
    )
    assert dead.read([("r1", "build", "1")]).failed == {"r1/build/1"}
