"""A runner manager reduced to what the reaper and its alerts read: heartbeats, machine creation, crash loops.

Each pass refreshes ``runner_manager_heartbeat`` on every tracked instance
through ``setLabels`` (read the instance, write with its ``labelFingerprint``),
spread over the interval with bounded concurrency; the label only advances on a
successful write. It exports, per (manager, project), the end of its last fully
successful pass, and counters of passes and of failed passes, as Prometheus metrics.

It also creates machines as docker-machine's google driver does (``instances.insert``),
counted under gitlab-runner's own name, and it crash-loops: the series the cause alerts
read (docs/design.md §10) come out of it as they come out of the real fleet.

The seed design's failure modes: ``kill()`` (the manager dies: no more writes and no
more metrics), writes that fail while the manager keeps reporting (the emulator's
``deny_set_labels`` answers 403, like lost IAM), and ``crash()``/``crash_loop()`` (OOM
restarts of its container: each one loses the machine store, so the machines it
tracked are abandoned; the emulator's ``instance_quota`` makes creations fail).

Its requests name it (``x-goog-api-client: runner-manager/...``, :func:`manager_clients`): they spend
the same per-project rate quotas as the reaper's (label writes and creations are mutations, the reads
before a write read requests), and the emulator's quota accounting tells the two apart. A creation the
quota refuses (403 ``rateLimitExceeded``) counts as ``creation-failed``, as any failed creation does.

Run: ``python -m include.emulators.gce.manager --endpoint http://127.0.0.1:8085
--name mgr-a --project p --instance us-east1-b/runner-1 --metrics-port 9101``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIServer

from google.cloud import compute_v1
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from reaper.gce.clients import ComputeClients, compute_clients

log = logging.getLogger(__name__)
USER_AGENT = "runner-manager/0.1.0"  # the caller the emulator's quota accounting names it by
LAST_PASS = "runner_manager_heartbeat_last_pass_timestamp_seconds"
FAILED_PASSES = "runner_manager_heartbeat_failed_passes"  # prometheus_client adds _total
PASSES = "runner_manager_heartbeat_passes"  # every pass, failed or not: the alerts' denominator
# What kube-state-metrics reports of the manager's container (internal/store/pod.go), served here with the
# manager's own metrics so that one scrape sees both; its labels are the pod's.
RESTARTS = "kube_pod_container_status_restarts"  # prometheus_client adds _total
# gitlab-runner's docker+machine provider (executors/docker/machine/provider.go): one counter per action,
# "created" or "creation-failed" for each docker-machine create, the executor as a constant label.
ACTIONS = "gitlab_runner_autoscaling_actions"  # prometheus_client adds _total
EXECUTOR = "docker+machine"


def manager_clients(api_endpoint: str | None = None) -> ComputeClients:
    """Compute clients that name the manager as their caller, not the reaper."""
    return compute_clients(api_endpoint=api_endpoint, user_agent=USER_AGENT)


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
        clock=time.time,
        namespace: str = "runner-managers",
        machine_labels: dict[str, str] | None = None,
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
        pod = ("namespace", "pod", "container")
        self.restarts = Counter(
            RESTARTS, "The number of container restarts per container.", pod, registry=self.registry
        ).labels(namespace, name, "runner")
        self.restarts.inc(0)
        actions = Counter(
            ACTIONS,
            "The total number of actions executed by the provider.",
            ("executor", "action"),
            registry=self.registry,
        )
        self.created, self.creation_failed = (
            actions.labels(EXECUTOR, "created"),
            actions.labels(EXECUTOR, "creation-failed"),
        )
        self.created.inc(0)
        self.creation_failed.inc(0)
        self.machine_labels = machine_labels if machine_labels is not None else {"ci_ephemeral": "true"}
        self._machines = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._crash_loop: threading.Thread | None = None
        self._metrics_server: WSGIServer | None = None

    def write(self, zone: str, instance: str) -> bool:
        """Stamp the current time on one instance; True only when the write was accepted."""
        try:
            current = self.clients.instances.get(
                project=self.project, zone=zone, instance=instance, retry=None, timeout=10
            )
            labels = dict(current.labels)
            labels[self.heartbeat_label] = str(int(self.clock()))
            request = compute_v1.InstancesSetLabelsRequest(labels=labels, label_fingerprint=current.label_fingerprint)
            self.clients.instances.set_labels_unary(
                project=self.project,
                zone=zone,
                instance=instance,
                instances_set_labels_request_resource=request,
                retry=None,
                timeout=10,
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

    def create_machine(self, zone: str) -> bool:
        """Create one machine and track it, as docker-machine's google driver does: ``instances.insert`` with
        the fleet's labels and a first heartbeat. Counted as gitlab-runner counts it: created or creation-failed."""
        name = f"{self.name}-machine-{next(self._machines)}"
        labels = {**self.machine_labels, self.heartbeat_label: str(int(self.clock()))}
        instance = compute_v1.Instance(name=name, labels=labels)
        try:
            self.clients.instances.insert_unary(
                project=self.project, zone=zone, instance_resource=instance, retry=None, timeout=10
            )
        except Exception as exc:
            log.info("manager %s: creating %s failed: %s", self.name, name, exc)
            self.creation_failed.inc()
            return False
        self.created.inc()
        self.instances = [*self.instances, (zone, name)]
        return True

    def crash(self) -> None:
        """The container dies (an OOM kill) and the kubelet restarts it: one more restart, and the new process,
        its machine store lost, tracks none of the machines the old one did. (The process here stays up: its
        counters go on where a real one's would start again, which Prometheus reads the same.)"""
        self.restarts.inc()
        self.instances = []

    def crash_loop(self, every: float, zone: str) -> ManagerSimulator:
        """Crash every ``every`` seconds until killed; each restart re-creates one idle machine in ``zone``."""

        def loop() -> None:
            while not self._stop.wait(every):
                self.crash()
                self.create_machine(zone)

        self._crash_loop = threading.Thread(target=loop, name=f"crash-loop-{self.name}", daemon=True)
        self._crash_loop.start()
        return self

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
        for thread in (self._thread, self._crash_loop):
            if thread:
                thread.join(timeout=30)
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
    parser.add_argument("--crash-every", type=float, default=0.0, help="crash-loop: restart this often (0: never)")
    parser.add_argument("--zone", default="us-east1-b", help="where a restart re-creates its idle machine")
    args = parser.parse_args()
    instances = [tuple(spec.split("/", 1)) for spec in args.instance]
    manager = ManagerSimulator(args.name, args.project, manager_clients(args.endpoint), instances, args.interval)
    port = manager.serve_metrics(args.metrics_port)
    print(f"manager {args.name} tracking {len(instances)} instances, metrics on :{port}", flush=True)
    manager.start()
    if args.crash_every:
        manager.crash_loop(args.crash_every, args.zone)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        manager.kill()


if __name__ == "__main__":
    main()
