"""``make demo`` / ``make demo-down``: the reaper on an embedded fleet, in a real Airflow, on a laptop.

``python -m include.demo up`` starts, each as its own process recorded in
``.demo/pids.json``: SecantusDB (MongoDB), nats-server (when installed), the demo
fleet (``include/demo/fleet.py``: both emulators, simulated managers and runners),
Prometheus and the Pushgateway (when installed), and ``airflow standalone``
(LocalExecutor, metadata DB in the local PostgreSQL, connections and pools
imported from ``include/demo/connections.json`` and ``include/airflow/pools.json``).
It then triggers one sweep of each rollout phase, in order, through Airflow's REST
API (each phase but the active one, enforcement, confirmed with ``confirm_phase``, as an
operator confirms a phase by hand), and prints what each phase reported and deleted, the ledger's summary, and
where to look. Everything keeps running for the UI until ``python -m include.demo down``,
which stops every recorded process group by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template

from include.airflow_components import Deployment
from include.demo import celery
from include.emulators.http import Daemon, free_port, listening, secantusdb_argv, server_binary
from include.local_postgres import server_url

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("REAPER_DEMO_STATE") or ROOT / ".demo").resolve()
PIDS = STATE / "pids.json"
HERE = Path(__file__).parent
RULES = STATE / "reaper-rules.yml"  # generated from the demo's config (reaper alert-rules)
USER, PASSWORD = "admin", "reaper-demo"
POSTGRES = server_url()  # the local server, as scripts/bootstrap.sh left it
# Where it all lives; tests set these so they never touch a demo a user is running.
DB = os.environ.get("REAPER_DEMO_DB") or "reaper_demo"  # databases {DB}_airflow and {DB}_steps
UI_PORT = int(os.environ.get("REAPER_DEMO_PORT") or 8080)  # taken when free, else any free port
EXECUTOR = os.environ.get("REAPER_DEMO_EXECUTOR") or "local"  # or "celery": make demo EXECUTOR=celery
QUARANTINE = 30 + 2  # max_job_timeout + slack + clock_skew of include/demo/reaper.yaml, seconds


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


# --- processes --------------------------------------------------------------------------------


def _pids() -> dict[str, int]:
    return json.loads(PIDS.read_text()) if PIDS.exists() else {}


def start(
    name: str,
    argv: list[str],
    what: str,
    ready: Callable[[], object],
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> Daemon:
    """Start ``argv`` in its own process group, logging to ``.demo/logs/NAME.log``; record its pid
    (``down`` stops it by that), then wait until ``ready()``."""
    daemon = Daemon(argv, None, what, log=STATE / "logs" / f"{name}.log", env=env, cwd=ROOT, detach=True)
    PIDS.write_text(json.dumps({**_pids(), name: daemon.process.pid}, indent=2))
    daemon.wait(ready, timeout)
    return daemon


# What ``up`` writes that lets someone in: the Airflow login and the emulated cluster's kubeconfig (its token).
CREDENTIALS = ("airflow/passwords.json", "kubeconfig.json")


def down(databases: bool = True) -> None:
    """Stop every process group ``up`` started (SIGTERM, then SIGKILL after 20 s), remove the credentials it
    wrote (:data:`CREDENTIALS`), then drop the demo's PostgreSQL databases; the logs stay in ``.demo/logs``."""
    pids = _pids()
    for name, pid in pids.items():
        try:
            os.killpg(pid, signal.SIGTERM)
            say(f"stopping {name} (pid {pid})")
        except ProcessLookupError:
            pass
    deadline = time.time() + 20
    for pid in pids.values():
        while time.time() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    PIDS.unlink(missing_ok=True)
    for name in CREDENTIALS:
        (STATE / name).unlink(missing_ok=True)
    if databases:
        drop_databases()


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


# --- set-up -----------------------------------------------------------------------------------


DATABASES = (f"{DB}_airflow", f"{DB}_steps")


def _postgres():
    import psycopg

    try:
        return psycopg.connect(f"{POSTGRES}/postgres", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise SystemExit(f"demo: PostgreSQL on 127.0.0.1:5432 unreachable ({exc}); run scripts/bootstrap.sh") from None


def fresh_databases() -> None:
    with _postgres() as admin:
        for name in DATABASES:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')


def drop_databases() -> None:
    try:
        import psycopg  # noqa: F401 - only in the venv; `down` also runs without it
    except ImportError:
        say(f"psycopg not installed: databases {', '.join(DATABASES)} left in place")
        return
    with _postgres() as admin:
        for name in DATABASES:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def render(template: Path, out: Path, values: dict[str, object]) -> Path:
    out.write_text(Template(template.read_text()).substitute({k: str(v) for k, v in values.items()}))
    return out


def airflow_env(config: Path, api_port: int) -> dict[str, str]:
    home = STATE / "airflow"
    home.mkdir(exist_ok=True)
    (home / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # not a user's own Airflow
    return {
        **inherited,
        # standalone starts its components as `airflow ...` subprocesses: the venv's bin goes first on PATH.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{POSTGRES.replace('postgresql', 'postgresql+psycopg')}/{DATABASES[0]}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",  # the schedules are off: manual triggers only
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{api_port}",
        "REAPER_CONFIG": str(config),
    }


def prometheus_config(managers: list[dict[str, object]], pushgateway: str | None) -> Path:
    """Scrape the managers (each target with its labels) and the Pushgateway; load the generated rules."""
    targets = [{"targets": [m["address"]], "labels": m["labels"]} for m in managers]
    jobs: list[dict[str, object]] = [{"job_name": "runner-managers", "static_configs": targets}]
    if pushgateway:
        jobs.append({"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": [pushgateway]}]})
    config = {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": [str(RULES)],  # a glob: none until configure() generates them from the demo's config
        "scrape_configs": jobs,
    }
    path = STATE / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


# --- the sweeps -------------------------------------------------------------------------------


class Api:
    """Airflow's REST API with a token of the demo user."""

    def __init__(self, base: str) -> None:
        import requests

        self.base, self.http = base, requests.Session()
        token = self.http.post(f"{base}/auth/token", json={"username": USER, "password": PASSWORD}, timeout=10)
        token.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def get(self, path: str) -> dict[str, object]:
        response = self.http.get(f"{self.base}/api/v2{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def trigger(self, dag_id: str, conf: dict[str, object] | None = None) -> str:
        body = {"logical_date": None, **({"conf": conf} if conf else {})}
        response = self.http.post(f"{self.base}/api/v2/dags/{dag_id}/dagRuns", json=body, timeout=10)
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def wait(self, dag_id: str, run_id: str, timeout: float = 600) -> str:
        from urllib.parse import quote

        import requests

        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                state = str(self.get(f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")["state"])
            except requests.Timeout:  # the API server of a loaded machine; the run goes on regardless
                continue
            if state in ("success", "failed"):
                return state
            time.sleep(0.5)
        raise SystemExit(f"demo: {dag_id} run {run_id} did not finish within {timeout:.0f} s")


TARGETS = ("gce", "k8s")


def rollout(targets: tuple[str, ...] = TARGETS) -> list[str]:
    """Every sweep DAG of these targets in rollout order: GCE's phases, then Kubernetes'."""
    from reaper.model import dag_id_of
    from reaper.sweep.factory import PHASES

    return [dag_id_of(target, phase) for target in targets for phase in PHASES[target]]


def confirmations(target: str) -> list[dict[str, object]]:
    """Each phase's trigger conf, in rollout order: the demo's config makes enforcement the active phase, and a
    manual run of any other phase is a dry run unless its trigger confirms the phase (with a reason)."""
    from reaper.model import Phase
    from reaper.sweep.factory import PHASES
    from reaper.sweep.gate import gated

    reason = "make demo: one sweep of every rollout phase, in order"
    active = Phase.ENFORCEMENT  # rollout in include/demo/reaper.yaml
    return [
        {"confirm_phase": phase.value, "override_reason": reason} if gated(phase, active) else {}
        for phase in PHASES[target]
    ]


def sweep_all(api: Api, crashed_at: float) -> list[tuple[str, str, str]]:
    """Each target's phases one after another in rollout order, the two targets side by side: they share
    nothing but Airflow (their own pools, leases and scopes), so the demo takes the longer of the two."""

    def sweep(target: str) -> list[tuple[str, str, str]]:
        own = Api(api.base)  # a session of this thread's own: requests' sessions are not made to be shared
        runs = []
        for dag_id, conf in zip(rollout((target,)), confirmations(target), strict=True):
            if dag_id == "reaper_gce_enforcement":
                wait = crashed_at + QUARANTINE - time.time()
                if wait > 0:
                    say(f"waiting {wait:.0f} s until the crashed manager m4's instances are past their quarantine")
                    time.sleep(wait)
            started = time.time()
            run_id = own.trigger(dag_id, conf)
            state = own.wait(dag_id, run_id)
            say(f"{dag_id}: {state} in {time.time() - started:.0f} s")
            runs.append((dag_id, run_id, state))
        return runs

    with ThreadPoolExecutor(len(TARGETS), thread_name_prefix="demo-sweep") as pool:
        return [run for runs in pool.map(sweep, TARGETS) for run in runs]


def demo_ledger(reaper_config: Path, connections: Path):
    """The ledger the sweeps write: the database of the rendered reaper config, on a client of the
    Airflow connection it names, as ``connections.json`` defines it for ``airflow standalone``."""
    from airflow.sdk import Connection
    from pymongo import MongoClient

    from reaper.config import load_config
    from reaper.ledger import Ledger
    from reaper.stores.mongo import client_options

    cfg = load_config(reaper_config).ledger
    fields = json.loads(connections.read_text())[cfg.conn_id]
    conn = Connection.from_json(json.dumps(fields), conn_id=cfg.conn_id)
    return Ledger(MongoClient(**client_options(conn, cfg.timeout.total_seconds())), cfg)


def summarize(ledger, runs: list[tuple[str, str, str]]) -> dict[str, object]:
    """What each sweep reported, deleted and kept, and the ledger's records counted."""
    from reaper.records import SweepSummary

    phases = []
    for dag_id, run_id, state in runs:
        found = ledger.summaries(dag_id, run_id, limit=1)
        doc = found[0] if found else SweepSummary(dag_id, run_id)
        decisions = doc.decisions or []
        phases.append(
            {
                "dag_id": dag_id,
                "run_id": run_id,
                "state": state,
                "reported": sum(d.count for d in decisions if d.action == "report"),
                "deleted": (doc.outcomes or {}).get("deleted", 0),
                "kept": sum((doc.kept or {}).values()) + sum(d.count for d in decisions if d.action == "keep"),
                "holds": {s.scope: s.holds for s in doc.scopes or [] if s.holds},
            }
        )
    counts = ledger.tally()
    return {"phases": phases, "ledger": [[*key, n] for key, n in sorted(counts.items())]}


def alerts_page(prometheus_url: str) -> str:
    """Prometheus' alerts page: ``/alerts``, or ``/classic/alerts`` where the build has no React UI (Debian's
    prometheus package answers 404 at ``/alerts``)."""
    import requests

    for path in ("/alerts", "/classic/alerts"):
        try:
            if requests.get(f"{prometheus_url}{path}", timeout=10).status_code == 200:
                return f"{prometheus_url}{path}"
        except requests.RequestException:
            break
    return f"{prometheus_url}/alerts"


def alerts(prometheus_url: str) -> list[dict[str, str]]:
    """The alert rules' pending and firing alerts, once Prometheus has scraped the last sweep's push."""
    import requests

    time.sleep(3 * 2)  # scrape and rule evaluation run every 2 s (prometheus_config)
    found = requests.get(f"{prometheus_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    keep = ("target", "scope", "manager", "project", "pod", "shard", "window")
    return sorted(
        (
            {
                "alert": a["labels"]["alertname"],
                "state": a["state"],
                **{k: a["labels"][k] for k in keep if k in a["labels"]},
            }
            for a in found
        ),
        key=lambda a: sorted(a.items()),
    )


def table(summary: dict[str, object]) -> str:
    lines = [f"{'DAG':<32} {'state':<8} {'reported':>8} {'deleted':>8} {'kept':>5}  holds"]
    for p in summary["phases"]:  # type: ignore[attr-defined]  # JSON data typed object: its shape is this code's own
        holds = ", ".join(f"{scope}: {'+'.join(h)}" for scope, h in p["holds"].items()) or "-"
        lines.append(f"{p['dag_id']:<32} {p['state']:<8} {p['reported']:>8} {p['deleted']:>8} {p['kept']:>5}  {holds}")
    lines += ["", "Ledger: records by target, action and reason"]
    lines += [f"  {t:<4} {a:<14} {why:<28} {n:>4}" for t, a, why, n in summary["ledger"]]  # type: ignore[attr-defined]  # JSON data typed object: its shape is this code's own
    lines += ["", f"Alerts ({RULES}, from the demo's config; docs/runbook.md says what each asks of you)"]
    for a in summary["alerts"] or [{"alert": "none", "state": ""}]:  # type: ignore[attr-defined]  # JSON data typed object: its shape is this code's own
        labels = ", ".join(f"{k}={v}" for k, v in a.items() if k not in ("alert", "state"))
        lines.append(f"  {a['state']:<8} {a['alert']:<26} {labels}")
    return "\n".join(lines)


# --- up ---------------------------------------------------------------------------------------


@dataclass
class Services:
    """What :func:`services` started, and where: everything the reaper's config and connections name."""

    mongo_port: int
    nats_port: int  # rendered into connections.json even when nats-server is not installed (unused then)
    nats: bool  # nats-server is installed and running: run leases in NATS, else in MongoDB
    world: dict[str, object]  # the fleet's fleet.json: emulator endpoints, manager metrics, when m4 crashed
    prometheus_url: str
    pushgateway_url: str  # "" without prometheus-pushgateway


def up() -> None:
    down(databases=False)  # a demo still running from the same state directory
    if STATE.exists():
        shutil.rmtree(STATE)
    (STATE / "logs").mkdir(parents=True)
    say("starting SecantusDB (MongoDB wire protocol), NATS, the fleet, Prometheus")
    running = services()
    broker = celery.services(start) if EXECUTOR == "celery" else None
    reaper_config, connections = configure(running)
    base, api = airflow(reaper_config, connections, broker)
    say("sweeping every phase in rollout order")
    runs = sweep_all(api, float(running.world["crashed_at"]))  # type: ignore[arg-type]  # JSON data typed object: its shape is this code's own
    report(runs, running, reaper_config, connections, base)


def services() -> Services:
    """SecantusDB, nats-server (when installed), the fleet, the Pushgateway (when installed) and Prometheus."""
    mongo_port = free_port()
    start("secantusdb", secantusdb_argv(mongo_port), "SecantusDB", lambda: listening(mongo_port))
    mongo_url = f"mongodb://127.0.0.1:{mongo_port}/"

    nats, nats_port = server_binary("nats-server", required=False), free_port()
    if nats:
        argv = [nats, "-a", "127.0.0.1", "-p", str(nats_port), "-js", "-sd", str(STATE / "nats")]
        start("nats", argv, "nats-server", lambda: listening(nats_port))
    else:
        say("nats-server not installed: run leases live in MongoDB (k8s.lease_source: mongo)")

    fresh_databases()
    fleet_argv = [sys.executable, "-m", "include.demo.fleet", "--state", str(STATE), "--mongo-url", mongo_url]
    fleet_argv += ["--postgres-db", DATABASES[1]]
    fleet_argv += ["--nats-url", f"nats://127.0.0.1:{nats_port}"] if nats else []
    start("fleet", fleet_argv, "the fleet", lambda: (STATE / "fleet.json").exists())
    world = json.loads((STATE / "fleet.json").read_text())

    pushgateway_url = ""
    if gateway := server_binary("prometheus-pushgateway", required=False):
        port = free_port()
        # In memory: Debian's build persists to /var/lib/prometheus/pushgateway.data by default.
        argv = [gateway, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="]
        start("pushgateway", argv, "the Pushgateway", lambda: listening(port))
        pushgateway_url = f"http://127.0.0.1:{port}"
    prometheus, prom_port = server_binary("prometheus", required=False), free_port()
    if not prometheus:
        raise SystemExit("demo: prometheus is not installed (writer health reads it); run scripts/bootstrap.sh")
    config = prometheus_config(world["manager_metrics"], pushgateway_url.removeprefix("http://"))
    prometheus_url = f"http://127.0.0.1:{prom_port}"
    argv = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={STATE / 'prometheus'}"]
    argv += [f"--web.listen-address=127.0.0.1:{prom_port}", "--web.enable-lifecycle"]  # /-/reload
    start("prometheus", argv, "Prometheus", lambda: _get(f"{prometheus_url}/-/ready"))
    return Services(mongo_port, nats_port, bool(nats), world, prometheus_url, pushgateway_url)


def configure(running: Services) -> tuple[Path, Path]:
    """The reaper's config and Airflow's connections, rendered for these services into the state directory."""
    values = {
        "STATE": STATE,
        "PROMETHEUS_URL": running.prometheus_url,
        "PUSHGATEWAY_URL": running.pushgateway_url,
        "LEASE_SOURCE": "nats" if running.nats else "mongo",
        "GCE_ENDPOINT": running.world["gce_endpoint"],
        "KUBECONFIG": running.world["kubeconfig"],
        "MONGO_PORT": running.mongo_port,
        "NATS_PORT": running.nats_port,
        "STEPS_DB": DATABASES[1],
        # Celery workers share no disk: the sweep files go to object storage there
        "SWEEP_STORE": celery.SWEEP_STORE if EXECUTOR == "celery" else f"file://{STATE}/sweeps",
    }
    reaper_config = render(HERE / "reaper.yaml", STATE / "reaper.yaml", values)
    alert_rules(reaper_config, running.prometheus_url)
    return reaper_config, render(HERE / "connections.json", STATE / "connections.json", values)


def alert_rules(reaper_config: Path, prometheus_url: str) -> None:
    """The alert rules of the demo's config (its short clocks, its manual schedules), loaded into Prometheus."""
    import requests

    from reaper.alert_rules import render as render_rules
    from reaper.config import load_config

    RULES.write_text(render_rules(load_config(reaper_config), str(reaper_config)))
    requests.post(f"{prometheus_url}/-/reload", timeout=10).raise_for_status()


def airflow(reaper_config: Path, connections: Path, broker: tuple[str, dict[str, str]] | None) -> tuple[str, Api]:
    """Airflow's metadata DB migrated, the connections and pools imported, ``airflow standalone`` (or, with
    a Celery ``broker`` and its settings, the components and two Celery workers) running and the reaper's
    DAGs parsed; its base URL and its REST API."""
    api_port = free_port() if listening(UI_PORT) else UI_PORT
    env = airflow_env(reaper_config, api_port)
    deployment = None
    if broker is not None:
        url = f"{POSTGRES.replace('postgresql', 'postgresql+psycopg')}/{DATABASES[0]}"
        home, users = Path(env["AIRFLOW_HOME"]), {USER: PASSWORD}
        deployment = Deployment(home, url, reaper_config, users, "CeleryExecutor", broker[0], api_port, broker[1])
        env = deployment.env()
    airflow_bin = server_binary("airflow")
    say(f"migrating Airflow's metadata DB (PostgreSQL database {DATABASES[0]})")
    for argv in (
        [airflow_bin, "db", "migrate"],
        [airflow_bin, "connections", "import", str(connections)],
        [airflow_bin, "pools", "import", str(ROOT / "include" / "airflow" / "pools.json")],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"demo: {' '.join(argv[1:3])} failed:\n{done.stdout}{done.stderr}")
    base = f"http://127.0.0.1:{api_port}"
    health = f"{base}/api/v2/monitor/health"
    if deployment is None:
        say("starting airflow standalone (API server, scheduler, DAG processor, triggerer)")
        server = start("airflow", [airflow_bin, "standalone"], "airflow standalone", lambda: _get(health), 300, env)
    else:
        say(f"starting the API server, DAG processor, scheduler and {celery.WORKERS} Celery workers")
        first, *others = celery.components(deployment)
        server = start(first.name, first.argv, first.name, lambda: _get(health), 300, first.env)
        for component in others:
            start(component.name, component.argv, component.name, lambda: True, env=component.env)
    api = Api(base)
    server.wait(lambda: all(api.get(f"/dags/{d}") for d in rollout()), 300, "the reaper DAGs")
    return base, api


def report(
    runs: list[tuple[str, str, str]], running: Services, reaper_config: Path, connections: Path, base: str
) -> None:
    """What each sweep did, from the ledger, and the alerts (also in ``.demo/summary.json``); where to
    look next. Fails when a sweep failed."""
    ledger = demo_ledger(reaper_config, connections)
    summary = {**summarize(ledger, runs), "alerts": alerts(running.prometheus_url)}
    (STATE / "summary.json").write_text(json.dumps(summary, indent=2))
    print()
    print(table(summary))
    print(
        f"""
Airflow UI      {base}  (login {USER} / {PASSWORD})
Audit view      {base}/plugin/reaper-sweeps  (Browse -> Reaper sweeps; each DAG run's Reaper decisions tab)
Prometheus      {alerts_page(running.prometheus_url)}  (the reaper's alert rules, fed by the Pushgateway)
Config          {reaper_config}  (quarantine 30 s; production default 4 h)
Logs            {STATE / "logs"}
Stop it all     make demo-down"""
    )
    failed = [dag_id for dag_id, _, state in runs if state != "success"]
    if failed:
        raise SystemExit(f"demo: these sweeps failed: {', '.join(failed)} (see the Airflow UI)")


def _get(url: str) -> bool:
    import requests

    return requests.get(url, timeout=2).ok


def main() -> None:
    # This process imports Airflow too (the DAG ids): with no AIRFLOW_HOME that creates ~/airflow/logs. It
    # uses the demo's Airflow home, the one ``airflow_env`` gives ``airflow standalone``.
    os.environ["AIRFLOW_HOME"] = str(STATE / "airflow")
    command = sys.argv[1] if len(sys.argv) > 1 else "up"
    if command == "up":
        try:
            up()
        except (RuntimeError, TimeoutError) as exc:  # a server exited or never came up
            down()
            raise SystemExit(f"demo: {exc}; see {STATE / 'logs'}") from None
        except BaseException:
            down()  # a half-started demo is stopped; its logs stay in .demo/logs
            raise
    elif command == "down":
        down()
    else:
        raise SystemExit("usage: python -m include.demo [up|down]")


if __name__ == "__main__":
    main()
