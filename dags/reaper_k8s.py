"""Airflow DAGs: reaper sweeps of the k8s target, one DAG per rollout phase, generated from include/reaper.yaml.

The task graph lives in plugins/reaper/sweep/factory.py. Only the phase named by
``rollout.k8s`` in the config runs on the schedule; the others are for manual triggers.
Move the rollout by changing that value, never by pausing DAGs.
"""

from reaper.config import load_config
from reaper.sweep.factory import build_dags

globals().update(build_dags(load_config(), "k8s"))
