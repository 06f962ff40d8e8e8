"""Airflow DAGs: reaper sweeps of the gce target, one DAG per rollout phase, generated from include/reaper.yaml.

The task graph lives in plugins/reaper/sweep/factory.py. Pause and unpause these DAGs
to move the target through the rollout (telemetry -> ... -> enforcement).
"""

from reaper.config import load_config
from reaper.sweep.factory import build_dags

globals().update(build_dags(load_config(), "gce"))
