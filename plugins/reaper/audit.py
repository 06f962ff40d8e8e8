"""The audit view: the ledger's sweeps over time, each sweep's resources, a resource's history; HTML, JSON, CSV.

Mounted into Airflow's API server by the ``reaper_audit`` plugin under ``/reaper``. Every route
requires Airflow's own authentication and the right to read DAG runs (plugin routes are
unauthenticated unless they ask for it), and shows only the DAGs the auth manager lets the user
read. The pages are built by :mod:`reaper.report.views`; here the requests are read and the
ledger is asked, a page at a time.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse

from reaper.config import ConfigError, Settings, load_config
from reaper.model import Phase, dag_id_of
from reaper.records import SweepSummary
from reaper.report import oncall, views
from reaper.report.reasons import Limits
from reaper.report.rows import COLUMNS, Row, ledger_rows
from reaper.report.timeline import panels, scopes_of

if TYPE_CHECKING:
    from reaper.ledger import Ledger
    from reaper.report.queries import AuditQueries, History, RowFilter

READ_RUNS = requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN)
MAX_PAGE_SIZE = 500  # rows of a page at most: a bigger read is an export


def settings() -> Settings:
    """The deployment's config, as the DAGs read it: read once per request, whichever dependencies need it
    (a dependency, so tests can swap it)."""
    return load_config()


if TYPE_CHECKING:  # what the routes get; at run time FastAPI reads only the Depends (pymongo stays unimported)
    SettingsDep = Settings
else:
    SettingsDep = Annotated[object, Depends(settings)]


def ledger(config: SettingsDep) -> Ledger:
    """The ledger of the configured deployment, on this process's one client of its connection
    (a dependency, so tests can swap it)."""
    from reaper.ledger import Ledger

    return Ledger.connect(config.ledger)


def limits() -> Limits | None:
    """The configured thresholds the reasons quote; None (sentences without them) when the config is unreadable."""
    try:
        return Limits.of(load_config())
    except ConfigError:
        return None


def readable_dags(user: GetUserDep) -> frozenset[str]:
    """The DAGs this user may read, as Airflow's auth manager says: the view shows no other DAG's sweeps."""
    return frozenset(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


if TYPE_CHECKING:
    LedgerDep = Ledger
else:
    LedgerDep = Annotated[object, Depends(ledger)]  # object: the plugin loads without pymongo
LimitsDep = Annotated[Limits | None, Depends(limits)]
DagsDep = Annotated[frozenset[str], Depends(readable_dags)]
router = APIRouter(dependencies=[Depends(READ_RUNS)])


def _urls(request: Request) -> views.Urls:
    return views.Urls(str(request.scope.get("root_path", "")).rstrip("/"))


def _readable(dag_id: str, dags: frozenset[str]) -> None:
    if dag_id not in dags:
        raise HTTPException(403, f"you may not read DAG {dag_id}")


def _filters(request: Request) -> RowFilter:
    from reaper.report.queries import RowFilter

    return RowFilter(**{f: request.query_params.get(f, "").strip() for f in views.FILTERS})


def _order(order: str) -> str:
    from reaper.report.queries import ORDERS

    if order.lstrip("-") not in ORDERS:
        raise HTTPException(422, f"order must be one of {sorted(ORDERS)}, optionally with a leading -")
    return order


def _queries(led: Ledger) -> AuditQueries:
    from reaper.report.queries import AuditQueries  # imports pymongo: not on the plugin's import

    return AuditQueries(led)


def _window(led: Ledger, dags: frozenset[str], days: int) -> list[dict[str, object]]:
    return _queries(led).timeline(dags, datetime.now(UTC) - timedelta(days=days)) if dags else []


# --- the overview -------------------------------------------------------------------------------


def _expected(config: Settings, dags: frozenset[str]) -> dict[str, timedelta]:
    """The active phase's DAG of each enabled target the user may read, and its schedule interval."""
    out = {}
    for target in ("gce", "k8s"):
        dag_id = dag_id_of(target, Phase(getattr(config.rollout, target)))
        if getattr(config, target).enabled and dag_id in dags:
            out[dag_id] = getattr(config.airflow, f"{target}_schedule")
    return out


def _alerts(config: Settings) -> tuple[list[oncall.Need], str]:
    """The reaper's firing alerts in ``metrics.prometheus_url`` (none configured: none), or why they are unknown:
    read from its alerting rules, so a Prometheus without them, or with one it cannot evaluate, says so
    (:mod:`reaper.alerting`) instead of reading as "nothing fires"."""
    from reaper import alerting

    if not config.metrics.prometheus_url:
        return [], ""
    try:
        found = alerting.rules(config)
    except alerting.AlertingError as exc:
        return [], f"{exc}: look there"
    broken = alerting.unhealthy(found)
    unknown = f"Prometheus at {alerting.shown(config)} cannot evaluate {'; '.join(broken)}: those alerts cannot fire"
    alerts = (a for r in found for a in r.get("alerts") or [])  # type: ignore[attr-defined]  # a JSON list
    return oncall.firing(alerts, config.metrics.runbook_url), unknown if broken else ""


@router.get("/", response_class=HTMLResponse, response_model=None)
def overview(
    request: Request,
    led: LedgerDep,
    dags: DagsDep,
    config: SettingsDep,
    days: int = Query(14, ge=1, le=400),
    dag_id: str | None = None,
    run_id: str | None = None,
    scope: str = "",
) -> str | RedirectResponse:
    """What needs a human now, then per target its active DAG's fleet over time (another DAG's with ``dag_id``,
    one scope of it with ``scope``), then the latest sweeps."""
    urls = _urls(request)
    if dag_id and run_id:  # the links of earlier versions
        return RedirectResponse(urls.sweep(dag_id, run_id))
    if dag_id:
        _readable(dag_id, dags)
    summaries, unreadable = oncall.readable(_window(led, dags, days))
    by_dag: dict[str, list[SweepSummary]] = {}
    for s in summaries:  # oldest first
        by_dag.setdefault(s.dag_id, []).append(s)
    latest = {dag: sweeps[-1] for dag, sweeps in by_dag.items()}
    expected = _expected(config, dags)
    alerts, unknown = _alerts(config)
    needs = [*unreadable, *oncall.needs(by_dag, expected), *alerts]
    charted = {t: views.charted_dag(t, latest, expected, dag_id) for t in ("gce", "k8s")}
    typed = {d: by_dag[d] for d in charted.values() if d}  # what the charts read
    hrefs = {(s.dag_id, s.run_id, s.execution): urls.sweep(s.dag_id, s.run_id) for d in typed for s in typed[d]}
    newest = list(reversed(summaries))[:50]  # the window is read oldest first
    return views.overview_page(
        views.Overview(
            needs,
            unknown,
            charted,
            panels([s for sweeps in typed.values() for s in sweeps], hrefs, scope),
            {d: scopes_of(sweeps) for d, sweeps in typed.items()},
            scope,
            latest,
            days,
        ),
        newest,
        urls,
        config.metrics.runbook_url,
    )


@router.get("/api/sweeps")
def api_sweeps(led: LedgerDep, dags: DagsDep, days: int = Query(14, ge=1, le=400)) -> list[dict[str, object]]:
    """The summaries of the last ``days`` of the DAGs the user may read, oldest first (what the overview charts)."""
    return _window(led, dags, days)


# --- one sweep ----------------------------------------------------------------------------------


def _page_rows(
    led: Ledger, dag_id: str, run_id: str, filters: RowFilter, order: str, number: int, size: int, lim: Limits | None
) -> tuple[list[Row], int]:
    queries = _queries(led)
    decisions, total = queries.decision_page(dag_id, run_id, filters, order, (number - 1) * size, size)
    companions = queries.companions(dag_id, run_id, {str(d["uid"]) for d in decisions}) if decisions else []
    return ledger_rows(decisions, companions, lim), total


@router.get("/sweeps/{dag_id}/{run_id}", response_class=HTMLResponse)
def sweep(
    request: Request,
    led: LedgerDep,
    lim: LimitsDep,
    dags: DagsDep,
    dag_id: str,
    run_id: str,
    order: str = "scope",
    page: int = Query(1, ge=1),
    size: int = Query(50, ge=1, le=MAX_PAGE_SIZE),
) -> str:
    _readable(dag_id, dags)
    rows, total = _page_rows(led, dag_id, run_id, _filters(request), _order(order), page, size, lim)
    params = {k: v for k, v in request.query_params.items() if k in (*views.FILTERS, "order", "size")}
    shown = views.Page(page, size, total)
    held = led.held(dag_id, run_id)
    made = led.approvals_of({dag_id}, items=True, run_id=run_id)
    executions = _queries(led).executions(dag_id, run_id)
    return views.sweep_page(executions, rows, shown, params, _urls(request), dag_id, run_id, held, made, time.time())


@router.get("/approvals/{dag_id}", response_class=HTMLResponse)
def approvals(request: Request, led: LedgerDep, dags: DagsDep, dag_id: str) -> str:
    """The DAG's approvals, newest first, with their items, the sweep each came from and the run that used it."""
    _readable(dag_id, dags)
    return views.approvals_page(dag_id, led.approvals_of({dag_id}, items=True), _urls(request), time.time())


TRIGGER_RUNS = requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN)
FORM_LIMIT = 4 << 20  # bytes of an approval form at most: ~50,000 scope/uid@state items (~75 bytes each, encoded)


@router.post("/sweeps/{dag_id}/{run_id}/approve", dependencies=[Depends(TRIGGER_RUNS)])
async def approve(
    request: Request, led: LedgerDep, dags: DagsDep, user: GetUserDep, dag_id: str, run_id: str
) -> Response:
    """Record an approval of the selected held deletes (:func:`reaper.approvals.approve`) by the logged-in user, who
    must be allowed to trigger the DAG, then back to the sweep page at the approval, which says how to trigger it.

    Cross-site requests are refused: Airflow's login is a cookie a browser would send with a form another site
    posts, so the form must come from this origin (``Origin``, else ``Referer``, as OWASP advises without a token).
    """
    from urllib.parse import parse_qs, urlsplit

    from starlette.concurrency import run_in_threadpool

    from reaper.approvals import approve as record
    from reaper.durations import parse_duration

    _readable(dag_id, dags)
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    here = urlsplit(str(request.base_url))
    if urlsplit(source)[:2] != here[:2]:
        raise HTTPException(403, "approvals are posted from the sweep page of this site only")
    body = await request.body()
    if len(body) > FORM_LIMIT:
        raise HTTPException(413, f"the form is larger than {FORM_LIMIT} bytes")
    form = parse_qs(body.decode(), keep_blank_values=True)
    items = form.get("item") or []
    if not items:
        raise HTTPException(422, "item: expected at least one held delete selected")
    try:  # the ledger's reads and write off the API server's event loop, which every other request shares
        approval = await run_in_threadpool(
            record,
            led,
            dag_id,
            run_id,
            items,
            str(user.get_name()),
            (form.get("reason") or [""])[0],
            parse_duration((form.get("expires") or ["4h"])[0]),
            time.time(),
        )
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    # Back to the sweep, at the approval's row: it says how to trigger a run with it. Airflow 3.3's UI has no URL
    # that opens its Trigger form with a conf filled in (views.Urls.dag), so no redirect could do it for the user.
    back = f"{_urls(request).sweep(dag_id, run_id)}#{views.anchor(approval.id)}"
    return RedirectResponse(back, status_code=303)


@router.get("/api/sweeps/{dag_id}/{run_id}/rows")
def api_rows(
    request: Request,
    led: LedgerDep,
    lim: LimitsDep,
    dags: DagsDep,
    dag_id: str,
    run_id: str,
    order: str = "scope",
    page: int = Query(1, ge=1),
    size: int = Query(50, ge=1, le=MAX_PAGE_SIZE),
) -> dict[str, object]:
    """One page of a sweep's rows (filters as the page's), and how many match."""
    _readable(dag_id, dags)
    rows, total = _page_rows(led, dag_id, run_id, _filters(request), _order(order), page, size, lim)
    return {"total": total, "page": page, "size": size, "rows": [r.cells() for r in rows]}


def _export(led: Ledger, dag_id: str, run_id: str, filters: RowFilter, lim: Limits | None) -> list[Row]:
    """Every row of the filtered set: the run's intents and outcomes in one read, joined in memory."""
    queries = _queries(led)
    return ledger_rows(list(queries.decisions(dag_id, run_id, filters)), queries.companions(dag_id, run_id), lim)


@router.get("/sweeps/{dag_id}/{run_id}/rows.json")
def export_json(
    request: Request, led: LedgerDep, lim: LimitsDep, dags: DagsDep, dag_id: str, run_id: str
) -> JSONResponse:
    _readable(dag_id, dags)
    rows = [r.cells() for r in _export(led, dag_id, run_id, _filters(request), lim)]
    name = f"{dag_id}-{run_id}.json".replace(":", "_").replace("+", "_")
    return JSONResponse(rows, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/sweeps/{dag_id}/{run_id}/rows.csv")
def export_csv(
    request: Request, led: LedgerDep, lim: LimitsDep, dags: DagsDep, dag_id: str, run_id: str
) -> StreamingResponse:
    _readable(dag_id, dags)
    rows = _export(led, dag_id, run_id, _filters(request), lim)

    def lines() -> Iterator[str]:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for values in (COLUMNS, *([r.cells()[c] for c in COLUMNS] for r in rows)):
            writer.writerow(values)
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()

    name = f"{dag_id}-{run_id}.csv".replace(":", "_").replace("+", "_")
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(lines(), media_type="text/csv; charset=utf-8", headers=headers)


# --- one resource ---------------------------------------------------------------------------------


def _history(led: Ledger, term: str, dags: frozenset[str], lim: Limits | None) -> tuple[list[Row], History | None]:
    if not (term and dags):
        return [], None
    found = _queries(led).history(term, dags)
    decisions = [r for r in found.records if r.get("kind") == "decision"]
    return ledger_rows(decisions, [r for r in found.records if r.get("kind") != "decision"], lim), found


@router.get("/history", response_class=HTMLResponse)
def history(request: Request, led: LedgerDep, lim: LimitsDep, dags: DagsDep, q: str = "") -> str:
    rows, found = _history(led, q.strip(), dags, lim)
    return views.history_page(q.strip(), rows, found, _urls(request))


@router.get("/api/history")
def api_history(led: LedgerDep, lim: LimitsDep, dags: DagsDep, q: str) -> dict[str, object]:
    """What the history search finds for ``q`` (a name or its prefix, a uid, a Kubernetes run id, an
    Airflow run id): the resources' rows and transitions, the sweeps of that run, newest first."""
    rows, found = _history(led, q.strip(), dags, lim)
    return {
        "rows": [r.cells() for r in rows],
        "transitions": found.transitions if found else [],
        "sweeps": found.sweeps if found else [],
        "more": bool(found and found.more),
    }


# No generated docs: FastAPI would serve /docs, /redoc and /openapi.json outside the router,
# so without Airflow's login.
app = FastAPI(title="Reaper audit", docs_url=None, redoc_url=None, openapi_url=None)
app.include_router(router)


@app.exception_handler(HTTPException)
async def login_first(request: Request, exc: HTTPException) -> Response:
    """A browser that is not logged in is sent to Airflow's login page, and back here after it; a
    script (no ``text/html`` in its Accept, or an ``/api/`` route) gets the 401 as it is."""
    browser = "text/html" in request.headers.get("accept", "") and "/api/" not in request.url.path
    if exc.status_code == 401 and browser:
        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=302)
    return await http_exception_handler(request, exc)


@app.exception_handler(ConfigError)
def unreadable_config(request: Request, exc: ConfigError) -> HTMLResponse | JSONResponse:
    """The API server reads the reaper's config as the DAGs do: a bad or missing one is one clear answer
    (503, the file, the key and what to set), not a bare 500. Only after the login: the router's
    dependencies, Airflow's authentication first, run before the ledger's."""
    why = f"{exc} (the API server reads REAPER_CONFIG, else include/reaper.yaml, as the DAGs do)"
    if "/api/" in request.url.path:
        return JSONResponse({"detail": why}, status_code=503)
    return HTMLResponse(views.config_error_page(why, _urls(request)), status_code=503)
