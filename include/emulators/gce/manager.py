"""A runner manager that only does what the reaper depends on: stamp a heartbeat on the instances it tracks.

Each pass refreshes ``runner_manager_heartbeat`` on every tracked instance
through ``setLabels`` (read the instance, write with its ``labelFingerprint``),
spread over the interval with bounded concurrency; the label only advances on a
successful write. It exports, per (manager, project), the end of its last fully
successful pass, and counters of passes and of failed passes, as Prometheus metrics.

Two failure modes of the seed design: ``kill()`` (the manager dies: no more
writes and no more metrics), and writes that fail while the manager keeps
reporting (the emulator's ``deny_set_labels`` answers 403, like lost IAM).

Run: ``python -m include.emulators.gce.manager --endpoint http://127.0.0.1:8085
--name mgr-a --project p --instance us-east1-b/runner-1 --metrics-port 9101``.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from google.cloud import compute_v1
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from reaper.gce.clients import ComputeClients, compute_clients

log = logging.getLogger(__name__)
LAST_PASS = "runner_manager_heartbeat_last_pass_timestamp_seconds"
FAILED_PASSES = "runner_manager_heartbeat_failed_passes"  # prometheus_client adds _total
PASSES = "runner_manager_heartbeat_passes"  # every pass, failed or not: the alerts' denominator


class ManagerSimulator:
    def __init__(
        self,
        name: str,
        project: str,
        clients: ComputeClients,
        instances: list[tuple[str, str]],
        interval: float = 60.0,
        concurrency: int = 4,
        heartbeat_label: str = "runner_manager_heartbeat",
        clock=time.time,  # type: ignore[no-untyped-def]
    ) -> None:
        self.name, self.project, self.clients = name, project, clients
        self.instances = list(instances)  # (zone, instance name)
        self.interval, self.concurrency, self.heartbeat_label, self.clock = (
            interval,
            concurrency,
            heartbeat_label,
            clock,
        )
        self.registry = CollectorRegistry()
        labels = ("manager", "project")
        self.last_pass = Gauge(
            LAST_PASS, "End of the last pass in which every heartbeat write succeeded", labels, registry=self.registry
        ).labels(name, project)
        self.failed_passes = Counter(
            FAILED_PASSES, "Passes in which a heartbeat write failed", labels, registry=self.registry
        ).labels(name, project)
        self.failed_passes.inc(0)
        self.passes = Counter(PASSES, "Heartbeat passes, failed or not", labels, registry=self.registry).labels(
            name, project
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics_server = None

    def write(self, zone: str, instance: str) -> bool:
        """Stamp the current time on one instance; True only when the write was accepted."""
        target = {"project": self.project, "zone": zone, "instance": instance}
        try:
            current = self.clients.instances.get(**target, retry=None, timeout=10)
            labels = dict(current.labels)
            labels[self.heartbeat_label] = str(int(self.clock()))
            request = compute_v1.InstancesSetLabelsRequest(labels=labels, label_fingerprint=current.label_fingerprint)
            self.clients.instances.set_labels_unary(
                **target, instances_set_labels_request_resource=request, retry=None, timeout=10
            )
            return True
        except Exception as exc:
            log.info("manager %s: heartbeat write to %s failed: %s", self.name, instance, exc)
            return False

    def run_pass(self, spread: float = 0.0) -> bool:
        """One pass over every tracked instance, starts spread over ``spread`` seconds."""
        step = spread / max(1, len(self.instances))
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = []
            for i, (zone, instance) in enumerate(self.instances):
                if i and step:
                    self._stop.wait(step)
                if self._stop.is_set():
                    return False
                futures.append(pool.submit(self.write, zone, instance))
            ok = all(f.result() for f in futures)
        self.passes.inc()
        if ok:
            self.last_pass.set(self.clock())
        else:
            self.failed_passes.inc()
        return ok

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> int:
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._metrics_server = server
        return server.server_port

    def start(self) -> ManagerSimulator:
        def loop() -> None:
            while not self._stop.is_set():
                started = time.monotonic()
                self.run_pass(spread=self.interval * 0.8)
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

        self._thread = threading.Thread(target=loop, name=f"manager-{self.name}", daemon=True)
        self._thread.start()
        return self

    def kill(self) -> None:
        """The manager dies: its writes stop and its metrics endpoint disappears."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="Compute API endpoint, e.g. the emulator's")
    parser.add_argument("--name", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--instance", action="append", default=[], metavar="ZONE/NAME")
    parser.add_argument("--interval", type=float, default=60.0)
    parser.add_argument("--metrics-port", type=int, default=9101)
    args = parser.parse_args()
    instances = [tuple(spec.split("/", 1)) for spec in args.instance]
    manager = ManagerSimulator(
        args.name, args.project, compute_clients(api_endpoint=args.endpoint), instances, args.interval
    )  # type: ignore[arg-type]
    port = manager.serve_metrics(args.metrics_port)
    print(f"manager {args.name} tracking {len(instances)} instances, metrics on :{port}", flush=True)
    manager.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        manager.kill()


if __name__ == "__main__":
    main()
