"""One object per target that does a sweep's I/O with the real adapters, built from Airflow connections.

The DAG factory only orchestrates: list, gather evidence, delete. Which adapter
serves which step, and with which connection, is decided here and nowhere else.
Adapters are imported inside the methods: DAG files import this module at parse
time, and the SDKs behind the adapters take seconds to import.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from reaper.config import Settings
from reaper.model import Evidence, GceInstance, K8sObject, Resource
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

    def delete(self, resources: list[Resource]) -> list[dict[str, str]]:
        from reaper.gce.deleter import GceDeleter

        outcomes = GceDeleter(self.clients, self.config).delete(resources)  # type: ignore[arg-type]
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

    def evidence(self, resources: list[Resource], incomplete: list[str]) -> Evidence:
        from reaper.k8s.evidence import gather
        from reaper.stores.mongo import MongoLeases, MongoRunStore, mongo_client
        from reaper.stores.nats import NatsLeases, nats_url
        from reaper.stores.postgres import PostgresStepStore, postgres_connect

        k8s = self.config.k8s
        leases = None
        if k8s.lease_source == "nats":
            leases = NatsLeases(nats_url(k8s.nats_leases.conn_id), k8s.nats_leases).read
        elif k8s.lease_source == "mongo":
            cfg = k8s.mongo_leases
            leases = MongoLeases(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).read
        runs = None
        if k8s.run_store == "mongo":
            cfg_runs = k8s.mongo_run_store
            runs = MongoRunStore(mongo_client(cfg_runs.conn_id, cfg_runs.timeout.total_seconds()), cfg_runs).read
        steps = None
        if k8s.step_store == "postgres":
            cfg_steps = k8s.postgres_step_store
            connect = postgres_connect(cfg_steps.conn_id, cfg_steps.timeout.total_seconds())
            steps = PostgresStepStore(connect, cfg_steps).read
        incomplete_scopes = frozenset(("k8s", s) for s in incomplete)
        return gather(resources, self.config, leases, runs, steps, incomplete_scopes)  # type: ignore[arg-type]

    def delete(self, resources: list[Resource]) -> list[dict[str, str]]:
        from reaper.k8s.deleter import K8sDeleter

        outcomes = K8sDeleter(self.api_for, self.config).delete(resources)  # type: ignore[arg-type]
        return [
            outcome_record(o.cluster, o.uid, f"{o.kind}/{o.namespace}/{o.name}", o.result, o.detail) for o in outcomes
        ]


TARGETS = {"gce": GceTarget, "k8s": K8sTarget}
