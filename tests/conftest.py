"""Test-wide setup: Airflow gets a private home so tests never touch a user's installation; and the
fixtures the integration and end-to-end tests share: the emulators and real servers of their own.

Helpers (plain functions and classes) are in ``tests.helpers``; a fixture's heavy imports happen
when it is used, so the unit tests import none of them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from include.emulators.http import Daemon, free_port, server_binary, start_secantusdb
from tests.helpers import POSTGRES_DSN, ROOT

if TYPE_CHECKING:
    from include.emulators.gce import Fleet
    from reaper.gce.clients import ComputeClients

# One home per process: pytest-xdist's workers (``make test`` runs two) inherit the controller's environment,
# and two workers sharing one SQLite metadata DB would lock each other out.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if "AIRFLOW_HOME" not in os.environ or os.environ.get("REAPER_TEST_AIRFLOW_HOME_OF", _WORKER) != _WORKER:
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix=f"reaper-airflow-home-{_WORKER}")
    os.environ["REAPER_TEST_AIRFLOW_HOME_OF"] = _WORKER
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)  # its DB and logs
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
# The emulated Compute API's rate quotas refill every second, not every minute (its faster clock): a 429 or a
# used-up quota a test injects is waited for a second, not a minute. Tests of the API's own minute unset it.
os.environ.setdefault("REAPER_EMULATOR_QUOTA_WINDOW", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heaviest modules first, by their ``slow`` marker's seconds: ``make test``'s workers each take whole
    modules, so a long one started last would run alone at the end of the suite."""
    weight: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("slow")
        module = item.nodeid.split("::")[0]
        weight[module] = max(weight.get(module, 0.0), float(mark.args[0]) if mark and mark.args else 0.0)
    items.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])


# --- emulators ----------------------------------------------------------------------------------


@pytest.fixture
def gce() -> Iterator[tuple[Fleet, ComputeClients]]:
    """A running GCE emulator and real ``compute_v1`` clients pointed at it."""
    from include.emulators.gce import Emulator
    from reaper.gce.clients import compute_clients

    with Emulator() as emulator:
        yield emulator.fleet, compute_clients(api_endpoint=emulator.endpoint)


@pytest.fixture
def kube():
    """A running Kubernetes API emulator and a real ``kubernetes`` ApiClient from its kubeconfig."""
    from kubernetes import config as kconfig

    from include.emulators.k8s import K8sEmulator
    from reaper.k8s.client import single_tries

    with K8sEmulator() as emulator:
        yield emulator.cluster, single_tries(kconfig.new_client_from_config_dict(emulator.kubeconfig())), emulator


# --- real servers -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mongo_server() -> Iterator[Daemon]:
    """SecantusDB (a MongoDB wire-protocol server) on a free port, in memory."""
    daemon = start_secantusdb()
    yield daemon
    daemon.stop()


@pytest.fixture
def mongo(mongo_server: Daemon):
    """A pymongo client and a database of this test's own, dropped afterwards."""
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{mongo_server.port}/", serverSelectionTimeoutMS=3000
    )
    name = f"reaper_test_{uuid.uuid4().hex[:12]}"
    yield client, name
    client.drop_database(name)
    client.close()


@pytest.fixture
def nats_server(tmp_path) -> Iterator[Daemon]:
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


@pytest.fixture
def postgres() -> Iterator[str]:
    """The DSN of a database of this test's own on the local PostgreSQL, dropped afterwards."""
    import psycopg

    name = f"reaper_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield POSTGRES_DSN.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
