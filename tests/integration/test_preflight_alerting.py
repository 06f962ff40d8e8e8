"""``reaper check`` against the Prometheus that evaluates the reaper's alerts (``metrics.prometheus_url``): a real
Prometheus with the generated rules loaded, scraping a stand-in for kube-state-metrics and the runner managers.

A selector that matches no series validates and its alert can then never fire; a Prometheus without the rules
lists no alert. Both are one failed line naming the key, not "all is well".
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reaper.alert_rules import render
from reaper.preflight import _alerting
from tests.builders import settings
from tests.integration.prometheus import Prometheus

EXPOSITION = b"""# TYPE kube_pod_container_status_restarts_total counter
kube_pod_container_status_restarts_total{cluster="runner-managers-1",namespace="ci",pod="m1",container="runner"} 0
kube_pod_container_status_restarts_total{cluster="runner-managers-1",namespace="ci",pod="log-1",container="agent"} 4
# TYPE gitlab_runner_autoscaling_actions_total counter
gitlab_runner_autoscaling_actions_total{cluster="runner-managers-1",executor="docker+machine",action="created"} 5
"""


@pytest.fixture(scope="module")
def exporter():
    """One scrape target with the managers' and kube-state-metrics' series (labels as a cluster's Prometheus adds)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(EXPOSITION)

        def log_message(self, *args: object) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def _prometheus(tmp_path, target: str, with_rules: bool) -> Prometheus:
    rules = tmp_path / "reaper-rules.yml"
    rules.write_text(render(settings(), "the defaults"))
    prom = Prometheus(tmp_path, [target], rules=rules if with_rules else None)
    prom.wait_for("kube_pod_container_status_restarts_total", lambda r: len(r) == 2)
    return prom


def _lines(**metrics: object) -> dict[str, tuple[bool, str]]:
    # honor_labels is off in this scrape: the exporter's labels stay as they are (no exported_ prefix clash).
    return {c.key: (c.ok, c.found) for c in _alerting(settings(metrics=metrics))}


def test_the_rules_loaded_and_each_cause_selector_matching_series_pass(tmp_path, exporter) -> None:
    prom = _prometheus(tmp_path, exporter, with_rules=True)
    try:
        found = _lines(prometheus_url=prom.url)
        ok, says = found["metrics.prometheus_url"]
        assert ok and "reaper alert rules" in says
        ok, says = found["cause_alerts.manager_pods"]
        assert ok and says.startswith("1 series match")  # the manager, not the logging agent
        assert found["cause_alerts.runner_managers"][0]
        # A container selector that matches no manager: RunnerManagerCrashLooping could never fire.
        cfg = settings(
            metrics={"prometheus_url": prom.url}, cause_alerts={"manager_pods": {"container": "gitlab-runner"}}
        )
        lines = {c.key: (c.ok, c.found) for c in _alerting(cfg)}
        ok, says = lines["cause_alerts.manager_pods"]
        assert not ok and "no series matches" in says and "its alert can never fire" in says
    finally:
        prom.stop()


def test_a_prometheus_without_the_reapers_rules_fails_naming_the_key(tmp_path, exporter) -> None:
    prom = _prometheus(tmp_path, exporter, with_rules=False)
    try:
        ok, says = _lines(prometheus_url=prom.url)["metrics.prometheus_url"]
        assert not ok and "has none of the reaper's alert rules loaded" in says
        unreachable = _lines(prometheus_url="http://reaper:s3cret@127.0.0.1:1")
        ok, says = unreachable["metrics.prometheus_url"]
        assert not ok and "did not answer /api/v1/rules" in says and "s3cret" not in says
    finally:
        prom.stop()
