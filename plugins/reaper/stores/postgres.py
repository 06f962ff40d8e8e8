"""Step results from Postgres ``step_runs``: one query per batch of runs.

A step attempt is terminal only when its status is terminal and its results are
durable (or it failed); the policy decides that from (status, results durable).
The policy reads a key missing from the answer as "no such row", so the store
answers only for what it matched by value: the pod's labels are compared with
the typed columns in SQL (``char(n)`` against text, an integer or numeric
attempt against the label's number), never as ``str()`` of the columns.
Anything it cannot vouch for is unknown: a malformed attempt label, a table
whose schema is not the documented one, disagreeing duplicate rows, a NULL
status, a batch that errors or times out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

import psycopg
from psycopg import sql

from reaper.config import PostgresStepStoreConfig
from reaper.model import Keyed, step_key

log = logging.getLogger(__name__)

_TEXT = (frozenset({"text", "varchar", "bpchar"}), "text, varchar or char(n)")
# Config attribute of each column -> (accepted pg_type names, what the warning says is expected).
SCHEMA: dict[str, tuple[frozenset[str], str]] = {
    "run_column": _TEXT,
    "step_column": _TEXT,
    "attempt_column": (frozenset({"int2", "int4", "int8", "numeric"}), "smallint, integer, bigint or numeric"),
    "status_column": _TEXT,
    "results_column": (frozenset({"json", "jsonb"}), "json or jsonb"),
}
# Tables and views; a materialized view is a snapshot and a foreign table compares remotely.
_RELKINDS = frozenset({"r", "p", "v"})

# ASCII digits only (str.isdigit and \d accept other scripts), bounded like a Kubernetes label value.
_ATTEMPT = re.compile(r"[0-9]{1,63}")

_COLUMNS = sql.SQL("""
SELECT c.relkind, a.attname, t.typname, format_type(a.atttypid, a.atttypmod), coalesce(o.collisdeterministic, true)
FROM pg_class c
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_collation o ON o.oid = a.attcollation
WHERE c.oid = to_regclass(%s)
""")

# Joins the requested (run, step, attempt) tuples to the rows by value; ``i`` maps a row back to its lookup.
_BATCH = """
SELECT w.i, t.{status}::text, coalesce({typeof}(t.{results}), 'null') <> 'null'
FROM unnest(%s::text[], %s::text[], %s::numeric[]) WITH ORDINALITY AS w(run, step, attempt, i)
JOIN {table} AS t ON t.{run} = w.run AND t.{step} = w.step AND t.{attempt} = w.attempt
"""

Lookup = tuple[str, str, str, int]  # key, run, step, attempt number
Answer = tuple[str | None, bool]


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


def attempt_number(label: str) -> int | None:
    """The attempt a label names: a canonical decimal integer, leading zeros allowed; else ``None``."""
    return int(label) if _ATTEMPT.fullmatch(label) else None


def lookups(attempts: Iterable[tuple[str, str, str]]) -> tuple[dict[str, Lookup], set[str]]:
    """The lookups to make by key, and the keys no lookup can answer (they are unknown, never absent).

    A label that is not a number, a NUL (text cannot hold it), or one key for two different
    tuples (``step_key`` joins with "/") cannot be asked without guessing which row is meant.
    """
    wanted: dict[str, Lookup] = {}
    unknown: set[str] = set()
    for run, step, label in attempts:
        key, number = step_key(run, step, label), attempt_number(label)
        if number is None or "\0" in run + step:
            unknown.add(key)
            continue
        lookup = (key, run, step, number)
        if wanted.setdefault(key, lookup) != lookup:
            unknown.add(key)
    return {k: r for k, r in wanted.items() if k not in unknown}, unknown


def schema_problem(table: str, rows: list[tuple[object, ...]], config: PostgresStepStoreConfig) -> str | None:
    """Why ``table`` (its ``pg_catalog`` rows) is not the documented step_runs schema, or ``None``."""
    if not rows:
        return f"step_runs table {table} not found"
    if rows[0][0] not in _RELKINDS:
        return f"step_runs table {table} is not a table or view (relkind {rows[0][0]!r})"
    columns = {name: (typname, shown, deterministic) for _, name, typname, shown, deterministic in rows}
    problems = []
    for attribute, (accepted, expected) in SCHEMA.items():
        name = getattr(config, attribute)
        typname, shown, deterministic = columns.get(name, (None, "missing", True))
        if typname not in accepted:
            problems.append(f"column {name} is {shown}, expected {expected}")
        elif not deterministic:
            problems.append(f"column {name} has a nondeterministic collation, expected a deterministic one")
    return f"step_runs table {table}: {'; '.join(problems)}" if problems else None


def _decide(answers: set[Answer]) -> tuple[str, bool] | None:
    """The one answer all matching rows agree on; ``None`` when they disagree or a status is NULL."""
    if len(answers) != 1:
        return None
    status, durable = next(iter(answers))
    return None if status is None else (status, durable)


class PostgresStepStore:
    def __init__(self, connect: Callable[[], psycopg.Connection], config: PostgresStepStoreConfig) -> None:
        self.connect, self.config = connect, config
        self.table = sql.Identifier(*config.table.split("."))
        # The batch query once the schema checked out, else why it did not: checked once per store.
        self.checked: sql.Composed | str | None = None

    def read(self, attempts: Iterable[tuple[str, str, str]]) -> Keyed[tuple[str, bool]]:
        """State of each wanted (run, step, attempt); a key in neither ``known`` nor ``failed`` has no row."""
        wanted, failed = lookups(attempts)
        known: dict[str, tuple[str, bool]] = {}
        if wanted:
            try:
                with self.connect() as conn:
                    query = self._query(conn)
                    if query is None:
                        failed.update(wanted)
                    else:
                        for batch in self._batches(wanted):
                            self._read_batch(conn, query, batch, known, failed)
            except psycopg.Error as exc:
                log.warning("step_runs unreadable: %s", exc)
                failed.update(key for key in wanted if key not in known)
        return Keyed(known=known, failed=frozenset(failed), complete=True)

    def schema_problem(self) -> str | None:
        """Why the table is not the documented step_runs schema (or cannot be read), or ``None``: the preflight."""
        try:
            with self.connect() as conn:
                self._query(conn)
        except psycopg.Error as exc:
            return f"step_runs table {self.config.table} unreadable: {type(exc).__name__}"
        return self.checked if isinstance(self.checked, str) else None

    def _query(self, conn: psycopg.Connection) -> sql.Composed | None:
        """The batch query for this table, or ``None`` (logged) when its schema is not the documented one."""
        if self.checked is None:
            with conn.transaction():
                rows = conn.execute(_COLUMNS, [self.table.as_string(conn)]).fetchall()
            types = {name: typname for _, name, typname, *_ in rows}
            problem = schema_problem(self.config.table, rows, self.config)
            self.checked = problem or self._batch_query(types[self.config.results_column])
        if isinstance(self.checked, str):
            log.warning("%s; every step attempt is unknown", self.checked)
            return None
        return self.checked

    def _batch_query(self, results_type: str) -> sql.Composed:
        """The query for a checked schema; ``{json,jsonb}_typeof`` fails, rather than guesses, on any other type."""
        c = self.config
        return sql.SQL(_BATCH).format(
            run=sql.Identifier(c.run_column),
            step=sql.Identifier(c.step_column),
            attempt=sql.Identifier(c.attempt_column),
            status=sql.Identifier(c.status_column),
            results=sql.Identifier(c.results_column),
            typeof=sql.Identifier("pg_catalog", f"{results_type}_typeof"),
            table=self.table,
        )

    def _batches(self, wanted: dict[str, Lookup]) -> list[list[Lookup]]:
        """The lookups grouped ``batch_size`` runs at a time."""
        by_run: dict[str, list[Lookup]] = {}
        for lookup in wanted.values():
            by_run.setdefault(lookup[1], []).append(lookup)
        runs, size = sorted(by_run), self.config.batch_size
        return [[r for run in runs[i : i + size] for r in by_run[run]] for i in range(0, len(runs), size)]

    def _read_batch(
        self,
        conn: psycopg.Connection,
        query: sql.Composed,
        batch: list[Lookup],
        known: dict[str, tuple[str, bool]],
        failed: set[str],
    ) -> None:
        """One query for the batch: each key gets the answer its matching rows agree on, or is unknown."""
        _, runs, steps, numbers = zip(*batch, strict=True)
        answers: dict[str, set[Answer]] = {}
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(query, [list(runs), list(steps), list(numbers)])
                for i, status, durable in cur:
                    answers.setdefault(batch[i - 1][0], set()).add((status, bool(durable)))
        except psycopg.Error as exc:
            log.warning("step_runs batch of %d step attempts unknown: %s", len(batch), exc)
            failed.update(key for key, *_ in batch)
            return
        for key, found in answers.items():
            answer = _decide(found)
            if answer is None:
                failed.add(key)
            else:
                known[key] = answer
