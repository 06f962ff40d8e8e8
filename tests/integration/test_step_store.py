"""The Postgres step store against a real PostgreSQL: pods' labels match ``step_runs`` rows by value.

Each case is a table a real deployment could have. A miss is read by the policy as "no row": the
store must never answer for a key it did not match by value, nor match one it should not.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
import pytest

from reaper.config import PostgresStepStoreConfig
from reaper.stores.postgres import PostgresStepStore

COLUMNS = {"run_id": "text", "step": "text", "attempt": "integer", "status": "text", "results": "jsonb"}


def make_table(dsn: str, rows: Sequence[tuple[object, ...]], **types: str | None) -> None:
    """A ``step_runs`` table with the default columns, ``types`` overriding (``None`` drops a column)."""
    columns = {**COLUMNS, **types}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE step_runs ({', '.join(f'{c} {t}' for c, t in columns.items() if t)})")
        for row in rows:
            conn.execute(f"INSERT INTO step_runs VALUES ({', '.join(['%s'] * len(row))})", row)


def store(dsn: str, **config: Any) -> PostgresStepStore:
    return PostgresStepStore(lambda: psycopg.connect(dsn), PostgresStepStoreConfig(**config))


RUNNING = ("r1", "build", 1, "running", None)

# --- labels match rows by value, never by their str() -------------------------


@pytest.mark.parametrize(
    ("types", "label"),
    [
        ({}, "01"),  # leading zeros: attempt 1
        ({"step": "char(16)"}, "1"),  # stored blank-padded
        ({"run_id": "char(12)"}, "1"),
        ({"run_id": "varchar(12)", "step": "varchar(16)"}, "1"),
        ({"attempt": "numeric(4,1)"}, "1"),  # stored as 1.0
        ({"attempt": "numeric(4,1)"}, "001"),
        ({"attempt": "smallint"}, "1"),
        ({"attempt": "bigint"}, "1"),
        ({"attempt": "numeric"}, "1"),
    ],
)
def test_running_row_matches_by_value(postgres, types, label) -> None:
    make_table(postgres, [RUNNING], **types)
    answer = store(postgres).read([("r1", "build", label)])
    assert answer.known == {f"r1/build/{label}": ("running", False)}
    assert answer.failed == set()


@pytest.mark.parametrize("label", ["abc", "", "1.5", " 1", "1 ", "+1", "-1", "1\n", "١", "١٢", "0x1"])
def test_malformed_attempt_label_is_unknown_not_absent(postgres, label) -> None:
    make_table(postgres, [RUNNING])
    answer = store(postgres).read([("r1", "build", label), ("r1", "build", "1")])
    assert answer.failed == {f"r1/build/{label}"}
    assert answer.known == {"r1/build/1": ("running", False)}


def test_other_attempt_row_is_not_this_attempt(postgres) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", '{"a": 1}')])
    answer = store(postgres).read([("r1", "build", "2")])
    assert answer.known == {}  # absent: attempt 1's row never answers for attempt 2
    assert answer.failed == set()
    assert answer.complete


@pytest.mark.parametrize("attempt_type", ["smallint", "numeric(4,1)"])
def test_attempt_label_out_of_column_range_is_absent(postgres, attempt_type) -> None:
    make_table(postgres, [RUNNING], attempt=attempt_type)
    answer = store(postgres).read(
        [("r1", "build", "9" * 63), ("r1", "build", "0" * 62 + "1"), ("r1", "build", "1" * 64)]
    )
    assert answer.known == {"r1/build/" + "0" * 62 + "1": ("running", False)}
    assert answer.failed == {"r1/build/" + "1" * 64}  # longer than any label value: malformed, not absent


def test_fractional_attempt_row_matches_no_label(postgres) -> None:
    make_table(postgres, [("r1", "build", 1.5, "succeeded", '{"a": 1}')], attempt="numeric(4,1)")
    answer = store(postgres).read([("r1", "build", "1"), ("r1", "build", "2")])
    assert answer.known == {} and answer.failed == set()


def test_only_requested_keys_are_answered(postgres) -> None:
    make_table(postgres, [RUNNING, ("r1", "test", 1, "succeeded", '{"a": 1}'), ("r2", "build", 1, "failed", None)])
    answer = store(postgres).read([("r1", "build", "1")])
    assert answer.known == {"r1/build/1": ("running", False)}


def test_padded_label_does_not_match_trimmed_row(postgres) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", '{"a": 1}')], step="char(16)")
    answer = store(postgres).read([("r1", "build ", "1"), ("r1 ", "build", "1")])
    assert answer.known == {}


# --- items 3-5: JSON null, duplicates, char(n) status ------------------------------------------


@pytest.mark.parametrize(("results_type", "value"), [("jsonb", "null"), ("json", "null"), ("json", " null ")])
def test_json_null_results_are_not_durable(postgres, results_type, value) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", value)], results=results_type)
    assert store(postgres).read([("r1", "build", "1")]).known == {"r1/build/1": ("succeeded", False)}


@pytest.mark.parametrize("value", ['{"a": {"b": [null]}}', "[]", "false", "0", '""'])
def test_non_null_json_results_are_durable(postgres, value) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", value)], results="json")
    assert store(postgres).read([("r1", "build", "1")]).known == {"r1/build/1": ("succeeded", True)}


@pytest.mark.parametrize(
    "other",
    [("r1", "build", 1, "running", None), ("r1", "build", 1, "succeeded", "null"), ("r1", "build", 1, None, None)],
)
def test_disagreeing_duplicates_are_unknown(postgres, other) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", '{"a": 1}'), other])
    answer = store(postgres).read([("r1", "build", "1")])
    assert answer.failed == {"r1/build/1"}
    assert answer.known == {}


def test_duplicates_equal_by_value_agree(postgres) -> None:
    rows = [("r1", "build ", 1, "succeeded", '{"a": 1}'), ("r1", "build", 1.0, "succeeded  ", '{"b": 2}')]
    make_table(postgres, rows, step="char(8)", attempt="numeric(4,1)", status="char(12)")
    answer = store(postgres).read([("r1", "build", "1")])
    assert answer.known == {"r1/build/1": ("succeeded", True)}


def test_null_status_is_unknown(postgres) -> None:
    make_table(postgres, [("r1", "build", 1, None, '{"a": 1}')])
    assert store(postgres).read([("r1", "build", "1")]).failed == {"r1/build/1"}


@pytest.mark.parametrize("status_type", ["char(12)", "varchar(12)"])
def test_status_is_its_trimmed_text(postgres, status_type) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", '{"a": 1}')], status=status_type)
    assert store(postgres).read([("r1", "build", "1")]).known == {"r1/build/1": ("succeeded", True)}


# --- item 2: the schema is checked before the table is trusted ---------------------------------


TEXT, NUMBER, JSON = "text, varchar or char(n)", "smallint, integer, bigint or numeric", "json or jsonb"


@pytest.mark.parametrize(
    ("column", "type_", "value", "found", "expected"),
    [
        ("run_id", "integer", "1", "integer", TEXT),
        ("step", "name", "build", "name", TEXT),
        ("attempt", "text", "1", "text", NUMBER),
        ("attempt", "double precision", "1", "double precision", NUMBER),
        ("status", "integer", "1", "integer", TEXT),
        ("results", "text", "{}", "text", JSON),
        ("results", "jsonb[]", '{"{}"}', "jsonb[]", JSON),
        ("results", None, None, "missing", JSON),
        ("attempt", None, None, "missing", NUMBER),
    ],
)
def test_schema_mismatch_makes_every_key_unknown(postgres, caplog, column, type_, value, found, expected) -> None:
    row = {"run_id": "1", "step": "build", "attempt": "1", "status": "succeeded", "results": "{}", column: value}
    make_table(postgres, [], **{column: type_})
    with psycopg.connect(postgres, autocommit=True) as conn:
        present = {c: v for c, v in row.items() if v is not None}
        conn.execute(
            f"INSERT INTO step_runs ({', '.join(present)}) VALUES ({', '.join(['%s'] * len(present))})",
            list(present.values()),
        )
    with caplog.at_level(logging.WARNING, logger="reaper.stores.postgres"):
        answer = store(postgres).read([("1", "build", "1"), ("2", "x", "1")])
    assert answer.failed == {"1/build/1", "2/x/1"}
    assert answer.known == {}
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "step_runs" in line and f"column {column}" in line and found in line and expected in line


def test_missing_table_makes_every_key_unknown(postgres, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="reaper.stores.postgres"):
        answer = store(postgres, table="ci.step_runs").read([("r1", "build", "1")])
    assert answer.failed == {"r1/build/1"}
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "ci.step_runs" in line and "not found" in line


def test_nondeterministic_collation_is_a_mismatch(postgres, caplog) -> None:
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
    make_table(postgres, [("r1", "Build", 1, "succeeded", '{"a": 1}')], step='text COLLATE "ci"')
    with caplog.at_level(logging.WARNING, logger="reaper.stores.postgres"):
        answer = store(postgres).read([("r1", "build", "1")])
    assert answer.failed == {"r1/build/1"}  # "Build" = "build" under that collation
    assert "column step" in caplog.text and "deterministic" in caplog.text


def test_view_is_read_and_materialized_view_is_not(postgres, caplog) -> None:
    make_table(postgres, [("r1", "build", 1, "succeeded", '{"a": 1}')])
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE VIEW live AS SELECT * FROM step_runs")
        conn.execute("CREATE MATERIALIZED VIEW snapshot AS SELECT * FROM step_runs")
    assert store(postgres, table="live").read([("r1", "build", "1")]).known == {"r1/build/1": ("succeeded", True)}
    with caplog.at_level(logging.WARNING, logger="reaper.stores.postgres"):
        assert store(postgres, table="snapshot").read([("r1", "build", "1")]).failed == {"r1/build/1"}
    assert "snapshot is not a table or view" in caplog.text


def test_schema_qualified_table_and_custom_columns(postgres) -> None:
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA ci")
        conn.execute("CREATE TABLE step_runs (run_id int, step int, attempt text, status int, results text)")
        conn.execute("CREATE TABLE ci.step_runs (run text, name char(8), n bigint, state varchar(16), out json)")
        conn.execute("INSERT INTO ci.step_runs VALUES ('r1', 'build', 1, 'succeeded', '{}')")
    names = {"run_column": "run", "step_column": "name", "attempt_column": "n", "status_column": "state"}
    answer = store(postgres, table="ci.step_runs", results_column="out", **names).read([("r1", "build", "1")])
    assert answer.known == {"r1/build/1": ("succeeded", True)}


class CountingCursor(psycopg.Cursor):
    executed: ClassVar[list[str]] = []

    def execute(self, query, params=None, **kwargs):
        CountingCursor.executed.append(str(query))
        return super().execute(query, params, **kwargs)


def test_schema_checked_once_per_store_and_one_query_per_batch(postgres) -> None:
    make_table(postgres, [RUNNING, ("r2", "build", 1, "failed", None), ("r3", "build", 1, "succeeded", "{}")])
    CountingCursor.executed = []
    config = PostgresStepStoreConfig(batch_size=2)
    steps = PostgresStepStore(lambda: psycopg.connect(postgres, cursor_factory=CountingCursor), config)
    wanted = [("r1", "build", "1"), ("r2", "build", "1"), ("r3", "build", "1"), ("r3", "test", "1")]
    expected = {"r1/build/1": ("running", False), "r2/build/1": ("failed", False), "r3/build/1": ("succeeded", True)}
    assert steps.read(wanted).known == expected
    assert len(CountingCursor.executed) == 3  # the check, then 2 batches of at most 2 runs
    assert steps.read(wanted).known == expected
    assert len(CountingCursor.executed) == 5  # the check is not repeated


def test_column_changed_after_the_check_makes_keys_unknown(postgres) -> None:
    make_table(postgres, [RUNNING])
    steps = store(postgres)
    assert steps.read([("r1", "build", "1")]).known == {"r1/build/1": ("running", False)}
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("ALTER TABLE step_runs ALTER COLUMN results TYPE text")
        conn.execute("UPDATE step_runs SET status = 'succeeded', results = '{\"a\": 1}'")
    assert steps.read([("r1", "build", "1")]).failed == {"r1/build/1"}
