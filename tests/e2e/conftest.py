"""End-to-end fixtures: Airflow's metadata DB, and a sweeper running the reaper's DAGs against the test servers
(the emulators and servers themselves are the fixtures of ``tests/conftest.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """``dag.test()`` needs a migrated metadata DB (a private SQLite one, in the test AIRFLOW_HOME)."""
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)


class Sweeper:
    """Writes a config, points the connections at the test servers, and runs a reaper DAG with dag.test()."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mongo_port: int) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch
        monkeypatch.setenv(
            "AIRFLOW_CONN_MONGO_DEFAULT", json.dumps({"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_port})
        )

    def connect_gce(self, endpoint: str) -> None:
        extra = {"api_endpoint": endpoint, "anonymous": True}
        self.monkeypatch.setenv(
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
        )

    def connect_k8s(self, kubeconfig: dict[str, object], nats_port: int, postgres_dsn: str | None = None) -> None:
        """Cluster ``kube_e2e`` is the emulator; leases in NATS; step results in ``postgres_dsn`` when given."""
        self.monkeypatch.setenv(
            "AIRFLOW_CONN_KUBE_E2E",
            json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig)}}),
        )
        self.monkeypatch.setenv(
            "AIRFLOW_CONN_NATS_DEFAULT", json.dumps({"conn_type": "generic", "host": "127.0.0.1", "port": nats_port})
        )
        if postgres_dsn:
            self.monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", postgres_dsn)

    def configure(self, config: dict[str, object]) -> None:
        """``config`` over a base whose active phase is enforcement for both targets: a test's sweep of any
        phase is then no what-if of a later phase (docs/design.md §8), unless its ``rollout`` says so."""
        base = {
            "airflow": {"sweep_store": f"file://{self.tmp_path}/sweeps", "retries": 0},
            "rollout": {"gce": "enforcement", "k8s": "enforcement"},
        }
        merged = {**base, **config, "airflow": {**base["airflow"], **config.get("airflow", {})}}  # type: ignore[dict-item]  # JSON data typed object: its shape is this code's own
        path = self.tmp_path / "reaper.yaml"
        path.write_text(json.dumps(merged))  # JSON is YAML
        self.monkeypatch.setenv("REAPER_CONFIG", str(path))

    def run(self, dag_id: str, logical_date=None, **conf: object):
        """One run of ``dag_id``; the same ``logical_date`` again re-runs that run, cleared (its next execution)."""
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(ROOT / "dags"))
        assert bag.import_errors == {}
        if logical_date is None:
            return bag.dags[dag_id].test(run_conf=conf or None)
        return bag.dags[dag_id].test(run_conf=conf or None, logical_date=logical_date, run_after=logical_date)


@pytest.fixture
def sweeper(airflow_db, mongo_server, tmp_path, monkeypatch) -> Iterator[Sweeper]:
    yield Sweeper(tmp_path, monkeypatch, mongo_server.port)
