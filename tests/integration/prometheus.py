"""Starts a real Prometheus (Debian's ``prometheus``) on loopback for a test, scraping given targets (and
evaluating a rules file, when given one)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import requests

from include.emulators.http import free_port, wait_until


class Prometheus:
    def __init__(
        self, workdir: Path, targets: list[str], scrape_interval: str = "1s", rules: Path | None = None
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run scripts/bootstrap.sh (make test does)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {scrape_interval}, evaluation_interval: {scrape_interval}}}\n"
            f"scrape_configs:\n  - job_name: managers\n    static_configs:\n      - targets: {targets!r}\n"
            + (f"rule_files: [{str(rules)!r}]\n" if rules else "")
        )
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "prometheus.log").open("w"),
        )
        try:
            ready = f"{self.url}/-/ready"
            log = workdir / "prometheus.log"
            wait_until(lambda: requests.get(ready, timeout=1).ok, f"prometheus ({log})", 30, self.process)
        except TimeoutError:
            self.stop()
            raise

    def wait_for(self, query: str, predicate, timeout: float = 20.0):
        """Poll an instant query until ``predicate(result)`` holds; return the result."""
        deadline = time.time() + timeout
        result = None
        while time.time() < deadline:
            body = requests.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=5).json()
            result = body["data"]["result"]
            if predicate(result):
                return result
            time.sleep(0.3)
        raise AssertionError(f"{query}: condition not met within {timeout}s, last result {result}")

    def wait_for_writers(self, count: int, timeout: float = 20.0) -> None:
        """Until ``count`` heartbeat writers each have a last pass and a failed-pass count the reaper can read:
        ``increase()`` answers for a counter only from its second sample on, and until then the writer's
        project reads as unknown (a failed-pass metric the project lacks could hide a failing writer)."""
        self.wait_for("runner_manager_heartbeat_last_pass_timestamp_seconds > 0", lambda r: len(r) == count, timeout)
        self.wait_for("increase(runner_manager_heartbeat_failed_passes_total[1m])", lambda r: len(r) == count, timeout)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
