"""The stores' clients come from Airflow connections (env-var connections, as a deployment defines them)."""

from __future__ import annotations

import asyncio
import json

import pytest

from reaper.config import MongoRunStoreConfig, NatsLeaseConfig, PostgresStepStoreConfig
from reaper.stores.mongo import MongoRunStore, mongo_client
from reaper.stores.nats import NatsLeases, NatsOptions, nats_options
from reaper.stores.postgres import PostgresStepStore, postgres_connect
from tests.helpers.k8s import put_kv


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_mongo_client_from_connection(monkeypatch, mongo_server, mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_one({"_id": "r1", "status": "failed"})
    _conn(monkeypatch, "mongo_test", conn_type="mongo", host="127.0.0.1", port=mongo_server.port)
    store = MongoRunStore(mongo_client("mongo_test", 2.0), MongoRunStoreConfig(database=db))
    assert store.read(["r1"]).known == {"r1": "failed"}


def test_mongo_client_timeouts_are_bounded(monkeypatch) -> None:
    _conn(monkeypatch, "mongo_test", conn_type="mongo", host="127.0.0.1", port=1)
    client = mongo_client("mongo_test", 0.5)
    assert client.options.server_selection_timeout == 0.5
    assert MongoRunStore(client, MongoRunStoreConfig()).read(["r1"]).failed == {"r1"}


def test_nats_options_from_connection(monkeypatch, nats_server) -> None:
    _conn(monkeypatch, "nats_test", conn_type="generic", host="127.0.0.1", port=nats_server.port)
    options = nats_options("nats_test")
    url = f"nats://127.0.0.1:{nats_server.port}"
    assert options == NatsOptions((url,))
    asyncio.run(put_kv(url, "run_leases", ["r1", "r2"]))
    assert set(NatsLeases(options, NatsLeaseConfig()).read().known) == {"r1"}


def test_postgres_connect_from_connection(monkeypatch, postgres) -> None:
    import time

    import psycopg

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        conn.execute("INSERT INTO step_runs VALUES ('r1','build',1,'failed',NULL)")
    database = postgres.rsplit("/", 1)[1]
    _conn(
        monkeypatch,
        "pg_test",
        conn_type="postgres",
        host="127.0.0.1",
        port=5432,
        login="postgres",
        password="postgres",
        schema=database,
    )
    store = PostgresStepStore(postgres_connect("pg_test", 1.0), PostgresStepStoreConfig())
    assert store.read([("r1", "build", "1")]).known == {"r1/build/1": ("failed", False)}
    with psycopg.connect(postgres) as migration:  # holds the table: the read times out, it does not wait
        migration.execute("LOCK TABLE step_runs IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        assert store.read([("r1", "build", "1")]).failed == {"r1/build/1"}
        assert time.monotonic() - started < 5
