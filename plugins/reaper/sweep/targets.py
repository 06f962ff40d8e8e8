"""One object per target that does a sweep's I/O with the real adapters, built from Airflow connections.

The DAG factory only orchestrates: list, gather evidence, delete. Which adapter
serves which step, and with which connection, is decided here and nowhere else.
Adapters are imported inside the methods: DAG files import this module at parse
time, and the SDKs behind the adapters take seconds to import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from reaper.config import Settings
from reaper.fence import SendGuard
from reaper.model import Evidence, GceInstance, K8sObject, Keyed, Resource
from reaper.retry import Backoff


@dataclass
class Listing:
    """What listing a shard of scopes found: resources, problems of incomplete scopes, hygiene counts."""

    resources: list[Resource]
    problems: dict[str, list[str]] = field(default_factory=dict)
    hygiene: dict[str, int] = field(default_factory=dict)


def outcome_record(scope: str, uid: str, name: str, result: str, detail: str) -> dict[str, str]:
    return {"scope": scope, "uid": uid, "name": name, "result": result, "detail": detail}


class GceTarget:
    name = "gce"
    resource_type = GceInstance

    def __init__(self, config: Settings) -> None:
        self.config = config

    @cached_property
    def clients(self):  # type: ignore[no-untyped-def]
        from reaper.gce.clients import clients_from_connection

        return clients_from_connection(self.config.gce.conn_id)

    def scopes(self) -> list[str]:
        return list(self.config.gce.projects)

    def uid(self, resource: GceInstance) -> str:
        return resource.id

    def unit(self, resource: GceInstance) -> tuple[str, str]:
        """Instances are deleted independently: each is its own unit of a batch."""
        return resource.project, resource.id

    def record_name(self, resource: GceInstance) -> str:
        return resource.name

    def list(self, scopes: list[str]) -> Listing:
        """In-scope instances of these projects, and the problems of each incomplete listing."""
        from reaper.gce.inventory import list_projects

        gce = self.config.gce
        listings = list_projects(
            self.clients,
            scopes,
            gce.selector,
            gce.list_concurrency,
            Backoff(gce.max_retries),
            gce.request_timeout.total_seconds(),
        )
        resources: list[Resource] = [i for listing in listings for i in listing.instances]
        return Listing(resources, {x.project: x.problems for x in listings if not x.complete})

    def evidence(self, resources: list[Resource], incomplete: list[str]) -> Evidence:
        from reaper.gce.writer_health import PrometheusWriterHealth

        health = self.config.gce.writer_health
        records = PrometheusWriterHealth(health).read() if health.source == "prometheus" else None
        return Evidence(writer_health=records, incomplete=frozenset(("gce", s) for s in incomplete))

    def warnings(self, resources: list[Resource]) -> list[str]:
        return []

    def delete(self, resources: list[Resource], guard: SendGuard) -> list[dict[str, str]]:
        from reaper.gce.deleter import GceDeleter

        outcomes = GceDeleter(self.clients, self.config).delete(resources, guard)  # type: ignore[arg-type]
        return [outcome_record(o.project, o.id, o.name, o.result, o.detail) for o in outcomes]


class K8sTarget:
    name = "k8s"
    resource_type = K8sObject

    def __init__(self, config: Settings) -> None:
        self.config = config
        self._apis: dict[str, object] = {}

    def api_for(self, cluster: str):  # type: ignore[no-untyped-def]
        """The cluster's ApiClient, made once per sweep task from its Airflow connection."""
        from reaper.k8s.client import api_client_from_connection

        if cluster not in self._apis:
            self._apis[cluster] = api_client_from_connection(cluster)
        return self._apis[cluster]

    def scopes(self) -> list[str]:
        return list(self.config.k8s.clusters)

    def uid(self, resource: K8sObject) -> str:
        return resource.uid

    def unit(self, resource: K8sObject) -> tuple[str, str]:
        """A run's objects are one unit: batched together, deleted Pod first, stopped together."""
        from reaper.k8s.deleter import run_key

        return run_key(resource, self.config.k8s.run_label)

    def record_name(self, resource: K8sObject) -> str:
        return f"{resource.kind}/{resource.namespace}/{resource.name}"

    def list(self, scopes: list[str]) -> Listing:
        """Managed objects of these clusters, problems of incomplete listings, and hygiene findings
        (the cluster's own defences missing: reported, never acted on)."""
        from reaper.k8s.inventory import list_cluster

        k8s = self.config.k8s
        result = Listing([])
        hygiene: Counter[str] = Counter()
        for cluster in scopes:
            listing = list_cluster(
                self.api_for(cluster),
                cluster,
                k8s.selector,
                Backoff(k8s.max_retries),
                k8s.request_timeout.total_seconds(),
            )
            result.resources += listing.objects
            hygiene.update(f["finding"] for f in listing.hygiene())
            if not listing.complete:
                result.problems[cluster] = listing.problems
        result.hygiene = dict(hygiene)
        return result

    @cached_property
    def leases(self) -> Callable[[list[str]], Keyed[float | None] | None] | None:
        """The configured liveness authority's reader, or None (every lease unknown)."""
        k8s = self.config.k8s
        if k8s.lease_source == "nats":
            from reaper.stores.nats import NatsLeases, nats_options

            return NatsLeases(nats_options(k8s.nats_leases.conn_id), k8s.nats_leases).read
        if k8s.lease_source == "mongo":
            from reaper.stores.mongo import MongoLeases, mongo_client

            cfg = k8s.mongo_leases
            return MongoLeases(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).read
        return None

    @cached_property
    def runs(self) -> Callable[[list[str]], Keyed[str]] | None:
        """The run store's reader, or None (every run's state unknown)."""
        k8s = self.config.k8s
        if k8s.run_store != "mongo":
            return None
        from reaper.stores.mongo import MongoRunStore, mongo_client

        cfg = k8s.mongo_run_store
        return MongoRunStore(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).read

    def evidence(self, resources: list[Resource], incomplete: list[str]) -> Evidence:
        from reaper.k8s.evidence import gather
        from reaper.stores.postgres import PostgresStepStore, postgres_connect

        k8s = self.config.k8s
        steps = None
        if k8s.step_store == "postgres":
            cfg_steps = k8s.postgres_step_store
            connect = postgres_connect(cfg_steps.conn_id, cfg_steps.timeout.total_seconds())
            steps = PostgresStepStore(connect, cfg_steps).read
        incomplete_scopes = frozenset(("k8s", s) for s in incomplete)
        return gather(resources, self.config, self.leases, self.runs, steps, incomplete_scopes)  # type: ignore[arg-type]

    def warnings(self, resources: list[Resource]) -> list[str]:
        from reaper.k8s.evidence import unguarded_step_pods

        return unguarded_step_pods(resources, self.config)  # type: ignore[arg-type]

    def revalidate(self, cluster: str, run: str) -> str | None:
        """Right before a run's first delete: its lease still absent and its run still over, or why not."""
        from reaper.k8s.evidence import still_reapable

        return still_reapable(run, self.config, self.leases, self.runs)

    def delete(self, resources: list[Resource], guard: SendGuard) -> list[dict[str, str]]:
        from reaper.k8s.deleter import K8sDeleter

        deleter = K8sDeleter(self.api_for, self.config, revalidate=self.revalidate)
        outcomes = deleter.delete(resources, guard)  # type: ignore[arg-type]
        return [
            outcome_record(o.cluster, o.uid, f"{o.kind}/{o.namespace}/{o.name}", o.result, o.detail) for o in outcomes
        ]


TARGETS = {"gce": GceTarget, "k8s": K8sTarget}
