"""``reaper_config_check``: validates the reaper config, logs each phase's effective rule modes, and runs the
preflight against the live systems (``reaper check``, :mod:`reaper.preflight`).

Manual trigger only; the first step of a deployment. The config check reads the config file only;
the preflight then reaches every connection the config names (one page of a listing at most, no
writes) and fails the task when any check fails, each failure one log line naming the config key and
what was found. It never deletes anything; the sweeping DAGs come from the DAG factory.
It also says loudly what the config leaves unguarded (no step store: step results
are not checked for durability before a sandbox is reaped) or unwatched (no
Pushgateway: no sweep pushes the metrics the alerts read), and which phase of each
target is active.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task


@dag(
    dag_id="reaper_config_check",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["reaper"],
    default_args={"retries": 0, "retry_delay": timedelta(seconds=5)},
    doc_md=__doc__,
)
def reaper_config_check() -> None:
    @task
    def check_config() -> dict[str, dict[str, str]]:
        # Imported in the task, not at parse time: parsing a DAG file must do no I/O.
        import logging

        from reaper.config import load_config
        from reaper.model import Mode, Phase
        from reaper.policy.modes import effective_modes
        from reaper.sweep.factory import executors, refuse_unshared_store

        config = load_config()
        log = logging.getLogger("reaper.config_check")
        if config.k8s.enabled and config.k8s.step_store == "none" and config.rules.sandbox_orphan != Mode.OFF:
            log.warning(
                "k8s.step_store is none: step pods' results are NOT checked for durability before their sandbox "
                "is reaped (docs/design.md §5, row 7); set k8s.step_store: postgres if your runs have step pods"
            )
        if not config.metrics.pushgateway_url:
            log.warning(
                "metrics.pushgateway_url is empty: no sweep pushes metrics, so no reaper alert can fire but "
                "ReaperNotReporting; set it to your Pushgateway (the rules: `reaper alert-rules`)"
            )
        names = executors()
        refuse_unshared_store(config, names)
        log.info("executors %s, sweep store %s: accepted", ", ".join(names), config.airflow.sweep_store)
        for target in ("gce", "k8s"):
            if getattr(config, target).enabled:
                phase = getattr(config.rollout, target)
                log.info("%s: active phase %s (rollout.%s): only its DAG runs on the schedule", target, phase, target)
        return {phase.value: {r: str(m) for r, m in effective_modes(config, phase).items()} for phase in Phase}

    @task
    def preflight() -> list[str]:
        """Every connection, store, metric and project the config names, checked live (``reaper check``)."""
        import logging

        from airflow.sdk.exceptions import AirflowFailException

        from reaper.config import load_config
        from reaper.preflight import preflight as run_preflight

        log = logging.getLogger("reaper.preflight")
        checks = run_preflight(load_config())
        for check in checks:
            (log.info if check.ok else log.error)("%s", check.line())
        failed = [check.line() for check in checks if not check.ok]
        if failed:
            raise AirflowFailException(f"{len(failed)} preflight checks failed: " + "; ".join(failed))
        return [check.line() for check in checks]

    check_config() >> preflight()


reaper_config_check()
