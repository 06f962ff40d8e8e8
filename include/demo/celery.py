"""``make demo EXECUTOR=celery``: the same demo on the CeleryExecutor, with two workers that share no disk.

``airflow standalone`` always runs the LocalExecutor, so here the demo starts Airflow's components itself
(:mod:`include.airflow_components`: api-server, scheduler, dag-processor, two Celery workers, each worker
with its own home and temporary directory), a Redis broker, and ``gcp-storage-emulator`` for the sweep
files, which go to ``gs://`` as on a real deployment. Every process is recorded in ``.demo/pids.json``
like the demo's others, so ``make demo-down`` stops them.
"""

from __future__ import annotations

from collections.abc import Callable

from include import airflow_components
from include.airflow_components import Component, Deployment
from include.emulators.http import free_port, listening

SWEEP_STORE = airflow_components.SWEEP_STORE
WORKERS = 2
Start = Callable[..., object]  # include.demo.__main__.start


def services(start: Start) -> tuple[str, dict[str, str]]:
    """Redis and the Cloud Storage emulator; the broker URL and what every Airflow process needs for the store."""
    redis_port, store_port = free_port(), free_port()
    start("redis", airflow_components.redis_argv(redis_port), "Redis", lambda: listening(redis_port))
    storage = airflow_components.storage_emulator_argv(store_port)
    start("storage", storage, "gcp-storage-emulator", lambda: listening(store_port))
    return f"redis://127.0.0.1:{redis_port}/0", airflow_components.sweep_store_settings(store_port)


def components(deployment: Deployment) -> list[Component]:
    """What the demo starts once the metadata DB is ready: the api-server first, then the rest."""
    return [*deployment.servers(), deployment.scheduler(), *deployment.workers(WORKERS)]
