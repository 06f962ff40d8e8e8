"""Credentials written into the Prometheus or Pushgateway URL never reach a log line (review finding)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from reaper.config import WriterHealthConfig
from reaper.gce.writer_health import PrometheusWriterHealth
from reaper.metrics import PushedSweep, push_sweep
from reaper.redact import url_for_log

USERINFO = "reaper:s3cret%2FPw%2B%40%3A%25%3F"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://{USERINFO}@127.0.0.1:9091/x?token=t", "http://***@127.0.0.1:9091/x"),
        ("https://prom.example:9090", "https://prom.example:9090"),
        ("http://[::1", "<unparseable URL>"),
    ],
)
def test_url_for_log_drops_credentials_and_query(url: str, shown: str) -> None:
    assert url_for_log(url) == shown


def test_a_failed_push_logs_no_credentials(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    summary: dict[str, object] = {"scopes": [], "census": {}, "decisions": []}
    sweep = PushedSweep("gce", summary, {}, (), full=False, completed=False, started_at=0.0, finished_at=0.0)  # type: ignore[arg-type]  # a dict for the SweepSummary: a failed attempt's push reads none of it
    assert push_sweep(f"http://{USERINFO}@127.0.0.1:1", sweep, 1.0, []) == 1
    assert "s3cret" not in caplog.text and "metrics push to http://***@127.0.0.1:1 failed" in caplog.text


@pytest.mark.parametrize(
    "url",
    [f"http://{USERINFO}@127.0.0.1:1", f"http://{USERINFO}@127.0.0.1:99999", f"htp://{USERINFO}@x"],
    ids=["refused", "bad-port", "bad-scheme"],
)
def test_unreadable_writer_health_logs_no_credentials(caplog, url: str) -> None:
    caplog.set_level(logging.DEBUG)
    assert PrometheusWriterHealth(WriterHealthConfig(prometheus_url=url, timeout=timedelta(seconds=1))).read() is None
    assert "s3cret" not in caplog.text and "writer health from" in caplog.text
