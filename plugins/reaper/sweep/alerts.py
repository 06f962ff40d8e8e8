"""Failure alerts of the sweep DAGs: an Airflow notifier on every task and DAG run failure.

By default the alert is an ERROR log line that names the DAG, the task and the
error (log-based alerting picks it up); with ``alerts.email`` set, Airflow's SMTP
notifier mails it through ``alerts.smtp_conn_id`` as well.
"""

from __future__ import annotations

import logging

from airflow.sdk import Context
from airflow.sdk.bases.notifier import BaseNotifier

from reaper.config import AlertsConfig

log = logging.getLogger("reaper.alerts")


class LogNotifier(BaseNotifier):
    """Logs the failure at ERROR, with what an on-call person needs to find it."""

    template_fields = ()

    def notify(self, context: Context) -> None:
        ti = context.get("ti") or context.get("task_instance")
        run = context.get("dag_run")
        log.error(
            "reaper sweep failed: dag=%s run=%s task=%s error=%s",
            getattr(run, "dag_id", None) or getattr(ti, "dag_id", "?"),
            getattr(run, "run_id", "?"),
            getattr(ti, "task_id", "-"),
            context.get("exception") or context.get("reason") or "see the task log",
        )


def notifiers(config: AlertsConfig) -> list[BaseNotifier]:
    found: list[BaseNotifier] = [LogNotifier()]
    if config.email:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        found.append(
            SmtpNotifier(
                to=config.email,
                smtp_conn_id=config.smtp_conn_id,
                subject="[reaper] {{ dag.dag_id }} failed",
                html_content="Reaper sweep {{ dag.dag_id }} run {{ run_id }} failed in "
                "{{ ti.task_id if ti else 'the DAG run' }}. See the task log and the ledger.",
            )
        )
    return found
