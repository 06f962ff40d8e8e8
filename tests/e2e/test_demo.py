"""``make demo`` as the README runs it (``python -m include.demo up``), then ``down``: every phase sweeps
in a real ``airflow standalone``, the orphans go, the live fleet stays, and ``down`` stops every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
import requests

from include.emulators.http import free_port
from include.local_postgres import password_file
from reaper.gce.clients import compute_clients
from tests.helpers import POSTGRES_DSN, ROOT

pytestmark = pytest.mark.slow(185)  # seconds, about: the heaviest modules start first (tests/conftest.py)

LIVE_GCE = {f"m{m}-runner-{i}" for m in (1, 2, 3, 5) for i in range(4)}
HELD_IN_C = {"gone-runner-2"}  # ci-runners-c: its writer fails, so nothing there may go
PINNED = {"pinned-runner"}  # reaper_keep=true


def _gce_names(endpoint: str) -> set[str]:
    clients = compute_clients(api_endpoint=endpoint)
    names = set()
    for project in ("ci-runners-a", "ci-runners-b", "ci-runners-c"):
        for _, scoped in clients.instances.aggregated_list(project=project, timeout=10):
            names |= {i.name for i in scoped.instances}
    return names


def _k8s_runs(kubeconfig: str) -> set[str]:
    from kubernetes import client, config

    api = config.new_client_from_config(kubeconfig)
    pods = client.CoreV1Api(api).list_namespaced_pod("ci", _request_timeout=10).items
    return {p.metadata.labels["iterion.io/run-id"] for p in pods}


def test_demo_sweeps_every_phase_reaps_the_orphans_and_stops_everything(tmp_path) -> None:
    state, db = tmp_path / "demo", f"reaper_demotest_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "REAPER_DEMO_STATE": str(state), "REAPER_DEMO_DB": db, "REAPER_DEMO_PORT": str(free_port())}
    env.pop("AIRFLOW_HOME")  # as a user runs it: the demo keeps Airflow's files in its own state, never ~/airflow
    env["PGPASSFILE"] = str(password_file())  # the local role's password, where bootstrap left it, HOME aside
    env["HOME"] = str(tmp_path / "home")
    demo = [sys.executable, "-m", "include.demo"]
    try:
        up = subprocess.run([*demo, "up"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        assert "reported  deleted" in up.stdout and "login admin / reaper-demo" in up.stdout

        summary = json.loads((state / "summary.json").read_text())
        phases = {p["dag_id"]: p for p in summary["phases"]}
        assert {p["state"] for p in phases.values()} == {"success"} and len(phases) == 7
        assert [phases[d]["deleted"] for d in phases] == [0, 1, 0, 6, 0, 0, 12]
        assert phases["reaper_gce_telemetry"]["reported"] == 0 and phases["reaper_k8s_telemetry"]["reported"] == 0
        assert phases["reaper_gce_enforcement"]["holds"] == {"ci-runners-c": ["writer_unhealthy", "budget_exceeded"]}

        firing = [a for a in summary["alerts"] if a["state"] == "firing"]
        budget_alerts = [a for a in firing if a["alert"] == "ReaperBudgetHold"]
        assert {a["scope"] for a in budget_alerts} == {"ci-runners-c"}  # from the sweeps' pushed metrics
        # The cause alerts, from the managers' own series: m4's restarts and its creations failing on the quota.
        assert {a["pod"] for a in firing if a["alert"] == "RunnerManagerCrashLooping"} == {"m4"}
        burns = {(a["shard"], a["window"]) for a in firing if a["alert"] == "MachineCreationBudgetBurn"}
        assert burns == {("ci-runners-b", "fast"), ("ci-runners-b", "slow")}
        assert "RunnerManagerCrashLooping" in up.stdout

        world = json.loads((state / "fleet.json").read_text())
        # m4's abandoned VMs and the old leftovers: gone; none of m4's re-created machines got past the quota.
        assert _gce_names(world["gce_endpoint"]) == LIVE_GCE | HELD_IN_C | PINNED
        assert _k8s_runs(world["kubeconfig"]) == {
            "live-1",
            "live-2",
            "crashed-3",  # lease lost but the run is still "running": kept, reported
            "uploading-7",  # results egress still running
            "stepped-8",  # step results not durable yet
            "young-9",  # younger than min_age
        }
        # Every URL the demo prints answers (Debian's Prometheus has no /alerts, only /classic/alerts).
        printed = [line for line in up.stdout.splitlines() if line.startswith(("Prometheus ", "Audit view "))]
        urls = [word for line in printed for word in line.split() if word.startswith("http")]
        assert len(urls) == 2 and all(requests.get(url, timeout=10).status_code == 200 for url in urls), urls
        pids = json.loads((state / "pids.json").read_text())
        assert set(pids) >= {"secantusdb", "nats", "fleet", "prometheus", "airflow"}
    finally:
        subprocess.run([*demo, "down"], cwd=ROOT, env=env, capture_output=True, timeout=120, check=True)
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
            left = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{db}%",)).fetchall()
            for (name,) in left:  # only if down failed to drop them
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert left == []  # down dropped the demo's databases
    for name, pid in pids.items():
        try:
            os.killpg(pid, 0)
            raise AssertionError(f"{name} (pid {pid}) still runs after down")
        except ProcessLookupError:
            pass
    assert not (state / "pids.json").exists()
    assert (state / "logs").is_dir()  # the logs stay; the credentials do not
    assert not (tmp_path / "home" / "airflow").exists()
    assert not (state / "airflow" / "passwords.json").exists() and not (state / "kubeconfig.json").exists()
