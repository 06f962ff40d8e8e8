"""The demo's world without NATS: ``include/demo/fleet.py`` keeps the leases in MongoDB, and the demo
config rendered for that case drives the reaper's own adapters to the decisions the README promises.
(``tests/e2e/test_demo.py`` runs the whole demo, with NATS.)"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
import yaml
from kubernetes import config as kconfig
from pymongo import MongoClient

from include.demo.__main__ import HERE, render
from include.emulators.http import start_secantusdb, wait_until
from reaper.config import parse_settings
from reaper.k8s.evidence import gather
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject, Phase
from reaper.policy import evaluate
from reaper.stores.mongo import MongoLeases, MongoRunStore
from reaper.stores.postgres import PostgresStepStore
from tests.helpers import fast_backoff

ROOT = Path(__file__).resolve().parents[2]


def test_without_nats_the_demo_fleet_keeps_leases_in_mongodb(tmp_path, postgres) -> None:
    store = start_secantusdb()
    mongo_url = f"mongodb://127.0.0.1:{store.port}/"
    argv = [sys.executable, "-m", "include.demo.fleet", "--state", str(tmp_path), "--mongo-url", mongo_url]
    database = postgres.rsplit("/", 1)[1]  # of the local server, which the fleet reaches as the tests do
    fleet = subprocess.Popen([*argv, "--postgres-db", database], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: (tmp_path / "fleet.json").exists(), "the demo fleet", 60, fleet)
        world = json.loads((tmp_path / "fleet.json").read_text())
        values = {
            "STATE": tmp_path,
            "PROMETHEUS_URL": "http://127.0.0.1:9",
            "PUSHGATEWAY_URL": "",
            "SWEEP_STORE": f"file://{tmp_path}/sweeps",  # the local demo's: make demo without EXECUTOR=celery
        }
        rendered = render(HERE / "reaper.yaml", tmp_path / "reaper.yaml", {**values, "LEASE_SOURCE": "mongo"})
        config = parse_settings(yaml.safe_load(rendered.read_text()), str(rendered))
        assert config.k8s.lease_source == "mongo"

        api = kconfig.new_client_from_config(world["kubeconfig"])
        listing = list_cluster(api, "demo_cluster", config.k8s.selector, fast_backoff(), 10)
        client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, serverSelectionTimeoutMS=5000)
        leases = MongoLeases(client, config.k8s.mongo_leases)
        runs = MongoRunStore(client, config.k8s.mongo_run_store)
        steps = PostgresStepStore(lambda: psycopg.connect(postgres), config.k8s.postgres_step_store)
        evidence = gather(cast(list[K8sObject], listing.resources), config, leases.read, runs.read, steps.read)
        plan = evaluate(listing.resources, evidence, config, Phase.ENFORCEMENT, datetime.now(UTC))
    finally:
        fleet.terminate()
        fleet.wait(timeout=30)
        store.stop()

    reasons: dict[str, set[str]] = {}
    for d in plan.decisions:
        reasons.setdefault(d.resource.labels["iterion.io/run-id"], set()).add(d.reason)
    assert reasons == {
        "live-1": {"lease_held"},
        "live-2": {"lease_held"},
        "crashed-3": {"lease_held"},  # its lease was written once; it expires 20 s in
        "done-4": {"sandbox_orphan"},
        "failed-5": {"sandbox_orphan"},
        "vanished-6": {"sandbox_orphan"},
        "uploading-7": {"results_egress_in_progress"},
        "stepped-8": {"results_not_durable"},
        "young-9": {"min_age"},
    }
