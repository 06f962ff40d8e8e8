"""Airflow plugin: the reaper's audit view (the ledger's sweeps, decisions and outcomes) in the Airflow UI.

Served by Airflow's API server under /reaper, behind Airflow's authentication; shown inside Airflow (an
iframe under its own header) from Browse and as a tab of every DAG run (Airflow fills in the run; a run of
another DAG finds no sweep). An external view appears as a page or tab only with a ``url_route``; without
one it is a link that opens a new browser tab. Server-rendered pages with inline styles and SVG: nothing to
build, no static files to serve.
"""

from airflow.plugins_manager import AirflowPlugin

from reaper.audit import app


class ReaperAuditPlugin(AirflowPlugin):
    name = "reaper_audit"
    # Plain attributes, as AirflowPlugin declares them (mypy refuses a ClassVar over them); Airflow reads them
    # off the class.
    fastapi_apps: list[dict[str, object]] = [  # noqa: RUF012
        {"app": app, "url_prefix": "/reaper", "name": "Reaper audit"},
    ]
    external_views: list[dict[str, object]] = [  # noqa: RUF012
        {
            "name": "Reaper sweeps",
            "href": "/reaper/",
            "destination": "nav",
            "category": "browse",
            "url_route": "reaper-sweeps",
        },
        {
            "name": "Reaper decisions",
            "href": "/reaper/sweeps/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "reaper-decisions",
        },
    ]
