"""The audit view: each sweep's decisions and outcomes from the ledger, as an HTML page and a JSON API.

Mounted into Airflow's API server by the ``reaper_audit`` plugin under
``/reaper``. Every route requires Airflow's own authentication and the right to
read DAG runs (plugin routes are unauthenticated unless they ask for it).
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlencode

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import HTMLResponse

from reaper.config import load_config

if TYPE_CHECKING:
    from reaper.ledger import Ledger

READ_RUNS = requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN)
FILTERS = ("scope", "rule", "action", "name")


def ledger() -> Ledger:
    """The ledger of the configured deployment, on this process's one client of its connection
    (a dependency, so tests can swap it)."""
    from reaper.ledger import Ledger

    return Ledger.connect(load_config().ledger)


LedgerDep = Annotated[object, Depends(ledger)]  # object: the plugin loads without pymongo
router = APIRouter(dependencies=[Depends(READ_RUNS)])


@router.get("/api/sweeps")
def api_sweeps(led: LedgerDep, dag_id: str | None = None, limit: int = Query(50, ge=1, le=500)) -> list[dict]:
    return led.summaries(dag_id, limit=limit)


@router.get("/api/sweeps/{dag_id}/{run_id}/records")
def api_records(
    led: LedgerDep,
    dag_id: str,
    run_id: str,
    scope: str | None = None,
    rule: str | None = None,
    action: str | None = None,
    name: str | None = None,
) -> list[dict]:
    return led.run_records(dag_id, run_id, scope=scope, rule=rule, action=action, name=name)


def _cell(value: object) -> str:
    return escape("" if value is None else str(value))


def _table(rows: list[dict[str, object]], columns: list[str], link: str | None = None) -> str:
    """An HTML table; every value escaped. ``link`` names a column whose cell links to the row's ``href``."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td><a href="{escape(str(r["href"]))}">{_cell(r.get(c))}</a></td>'
            if c == link
            else f"<td>{_cell(r.get(c))}</td>"
            for c in columns
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@router.get("/", response_class=HTMLResponse)
def page(
    led: LedgerDep,
    dag_id: str | None = None,
    run_id: str | None = None,
    scope: str | None = None,
    rule: str | None = None,
    action: str | None = None,
    name: str | None = None,
) -> str:
    sweeps = led.summaries(dag_id)
    for s in sweeps:
        s["href"] = "?" + urlencode({"dag_id": s["dag_id"], "run_id": s["run_id"]})
        s["deleted"] = (s.get("outcomes") or {}).get("deleted", 0)  # type: ignore[union-attr]
        s["reported"] = sum(d["count"] for d in s.get("decisions", []) if d["action"] == "report")  # type: ignore[union-attr,index]
    _mark_rollout_changes(sweeps)
    columns = ["at", "dag_id", "run_id", "execution", "phase", "active phase", "branch", "why", "deleted", "reported"]
    parts = ["<h1>Reaper sweeps</h1>", _table(sweeps, columns, link="run_id")]
    if dag_id and run_id:
        filters = {"scope": scope, "rule": rule, "action": action, "name": name}
        form = "".join(f'<label>{k} <input name="{k}" value="{escape(v or "")}"></label> ' for k, v in filters.items())
        parts += [
            f"<h2>Decisions and outcomes of {escape(dag_id)} / {escape(run_id)}</h2>",
            f'<form method="get"><input type="hidden" name="dag_id" value="{escape(dag_id)}">'
            f'<input type="hidden" name="run_id" value="{escape(run_id)}">{form}<button>Filter</button></form>',
            _table(
                led.run_records(dag_id, run_id, **filters),
                [
                    "execution",
                    "scope",
                    "kind",
                    "action",
                    "rule",
                    "reason",
                    "name",
                    "location",
                    "result",
                    "detail",
                    "uid",
                ],
            ),
        ]
    style = "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:2px 6px}</style>"
    return f"<!doctype html><html><head><title>Reaper audit</title>{style}</head><body>{''.join(parts)}</body></html>"


def _mark_rollout_changes(sweeps: list[dict[str, object]]) -> None:
    """Each summary's active phase, and where it differs from its target's previous sweep: the rollout moved."""
    previous: dict[object, object] = {}
    for s in reversed(sweeps):  # oldest first
        active, target = s.get("active_phase"), s.get("target")
        moved = active and target in previous and previous[target] != active
        s["active phase"] = f"{active} (was {previous[target]})" if moved else active or ""
        if active:
            previous[target] = active


# No generated docs: FastAPI would serve /docs, /redoc and /openapi.json outside the router,
# so without Airflow's login.
app = FastAPI(title="Reaper audit", docs_url=None, redoc_url=None, openapi_url=None)
app.include_router(router)
