"""A SimpleAuthManager whose users may be limited to some DAGs: the audit view's per-DAG filter, tested.

Airflow's SimpleAuthManager grants by role only (and by team in multi-team mode), so a user who may
read some DAGs but not others needs an auth manager that says so; production ones (FAB, Keycloak)
do. Configured through ``AIRFLOW__CORE__AUTH_MANAGER`` for the API server the browser test starts;
``REAPER_TEST_READABLE_DAGS`` names, per user, the only DAGs they may read (``user=dag1,dag2;...``).
"""

from __future__ import annotations

import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


def readable() -> dict[str, set[str]]:
    """user -> the DAGs they may read; users not named are not limited."""
    spec = os.environ.get("REAPER_TEST_READABLE_DAGS", "")
    return {user: set(dags.split(",")) for user, _, dags in (p.partition("=") for p in spec.split(";") if p)}


class SomeDagsAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        limited = readable().get(user.get_name())
        if limited is not None and details is not None and details.id is not None and details.id not in limited:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
