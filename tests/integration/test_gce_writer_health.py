"""Writer health read from a real Prometheus that scrapes simulated managers, and from a fake
Prometheus API that puts on the wire what Thanos, Mimir or federation can send (partial answers,
non-finite samples, duplicate or unattributable series)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from include.emulators.gce.manager import FAILED_PASSES, LAST_PASS, ManagerSimulator, manager_clients
from include.emulators.http import free_port
from reaper.config import WriterHealthConfig, parse_settings
from reaper.gce.writer_health import PrometheusWriterHealth
from reaper.model import Evidence, GceInstance, Phase, WriterRecord
from reaper.policy import evaluate
from reaper.policy.gce import writer_hold
from tests.builders import HB
from tests.helpers.gce import add_instance
from tests.integration.fake_prometheus import FakePrometheus, series, vector
from tests.integration.prometheus import Prometheus

SETTINGS = parse_settings({}, "test")
NOW = time.time()


def stale_instance_verdicts(records: list[WriterRecord] | None, projects: list[str], now: float) -> dict[str, str]:
    """Project -> how the policy decides one instance of it whose heartbeat is past the quarantine, with
    these writer-health records: what a sweep would do with a dead manager's leftovers there."""
    beat = str(int(now - 5 * 3600))
    fleet = [
        GceInstance(p, "us-east1-b", f"vm-{p}", str(i), "RUNNING", {"ci_ephemeral": "true", HB: beat}, now - 86400)
        for i, p in enumerate(projects, 1)
    ]
    evidence = Evidence(writer_health=records, swept=frozenset(("gce", p) for p in projects))
    plan = evaluate(fleet, evidence, SETTINGS, Phase.ENFORCEMENT, datetime.fromtimestamp(now, UTC))
    return {d.resource.project: f"{d.action.value} {d.reason}" for d in plan.decisions}


def test_ok_failing_stale_and_dead_writers(gce, tmp_path: Path) -> None:
    fleet, clients = gce
    for project in ("p-ok", "p-failing", "p-stale", "p-dead"):
        add_instance(fleet, project, "us-east1-b", "vm")
    add_instance(fleet, "p-dead", "us-east1-b", "vm-alive")
    fleet.faults.deny_set_labels.add("p-failing")
    writes = manager_clients(clients.host)  # the managers' own caller name
    managers = {
        "ok": ManagerSimulator("m-ok", "p-ok", writes, [("us-east1-b", "vm")], interval=0.5),
        "failing": ManagerSimulator("m-failing", "p-failing", writes, [("us-east1-b", "vm")], interval=0.5),
        # Its passes succeed, but its clock says an hour ago: a wedged writer whose last pass is old.
        "stale": ManagerSimulator(
            "m-stale", "p-stale", writes, [("us-east1-b", "vm")], interval=0.5, clock=lambda: time.time() - 3600
        ),
        "dead": ManagerSimulator("m-dead", "p-dead", writes, [("us-east1-b", "vm")], interval=0.5),
        # Another manager of the dead one's project, still reporting: the source answers for p-dead.
        "alive": ManagerSimulator("m-alive", "p-dead", writes, [("us-east1-b", "vm-alive")], interval=0.5),
    }
    ports = {key: m.serve_metrics(free_port()) for key, m in managers.items()}
    for m in managers.values():
        m.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports.values()])
    try:
        # Two samples of every failed-pass counter: increase() answers for each manager (none is unknown).
        prom.wait_for(f"increase({FAILED_PASSES}_total[15m])", lambda r: len(r) == 5)
        prom.wait_for(f"increase({FAILED_PASSES}_total[15m]) > 0", lambda r: len(r) == 1)
        managers["dead"].kill()
        prom.wait_for(LAST_PASS, lambda r: len(r) == 4)  # the dead manager's series went stale

        config = WriterHealthConfig(prometheus_url=prom.url)
        read = PrometheusWriterHealth(config).read()
        records = {r.manager: r for r in read}
        assert set(records) == {"m-ok", "m-failing", "m-stale", "m-alive"}
        now = time.time()
        assert records["m-ok"].project == "p-ok" and not records["m-ok"].failing
        assert records["m-ok"].last_pass == pytest.approx(now, abs=10)
        assert records["m-failing"].failing
        assert records["m-stale"].last_pass == pytest.approx(now - 3600, abs=10) and not records["m-stale"].failing

        settings = parse_settings({}, "test")
        by_project = lambda p: [r for r in records.values() if r.project == p]  # noqa: E731
        assert writer_hold(by_project("p-ok"), settings, now) == (None, [])
        assert writer_hold(by_project("p-failing"), settings, now)[0] == "writer_unhealthy"
        assert writer_hold(by_project("p-stale"), settings, now)[1][0]["problem"] == "stale"
        assert writer_hold(by_project("p-dead"), settings, now) == (None, [])  # m-dead is dead: not a hold
        projects = ["p-ok", "p-failing", "p-stale", "p-dead"]
        assert stale_instance_verdicts(read, projects, now) == {
            "p-ok": "delete heartbeat_stale",
            "p-failing": "report writer_unhealthy",
            "p-stale": "report writer_unhealthy",
            "p-dead": "delete heartbeat_stale",  # the dead manager's leftovers are reaped
        }

        # A typo in the metric name: Prometheus answers no series, which is no proof that anyone died.
        typo = WriterHealthConfig(prometheus_url=prom.url, last_pass_metric=LAST_PASS.removesuffix("_seconds"))
        wrong = PrometheusWriterHealth(typo).read()
        assert stale_instance_verdicts(wrong, projects, now) == {
            "p-ok": "report writer_health_unknown",  # was delete: every manager read as dead
            "p-failing": "report writer_unhealthy",  # its failing passes still show
            "p-stale": "report writer_health_unknown",
            "p-dead": "report writer_health_unknown",
        }
    finally:
        for m in managers.values():
            m.kill()
        prom.stop()


def test_prometheus_down_means_unknown() -> None:
    config = WriterHealthConfig(prometheus_url=f"http://127.0.0.1:{free_port()}", timeout=timedelta(seconds=2))
    assert PrometheusWriterHealth(config).read() is None


def test_prometheus_error_answer_means_unknown(tmp_path: Path) -> None:
    prom = Prometheus(tmp_path, [])
    try:
        config = WriterHealthConfig(prometheus_url=prom.url, last_pass_metric="not a (valid query")
        assert PrometheusWriterHealth(config).read() is None
    finally:
        prom.stop()


# --- a fake Prometheus API: answers a real Prometheus does not give on demand --------------------


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    yield server
    server.close()


def read(fake: FakePrometheus) -> list[WriterRecord] | None:
    return PrometheusWriterHealth(WriterHealthConfig(prometheus_url=fake.url, timeout=timedelta(seconds=2))).read()


def hold(records: list[WriterRecord] | None, project: str) -> str | None:
    """The project's writer hold, as the policy decides it from these records at ``NOW``."""
    of_project = None if records is None else [r for r in records if r.project == project]
    return writer_hold(of_project, SETTINGS, NOW)[0]


def assert_unknown_pair(records: list[WriterRecord] | None, manager: str, project: str) -> None:
    """The pair is reported, as one record whose ``last_pass`` is NaN: present but unknown."""
    assert records is not None
    mine = [r for r in records if r.project == project]
    assert [(r.manager, r.failing) for r in mine] == [(manager, False)]
    assert math.isnan(mine[0].last_pass)


def test_documented_answer_is_read_with_two_queries(fake: FakePrometheus) -> None:
    fake.answer(
        vector(series("m-ok", "p-ok", f"{NOW - 60:.3f}", NOW), series("m-failing", "p-failing", "1.7e9", NOW)),
        vector(
            series("m-ok", "p-ok", "0", NOW),
            series("m-failing", "p-failing", "2", NOW),
            series("m-never", "p-never", "1", NOW),  # fails every pass: reports, so not dead
            series("m-dead", "p-dead", "0", NOW),  # its last-pass series went stale: dead
        ),
    )
    records = read(fake)
    assert records == [
        WriterRecord("m-failing", "p-failing", 1.7e9, True),
        WriterRecord("m-never", "p-never", 0.0, True),
        WriterRecord("m-ok", "p-ok", round(NOW - 60, 3), False),
    ]
    assert len(fake.queries) == 2
    assert hold(records, "p-ok") is None
    assert hold(records, "p-failing") == hold(records, "p-never") == "writer_unhealthy"
    # p-dead's only manager died: no series answers for the project, and silence proves nothing.
    assert hold(records, "p-dead") == "writer_health_unknown"


def test_a_dead_manager_beside_one_that_reports_is_no_hold(fake: FakePrometheus) -> None:
    fake.answer(
        vector(series("m-alive", "p-1", f"{NOW - 60:.3f}", NOW)),
        vector(series("m-alive", "p-1", "0", NOW), series("m-dead", "p-1", "0", NOW)),  # m-dead's last pass went
    )
    records = read(fake)
    assert [r.manager for r in records] == ["m-alive"]
    assert stale_instance_verdicts(records, ["p-1"], NOW) == {"p-1": "delete heartbeat_stale"}


@pytest.mark.parametrize("metric", ["last_pass_metric", "failed_passes_metric"])
def test_a_wrong_metric_name_holds_every_project(fake: FakePrometheus, metric: str) -> None:
    fake.answer(
        vector(series("m-1", "p-1", f"{NOW - 60:.3f}", NOW), series("m-2", "p-2", f"{NOW - 60:.3f}", NOW)),
        vector(series("m-1", "p-1", "0", NOW), series("m-2", "p-2", "0", NOW)),
    )
    assert stale_instance_verdicts(read(fake), ["p-1", "p-2"], NOW) == dict.fromkeys(
        ["p-1", "p-2"], "delete heartbeat_stale"
    )
    typo = WriterHealthConfig(
        prometheus_url=fake.url,
        timeout=timedelta(seconds=2),
        **cast(dict[str, Any], {metric: "runner_manager_heartbeat_typo"}),
    )
    records = PrometheusWriterHealth(typo).read()
    verdicts = stale_instance_verdicts(records, ["p-1", "p-2"], NOW)
    # Wrong last-pass name: every manager would read as dead. Wrong failed-pass name: every failing one as healthy.
    assert verdicts == dict.fromkeys(["p-1", "p-2"], "report writer_health_unknown")
    assert records == [] if metric == "last_pass_metric" else all(math.isnan(r.last_pass) for r in records)


@pytest.mark.parametrize("partial", ["last", "failed"])
def test_answer_with_warnings_means_source_unknown(
    fake: FakePrometheus, partial: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Thanos answers with the failing manager's store unreachable. Its series are simply missing,
    so read as complete the answer makes it a dead manager and its live VMs get reaped."""
    warning = {"warnings": ["partial response: store 10.0.0.7:10901 unreachable"]}
    last = vector(series("m-ok", "p-ok", str(int(NOW)), NOW), **(warning if partial == "last" else {}))
    failed = vector(series("m-ok", "p-ok", "0", NOW), **(warning if partial == "failed" else {}))
    fake.answer(last, failed)
    with caplog.at_level(logging.WARNING, logger="reaper.gce.writer_health"):
        records = read(fake)
    assert records is None
    assert hold(records, "p-failing") == hold(records, "p-ok") == "writer_health_unknown"
    assert "10.0.0.7:10901 unreachable" in caplog.text


def test_empty_warnings_list_is_a_complete_answer(fake: FakePrometheus) -> None:
    fake.answer(
        vector(series("m-ok", "p-ok", str(NOW), NOW), warnings=[]),
        vector(series("m-ok", "p-ok", "0", NOW), warnings=[]),
    )
    records = read(fake)
    assert records == [WriterRecord("m-ok", "p-ok", NOW, False)]
    assert hold(records, "p-ok") is None


# Sample values that are no finite Prometheus sample value (Python's float() takes most of them).
BAD_VALUES = ["NaN", "nan", "+Inf", "-Inf", "1e999", "", " 12", "12 ", "\u0661\u0662", "1_0", "0x10", 12, None, {}]
# Samples that are not the documented [unix_time, "value"] pair; v is the value that would pass.
BAD_SAMPLES = {
    "time-only": lambda v: [NOW],
    "triple": lambda v: [NOW, v, v],
    "time-as-string": lambda v: [str(NOW), v],
    "time-bool": lambda v: [True, v],
    "time-null": lambda v: [None, v],
    "object": lambda v: {"0": NOW, "1": v},
    "null": lambda v: None,
}
UNUSABLE = [pytest.param(lambda v, bad=bad: [NOW, bad], id=repr(bad)) for bad in BAD_VALUES] + [
    pytest.param(build, id=name) for name, build in BAD_SAMPLES.items()
]


@pytest.mark.parametrize("query", ["last", "failed"])
@pytest.mark.parametrize("sample", UNUSABLE)
def test_unusable_sample_makes_its_pair_unknown(fake: FakePrometheus, query: str, sample) -> None:
    """A NaN compares false to every threshold, so a NaN writer passed for healthy. The
    good values are a fresh last pass and no failed pass: any misreading of the bad one as them is
    a healthy writer."""
    good = {"last": str(int(NOW)), "failed": "0"}
    answers = {q: [series("m-ok", "p-ok", v, NOW), series("m-bad", "p-bad", v, NOW)] for q, v in good.items()}
    answers[query][1]["value"] = sample(good[query])
    fake.answer(vector(*answers["last"]), vector(*answers["failed"]))
    records = read(fake)
    assert_unknown_pair(records, "m-bad", "p-bad")
    assert hold(records, "p-bad") == "writer_health_unknown"
    assert hold(records, "p-ok") is None


def test_negative_failed_pass_count_makes_its_pair_unknown(fake: FakePrometheus) -> None:
    """``increase()`` of a counter is never negative: the series is not what it claims to be."""
    fake.answer(vector(series("m-1", "p-1", str(NOW), NOW)), vector(series("m-1", "p-1", "-1", NOW)))
    records = read(fake)
    assert_unknown_pair(records, "m-1", "p-1")
    assert hold(records, "p-1") == "writer_health_unknown"


@pytest.mark.parametrize(
    ("query", "values"),
    [("last", [str(NOW - 7200), str(NOW)]), ("last", [str(NOW), str(NOW)]), ("failed", ["3", "0"])],
)
def test_duplicate_series_make_their_pair_unknown(fake: FakePrometheus, query: str, values: list[str]) -> None:
    """Two series for one pair (relabelling, federation) contradict or shadow each other: neither wins."""
    twice = [series("m-1", "p-dup", v, NOW) for v in values]
    last = [
        series("m-ok", "p-ok", str(NOW), NOW),
        *(twice if query == "last" else [series("m-1", "p-dup", str(NOW), NOW)]),
    ]
    failed = [series("m-ok", "p-ok", "0", NOW), *(twice if query == "failed" else [series("m-1", "p-dup", "0", NOW)])]
    fake.answer(vector(*last), vector(*failed))
    records = read(fake)
    assert_unknown_pair(records, "m-1", "p-dup")
    assert hold(records, "p-dup") == "writer_health_unknown"
    assert hold(records, "p-ok") is None


@pytest.mark.parametrize("query", ["last", "failed"])
@pytest.mark.parametrize(
    "metric",
    [
        {"project": "p-1"},
        {"manager": "m-1"},
        {"manager": "", "project": "p-1"},  # an empty label is an absent label in Prometheus
        {"manager": "m-1", "project": ""},
        {"manager": 7, "project": "p-1"},
        None,
    ],
)
def test_unattributable_series_means_source_unknown(
    fake: FakePrometheus, query: str, metric: object, caplog: pytest.LogCaptureFixture
) -> None:
    """The series may be the only report of some project's failing writer: no project is known complete."""
    stray = {"metric": metric, "value": [NOW, str(NOW) if query == "last" else "0"]}
    last = vector(series("m-ok", "p-ok", str(NOW), NOW), *([stray] if query == "last" else []))
    failed = vector(series("m-ok", "p-ok", "0", NOW), *([stray] if query == "failed" else []))
    fake.answer(last, failed)
    with caplog.at_level(logging.WARNING, logger="reaper.gce.writer_health"):
        records = read(fake)
    assert records is None
    assert hold(records, "p-ok") == "writer_health_unknown"
    assert "label" in caplog.text


@pytest.mark.parametrize(
    ("code", "body"),
    [
        pytest.param(503, {"status": "error", "errorType": "unavailable", "error": "overloaded"}, id="http-503"),
        pytest.param(200, b"<html>proxy login</html>", id="html"),
        pytest.param(200, b"[]", id="array"),
        pytest.param(
            200,
            b'{"status": "success", "data": {"resultType": "vector", "result": ['
            b'{"metric": {"manager": "m-ok", "project": "p-ok"}, "value": [1, NaN]}]}}',
            id="nan-literal",  # Python's json takes it, JSON does not
        ),
        pytest.param(
            200,
            b'{"status": "success", "status": "error", "data": {"resultType": "vector", "result": []}}',
            id="key-twice",
        ),
        pytest.param(200, {"status": "error", "data": {"resultType": "vector", "result": []}}, id="status-error"),
        pytest.param(200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, id="matrix"),
        pytest.param(200, {"status": "success", "data": None}, id="data-null"),
        pytest.param(200, {"status": "success", "data": {"resultType": "vector", "result": {}}}, id="result-object"),
    ],
)
def test_unreadable_answer_means_source_unknown(fake: FakePrometheus, code: int, body: object) -> None:
    fake.answer(body, vector(series("m-ok", "p-ok", "0", NOW)), (code, 200))
    records = read(fake)
    assert records is None
    assert hold(records, "p-ok") == "writer_health_unknown"


def test_a_manager_without_a_failed_pass_series_is_unknown_even_beside_one_with_it() -> None:
    """Two managers of project p report last passes; only A exports the failed-pass counter (B runs a build that
    renamed it, or its relabelling drops it): B's failures are invisible, so its health is unknown, not healthy."""
    from reaper.config import parse_settings
    from reaper.gce.writer_health import _join
    from reaper.policy.gce import writer_hold

    now = time.time()
    records = _join({("mgr-a", "p"): now - 30, ("mgr-b", "p"): now - 30}, {("mgr-a", "p"): 0.0})
    assert writer_hold(records, parse_settings({}, "test"), now)[0] == "writer_health_unknown"
