"""``make demo EXECUTOR=celery``: the same demo on the CeleryExecutor, with two workers that share no disk.

``airflow standalone`` always runs the LocalExecutor, so here the demo starts Airflow's components itself
(:mod:`include.airflow_components`: api-server, scheduler, dag-processor, two Celery workers, each worker
with its own home and temporary directory), a Redis broker, and ``gcp-storage-emulator`` for the sweep
files, which go to ``gs://`` as on a real deployment. Every process is recorded in ``.demo/pids.json``
like the demo's others, so ``make demo-down`` stops them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from include.airflow_components import Component, Deployment
from include.emulators.http import free_port, listening, server_binary

BUCKET = "reaper-sweeps"
SWEEP_STORE = f"gs://reaper_sweeps@{BUCKET}/sweeps"  # the connection reaper_sweeps points at the emulator
WORKERS = 2
Start = Callable[..., object]  # include.demo.__main__.start


def services(start: Start) -> tuple[str, dict[str, str]]:
    """Redis and the Cloud Storage emulator; the broker URL and what every Airflow process needs for the store."""
    redis_port, store_port = free_port(), free_port()
    redis = [server_binary("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""]
    start("redis", redis, "Redis", lambda: listening(redis_port))
    storage = [server_binary("gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(store_port)]
    storage += ["--in-memory", "--default-bucket", BUCKET, "-q"]
    start("storage", storage, "gcp-storage-emulator", lambda: listening(store_port))
    extra = {"is_anonymous": True, "project": "reaper-demo", "gcs.endpoint": f"http://127.0.0.1:{store_port}"}
    settings = {
        "AIRFLOW_CONN_REAPER_SWEEPS": json.dumps({"conn_type": "google_cloud_platform", "extra": extra}),
        # gcsfs otherwise probes the bucket type over gRPC, which the emulator does not speak (60 s a call)
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }
    return f"redis://127.0.0.1:{redis_port}/0", settings


def components(deployment: Deployment) -> list[Component]:
    """What the demo starts once the metadata DB is ready: the api-server first, then the rest."""
    return [*deployment.servers(), deployment.scheduler(), *deployment.workers(WORKERS)]
