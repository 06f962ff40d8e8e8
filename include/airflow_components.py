"""Airflow's components as separate processes: the environment they share and the command line of each,
for the LocalExecutor or the CeleryExecutor with workers that share no disk.

The Celery demo (``make demo EXECUTOR=celery``) and the end-to-end tests start Airflow from here, so
what took finding out (``shared/notes/airflow-traps.md``) is written once:

- every process shares one JWT secret, and tasks reach the api-server's execution API on its own port;
- Celery: a Redis broker; the result backend in the metadata DB through psycopg2
  (``db+postgresql+psycopg2``: a plain ``db+postgresql`` makes SQLAlchemy look for psycopg 3 and the
  worker dies); one task at a time per worker slot with no prefetch, so mapped tasks spread over workers;
- each worker has an ``AIRFLOW_HOME`` (its logs) and a ``TMPDIR`` of its own, so a task that read
  another task's local file would fail, its own log-server port, and its own hostname, which Airflow
  records as the ``hostname`` of every task instance it runs (:func:`worker_hostname`);
- off GCP, the sweep store on ``gcp-storage-emulator`` (a Redis broker and that emulator are started
  from :func:`redis_argv` and :func:`storage_emulator_argv`).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from include.emulators.http import free_port, server_binary

ROOT = Path(__file__).resolve().parents[1]
WORKER_NAME = "REAPER_WORKER_HOSTNAME"  # read by worker_hostname() in each worker's tasks


SWEEP_BUCKET = "reaper-sweeps"
SWEEP_STORE = f"gs://reaper_sweeps@{SWEEP_BUCKET}/sweeps"  # the connection reaper_sweeps: sweep_store_settings()


def redis_argv(port: int) -> list[str]:
    """A Redis broker on ``127.0.0.1:port`` that keeps nothing on disk."""
    return [server_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]


def storage_emulator_argv(port: int) -> list[str]:
    """gcp-storage-emulator on ``127.0.0.1:port``, in memory, with the sweep store's bucket."""
    argv = [server_binary("gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(port)]
    return [*argv, "--in-memory", "--default-bucket", SWEEP_BUCKET, "-q"]


def sweep_store_settings(port: int) -> dict[str, str]:
    """What every process needs to reach :data:`SWEEP_STORE` on the storage emulator on ``port``."""
    extra = {"is_anonymous": True, "project": "reaper-local", "gcs.endpoint": f"http://127.0.0.1:{port}"}
    return {
        "AIRFLOW_CONN_REAPER_SWEEPS": json.dumps({"conn_type": "google_cloud_platform", "extra": extra}),
        # gcsfs otherwise probes the bucket type over gRPC, which the emulator does not speak (60 s a call)
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }


def worker_hostname() -> str:
    """``[core] hostname_callable`` of the workers started here: the name each was given, else the FQDN."""
    return os.environ.get(WORKER_NAME) or socket.getfqdn()


@dataclass(frozen=True)
class Component:
    """One process to start: ``name`` for its log file and pid, its command line and environment."""

    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class Deployment:
    """One Airflow installation on this machine: a metadata DB in PostgreSQL, one home, one api-server.

    ``settings`` are more environment variables for every process (``AIRFLOW__...`` options,
    ``AIRFLOW_CONN_...`` connections). ``broker_url`` (Redis) is needed for the CeleryExecutor.
    """

    home: Path
    database_url: str  # SQLAlchemy URL of the metadata DB: postgresql+psycopg://user:password@host:port/db
    reaper_config: Path
    users: dict[str, str]  # login -> password, all admins
    executor: str = "LocalExecutor"
    broker_url: str = ""
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    jwt_secret: str = field(default_factory=lambda: secrets.token_hex(32))  # 64 bytes: SHA-512 wants no fewer

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, executor: str | None = None) -> dict[str, str]:
        """What every component of this deployment runs with (never a user's own ``AIRFLOW_*`` variables)."""
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps(self.users))
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        executor = executor or self.executor
        env = {
            **inherited,
            # components start further `airflow` subprocesses: the venv's bin first on PATH
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__EXECUTOR": executor,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{user}:admin" for user in self.users),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "REAPER_CONFIG": str(self.reaper_config),
        }
        if executor == "CeleryExecutor":
            if not self.broker_url:
                raise ValueError("the CeleryExecutor needs a broker_url (redis://host:port/db)")
            env |= {
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+"
                + self.database_url.replace("postgresql+psycopg://", "postgresql+psycopg2://"),
                "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            }
        return env | self.settings

    def airflow(self, *args: str) -> list[str]:
        return [server_binary("airflow"), *args]

    def setup(self) -> list[list[str]]:
        """Run once, in order, before the components: the metadata DB and the reaper's pools."""
        return [
            self.airflow("db", "migrate"),
            self.airflow("pools", "import", str(ROOT / "include/airflow/pools.json")),
        ]

    def servers(self) -> list[Component]:
        """The api-server and the dag-processor: they outlive a scheduler swapped for another executor's."""
        env = self.env()
        return [
            Component("api-server", self.airflow("api-server", "-p", str(self.port)), env),
            Component("dag-processor", self.airflow("dag-processor"), env),
        ]

    def scheduler(self, executor: str | None = None) -> Component:
        return Component("scheduler", self.airflow("scheduler"), self.env(executor))

    def workers(self, count: int) -> list[Component]:
        """``count`` Celery workers, each one task slot, its own home, temporary directory, log port and name."""
        workers = []
        for index in range(1, count + 1):
            name = f"reaper-worker-{index}"
            home = self.home / "workers" / name
            (home / "tmp").mkdir(parents=True, exist_ok=True)
            env = self.env("CeleryExecutor") | {
                "AIRFLOW_HOME": str(home),
                "TMPDIR": str(home / "tmp"),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.worker_hostname",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                WORKER_NAME: name,
            }
            argv = self.airflow("celery", "worker", "--celery-hostname", f"{name}@%h", "--without-gossip")
            workers.append(Component(name, [*argv, "--without-mingle"], env))
        return workers
