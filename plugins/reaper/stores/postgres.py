"""Step results from Postgres ``step_runs``: one query per batch of runs.

A step attempt is terminal only when its status is terminal and its results are
durable (or it failed); the policy decides that from (status, results present).
A batch that errors or times out makes its step attempts unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import psycopg
from psycopg import sql

from reaper.config import PostgresStepStoreConfig
from reaper.model import Keyed, step_key

log = logging.getLogger(__name__)


def postgres_connect(conn_id: str, timeout: float) -> Callable[[], psycopg.Connection]:
    """A connection factory for the Airflow connection ``conn_id``, with connect and statement timeouts."""
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    # Not get_uri(): it is SQLAlchemy-flavoured ("postgresql+psycopg://"), which psycopg refuses.
    conn = PostgresHook(postgres_conn_id=conn_id).get_connection(conn_id)
    params = {
        "host": conn.host or "127.0.0.1",
        "port": conn.port or 5432,
        "user": conn.login,
        "password": conn.password,
        "dbname": conn.schema or "postgres",
        "connect_timeout": max(1, int(timeout)),
        "options": f"-c statement_timeout={int(timeout * 1000)}",
    }
    return lambda: psycopg.connect(**{k: v for k, v in params.items() if v is not None})


class PostgresStepStore:
    def __init__(self, connect: Callable[[], psycopg.Connection], config: PostgresStepStoreConfig) -> None:
        self.connect, self.config = connect, config
        c = config
        self.query = sql.SQL(
            "SELECT {run}, {step}, {attempt}, {status}, {results} IS NOT NULL FROM {table} WHERE {run} = ANY(%s)"
        ).format(
            run=sql.Identifier(c.run_column),
            step=sql.Identifier(c.step_column),
            attempt=sql.Identifier(c.attempt_column),
            status=sql.Identifier(c.status_column),
            results=sql.Identifier(c.results_column),
            table=sql.Identifier(*c.table.split(".")),
        )

    def read(self, attempts: Iterable[tuple[str, str, str]]) -> Keyed[tuple[str, bool]]:
        """State of each wanted (run, step, attempt); rows not returned are provably absent."""
        by_run: dict[str, list[str]] = {}
        for run, step, attempt in attempts:
            by_run.setdefault(run, []).append(step_key(run, step, attempt))
        runs = sorted(by_run)
        known: dict[str, tuple[str, bool]] = {}
        failed: set[str] = set()
        size = self.config.batch_size
        batches = [runs[i : i + size] for i in range(0, len(runs), size)]
        try:
            with self.connect() as conn:
                for batch in batches:
                    try:
                        with conn.transaction(), conn.cursor() as cur:
                            cur.execute(self.query, [batch])
                            for run, step, attempt, status, has_results in cur:
                                known[step_key(str(run), str(step), str(attempt))] = (str(status), bool(has_results))
                    except psycopg.Error as exc:
                        log.warning("step_runs batch of %d runs unknown: %s", len(batch), exc)
                        failed.update(k for run in batch for k in by_run[run])
        except psycopg.Error as exc:
            log.warning("step_runs unreadable: %s", exc)
            failed.update(k for keys in by_run.values() for k in keys)
        return Keyed(known=known, failed=frozenset(failed), complete=True)
