"""Evidence-decoder fuzz for writer health: generated wire answers, read over HTTP.

Every form the Prometheus API's JSON can carry goes through a fake server to the
real ``PrometheusWriterHealth``, and the policy's ``writer_hold`` judges each
project. The generator tags what it builds (is this answer complete, which pair
does this series belong to, which finite value does this sample document), so
the oracle never re-parses the wire with the decoder's own rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NamedTuple, cast

import pytest
from hypothesis import event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from reaper.config import WriterHealthConfig, parse_settings
from reaper.gce.writer_health import PrometheusWriterHealth
from reaper.model import WriterRecord
from reaper.policy.gce import writer_hold
from tests.integration.fake_prometheus import FakePrometheus

SETTINGS = parse_settings({}, "test")
NOW = 1_800_000_000.0
STALE_BEFORE = NOW - SETTINGS.gce.writer_stale_after.total_seconds()
FUTURE_AFTER = NOW + SETTINGS.gce.clock_skew.total_seconds()
MANAGERS, PROJECTS = ("m1", "m2", "m3"), tuple(f"p{i}" for i in range(1, 7))
MISSING = "<absent>"  # a key left out of the JSON
Pair = tuple[str, str]


class Series(NamedTuple):
    json: dict[str, object]
    pair: Pair | None  # None: no non-empty manager and project label, cannot be attributed
    value: float | None  # the finite value of a documented [unix_time, "decimal"] sample, else None


class Answer(NamedTuple):
    code: int
    body: object  # JSON-able, or raw bytes
    complete: bool  # HTTP 200, success, vector, no warnings, every series attributed
    series: list[Series]


# Documented last passes cluster around the stale and future thresholds; failed passes around 0.
last_values = st.one_of(
    st.sampled_from([STALE_BEFORE - 1, STALE_BEFORE, NOW - 60, NOW, FUTURE_AFTER, FUTURE_AFTER + 1]),
    st.floats(STALE_BEFORE - 600, FUTURE_AFTER + 600),
)
failed_values = st.sampled_from([0.0, 0.0, 0.0, -0.0, 1.0, 2.5, -1.0, 1e-9])
# How a Go or Python number may be printed: Prometheus writes plain decimals, others exponents.
FORMATS = ["{:.0f}", "{!r}", "{:.3f}", "{:e}", "{:E}", "{:.12g}"]
# Values that are not a finite decimal string: non-finite, padded, non-ASCII digits, Python-only
# syntax, and JSON that is not a string at all (numbers, null, bool, nested).
UNDOCUMENTED = [
    *("NaN", "nan", "+Inf", "-Inf", "Inf", "infinity", "1e999", "-1e999"),
    *("", " 12", "12 ", "\u0661\u0662", "\uff11\uff12", "1_000", "0x10", "1,5"),
    *(0, 12, -1, 1.5, NOW, None, True, {"v": "1"}, ["1"]),
]
# Samples that are not the documented [unix_time, "value"] pair.
SHAPES: dict[str, Callable[[float, object], object]] = {
    "time-only": lambda at, v: [at],
    "triple": lambda at, v: [at, v, v],
    "time-as-string": lambda at, v: [str(at), v],
    "time-bool": lambda at, v: [True, v],
    "time-null": lambda at, v: [None, v],
    "object": lambda at, v: {"0": at, "1": v},
    "null": lambda at, v: None,
    "absent": lambda at, v: MISSING,
}
UNATTRIBUTABLE = [
    {"project": "p1"},
    {"manager": "m1"},
    {"manager": "", "project": "p1"},
    {"manager": "m1", "project": ""},
    {"manager": 7, "project": "p1"},
    {"manager": "m1", "project": None},
    None,
    MISSING,
]
# Each turns a documented answer into one that proves nothing as a whole: (HTTP status, body).
FAULTS: dict[str, Callable[[dict[str, Any]], tuple[int, object]]] = {  # a documented body, as JSON
    "http 503": lambda b: (503, {"status": "error", "errorType": "unavailable", "error": "overloaded"}),
    "http 422 with data": lambda b: (422, b),
    "status error": lambda b: (200, {**b, "status": "error"}),
    "status absent": lambda b: (200, {k: v for k, v in b.items() if k != "status"}),
    "status null": lambda b: (200, {**b, "status": None}),
    "matrix": lambda b: (200, {**b, "data": {**b["data"], "resultType": "matrix"}}),
    "scalar": lambda b: (200, {**b, "data": {**b["data"], "resultType": "scalar"}}),
    "resultType absent": lambda b: (200, {**b, "data": {"result": b["data"]["result"]}}),
    "warnings": lambda b: (200, {**b, "warnings": ["partial response: store 10.0.0.7:10901 unreachable"]}),
    "warnings blank": lambda b: (200, {**b, "warnings": [""]}),
    "warnings null": lambda b: (200, {**b, "warnings": None}),
    "warnings string": lambda b: (200, {**b, "warnings": "store unreachable"}),
    "data null": lambda b: (200, {**b, "data": None}),
    "result object": lambda b: (200, {**b, "data": {**b["data"], "result": {}}}),
    "html": lambda b: (200, b"<html>sign in</html>"),
    "array": lambda b: (200, b"[]"),
}
FAULT_KINDS = sorted(FAULTS) + [
    kind for kind in FAULTS if kind.startswith("warnings")
]  # partial answers twice as often


@st.composite
def samples(draw: st.DrawFn, values: st.SearchStrategy[float]) -> tuple[object, float | None]:
    """A sample and, when it is documented and finite, its value. Mostly documented, so that an
    anomaly is usually the only one in its project and decides the project's hold alone."""
    at = draw(st.one_of(st.integers(0, 2 * 10**9), st.floats(0, 2e9)))
    form = draw(st.integers(0, 7))  # 0-5 documented, 6 a bad value, 7 a bad shape
    value: object
    if form != 6:
        text = draw(st.sampled_from(FORMATS)).format(draw(values))
        value, finite = text, float(text)
    else:
        value, finite = draw(st.sampled_from(UNDOCUMENTED)), None
    if form != 7:
        return [at, value], finite
    return SHAPES[draw(st.sampled_from(sorted(SHAPES)))](at, value), None


@st.composite
def series(draw: st.DrawFn, values: st.SearchStrategy[float], project: str) -> Series:
    """A series of the project; two of one manager in one answer are duplicates."""
    pair = (draw(st.sampled_from(MANAGERS)), project)
    sample, value = draw(samples(values))
    doc = {"metric": {"manager": pair[0], "project": project}, "value": sample}
    return Series({k: v for k, v in doc.items() if v != MISSING}, pair, value)


@st.composite
def answers(draw: st.DrawFn, values: st.SearchStrategy[float]) -> Answer:
    """Zero to two series per project, sometimes a series no label attributes, sometimes a fault."""
    drawn = [draw(series(values, project)) for project in PROJECTS for _ in range(draw(st.integers(0, 2)))]
    if draw(st.integers(0, 5)) == 5:
        metric = draw(st.sampled_from(UNATTRIBUTABLE))
        stray = {k: v for k, v in (("metric", metric), ("value", [NOW, "0"])) if v != MISSING}
        drawn.insert(draw(st.integers(0, len(drawn))), Series(stray, None, None))
    body: dict[str, object] = {"status": "success", "data": {"resultType": "vector", "result": [s.json for s in drawn]}}
    roll = draw(st.integers(0, 9))
    if roll >= 8:
        code, wire = FAULTS[draw(st.sampled_from(FAULT_KINDS))](body)
        return Answer(code, wire, False, drawn)
    if roll == 7:
        body["warnings"] = []  # documented as present only when there are warnings; empty carries none
    return Answer(200, body, all(s.pair for s in drawn), drawn)


def expected(project: str, last: list[Series], failed: list[Series]) -> str:
    """What the documented rules make of one project, given complete answers.

    A pair is unknown when it has two series in one answer, a sample that is not
    documented with a finite value, or a negative failed-pass count, or a last
    pass without its failed-pass series. Otherwise a
    failed pass, or a last pass outside [stale, future], is unhealthy; a project
    with no last pass at all (only zero failed-pass counts, or no series) has only
    dead managers (no record).
    """
    mine = [(s, "last") for s in last if s.pair[1] == project] + [(s, "failed") for s in failed if s.pair[1] == project]
    if max(Counter((s.pair, which) for s, which in mine).values(), default=0) > 1:
        return "writer_health_unknown"
    if any(s.value is None or (which == "failed" and s.value < 0) for s, which in mine):
        return "writer_health_unknown"
    counted = {s.pair for s, which in mine if which == "failed"}
    if any(which == "last" and s.pair not in counted for s, which in mine):  # a wrong name would hide failures
        return "writer_health_unknown"
    # No value is None past the check above.
    failing = any(which == "failed" and cast(float, s.value) > 0 for s, which in mine)
    out_of_window = any(
        which == "last" and not STALE_BEFORE <= cast(float, s.value) <= FUTURE_AFTER for s, which in mine
    )
    if failing or out_of_window:
        return "writer_unhealthy"
    return "healthy" if any(which == "last" for _, which in mine) else "dead"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    yield server
    server.close()


@given(last=answers(last_values), failed=answers(failed_values))
@hsettings(max_examples=60, deadline=None, database=None)
def test_writer_health_is_healthy_only_on_documented_answers(
    fake: FakePrometheus, last: Answer, failed: Answer
) -> None:
    """Oracle: the generator knows whether each answer is complete (HTTP 200, ``success``,
    ``vector``, ``warnings`` absent or empty, every series with a non-empty manager and
    project label) and, per series, its pair and the finite value its documented
    ``[unix_time, "decimal"]`` sample carries (``None`` for any other form).

    - The source reads as ``None`` exactly when an answer is not complete.
    - Otherwise each project's hold is exactly what ``expected`` derives from those tags:
      healthy (records present, no hold) only when every series of the project is
      documented, unique per pair and answer, fresh and not failing; ``writer_health_unknown``
      when any is not documented, duplicated or a negative count; a dead manager (no
      record) only on a documented zero failed-pass count without a last pass;
      ``writer_unhealthy`` for documented failing, stale or future writers.

    ``NOW`` sits among the generated last-pass values, so a documented fresh pass is healthy.
    """
    fake.answer(last.body, failed.body, (last.code, failed.code))
    records = PrometheusWriterHealth(WriterHealthConfig(prometheus_url=fake.url, timeout=timedelta(seconds=5))).read()
    if not (last.complete and failed.complete):
        event("source unknown")
        assert records is None
        return
    assert records is not None and len(fake.queries) == 2
    for project in PROJECTS:
        want = expected(project, last.series, failed.series)
        event(want)
        mine: list[WriterRecord] = [r for r in records if r.project == project]
        hold = writer_hold(mine, SETTINGS, NOW)[0]
        if want == "healthy":
            assert mine and hold is None
        elif want == "dead":
            assert mine == []
        else:
            assert hold == want, (project, mine)
