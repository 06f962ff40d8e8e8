"""Fixtures that start emulators and real servers for the integration tests."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from pymongo import monitoring

from include.emulators.gce import Emulator, Fleet
from include.emulators.http import Daemon, free_port, server_binary, start_secantusdb
from include.emulators.shapes import gcloud_instance
from reaper.gce.clients import ComputeClients, compute_clients
from reaper.retry import Backoff

NOW = time.time()
HB = "runner_manager_heartbeat"


@pytest.fixture
def gce() -> Iterator[tuple[Fleet, ComputeClients]]:
    """A running GCE emulator and real ``compute_v1`` clients pointed at it."""
    with Emulator() as emulator:
        yield emulator.fleet, compute_clients(api_endpoint=emulator.endpoint)


def fast_backoff(retries: int = 4) -> Backoff:
    return Backoff(retries, base=0.01, cap=0.05)


def add_instance(
    fleet: Fleet,
    project: str,
    zone: str,
    name: str,
    heartbeat_age: float | None = 60,
    status: str = "RUNNING",
    instance_id: int | None = None,
    labels: dict[str, str] | None = None,
    created_age: float = 86400,
) -> dict[str, object]:
    all_labels = {"ci_ephemeral": "true", **(labels or {})}
    if heartbeat_age is not None:
        all_labels[HB] = str(int(NOW - heartbeat_age))
    inst = gcloud_instance(
        project, zone, name, instance_id or abs(hash((project, name))) % 10**18, status, all_labels, NOW - created_age
    )
    fleet.add(inst)
    return inst


# --- Kubernetes emulator -----------------------------------------------------------------------


@pytest.fixture
def kube():
    """A running Kubernetes API emulator and a real ``kubernetes`` ApiClient from its kubeconfig."""
    from kubernetes import config as kconfig

    from include.emulators.k8s import K8sEmulator

    with K8sEmulator() as emulator:
        yield emulator.cluster, kconfig.new_client_from_config_dict(emulator.kubeconfig()), emulator


# --- real servers -------------------------------------------------------------------------------


class FindCounter(monitoring.CommandListener):
    """Counts the round trips a MongoDB read costs: every ``find`` and ``getMore`` sent."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("find", "getMore", "aggregate"):
            self.commands.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture(scope="session")
def mongo_server() -> Iterator[Daemon]:
    """SecantusDB (a MongoDB wire-protocol server) on a free port, in memory."""
    daemon = start_secantusdb()
    yield daemon
    daemon.stop()


@pytest.fixture
def mongo(mongo_server: Daemon):
    """A pymongo client and a database of this test's own, dropped afterwards."""
    import uuid

    from pymongo import MongoClient

    client = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/", serverSelectionTimeoutMS=3000)
    name = f"reaper_test_{uuid.uuid4().hex[:12]}"
    yield client, name
    client.drop_database(name)
    client.close()


@pytest.fixture
def nats_server(tmp_path) -> Iterator[Daemon]:  # type: ignore[no-untyped-def]
    """A NATS server with JetStream of this test's own (so a test can stop it)."""
    port = free_port()
    daemon = Daemon(
        [server_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")],
        port,
        "nats-server",
    )
    yield daemon
    daemon.stop()


@pytest.fixture
def pushgateway() -> Iterator[Daemon]:
    """A Pushgateway of this test's own, in memory: Debian's build would otherwise load and persist
    every test's metrics in /var/lib/prometheus/pushgateway.data (its default ``--persistence.file``)."""
    binary = server_binary("prometheus-pushgateway")
    port = free_port()
    daemon = Daemon([binary, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="], port, "pushgateway")
    yield daemon
    daemon.stop()


POSTGRES_DSN = os.environ.get("REAPER_TEST_POSTGRES", "postgresql://postgres:postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def postgres() -> Iterator[str]:
    """The DSN of a database of this test's own on the local PostgreSQL, dropped afterwards."""
    import uuid

    import psycopg

    name = f"reaper_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield POSTGRES_DSN.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
