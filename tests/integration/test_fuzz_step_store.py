"""Evidence-decoder fuzz: the Postgres step store against a real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from decimal import Decimal
from typing import cast

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.config import PostgresStepStoreConfig
from reaper.model import step_key
from reaper.stores.postgres import PostgresStepStore

TERMINAL = {"succeeded", "failed", "cancelled"}
TEXTS = ["text", "varchar(12)", "char(12)"]
NUMBERS = ["smallint", "integer", "bigint", "numeric", "numeric(4,1)"]
RUNS, STEPS = ["r1", "r2", "٣"], ["build", "test"]
LABELS = ["0", "1", "2", "01", "001", "abc", "", "1.5", " 1", "1 ", "١", "+1"]
RESULTS = [None, "null", " null ", '{"a": {"b": [1, null]}}', "[]", '""', "0", "false"]

PADS = [("", "")] * 4 + [("", " "), ("", "  "), (" ", "")]  # (before, after)

Layout = dict[str, str]
Row = tuple[str, str, object, str | None, str | None]  # run, step, attempt, status, results


def padded(values: list[str]) -> st.SearchStrategy[str]:
    """A value as a writer may store it: exact, blank-padded, or with a leading blank."""
    return st.builds(lambda v, pad: pad[0] + v + pad[1], st.sampled_from(values), st.sampled_from(PADS))


@st.composite
def cases(draw: st.DrawFn) -> tuple[Layout, list[Row], list[tuple[str, str, str]], int]:
    """A step_runs layout, its rows, the pods' (run, step, attempt label) and a batch size."""
    layout = {
        "run_id": draw(st.sampled_from(TEXTS)),
        "step": draw(st.sampled_from(TEXTS)),
        "attempt": draw(st.sampled_from([*NUMBERS, "text"])),
        "status": draw(st.sampled_from(TEXTS)),
        "results": draw(st.sampled_from(["json", "jsonb", "text"])),
    }
    attempts: list[object] = [None, 0, 1, 2]
    if layout["attempt"].startswith("numeric"):
        attempts += [Decimal("1.0"), Decimal("1.5")]
    elif layout["attempt"] == "text":
        attempts += ["01", "١"]
    row = st.tuples(
        padded(RUNS),
        padded(STEPS),
        st.sampled_from(attempts),
        st.one_of(st.none(), padded(["succeeded", "failed", "running", "Succeeded"])),
        st.sampled_from(RESULTS),
    )
    rows: list[Row] = draw(st.lists(row, max_size=6))
    if rows and bool(draw(st.booleans())):  # bool(): else mypy infers the draw from `rows`, a list
        rows.append(draw(st.sampled_from(rows)))  # an exact duplicate
    pods = st.tuples(st.sampled_from([*RUNS, "r1 "]), st.sampled_from([*STEPS, "build "]), st.sampled_from(LABELS))
    return layout, rows, draw(st.lists(pods, min_size=1, max_size=6)), draw(st.integers(1, 3))


def documented(layout: Layout) -> bool:
    return layout["attempt"] in NUMBERS and layout["results"] in ("json", "jsonb")


def stored_text(column_type: str, value: str | None) -> str | None:
    """A text column's value as SQL compares it with text: char(n) drops its trailing blanks."""
    return value.rstrip(" ") if value is not None and column_type.startswith("char") else value


def matching(layout: Layout, rows: list[Row], run: str, step: str, label: str) -> list[Row]:
    """The rows whose (run, step, attempt) equal the pod's labels by value."""
    number = int(label)
    return [
        r
        for r in rows
        if stored_text(layout["run_id"], r[0]) == run
        and stored_text(layout["step"], r[1]) == step
        and r[2] is not None
        and Decimal(cast("int | Decimal | str", r[2])) == number  # an attempt as cases() draws it
    ]


def canonical(label: str) -> bool:
    return label.isascii() and label.isdigit()


def durable(results: str | None) -> bool:
    return results is not None and json.loads(results) is not None


def model(layout: Layout, rows: list[Row], pods: list[tuple[str, str, str]]) -> tuple[dict, AbstractSet[str]]:
    """The answer the store must give: (known, failed); a key in neither has no row."""
    known, failed = {}, set()
    for run, step, label in pods:
        key = step_key(run, step, label)
        if not documented(layout) or not canonical(label):
            failed.add(key)
            continue
        found = matching(layout, rows, run, step, label)
        answers = {(stored_text(layout["status"], r[3]), durable(r[4])) for r in found}
        if len(answers) == 1 and None not in next(iter(answers)):
            known[key] = answers.pop()
        elif answers:
            failed.add(key)
    return known, failed


def vouched(layout: Layout, rows: list[Row], run: str, step: str, label: str, status: str) -> bool:
    """Whether the evidence proves this attempt terminal with durable results (the invariant)."""
    if not (documented(layout) and canonical(label) and status.lower() in TERMINAL):
        return False
    found = matching(layout, rows, run, step, label)
    distinct = {(stored_text(layout["status"], r[3]), durable(r[4])) for r in found}
    return distinct == {(status, True)}


def test_step_store_vouches_only_for_matching_durable_rows(postgres) -> None:
    """A key comes back (terminal status, durable) only when exactly one row value matches the pod's
    (run, step, attempt) by value (identical duplicates count as one), its results are neither SQL
    NULL nor JSON null, and the schema is the documented one; everything else is unknown, absent or
    not durable.

    The oracle is plain Python over the generated values, independent of SQL: text and varchar
    compare exactly, char(n) after dropping trailing blanks (leading blanks always count), the
    attempt by numeric value against a label that is ASCII digits (leading zeros allowed; "١",
    "1.5", " 1" are unknown), results through ``json.loads``. A text attempt or results column is a
    schema mismatch: every key unknown. Beyond the invariant, ``model`` predicts the exact answer, so
    a store that turned everything unknown fails too.
    """
    with psycopg.connect(postgres, autocommit=True) as conn:

        @settings(max_examples=35, deadline=None, database=None)
        @given(cases())
        def check(case: tuple[Layout, list[Row], list[tuple[str, str, str]], int]) -> None:
            layout, rows, pods, batch_size = case
            conn.execute("DROP TABLE IF EXISTS step_runs")
            conn.execute(f"CREATE TABLE step_runs ({', '.join(f'{c} {t}' for c, t in layout.items())})")
            values = ", ".join(f"%s::{t}" for t in layout.values())  # typed, whatever psycopg infers
            texts = [[None if v is None else str(v) for v in row] for row in rows]
            conn.cursor().executemany(f"INSERT INTO step_runs VALUES ({values})", texts)
            config = PostgresStepStoreConfig(batch_size=batch_size)
            answer = PostgresStepStore(lambda: psycopg.connect(postgres), config).read(pods)

            for run, step, label in pods:
                status, results_durable = answer.known.get(step_key(run, step, label), ("", False))
                if results_durable and status.lower() in TERMINAL:
                    assert vouched(layout, rows, run, step, label, status), (run, step, label)
            assert (answer.known, answer.failed) == model(layout, rows, pods)

        check()
