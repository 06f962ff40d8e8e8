"""Writer health read from a real Prometheus that scrapes simulated managers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from include.emulators.gce.manager import FAILED_PASSES, LAST_PASS, ManagerSimulator
from include.emulators.http import free_port
from reaper.config import WriterHealthConfig, parse_settings
from reaper.gce.writer_health import PrometheusWriterHealth
from reaper.policy.gce import writer_hold
from tests.integration.conftest import add_instance
from tests.integration.prometheus import Prometheus


def test_ok_failing_stale_and_dead_writers(gce, tmp_path: Path) -> None:
    fleet, clients = gce
    for project in ("p-ok", "p-failing", "p-stale", "p-dead"):
        add_instance(fleet, project, "us-east1-b", "vm")
    fleet.faults.deny_set_labels.add("p-failing")
    managers = {
        "ok": ManagerSimulator("m-ok", "p-ok", clients, [("us-east1-b", "vm")], interval=0.5),
        "failing": ManagerSimulator("m-failing", "p-failing", clients, [("us-east1-b", "vm")], interval=0.5),
        # Its passes succeed, but its clock says an hour ago: a wedged writer whose last pass is old.
        "stale": ManagerSimulator(
            "m-stale", "p-stale", clients, [("us-east1-b", "vm")], interval=0.5, clock=lambda: time.time() - 3600
        ),
        "dead": ManagerSimulator("m-dead", "p-dead", clients, [("us-east1-b", "vm")], interval=0.5),
    }
    ports = {key: m.serve_metrics(free_port()) for key, m in managers.items()}
    for m in managers.values():
        m.start()
    prom = Prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports.values()])
    try:
        prom.wait_for(f"{FAILED_PASSES}_total", lambda r: len(r) == 4)
        prom.wait_for(f"increase({FAILED_PASSES}_total[15m]) > 0", lambda r: len(r) == 1)
        managers["dead"].kill()
        prom.wait_for(LAST_PASS, lambda r: len(r) == 3)  # the dead manager's series went stale

        config = WriterHealthConfig(prometheus_url=prom.url)
        records = {r.manager: r for r in PrometheusWriterHealth(config).read()}
        assert set(records) == {"m-ok", "m-failing", "m-stale"}
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
        assert writer_hold(by_project("p-dead"), settings, now) == (None, [])  # dead: not a hold
    finally:
        for m in managers.values():
            m.kill()
        prom.stop()


def test_prometheus_down_means_unknown() -> None:
    config = WriterHealthConfig(prometheus_url=f"http://127.0.0.1:{free_port()}", timeout="2s")
    assert PrometheusWriterHealth(config).read() is None


def test_prometheus_error_answer_means_unknown(tmp_path: Path) -> None:
    prom = Prometheus(tmp_path, [])
    try:
        config = WriterHealthConfig(prometheus_url=prom.url, last_pass_metric="not a (valid query")
        assert PrometheusWriterHealth(config).read() is None
    finally:
        prom.stop()
