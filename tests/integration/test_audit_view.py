"""The audit view: FastAPI TestClient against a real ledger; anonymous requests are refused."""

from __future__ import annotations

import json

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from reaper.audit import READ_RUNS, app, ledger
from reaper.config import LedgerConfig
from reaper.ledger import Ledger

IDS = {"dag_id": "reaper_gce_enforcement", "run_id": "manual__2026-11-29T12:00:00+00:00", "execution": 0, "lease": "t"}
GCE = {**IDS, "target": "gce"}


@pytest.fixture
def led(mongo) -> Ledger:
    client, db = mongo
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    stale = {"rule": "heartbeat_stale", "kind": "decision"}
    led.write(
        [
            {
                **GCE,
                "scope": "p1",
                "uid": "1",
                "action": "delete",
                "reason": "heartbeat_stale",
                "name": "runner-1",
                **stale,
            },
            {
                **GCE,
                "scope": "p1",
                "uid": "1",
                "action": "outcome",
                "kind": "outcome",
                "result": "deleted",
                "name": "runner-1",
            },
            {
                **GCE,
                "scope": "p2",
                "uid": "2",
                "action": "report",
                "reason": "budget_exceeded",
                "name": "<script>alert(1)</script>",
                **stale,
            },
        ]
    )
    led.summary(
        {
            **GCE,
            "phase": "enforcement",
            "branch": "delete",
            "why": "2 deletes",
            "outcomes": {"deleted": 1},
            "decisions": [{"action": "report", "count": 1}],
        }
    )
    return led


@pytest.fixture
def authorized(led):  # type: ignore[no-untyped-def]
    app.dependency_overrides[ledger] = lambda: led
    app.dependency_overrides[READ_RUNS] = lambda: None  # what Airflow's auth grants a user who may read runs
    yield TestClient(app)
    app.dependency_overrides.clear()


@pytest.mark.parametrize("path", ["/", "/api/sweeps", f"/api/sweeps/{IDS['dag_id']}/x/records"])
def test_anonymous_requests_are_refused(led, path: str) -> None:
    app.dependency_overrides[ledger] = lambda: led
    try:
        response = TestClient(app).get(path)
    finally:
        app.dependency_overrides.clear()
    assert response.status_code == 401


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_generated_docs_are_not_served(path: str) -> None:
    # FastAPI serves these by default without any dependency: the API's shape to anyone who asks.
    response = TestClient(app).get(path)
    assert response.status_code in (401, 404)
    assert "openapi" not in response.text.lower()


def test_every_route_requires_read_access() -> None:
    # A route added without the router (as FastAPI adds its docs) would answer anonymous requests.
    assert app.routes
    for route in app.routes:
        assert isinstance(route, APIRoute), route
        assert any(d.dependency is READ_RUNS for d in route.dependencies), route.path


def test_sweeps_api(authorized) -> None:
    sweeps = authorized.get("/api/sweeps").json()
    assert [(s["dag_id"], s["branch"], s["outcomes"]) for s in sweeps] == [
        ("reaper_gce_enforcement", "delete", {"deleted": 1})
    ]


def test_records_api_filters(authorized) -> None:
    base = f"/api/sweeps/{IDS['dag_id']}/{IDS['run_id']}/records"
    assert len(authorized.get(base).json()) == 3
    outcome = authorized.get(base, params={"scope": "p1", "action": "outcome"}).json()
    assert [r["name"] for r in outcome] == ["runner-1"]
    held = authorized.get(base, params={"rule": "heartbeat_stale", "action": "report"}).json()
    assert [r["reason"] for r in held] == ["budget_exceeded"]
    assert [r["uid"] for r in authorized.get(base, params={"name": "runner"}).json()] == ["1", "1"]
    assert authorized.get(base, params={"name": ".*"}).json() == []  # names are matched literally


def test_page_shows_the_sweep_and_its_deletions_escaped(authorized) -> None:
    listing = authorized.get("/")
    assert listing.status_code == 200 and "reaper_gce_enforcement" in listing.text
    page = authorized.get("/", params=IDS).text
    assert "runner-1" in page and "deleted" in page and "budget_exceeded" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_the_sweeps_page_shows_when_the_rollout_moved(authorized, led) -> None:
    for run, active in (("r1", "telemetry"), ("r2", "telemetry"), ("r3", "report-only")):
        led.summary({**GCE, "run_id": run, "target": "gce", "phase": "report-only", "active_phase": active})
    page = authorized.get("/").text
    assert page.count("report-only (was telemetry)") == 1 and "telemetry (was" not in page


def test_plugin_registers_the_app_and_links() -> None:
    from reaper_audit import ReaperAuditPlugin

    assert ReaperAuditPlugin.fastapi_apps[0]["url_prefix"] == "/reaper"
    assert {v["destination"] for v in ReaperAuditPlugin.external_views} == {"nav", "dag_run"}


def test_requests_reuse_one_client_of_the_configured_ledger(led, mongo_server, mongo, tmp_path, monkeypatch) -> None:
    # The real dependency (not swapped): the deployment's config and connection, one client per process.
    from pymongo import MongoClient

    import reaper.ledger
    import reaper.stores.mongo

    built: list[MongoClient] = []

    def counted(**options: object) -> MongoClient:
        built.append(MongoClient(**options))
        return built[-1]

    monkeypatch.setattr(reaper.stores.mongo, "MongoClient", counted)
    monkeypatch.setattr(reaper.ledger, "_clients", {})
    config = tmp_path / "reaper.yaml"
    config.write_text(json.dumps({"ledger": {"conn_id": "audit_test", "database": mongo[1]}}))  # JSON is YAML
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    conn = {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port}
    monkeypatch.setenv("AIRFLOW_CONN_AUDIT_TEST", json.dumps(conn))
    app.dependency_overrides[READ_RUNS] = lambda: None
    try:
        http = TestClient(app)
        sweeps = http.get("/api/sweeps").json()
        records = http.get(f"/api/sweeps/{IDS['dag_id']}/{IDS['run_id']}/records").json()
    finally:
        app.dependency_overrides.clear()
    assert [s["why"] for s in sweeps] == ["2 deletes"] and len(records) == 3
    assert len(built) == 1
