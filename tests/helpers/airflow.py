"""A real Airflow for the end-to-end tests: its components as processes of the test's own (from
:mod:`include.airflow_components`), a metadata DB of its own in the local PostgreSQL, and a REST client.

Every process started here is stopped when the ``airflow_site`` context ends, whatever happened,
and the metadata DB is dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import cast
from urllib.parse import quote

import psycopg
import requests

from include.airflow_components import Component, Deployment
from include.emulators.http import Daemon, wait_until
from tests.helpers import POSTGRES_DSN, ROOT

USER, PASSWORD = "admin", "reaper-test"


class Rest:
    """Airflow's REST API as the test's admin user."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http = requests.Session()
        token = self.http.post(f"{base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=10)
        token.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def api(self, method: str, path: str, **body: object) -> dict[str, object]:
        # 30 s: a single api-server on a loaded two-core machine has answered after 12 s
        response = self.http.request(method, f"{self.base}/api/v2{path}", json=body or None, timeout=30)
        response.raise_for_status()
        return response.json()

    def trigger_dag(self, dag_id: str, **conf: object) -> str:
        body: dict[str, object] = {"logical_date": None, **({"conf": conf} if conf else {})}
        return str(self.api("POST", f"/dags/{dag_id}/dagRuns", **body)["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, object]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def wait_for(self, dag_id: str, run_id: str, timeout: float = 120) -> dict[str, object]:
        """The run once it has finished (success or failed)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(0.25)
        raise TimeoutError(f"{dag_id} {run_id} not finished after {timeout:.0f}s")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, object]]:
        path = f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances?limit=1000"
        return cast("list[dict[str, object]]", self.api("GET", path)["task_instances"])


class Site:
    """The processes of one :class:`Deployment`, each in its own process group, logging to its home."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.daemons: dict[str, Daemon] = {}
        self.executor = ""

    def start(self, component: Component) -> Daemon:
        log = self.deployment.home / f"{component.name}.log"
        daemon = Daemon(component.argv, None, component.name, log=log, env=component.env, cwd=ROOT, detach=True)
        self.daemons[component.name] = daemon
        return daemon

    def stop(self, name: str) -> None:
        self.daemons.pop(name).stop(timeout=20)

    def kill(self, name: str) -> None:
        """SIGKILL the component and everything it started, as when its machine dies."""
        daemon = self.daemons.pop(name)
        os.killpg(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait(timeout=10)

    def use(self, executor: str, workers: int = 2) -> None:
        """Run tasks on ``executor`` from now on: a scheduler of that executor (one of another is stopped)
        and, with the CeleryExecutor, ``workers`` Celery workers (those killed are started again)."""
        if self.executor != executor:
            if "scheduler" in self.daemons:
                self.stop("scheduler")
            self.start(self.deployment.scheduler(executor))
            self.executor = executor
        if executor == "CeleryExecutor":
            for component in self.deployment.workers(workers):
                if component.name not in self.daemons:
                    self.start(component)

    def close(self) -> None:
        """Stop every process at once (each waits out its own warm shutdown), then forget them."""
        with ThreadPoolExecutor(max(1, len(self.daemons))) as pool:
            list(pool.map(lambda daemon: daemon.stop(timeout=20), self.daemons.values()))
        self.daemons.clear()


@contextmanager
def airflow_site(home: Path, reaper_config: Path, wait_for_dag: str, **deployment: object) -> Iterator[Site]:
    """A migrated metadata DB, the reaper's pools, the api-server and dag-processor running and
    ``wait_for_dag`` parsed; the scheduler and workers come with :meth:`Site.use`."""
    database = f"reaper_af_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = POSTGRES_DSN.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{database}"
    site = Site(Deployment(home, url, reaper_config, {USER: PASSWORD}, **deployment))  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name
    try:
        env = site.deployment.env()
        for argv in site.deployment.setup():
            subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
        for component in site.deployment.servers():
            site.start(component)
        health = f"{site.deployment.base_url}/api/v2/monitor/health"
        wait_until(lambda: requests.get(health, timeout=2).ok, "the api-server", 120)
        rest = Rest(site.deployment.base_url)
        wait_until(lambda: rest.api("GET", f"/dags/{wait_for_dag}"), f"{wait_for_dag} parsed", 120)
        yield site
    finally:
        site.close()
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
