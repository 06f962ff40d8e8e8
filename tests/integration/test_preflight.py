"""``reaper check``: the preflight against live systems, one line per check naming the config key.

Every system a deployment needs, of this test's own: the GCE and Kubernetes emulators, SecantusDB
(the ledger, the run store), NATS JetStream (the leases), PostgreSQL (step runs), a Prometheus
stand-in (writer health) and a Pushgateway. A config that points at all of them passes; one with a
typo in each of the places that validate but answer nothing fails, each failure naming its key.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pymongo import MongoClient

from reaper.cli import main
from tests.helpers.gce import add_instance
from tests.helpers.k8s import put_leases, seed_run
from tests.integration.fake_prometheus import FakePrometheus, series, vector

NUMBER = "123456789012"


@pytest.fixture
def world(gce, kube, mongo_server, nats_server, postgres, pushgateway, monkeypatch, tmp_path):
    """Everything up, with the Airflow connections the config names pointing at it; the good config's path."""
    fleet, clients = gce
    fleet.numbers["ci-a"] = NUMBER
    add_instance(fleet, "ci-a", "us-east1-b", "vm")
    _, _, emulator = kube
    prom = FakePrometheus()
    now = time.time()
    prom.answer(vector(series("mgr-a", "ci-a", str(now - 60), now)), vector(series("mgr-a", "ci-a", "0", now)))
    mongo: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/")
    runs_db = f"iterion_{tmp_path.name[-12:].replace('-', '_')}"  # this test's own run store
    mongo[runs_db]["runs"].insert_one({"_id": "run-1", "status": "succeeded"})
    asyncio.run(put_leases(f"nats://127.0.0.1:{nats_server.port}", ["run-2"]))
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE step_runs (run_id text, step text, attempt int, status text, results jsonb)")
    connections = {
        "MONGO_DEFAULT": {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port},
        "GOOGLE_CLOUD_DEFAULT": {
            "conn_type": "google_cloud_platform",
            "extra": {"api_endpoint": clients.host, "anonymous": True},
        },
        "KUBE_PRE": {"conn_type": "kubernetes", "extra": {"kube_config": json.dumps(emulator.kubeconfig())}},
        "NATS_DEFAULT": {"conn_type": "generic", "host": "127.0.0.1", "port": nats_server.port},
    }
    for name, connection in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{name}", json.dumps(connection))
    monkeypatch.setenv("AIRFLOW_CONN_POSTGRES_DEFAULT", postgres)
    config = {
        "gce": {"projects": [NUMBER], "writer_health": {"prometheus_url": prom.url}},
        "k8s": {"clusters": ["kube_pre"], "step_store": "postgres", "mongo_run_store": {"database": runs_db}},
        "metrics": {"pushgateway_url": pushgateway.url},
    }
    yield config, tmp_path
    prom.close()
    mongo.drop_database(runs_db)
    mongo.close()


def check(config: dict[str, object], folder: Path) -> tuple[int, list[str]]:
    path = folder / "reaper.yaml"
    path.write_text(json.dumps(config))
    out = io.StringIO()
    code = main(["check", "--config", str(path)], out)
    return code, out.getvalue().splitlines()


def test_a_config_that_points_at_everything_passes(world) -> None:
    config, folder = world
    code, lines = check(config, folder)
    assert code == 0, "\n".join(lines)
    assert not [line for line in lines if line.startswith("FAIL")]
    assert f"ok   gce.projects: {NUMBER} is ci-a (projects.get)" in lines  # resolved to its id
    assert any(line.startswith("ok   gce.writer_health: ci-a: 1 writer(s) report") for line in lines)
    for key in ("ledger.conn_id", "gce.conn_id", "k8s.clusters", "k8s.nats_leases.bucket", "k8s.mongo_run_store"):
        assert any(line.startswith(f"ok   {key}:") for line in lines), key
    assert lines[-1].endswith(" ok, 0 failed")


def test_each_place_that_validates_but_points_at_nothing_is_one_failed_line_naming_its_key(world) -> None:
    config, folder = world
    broken = {
        "gce": {
            "projects": [NUMBER, "999999999999"],  # the second no project's number
            "writer_health": {**config["gce"]["writer_health"], "last_pass_metric": "runner_heartbeat_last_pass"},
            "heartbeat_label": "runner_manager_heartbeats",  # the managers write runner_manager_heartbeat
            "protected_projects": ["ci-aa"],  # meant ci-a
        },
        "k8s": {
            **config["k8s"],
            "mongo_run_store": {"database": "iterion_typo"},  # the runs are in another database
            "nats_leases": {"bucket": "run_lease"},
            "mongo_leases": {"collection": "leases"},  # not read: the lease source is NATS
            "postgres_step_store": {"results_column": "result"},
        },
        "metrics": config["metrics"],
    }
    code, lines = check(broken, folder)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1
    expected = {
        "gce.projects": "999999999999: not resolved to a project id",
        "gce.writer_health.last_pass_metric": "no series of runner_heartbeat_last_pass",
        "k8s.mongo_run_store": "database 'iterion_typo' has no collection 'runs'",  # said once, not twice
        "k8s.nats_leases.bucket": "no JetStream KV bucket run_lease",
        "k8s.postgres_step_store.table": "column result is missing",
        "gce.heartbeat_label": "1 in-scope instances first listed in ci-a carries runner_manager_heartbeats",
        "gce.protected_projects": "ci-aa names no swept project",
    }
    for key, says in expected.items():
        assert any(line.startswith(f"FAIL {key}: ") and says in line for line in failed), (key, failed)
        assert all(line.count(f"{key}:") == 1 for line in failed if line.startswith(f"FAIL {key}: "))
    assert len(failed) == len(expected), failed
    assert lines[-1].endswith(f" ok, {len(expected)} failed")


def test_a_selector_that_matches_none_of_the_managers_instances_fails_and_an_idle_project_does_not(world, gce) -> None:
    # Review finding (helper-50): a selector that validates but matches nothing listed an empty fleet, and the
    # checks after it (the heartbeat label) saw nothing to check. Such a sweep reaps nothing and says nothing.
    config, folder = world
    config["gce"]["selector"] = {"ci_ephemeral": "yes"}  # the managers stamp ci_ephemeral=true
    code, lines = check(config, folder)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1 and len(failed) == 1, failed
    assert failed[0].startswith("FAIL gce.selector: no instance first listed in ci-a matches ci_ephemeral=yes")
    assert "but 1 carry runner_manager_heartbeat (their other labels: ci_ephemeral=true)" in failed[0]
    fleet, _ = gce
    # Review finding (helper-51): an idle pool beside a busy one whose managers stamp the same heartbeat label is
    # no wrong selector; instances that carry some of the selector's labels say nothing against it.
    fleet.projects["ci-a"]["us-east1-b"].clear()
    add_instance(fleet, "ci-a", "us-east1-b", "vm-b", labels={"pool": "b"})
    config["gce"]["selector"] = {"ci_ephemeral": "true", "pool": "a"}
    assert check(config, folder)[0] == 0, [line for line in check(config, folder)[1] if line.startswith("FAIL")]
    fleet.projects["ci-a"]["us-east1-b"].clear()  # an idle project: nothing to match, nothing wrong
    code, lines = check(config, folder)
    assert code == 0, [line for line in lines if line.startswith("FAIL")]


def test_a_kubernetes_selector_that_matches_none_of_the_runs_pods_fails_and_an_idle_cluster_does_not(
    world, kube
) -> None:
    config, folder = world
    cluster, _, _ = kube
    config["k8s"]["selector"] = {"iterion.io/managed": "yes"}  # the runners label their Pods managed=true
    assert check(config, folder)[0] == 0  # no Pod at all: an idle cluster, nothing wrong
    seed_run(cluster, "run-9")
    code, lines = check(config, folder)
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1 and len(failed) == 1, failed
    assert failed[0].startswith(
        "FAIL k8s.selector: no Pod in kube_pre (every namespace) matches iterion.io/managed=yes"
    )
    assert "but Pods carry iterion.io/run-id (e.g. ci/" in failed[0] and "iterion.io/managed=true" in failed[0]
    config["k8s"]["selector"] = {"iterion.io/managed": "true"}
    assert check(config, folder)[0] == 0  # the right selector: it matches the run's Pod


def test_a_writer_label_that_names_no_configured_project_fails_for_that_project(world) -> None:
    config, folder = world
    config["gce"]["writer_health"]["project_label"] = "gcp_project"
    code, lines = check(config, folder)
    assert code == 1
    # Every series then lacks the label: the answer as a whole is unreadable, and says so.
    assert any(line.startswith("FAIL gce.writer_health.prometheus_url:") for line in lines), lines


def test_a_mongo_lease_collection_that_holds_no_lease_fails(world) -> None:
    config, folder = world
    config["k8s"] = {**config["k8s"], "lease_source": "mongo", "mongo_leases": {"collection": "leases_typo"}}
    code, lines = check(config, folder)
    assert code == 1
    assert [line for line in lines if line.startswith("FAIL")] == [
        "FAIL k8s.mongo_leases: database 'iterion' has no collection 'leases_typo', so it may not be the store the "
        "runners write to: all keys unknown until it holds a document with _id and expires_at"
    ]


def test_a_lease_key_template_that_reads_no_key_of_the_bucket_as_a_lease_fails(world) -> None:
    config, folder = world
    config["k8s"] = {**config["k8s"], "nats_leases": {"key_template": "lease.{run}"}}
    code, lines = check(config, folder)
    assert code == 1
    assert [line for line in lines if line.startswith("FAIL")] == [
        "FAIL k8s.nats_leases.key_template: 2 keys in bucket run_leases, none of the form 'lease.{run}': "
        "every lease unknown"
    ]
