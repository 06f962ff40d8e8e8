"""Credentials of the stores' Airflow connections(docs/design.md §6).

Clients are built from the connection's fields, never by putting a password into a URI string, and
no password ever reaches a log line or an exception message: not on success, not against a server
that refuses it or does not answer, not when the client cannot even be built. The password holds
every character a URI gives a meaning to, and each of its pieces is recognisable, so a test catches
a partial leak (an ``InvalidURI`` message echoes most of the password, not all of it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, urlsplit

import nats
import pytest
from pymongo import MongoClient

from include.emulators.http import Daemon, free_port, server_binary, start_secantusdb
from reaper.config import MongoRunStoreConfig, NatsLeaseConfig
from reaper.stores.mongo import MongoConnectionError, MongoRunStore, mongo_client
from reaper.stores.nats import NatsLeases, nats_options

PASSWORD = "pwA1/pwB2+pwC3@pwD4:pwE5%pwF6?pwG7 pwH8"
WRONG = "pwH8 pwG7?pwF6%pwE5:pwD4@pwC3+pwB2/pwA1"
PIECE = re.compile(r"pw[A-H][1-8]")  # any recognisable piece of either password


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: object) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert not PIECE.search(text), f"a piece of the password leaked: {text!r}"


def assert_logs_clean(caplog: pytest.LogCaptureFixture) -> None:
    assert_no_secret(*(record.getMessage() for record in caplog.records), caplog.text)


def assert_exception_clean(exc: BaseException) -> None:
    assert_no_secret(str(exc), repr(exc), "".join(traceback.format_exception(exc)))


# --- MongoDB ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured_mongo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """SecantusDB requiring SCRAM authentication; user ``reaper`` (PASSWORD) may read ``iterion``."""
    storage = tmp_path_factory.mktemp("secured-mongo")
    setup = start_secantusdb(storage=storage)
    port = setup.port
    assert port is not None
    with cast(
        "MongoClient[dict[str, Any]]", MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=3000)
    ) as client:
        client["iterion"].command("createUser", "reaper", pwd=PASSWORD, roles=[{"role": "read", "db": "iterion"}])
        client["iterion"]["runs"].insert_one({"_id": "r1", "status": "failed"})
    setup.stop()
    daemon = start_secantusdb(port, storage=storage, options=("--auth",))
    yield port
    daemon.stop()


@pytest.mark.parametrize("auth_source", [{"schema": "iterion"}, {"extra": json.dumps({"authSource": "iterion"})}])
def test_a_password_with_uri_characters_authenticates(monkeypatch, caplog, secured_mongo, auth_source) -> None:
    caplog.set_level(logging.DEBUG)
    _conn(
        monkeypatch,
        "mongo_auth",
        conn_type="mongo",
        host="127.0.0.1",
        port=secured_mongo,
        login="reaper",
        password=PASSWORD,
        **auth_source,
    )
    client = mongo_client("mongo_auth", 3.0)
    credentials = client.options.pool_options._credentials
    assert (credentials.username, credentials.password, credentials.source) == ("reaper", PASSWORD, "iterion")
    assert MongoRunStore(client, MongoRunStoreConfig()).read(["r1"]).known == {"r1": "failed"}
    assert_no_secret(repr(client))
    assert_logs_clean(caplog)


@pytest.mark.parametrize("where", ["wrong password", "unreachable"])
def test_a_refused_or_unreachable_login_is_unknown_and_leaks_nothing(monkeypatch, caplog, secured_mongo, where) -> None:
    caplog.set_level(logging.DEBUG)
    port = secured_mongo if where == "wrong password" else free_port()
    password = WRONG if where == "wrong password" else PASSWORD
    fields = {"conn_type": "mongo", "host": "127.0.0.1", "port": port, "login": "reaper", "password": password}
    _conn(monkeypatch, "mongo_auth", schema="iterion", **fields)
    answer = MongoRunStore(mongo_client("mongo_auth", 1.0), MongoRunStoreConfig()).read(["r1"])
    assert answer.failed == {"r1"}
    assert any("keys unknown" in r.getMessage() for r in caplog.records)
    assert_logs_clean(caplog)


CONSTRUCTION_FAILURES = {
    # pymongo's ``InvalidURI`` quotes most of an unescaped password back.
    "credentials in a host URI": lambda port: {"host": f"mongodb://reaper:{PASSWORD}@127.0.0.1:{port}/"},
    "an option pymongo rejects": lambda port: {"host": "127.0.0.1", "port": port, "extra": '{"authMechanism": "NOPE"}'},
    "an SRV name that does not resolve": lambda port: {"host": "reaper-test.invalid", "extra": '{"srv": true}'},
    "an SRV connection with a port": lambda port: {
        "host": "reaper-test.invalid",
        "port": port,
        "extra": '{"srv": true}',
    },
}


@pytest.mark.parametrize("case", CONSTRUCTION_FAILURES)
def test_a_client_that_cannot_be_built_names_the_connection_only(monkeypatch, caplog, case) -> None:
    caplog.set_level(logging.DEBUG)
    fields = CONSTRUCTION_FAILURES[case](free_port())
    _conn(monkeypatch, "mongo_bad", conn_type="mongo", login="reaper", password=PASSWORD, **fields)
    with pytest.raises(MongoConnectionError, match="mongo_bad") as raised:
        mongo_client("mongo_bad", 1.0)
    assert raised.value.__cause__ is None and raised.value.__context__ is None
    assert_exception_clean(raised.value)
    assert_logs_clean(caplog)


def test_the_extras_that_matter_are_honoured_and_timeouts_stay_bounded(monkeypatch) -> None:
    extra = {
        "replicaSet": "rs0",
        "ssl": "true",
        "allow_insecure": True,
        "authSource": "admin",
        "authMechanism": "SCRAM-SHA-256",
        "socketTimeoutMS": 0,  # "never": the connection cannot lift the reaper's bound
        "serverSelectionTimeoutMS": 600000,
    }
    fields = {"host": "127.0.0.1", "port": free_port(), "login": "reaper", "password": PASSWORD}
    _conn(monkeypatch, "mongo_x", conn_type="mongo", schema="iterion", extra=json.dumps(extra), **fields)
    client = mongo_client("mongo_x", 0.5)
    options = client.options
    assert options.replica_set_name == "rs0"
    assert options.pool_options._credentials.source == "admin"  # the extra beats the schema
    assert options.pool_options._credentials.mechanism == "SCRAM-SHA-256"
    assert options._options["tls"] is True and options._options["tlsallowinvalidcertificates"] is True
    assert options.server_selection_timeout == 0.5 and options.timeout == 0.5
    assert options.pool_options.socket_timeout == 0.5 and options.pool_options.connect_timeout == 0.5
    client.close()


# --- NATS ---------------------------------------------------------------------------------------------


@pytest.fixture
def secured_nats(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """nats-server with JetStream that requires ``--user reaper --pass PASSWORD`` or ``--auth PASSWORD``."""
    port = free_port()
    auth = (
        ["--auth", PASSWORD]
        if getattr(request, "param", "user") == "token"
        else ["--user", "reaper", "--pass", PASSWORD]
    )
    argv = [server_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js"), *auth]
    daemon = Daemon(argv, port, "nats-server with auth")
    yield daemon
    daemon.stop()


async def _put_leases(port: int, keys: list[str], **auth: str) -> None:
    client = await nats.connect(f"nats://127.0.0.1:{port}", **auth)
    kv = await client.jetstream().create_key_value(bucket="run_leases")
    for key in keys:
        await kv.put(key, b"runner-7")
    await client.close()


def test_nats_login_and_password_are_connect_arguments(monkeypatch, caplog, secured_nats) -> None:
    caplog.set_level(logging.DEBUG)
    asyncio.run(_put_leases(secured_nats.port, ["r1", "r2"], user="reaper", password=PASSWORD))
    _conn(
        monkeypatch,
        "nats_auth",
        conn_type="generic",
        host="127.0.0.1",
        port=secured_nats.port,
        login="reaper",
        password=PASSWORD,
    )
    options = nats_options("nats_auth")
    assert (options.user, options.password, options.token) == ("reaper", PASSWORD, None)
    assert options.servers == (f"nats://127.0.0.1:{secured_nats.port}",)
    assert_no_secret(repr(options), str(options))
    assert set(NatsLeases(options, NatsLeaseConfig(timeout=timedelta(seconds=2))).read().known) == {"r1", "r2"}
    assert_logs_clean(caplog)


@pytest.mark.parametrize("secured_nats", ["token"], indirect=True)
@pytest.mark.parametrize("fields", [{"extra": json.dumps({"token": PASSWORD})}, {"password": PASSWORD}])
def test_a_nats_token_is_a_connect_argument(monkeypatch, caplog, secured_nats, fields) -> None:
    """A token comes from the extra ``token``, or is a password given without a login."""
    caplog.set_level(logging.DEBUG)
    asyncio.run(_put_leases(secured_nats.port, ["r1"], token=PASSWORD))
    _conn(monkeypatch, "nats_token", conn_type="generic", host="127.0.0.1", port=secured_nats.port, **fields)
    options = nats_options("nats_token")
    assert (options.user, options.password, options.token) == (None, None, PASSWORD)
    assert set(NatsLeases(options, NatsLeaseConfig(timeout=timedelta(seconds=2))).read().known) == {"r1"}
    assert_logs_clean(caplog)


def test_nats_credentials_in_a_host_url_are_taken_out_of_it(monkeypatch, caplog, secured_nats) -> None:
    caplog.set_level(logging.DEBUG)
    asyncio.run(_put_leases(secured_nats.port, ["r1"], user="reaper", password=PASSWORD))
    host = f"nats://reaper:{quote(PASSWORD, safe='')}@127.0.0.1:{secured_nats.port}"
    _conn(monkeypatch, "nats_url", conn_type="generic", host=host)
    options = nats_options("nats_url")
    assert options.servers == (f"nats://127.0.0.1:{secured_nats.port}",)
    assert (options.user, options.password) == ("reaper", PASSWORD)
    assert set(NatsLeases(options, NatsLeaseConfig(timeout=timedelta(seconds=2))).read().known) == {"r1"}
    assert_logs_clean(caplog)


@pytest.mark.parametrize("where", ["wrong password", "unreachable"])
def test_a_refused_or_unreachable_nats_is_unknown_and_leaks_nothing(monkeypatch, caplog, secured_nats, where) -> None:
    caplog.set_level(logging.DEBUG)
    port = secured_nats.port if where == "wrong password" else free_port()
    password = WRONG if where == "wrong password" else PASSWORD
    _conn(monkeypatch, "nats_auth", conn_type="generic", host="127.0.0.1", port=port, login="reaper", password=password)
    assert NatsLeases(nats_options("nats_auth"), NatsLeaseConfig(timeout=timedelta(seconds=1))).read() is None
    assert any("every lease unknown" in r.getMessage() for r in caplog.records)
    assert_logs_clean(caplog)


# --- PostgreSQL -------------------------------------------------------------------------------------


@pytest.fixture
def postgres_login(postgres: str) -> Iterator[tuple[str, str, str, int]]:
    """A role of this test's own whose password is PASSWORD, and the test's database with a step_runs row."""
    import uuid

    import psycopg
    from psycopg import sql

    role = f"reaper_pw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
        admin.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
        admin.execute("INSERT INTO step_runs VALUES ('r1', 'build', 1, 'failed', NULL)")
        admin.execute(sql.SQL("GRANT SELECT ON step_runs TO {}").format(sql.Identifier(role)))
    dsn = urlsplit(postgres)
    yield role, dsn.path.lstrip("/"), dsn.hostname or "127.0.0.1", dsn.port or 5432
    with psycopg.connect(postgres, autocommit=True) as admin:
        admin.execute(sql.SQL("REVOKE ALL ON step_runs FROM {}").format(sql.Identifier(role)))  # owns nothing
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("where", ["reachable", "unreachable"])
def test_a_postgres_password_arrives_intact_and_leaks_nothing(monkeypatch, caplog, postgres_login, where) -> None:
    """The password is a connect argument: libpq gets it byte for byte (the server checks it where it
    asks for one) and it is in no log line when the server cannot be reached."""
    from reaper.config import PostgresStepStoreConfig
    from reaper.stores.postgres import PostgresStepStore, postgres_connect

    caplog.set_level(logging.DEBUG)
    role, database, host, port = postgres_login
    port = port if where == "reachable" else free_port()
    fields = {"host": host, "port": port, "login": role, "password": PASSWORD, "schema": database}
    _conn(monkeypatch, "pg_auth", conn_type="postgres", **fields)
    connect = postgres_connect("pg_auth", 2.0)
    answer = PostgresStepStore(connect, PostgresStepStoreConfig()).read([("r1", "build", "1")])
    if where == "reachable":
        with connect() as conn:
            assert (conn.info.user, conn.info.password) == (role, PASSWORD)
        assert answer.known == {"r1/build/1": ("failed", False)}
    else:
        assert answer.failed == {"r1/build/1"}
        assert any("step_runs unreadable" in r.getMessage() for r in caplog.records)
    assert_logs_clean(caplog)
