"""The audit view: FastAPI TestClient against a real ledger (SecantusDB); Airflow's auth swapped for a user
who may read some DAGs. Anonymous requests are refused on every route."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from reaper import audit
from reaper.audit import READ_RUNS, app, ledger, limits, readable_dags, settings
from reaper.config import LedgerConfig
from reaper.ledger import Ledger

GCE_DAG, K8S_DAG = "reaper_gce_enforcement", "reaper_k8s_enforcement"
RUN = "manual__2026-11-29T12:00:00+00:00"
GCE = {"dag_id": GCE_DAG, "run_id": RUN, "execution": 0, "lease": "t", "target": "gce"}
K8S = {"dag_id": K8S_DAG, "run_id": RUN, "execution": 0, "lease": "k", "target": "k8s", "scope": "kube"}
SANDBOX = {"rule": "sandbox_orphan", "reason": "sandbox_orphan", "location": "ci", "name": "sandbox-done-4"}
ORPHAN_FACTS = {"run": "done-4", "lease": "absent", "store": "terminal", "status": "failed"}


def _decision(ids: dict[str, object], uid: str, action: str, **fields: object) -> dict[str, object]:
    return {**ids, "uid": uid, "action": action, "kind": "decision", **fields}


def _deleted(ids: dict[str, object], uid: str, name: str) -> list[dict[str, object]]:
    """The intent and the outcome of a delete, named as the delete path names them."""
    return [
        {**ids, "uid": uid, "action": "delete_intent", "kind": "intent", "name": name, "sent": True},
        {**ids, "uid": uid, "action": "outcome", "kind": "outcome", "name": name, "result": "deleted", "detail": ""},
    ]


@pytest.fixture
def led(mongo) -> Ledger:
    client, db = mongo
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    stale = {"rule": "heartbeat_stale", "resource_kind": "instance", "location": "us-east1-b"}
    led.write(
        [
            _decision({**GCE, "scope": "p1"}, "1", "delete", reason="heartbeat_stale", name="runner-1", **stale,
                      evidence={"heartbeat_age_s": 5 * 3600 + 12 * 60, "status": "RUNNING"}),
            *_deleted({**GCE, "scope": "p1"}, "1", "runner-1"),
            _decision({**GCE, "scope": "p2"}, "2", "report", reason="budget_exceeded",
                      name="<script>alert(1)</script>", **stale, evidence={"heartbeat_age_s": 7200}),
            # one run's three objects: Pod, Secret and NetworkPolicy under the same name
            *(
                _decision(K8S, f"u-{kind}", "delete", resource_kind=kind, evidence=ORPHAN_FACTS, **SANDBOX)
                for kind in ("Pod", "Secret", "NetworkPolicy")
            ),
            *(r for kind in ("Pod", "Secret") for r in _deleted(K8S, f"u-{kind}", f"{kind}/ci/sandbox-done-4")),
            _decision(K8S, "u-crashed", "report", resource_kind="Pod", rule="sandbox_orphan",
                      reason="lease_absent_run_active", location="ci", name="sandbox-crashed-3",
                      evidence={"run": "crashed-3", "lease": "absent", "store": "active", "status": "running"}),
        ]
    )  # fmt: skip
    census = {"p1": {"by_status": {"RUNNING": 4, "TERMINATED": 1}}, "p2": {"by_status": {"RUNNING": 6}}}
    led.summary(
        {
            **GCE,
            "phase": "enforcement",
            "branch": "delete",
            "why": "1 deletes within the cap",
            "state": "success",
            "outcomes": {"deleted": 1},
            "census": {"gce": census},
            "decisions": [
                {"scope": "p1", "rule": "heartbeat_stale", "reason": "heartbeat_stale", "action": "delete", "count": 1},
                {"scope": "p2", "rule": "heartbeat_stale", "reason": "budget_exceeded", "action": "report", "count": 1},
            ],
            "scopes": [
                {"scope": "p1", "holds": [], "overridden": ["budget_exceeded"], "labeled": 4, "stale": 3},
                {
                    "scope": "p2",
                    "holds": ["budget_exceeded", "writer_health_unknown"],
                    "blocking": ["budget_exceeded", "writer_health_unknown"],
                    "labeled": 6,
                    "stale": 5,
                    "unknown_evidence": ["writer health answered no series for this project"],
                },
            ],
            "warnings": ["12 pods carry step labels but k8s.step_store is none"],
            "override": {
                "reason": "INC-42 writer fixed",
                "user": "alice",
                "budget": True,
                "scopes": ["p1"],
                "applied": True,
            },
            "worker": "celery@host-2",
        }
    )
    led.summary({**K8S, "phase": "enforcement", "branch": "delete", "why": "3 deletes", "outcomes": {"deleted": 2}})
    return led


@pytest.fixture
def http(led):
    """A client as a user who may read the GCE DAG only (what the auth manager would answer for them)."""
    app.dependency_overrides.update(
        {
            ledger: lambda: led,
            READ_RUNS: lambda: None,
            readable_dags: lambda: frozenset({GCE_DAG}),
            limits: lambda: None,
        }
    )
    yield TestClient(app)
    app.dependency_overrides.clear()


def _as_reader_of(*dag_ids: str) -> None:
    app.dependency_overrides[readable_dags] = lambda: frozenset(dag_ids)


SWEEP = f"/sweeps/{GCE_DAG}/{RUN}"
K8S_SWEEP = f"/sweeps/{K8S_DAG}/{RUN}"
ROUTES = ["/", "/api/sweeps", SWEEP, f"/api{SWEEP}/rows", f"{SWEEP}/rows.csv", f"{SWEEP}/rows.json", "/history",
          "/api/history?q=x", f"/approvals/{GCE_DAG}"]  # fmt: skip
ACTIONS = [f"{SWEEP}/approve"]  # POST: tests/integration/test_audit_approve.py


@pytest.mark.parametrize("path", ROUTES)
def test_anonymous_requests_are_refused(led, path: str) -> None:
    app.dependency_overrides[ledger] = lambda: led
    try:
        response = TestClient(app).get(path)
    finally:
        app.dependency_overrides.clear()
    assert response.status_code == 401


class _Login:
    def get_url_login(self, next_url: str) -> str:
        return f"/auth/login?next={next_url}"


@pytest.mark.parametrize("path", ROUTES)
def test_an_anonymous_browser_is_sent_to_the_login_page(led, monkeypatch, path: str) -> None:
    monkeypatch.setattr(audit, "get_auth_manager", _Login)
    app.dependency_overrides[ledger] = lambda: led
    try:
        response = TestClient(app).get(path, headers={"Accept": "text/html,*/*"}, follow_redirects=False)
    finally:
        app.dependency_overrides.clear()
    if "/api/" in path:  # a script's route: the 401 as it is
        assert response.status_code == 401
    else:
        assert response.status_code == 302
        assert response.headers["location"] == f"/auth/login?next=http://testserver{path}"


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_generated_docs_are_not_served(path: str) -> None:
    # FastAPI serves these by default without any dependency: the API's shape to anyone who asks.
    response = TestClient(app).get(path)
    assert response.status_code in (401, 404)
    assert "openapi" not in response.text.lower()


def test_every_route_requires_read_access() -> None:
    # A route added without the router (as FastAPI adds its docs) would answer anonymous requests.
    assert len(app.routes) == len(ROUTES) + len(ACTIONS)
    for route in app.routes:
        assert isinstance(route, APIRoute), route
        assert any(d.dependency is READ_RUNS for d in route.dependencies), route.path


def test_a_k8s_run_is_one_row_per_object_with_its_kind_intent_and_outcome(http) -> None:
    _as_reader_of(K8S_DAG)
    rows = http.get(f"/api{K8S_SWEEP}/rows", params={"order": "kind"}).json()["rows"]
    assert [(r["kind"], r["name"], r["location"], r["outcome"]) for r in rows] == [
        ("NetworkPolicy", "sandbox-done-4", "ci", ""),  # its Pod and Secret went; it waits for the next sweep
        ("Pod", "sandbox-crashed-3", "ci", ""),
        ("Pod", "sandbox-done-4", "ci", "deleted"),
        ("Secret", "sandbox-done-4", "ci", "deleted"),
    ]
    assert rows[2]["intent_at"] and rows[2]["outcome_at"] and rows[0]["intent_at"] == ""
    assert rows[2]["why"] == "run done-4: lease absent, run store says terminal (failed): an orphan"
    assert rows[1]["why"].startswith("run crashed-3: lease absent, but run store says active (running)")


def test_filters_order_and_pages_are_applied_by_the_server(http) -> None:
    _as_reader_of(K8S_DAG)
    base = f"/api{K8S_SWEEP}/rows"
    names = [r["name"] for r in http.get(base, params={"order": "-name", "size": 1, "page": 1}).json()["rows"]]
    page = http.get(base, params={"order": "-name", "size": 1, "page": 4}).json()
    assert names == ["sandbox-done-4"] and page["total"] == 4 and page["rows"][0]["name"] == "sandbox-crashed-3"
    assert http.get(base, params={"order": "-name", "size": 1, "page": 5}).json()["rows"] == []
    assert [r["kind"] for r in http.get(base, params={"kind": "Secret"}).json()["rows"]] == ["Secret"]
    assert {r["kind"] for r in http.get(base, params={"outcome": "deleted"}).json()["rows"]} == {"Pod", "Secret"}
    second = http.get(base, params={"outcome": "deleted", "order": "-kind", "size": 1, "page": 2}).json()
    assert second["total"] == 2 and [r["kind"] for r in second["rows"]] == ["Pod"]  # paged after the outcome
    assert http.get(base, params={"outcome": "deleted", "kind": "Pod", "name": "done"}).json()["total"] == 1
    assert http.get(base, params={"reason": "lease_absent_run_active"}).json()["total"] == 1
    assert http.get(base, params={"name": "crashed"}).json()["total"] == 1
    assert http.get(base, params={"name": "u-Pod"}).json()["total"] == 1  # a uid
    assert http.get(base, params={"name": ".*"}).json()["total"] == 0  # names are matched literally
    assert http.get(base, params={"outcome": "failed"}).json()["total"] == 0
    assert http.get(base, params={"order": "evidence"}).status_code == 422


def test_exports_hold_the_filtered_rows(http) -> None:
    _as_reader_of(K8S_DAG)
    shown = http.get(f"/api{K8S_SWEEP}/rows", params={"name": "done"}).json()["rows"]
    as_json = http.get(f"{K8S_SWEEP}/rows.json", params={"name": "done"}).json()
    as_csv = list(csv.DictReader(io.StringIO(http.get(f"{K8S_SWEEP}/rows.csv", params={"name": "done"}).text)))
    assert as_json == shown and len(shown) == 3
    assert [(r["kind"], r["outcome"], r["why"]) for r in as_csv] == [(r["kind"], r["outcome"], r["why"]) for r in shown]


def test_sweep_page_shows_the_summary_reasons_in_words_and_links(http) -> None:
    page = http.get(SWEEP, params={"order": "name"}).text
    assert "1 deletes within the cap" in page and "INC-42 writer fixed" in page and "alice" in page
    assert "celery@host-2" in page  # a summary field this version does not know is still shown
    assert "budget: True; scopes: p1; applied: True" in page  # the override and the scopes it lifted
    assert "S 5 / L 6" in page and "budget_exceeded" in page
    assert "writer health answered no series for this project" in page  # why its evidence is unknown
    assert "12 pods carry step labels but k8s.step_store is none" in page  # the sweep's warnings
    assert "heartbeat 5 h 12 min old" in page and "deleted" in page
    assert f'href="/dags/{GCE_DAG}/runs/manual__2026-11-29T12%3A00%3A00%2B00%3A00"' in page
    assert "/tasks/delete/mapped" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert ".000" not in page  # no microseconds


def _values(page: str) -> list[dict[str, int]]:
    return [json.loads(html.unescape(v)) for v in re.findall(r'data-values="([^"]*)"', page)]


def test_overview_charts_the_fleet_and_drills_down_to_a_scope_with_holds_and_overrides_marked(http, led) -> None:
    page = http.get("/").text
    # The fleet: orphans found by rule over both scopes, deletions by outcome, scopes held by hold.
    assert _values(page) == [{"heartbeat_stale": 2}, {"deleted": 1}, {"budget_exceeded": 1}]
    assert "<h3>scope" not in page and '<option value="p2">p2</option>' in page  # one chart set, not one per scope
    _as_reader_of(GCE_DAG, K8S_DAG)
    led.summary({**K8S, "run_id": "scheduled__k", "phase": "enforcement", "scopes": [{"scope": "kube", "holds": []}]})
    both = http.get("/").text
    gce_form = both[both.index("<h2>GCE") : both.index("<h2>Kubernetes")]
    assert '<option value="p2">p2</option>' in gce_form and '"kube"' not in gce_form  # each DAG's own scopes
    assert '<option value="kube">kube</option>' in both[both.index("<h2>Kubernetes") :]
    drilled = http.get("/", params={"dag_id": GCE_DAG, "scope": "p1"}).text
    assert {"RUNNING": 4, "TERMINATED": 1} in _values(drilled)  # p1's census
    assert {"budget_exceeded": 1} not in _values(drilled)[3:]  # p2's reports are p2's
    assert {"budget_exceeded": 1} in _values(http.get("/", params={"dag_id": GCE_DAG, "scope": "p2"}).text)[3:]
    assert "hold budget_exceeded on p2 (blocks deletes), S 5 / L 6" in page
    assert "override by alice on p1: INC-42 writer fixed" in page  # the scopes whose budget hold it lifted
    assert f"/sweeps/{GCE_DAG}/manual__2026-11-29T12%3A00%3A00%2B00%3A00" in page


@pytest.fixture
def alerting():
    """A Prometheus answering ``/api/v1/rules?type=alert`` as its HTTP API documents it
    (https://prometheus.io/docs/prometheus/latest/querying/api/#rules): the reaper's rules, one firing and one
    pending, and another team's rule firing; ``/other/api/v1/rules`` is a Prometheus without the reaper's rules."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    def rule(name: str, state: str, runbook: str) -> dict[str, object]:
        notes = {"summary": f"{name} says so", "runbook_url": f"{runbook}#{name.lower()}"}
        labels = {"alertname": name, "severity": "page", "target": "gce", "scope": "p2"}
        alert = {"labels": labels, "annotations": notes, "state": state, "activeAt": "2026-12-01T10:00:00Z"}
        return {"type": "alerting", "name": name, "annotations": notes, "state": state, "alerts": [alert]}

    def answer(*rules: dict[str, object]) -> bytes:
        return json.dumps({"status": "success", "data": {"groups": [{"name": "g", "rules": list(rules)}]}}).encode()

    bodies = {
        "/api/v1/rules?type=alert": answer(
            rule("ReaperBudgetHold", "firing", "https://wiki/reaper"),
            rule("ReaperCapped", "pending", "https://wiki/reaper"),
            rule("DiskFull", "firing", "https://wiki/disks"),
        ),
        "/other/api/v1/rules?type=alert": answer(rule("DiskFull", "firing", "https://wiki/disks")),
        "/broken/api/v1/rules?type=alert": answer(
            {
                **rule("ReaperBudgetHold", "inactive", "https://wiki/reaper"),
                "health": "err",
                "lastError": "many-to-many",
            }
        ),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path in bodies else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(bodies.get(self.path, b"{}"))

        def log_message(self, *args: object) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_first_screen_says_what_needs_a_human_with_its_one_action(http, alerting) -> None:
    from tests.builders import settings as config

    _as_reader_of(GCE_DAG, K8S_DAG)
    active = {"gce": "enforcement", "k8s": "enforcement"}
    metrics = {"runbook_url": "https://wiki/reaper", "prometheus_url": alerting}
    app.dependency_overrides[settings] = lambda: config(rollout=active, metrics=metrics)
    page = http.get("/").text
    first = page[: page.index("<h2>GCE")]  # the first screen, above every chart
    needs = re.findall(r"<tr><td><b>([^<]+)</b></td><td>(.*?)</td><td>(.*?)</td>", first)
    assert [(what, why) for what, _, why in needs] == [
        ("scope held", "deletes held: budget_exceeded, writer_health_unknown"),
        ("alert firing", "page ReaperBudgetHold says so (scope=p2, target=gce)"),  # not the pending one, nor DiskFull
    ]
    assert f"/sweeps/{GCE_DAG}/" in needs[0][1] and "scope <b>p2</b>" in needs[0][1]
    assert "approve the reviewed ones" in first and "approval=&lt;id&gt;" in first  # the runbook's one action
    assert 'href="https://wiki/reaper#reaperbudgethold"' in first
    # The Kubernetes sweep in the fixture deleted 2 and failed none: nothing of it needs a human.
    assert K8S_DAG not in first
    # Never silently "no alert": a Prometheus that does not answer, or has none of the reaper's rules.
    app.dependency_overrides[settings] = lambda: config(rollout=active, metrics={"prometheus_url": alerting + "/x"})
    assert "did not answer /api/v1/rules" in http.get("/").text
    other = {"prometheus_url": alerting + "/other", "runbook_url": "https://wiki/reaper"}
    app.dependency_overrides[settings] = lambda: config(rollout=active, metrics=other)
    assert "has none of the reaper&#x27;s alert rules loaded" in http.get("/").text
    broken = {"prometheus_url": alerting + "/broken", "runbook_url": "https://wiki/reaper"}
    app.dependency_overrides[settings] = lambda: config(rollout=active, metrics=broken)
    assert "cannot evaluate ReaperBudgetHold: many-to-many: those alerts cannot fire" in http.get("/").text
    # Credentials in the URL are basic auth, never shown (review finding): answered, and refused.
    for where in (alerting.replace("http://", "http://reaper:s3cret@"), "http://reaper:s3cret@127.0.0.1:1"):
        creds = {"prometheus_url": where, "runbook_url": "https://wiki/reaper"}
        app.dependency_overrides[settings] = lambda creds=creds: config(rollout=active, metrics=creds)
        page = http.get("/").text
        assert "s3cret" not in page and "reaper:" not in page


def test_a_sweep_that_is_missing_or_failed_or_failing_needs_a_human(http, led) -> None:
    from tests.builders import settings as config

    _as_reader_of(GCE_DAG, K8S_DAG)
    led.sweeps.delete_many({})
    old = datetime.now(UTC) - timedelta(hours=1)  # the schedule is every 10 minutes
    failed = {"phase": "enforcement", "state": "failed", "why": "list_inventory failed", "outcomes": {"failed": 3}}
    led.sweeps.insert_one({**GCE, "run_id": "scheduled__9", "execution": 0, "lease": "z", "at": old, **failed})
    app.dependency_overrides[settings] = lambda: config(rollout={"gce": "enforcement", "k8s": "enforcement"})
    page = http.get("/").text
    first = page[: page.index("<h2>Latest sweeps")]
    found = re.findall(r"<tr><td><b>([^<]+)</b></td><td>(.*?)</td><td>(.*?)</td>", first)
    assert {(what, why) for what, _, why in found} >= {
        ("sweep missing", "the latest sweep is 1 h old; the schedule is every 10 min"),
        ("sweep failed", "list_inventory failed"),
        ("deletions failing", "3 deletes failed"),
        ("no sweep", "no sweep recorded in the window shown"),  # the Kubernetes DAG, every minute
    }


def test_a_kubernetes_sweep_shows_one_row_per_run_with_its_objects_inside(http, led) -> None:
    _as_reader_of(K8S_DAG)
    ids = {**K8S, "run_id": "scheduled__k"}
    led.write(
        _decision(ids, f"{run}-{kind}", "delete", resource_kind=kind, group=run, evidence=ORPHAN_FACTS, **SANDBOX)
        for run in ("run-1", "run-2")
        for kind in ("Pod", "Secret", "NetworkPolicy")
    )
    led.summary({**ids, "phase": "enforcement", "branch": "delete", "why": "6 deletes"})
    page = http.get(f"/sweeps/{K8S_DAG}/scheduled__k", params={"order": "run"}).text
    runs = re.findall(r"<tr><td>kube</td><td><b>([^<]+)</b></td><td>([^<]+)</td>.*?<summary>(\d+) objects", page)
    assert runs == [("run-1", "3 delete", "3"), ("run-2", "3 delete", "3")]
    assert '<option value="run" selected>one per run</option>' in page
    flat = http.get(f"/sweeps/{K8S_DAG}/scheduled__k").text
    assert 'class="runs"' not in flat and flat.count("<code>run-") == 6  # one row per object, by default


def test_a_sweep_page_says_what_the_owners_were_told_and_what_failed(http, led) -> None:
    told = {
        "sent": 1,
        "failed": 1,
        "notices": [
            {"channel": "smtp:default:sre@example.com", "event": "held", "ok": True, "error": ""},
            {"channel": "slack:default:#ci", "event": "deleted", "ok": False, "error": "channel_not_found"},
        ],
    }
    led.summary({**GCE, "run_id": "scheduled__n", "phase": "enforcement", "notifications": told})
    page = http.get(f"/sweeps/{GCE_DAG}/scheduled__n").text
    assert "<dt>notifications</dt><dd>sent 1, failed 1<br>slack:default:#ci deleted: channel_not_found</dd>" in page


def test_only_the_dags_the_user_may_read(http) -> None:
    assert K8S_DAG not in http.get("/").text
    assert {s["dag_id"] for s in http.get("/api/sweeps").json()} == {GCE_DAG}
    for path in (K8S_SWEEP, f"/api{K8S_SWEEP}/rows", f"{K8S_SWEEP}/rows.csv", f"/?dag_id={K8S_DAG}"):
        assert http.get(path).status_code == 403, path
    assert http.get("/api/history", params={"q": "sandbox-done-4"}).json()["rows"] == []


def test_history_follows_a_resource_across_sweeps(http, led) -> None:
    _as_reader_of(K8S_DAG)
    later = {**K8S, "run_id": "scheduled__2", "lease": "k2"}
    policy = _decision(
        later, "u-NetworkPolicy", "delete", resource_kind="NetworkPolicy", evidence=ORPHAN_FACTS, **SANDBOX
    )
    led.write([policy, *_deleted(later, "u-NetworkPolicy", "NetworkPolicy/ci/sandbox-done-4")])
    rows = http.get("/api/history", params={"q": "sandbox-done-4"}).json()["rows"]
    assert len(rows) == 4 and {r["run_id"] for r in rows} == {RUN, "scheduled__2"}
    outcomes = [(r["run_id"], r["outcome"]) for r in rows if r["kind"] == "NetworkPolicy"]
    assert sorted(outcomes) == [(RUN, ""), ("scheduled__2", "deleted")]
    by_uid = http.get("/api/history", params={"q": "u-Secret"}).json()["rows"]
    assert [(r["kind"], r["outcome"]) for r in by_uid] == [("Secret", "deleted")]
    page = http.get("/history", params={"q": "sandbox-done-4"}).text
    assert "outcome deleted at" in page and "scheduled__2" in page


def test_a_kept_vm_and_a_live_sandbox_tell_their_story_found_by_prefix_run_or_sweep(http, led) -> None:
    """Transitions recorded by the real ledger for resources that were never deleted: the history finds
    them by a name prefix, a uid, a Kubernetes run id, and an Airflow run id finds that run's sweeps."""
    from reaper.model import Evidence, Phase, Plan, Resource
    from tests.builders import inst, sandbox

    opted = inst(name="keepme-7", project="p1", labels={"reaper_keep": "true"})
    live = sandbox("run-77")
    swept = frozenset({("gce", "p1"), ("k8s", live[0].cluster)})
    first = Plan(
        Phase.ENFORCEMENT,
        0.0,
        [],
        [("gce", "opt_out", [opted]), ("k8s", "lease_held", cast(list[Resource], live))],
        [],
        {},
    )
    ids, label = {**GCE, "run_id": "scheduled__1"}, "iterion.io/run-id"
    assert led.record_transitions(ids, first, Evidence(swept=swept), label) == 1 + len(live)
    assert led.record_transitions({**ids, "run_id": "scheduled__2"}, first, Evidence(swept=swept), label) == 0
    gone = Plan(Phase.ENFORCEMENT, 0.0, [], [("gce", "opt_out", [opted])], [], {})
    later = {**ids, "run_id": "scheduled__3"}
    assert led.record_transitions(later, gone, Evidence(swept=swept), label) == len(live)
    led.summary({**later, "phase": "enforcement", "branch": "report_only", "why": "nothing to delete"})

    found = http.get("/api/history", params={"q": "keepme"}).json()  # a prefix of the name
    assert [(t["name"], t["state"], t["before"]) for t in found["transitions"]] == [("keepme-7", "keep:opt_out", "")]
    assert found["rows"] == []  # never a decision worth a record: its story is its transitions
    run = http.get("/api/history", params={"q": "run-77"}).json()["transitions"]
    assert {t["resource_kind"] for t in run} == {o.kind for o in live}
    assert sorted(t["state"] for t in run if t["uid"] == live[0].uid) == ["gone", "keep:lease_held"]
    assert http.get("/api/history", params={"q": opted.uid}).json()["transitions"][0]["name"] == "keepme-7"
    sweeps = http.get("/api/history", params={"q": "scheduled__3"}).json()["sweeps"]
    assert [(s["dag_id"], s["run_id"]) for s in sweeps] == [(GCE_DAG, "scheduled__3")]
    page = http.get("/history", params={"q": "run-77"}).text
    assert "kept (lease_held), first seen" in page and "gone from its scope&#x27;s listing" in page
    assert "UTC" in page


def test_old_links_lead_to_the_sweep(http, led) -> None:
    response = http.get("/", params={"dag_id": GCE_DAG, "run_id": RUN}, follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"].startswith(f"/sweeps/{GCE_DAG}/")


def test_plugin_registers_the_app_and_links() -> None:
    from reaper_audit import ReaperAuditPlugin

    assert ReaperAuditPlugin.fastapi_apps[0]["url_prefix"] == "/reaper"
    views = {v["destination"]: v["href"] for v in ReaperAuditPlugin.external_views}
    assert views == {"nav": "/reaper/", "dag_run": "/reaper/sweeps/{DAG_ID}/{RUN_ID}"}


def test_requests_reuse_one_client_of_the_configured_ledger(led, mongo_server, mongo, tmp_path, monkeypatch) -> None:
    # The real dependency (not swapped): the deployment's config and connection, one client per process.
    from pymongo import MongoClient

    import reaper.ledger
    import reaper.stores.mongo

    built: list[MongoClient] = []

    def counted(**options: Any) -> MongoClient:
        built.append(MongoClient(**options))
        return built[-1]

    monkeypatch.setattr(reaper.stores.mongo, "MongoClient", counted)
    monkeypatch.setattr(reaper.ledger, "_clients", {})
    config = tmp_path / "reaper.yaml"
    config.write_text(json.dumps({"ledger": {"conn_id": "audit_test", "database": mongo[1]}}))  # JSON is YAML
    monkeypatch.setenv("REAPER_CONFIG", str(config))
    conn = {"conn_type": "mongo", "host": "127.0.0.1", "port": mongo_server.port}
    monkeypatch.setenv("AIRFLOW_CONN_AUDIT_TEST", json.dumps(conn))
    app.dependency_overrides.update({READ_RUNS: lambda: None, readable_dags: lambda: frozenset({GCE_DAG})})
    try:
        http = TestClient(app)
        sweeps = http.get("/api/sweeps").json()
        rows = http.get(f"/api{SWEEP}/rows").json()["rows"]
    finally:
        app.dependency_overrides.clear()
    assert [s["why"] for s in sweeps] == ["1 deletes within the cap"] and len(rows) == 2
    assert rows[0]["why"] == "heartbeat 5 h 12 min old, quarantine 4 h"  # the configured quarantine (defaults)
    assert len(built) == 1


def test_the_overview_window_leaves_older_sweeps_out(http, led) -> None:
    old = datetime.now(UTC) - timedelta(days=20)
    led.sweeps.insert_one({**GCE, "run_id": "old", "at": old, "why": "old sweep"})
    assert [s["why"] for s in http.get("/api/sweeps").json()] == ["1 deletes within the cap"]
    assert len(http.get("/api/sweeps", params={"days": 30}).json()) == 2


@pytest.mark.parametrize(("path", "kind"), [("/", "text/html"), ("/api/sweeps", "application/json")])
def test_a_bad_config_is_one_clear_answer_after_the_login(tmp_path, monkeypatch, path: str, kind: str) -> None:
    bad = tmp_path / "reaper.yaml"
    bad.write_text("ledger:\n  timeout: soon\n")
    monkeypatch.setenv("REAPER_CONFIG", str(bad))
    assert TestClient(app).get(path).status_code == 401  # the login first: nothing about the config leaks
    app.dependency_overrides.update({READ_RUNS: lambda: None, readable_dags: lambda: frozenset({GCE_DAG})})
    try:
        response = TestClient(app).get(path)
    finally:
        app.dependency_overrides.clear()
    assert response.status_code == 503 and response.headers["content-type"].startswith(kind)
    assert str(bad) in response.text and "ledger.timeout" in response.text and "REAPER_CONFIG" in response.text
