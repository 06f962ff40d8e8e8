"""One object per target that does a sweep's I/O with the real adapters, built from Airflow connections.

The DAG factory only orchestrates: list, gather evidence, delete. Which adapter
serves which step, and with which connection, is decided here and nowhere else.
Adapters are imported inside the methods: DAG files import this module at parse
time, and the SDKs behind the adapters take seconds to import.
"""

from __future__ import annotations

import builtins  # the targets' ``list`` method shadows the builtin in their class bodies
from collections.abc import Callable, Hashable
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from reaper.config import Settings
from reaper.fence import SendGuard
from reaper.model import (
    Evidence,
    GceGroup,
    GceInstance,
    K8sObject,
    Keyed,
    Outcome,
    Phase,
    QuotaUse,
    Resolved,
    Resource,
    ScopeListing,
)
from reaper.retry import Backoff, Stop

if TYPE_CHECKING:  # the adapters are imported where they are used: DAG files import this module at parse time
    from kubernetes import client as k8s

    from reaper.gce.clients import ComputeClients
    from reaper.gce.quota import ProjectQuota

R = TypeVar("R", bound=Resource)


class Target(Protocol[R]):
    """What a sweep needs of a target: its scopes and schedule, listing, evidence, and deleting under a guard.

    ``R``: the resources it deletes (its ``unit``, ``record_name`` and ``delete`` take them); the sweep's steps
    hold any target (``Target[Any]``)."""

    name: str
    scope_key: str  # the config key under the target's section that names its scopes

    @property
    def resource_type(self) -> Any:
        """What it lists, as a type expression (a class or a union of classes): the sweep's files and delete
        batches are decoded as it (msgspec)."""
        ...

    @property
    def schedule(self) -> timedelta: ...

    @property
    def active_phase(self) -> Phase: ...

    @property
    def delete_rate(self) -> float:
        """Deletes per second per scope: each send takes a token of its scope's bucket."""
        ...

    def scopes(self) -> builtins.list[str]: ...

    def resolve(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[Resolved]:
        """These configured scopes by their canonical names, one entry per scope (once per sweep); no wait that
        ``stop`` refuses."""
        ...

    def unit(self, resource: R) -> Hashable: ...

    def record_name(self, resource: R) -> str: ...

    def list(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[ScopeListing]:
        """The scopes' listings; no wait (a used-up quota, a Retry-After) is made that ``stop`` refuses."""
        ...

    def quota_use(self) -> dict[str, QuotaUse]:
        """What this process's calls cost each scope since the last time this was asked (each task its own)."""
        ...

    def evidence(self, resources: builtins.list[R], incomplete: builtins.list[str]) -> Evidence: ...

    def warnings(self, resources: builtins.list[R]) -> builtins.list[str]: ...

    def delete(self, resources: builtins.list[R], guard: SendGuard) -> builtins.list[Outcome]: ...


class GceTarget:
    name = "gce"
    resource_type = GceInstance | GceGroup  # fleeting groups are listed for the residual-group report
    scope_key = "projects"

    def __init__(self, config: Settings) -> None:
        self.config = config

    @property
    def schedule(self) -> timedelta:
        return self.config.airflow.gce_schedule

    @property
    def active_phase(self) -> Phase:
        """The rollout phase whose DAG runs on the schedule and pushes metrics (``rollout.gce``)."""
        return Phase(self.config.rollout.gce)

    @property
    def delete_rate(self) -> float:
        return self.config.gce.delete_rate

    @cached_property
    def clients(self) -> ComputeClients:
        from reaper.gce.clients import clients_from_connection

        return clients_from_connection(self.config.gce.conn_id)

    @cached_property
    def quota(self) -> ProjectQuota:
        """The reaper's share of each project's rate quotas, paced for the whole process (every task of it)."""
        from reaper.gce.quota import ProjectQuota

        return ProjectQuota(self.config.gce.quota)

    def quota_use(self) -> dict[str, QuotaUse]:
        return self.quota.drain() if "quota" in self.__dict__ else {}

    def scopes(self) -> builtins.list[str]:
        return list(self.config.gce.projects)

    def resolve(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[Resolved]:
        """Each configured project by its id (:mod:`reaper.gce.projects`).

        Called by ``resolve_scopes``, which runs once per sweep, before the scopes are sharded: two
        names of one project become one scope, listed once whichever shards they would have fallen
        in, and every shard, listing, hold and metric carries the id from the start (a listing's
        scope is settled before it lists, and an instance it answers never adds one).
        """
        from reaper.gce.projects import resolve_projects

        if not scopes:  # nothing to sweep needs no clients
            return []
        gce = self.config.gce
        backoff, timeout = Backoff(gce.max_retries), gce.request_timeout.total_seconds()
        return resolve_projects(self.clients, scopes, gce.selector, gce.list_concurrency, backoff, timeout, self.quota)

    def unit(self, resource: GceInstance) -> tuple[str, str]:
        """Instances are deleted independently: each is its own unit of a batch."""
        return resource.project, resource.id

    def record_name(self, resource: GceInstance) -> str:
        return resource.name

    def list(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[ScopeListing]:
        """In-scope instances (and fleeting groups) of these projects, ``list_concurrency`` projects at a time."""
        from reaper.gce.groups import add_groups
        from reaper.gce.inventory import list_projects

        gce = self.config.gce
        timeout = gce.request_timeout.total_seconds()
        backoff = Backoff(gce.max_retries)
        listings = list_projects(
            self.clients, scopes, gce.selector, gce.list_concurrency, backoff, timeout, self.quota, stop
        )
        add_groups(listings, self.clients, gce, backoff, timeout, self.quota, stop)
        return listings

    def evidence(self, resources: builtins.list[Resource], incomplete: builtins.list[str]) -> Evidence:
        from reaper.gce.writer_health import PrometheusWriterHealth

        gce = self.config.gce
        source = PrometheusWriterHealth(gce.writer_health) if gce.writer_health.source == "prometheus" else None
        records = source.read() if source else None
        reporting = source.reporting(gce.quarantine) if source and gce.group_selector else None
        return Evidence(
            writer_health=records, incomplete=frozenset(("gce", s) for s in incomplete), reporting=reporting
        )

    def warnings(self, resources: builtins.list[Resource]) -> builtins.list[str]:
        return []

    def delete(self, resources: builtins.list[GceInstance], guard: SendGuard) -> builtins.list[Outcome]:
        from reaper.gce.deleter import GceDeleter

        deleter = GceDeleter(self.clients, self.config, quota=self.quota)
        return deleter.delete(resources, guard)


class K8sTarget:
    name = "k8s"
    resource_type = K8sObject
    scope_key = "clusters"

    def __init__(self, config: Settings) -> None:
        self.config = config
        self._apis: dict[str, k8s.ApiClient] = {}

    @property
    def schedule(self) -> timedelta:
        return self.config.airflow.k8s_schedule

    @property
    def active_phase(self) -> Phase:
        """The rollout phase whose DAG runs on the schedule and pushes metrics (``rollout.k8s``)."""
        return Phase(self.config.rollout.k8s)

    @property
    def delete_rate(self) -> float:
        return self.config.k8s.delete_rate_per_cluster

    def api_for(self, cluster: str) -> k8s.ApiClient:
        """The cluster's ApiClient, made once per sweep task from its Airflow connection."""
        from reaper.k8s.client import api_client_from_connection

        if cluster not in self._apis:
            self._apis[cluster] = api_client_from_connection(cluster)
        return self._apis[cluster]

    def scopes(self) -> builtins.list[str]:
        return list(self.config.k8s.clusters)

    def resolve(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[Resolved]:
        """A cluster is named by its Airflow connection: as configured."""
        return [Resolved(cluster, (cluster,)) for cluster in scopes]

    def unit(self, resource: K8sObject) -> tuple[str, str]:
        """A run's objects are one unit: batched together, deleted Pod first, stopped together."""
        from reaper.k8s.deleter import run_key

        return run_key(resource, self.config.k8s.run_label)

    def record_name(self, resource: K8sObject) -> str:
        return f"{resource.kind}/{resource.namespace}/{resource.name}"

    def quota_use(self) -> dict[str, QuotaUse]:
        return {}  # the API server throttles with Retry-After (API Priority and Fairness), no quota to share

    def list(self, scopes: builtins.list[str], stop: Stop | None = None) -> builtins.list[ScopeListing]:
        """Managed objects of these clusters, one cluster after another, with their hygiene findings
        (the cluster's own defences missing: reported, never acted on)."""
        from reaper.k8s.inventory import list_cluster

        k8s = self.config.k8s
        return [
            list_cluster(
                self.api_for(cluster),
                cluster,
                k8s.selector,
                Backoff(k8s.max_retries),
                k8s.request_timeout.total_seconds(),
                namespaces=k8s.namespaces,
            )
            for cluster in scopes
        ]

    @cached_property
    def _lease_source(self) -> object | None:
        k8s = self.config.k8s
        if k8s.lease_source == "nats":
            from reaper.stores.nats import NatsLeases, nats_options

            return NatsLeases(nats_options(k8s.nats_leases.conn_id), k8s.nats_leases)
        if k8s.lease_source == "mongo":
            from reaper.stores.mongo import MongoLeases, mongo_client

            cfg = k8s.mongo_leases
            return MongoLeases(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg)
        return None

    @property
    def leases(self) -> Callable[[builtins.list[str]], Keyed[float | None] | None] | None:
        """The configured liveness authority's reader for the sweep, or None (every lease unknown)."""
        return getattr(self._lease_source, "read", None)

    @property
    def lease_of(self) -> Callable[[builtins.list[str]], Keyed[float | None] | None] | None:
        """Its reader of one run's lease, the re-read right before that run's delete (NATS: that key alone)."""
        source = self._lease_source
        return getattr(source, "read_one", None) or getattr(source, "read", None)

    @cached_property
    def runs(self) -> Callable[[builtins.list[str]], Keyed[str]] | None:
        """The run store's reader, or None (every run's state unknown)."""
        k8s = self.config.k8s
        if k8s.run_store != "mongo":
            return None
        from reaper.stores.mongo import MongoRunStore, mongo_client

        cfg = k8s.mongo_run_store
        return MongoRunStore(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).read

    def evidence(self, resources: builtins.list[K8sObject], incomplete: builtins.list[str]) -> Evidence:
        from reaper.k8s.evidence import gather
        from reaper.stores.postgres import PostgresStepStore, postgres_connect

        k8s = self.config.k8s
        steps = None
        if k8s.step_store == "postgres":
            cfg_steps = k8s.postgres_step_store
            connect = postgres_connect(cfg_steps.conn_id, cfg_steps.timeout.total_seconds())
            steps = PostgresStepStore(connect, cfg_steps).read
        incomplete_scopes = frozenset(("k8s", s) for s in incomplete)
        return gather(resources, self.config, self.leases, self.runs, steps, incomplete_scopes)

    def warnings(self, resources: builtins.list[K8sObject]) -> builtins.list[str]:
        from reaper.k8s.evidence import unguarded_step_pods, unseen_sidecar

        return unguarded_step_pods(resources, self.config) + unseen_sidecar(resources, self.config)

    def revalidate(self, cluster: str, run: str) -> str | None:
        """Right before a run's first delete: its lease still absent and its run still over, or why not."""
        from reaper.k8s.evidence import still_reapable

        return still_reapable(run, self.config, self.lease_of, self.runs)

    def delete(self, resources: builtins.list[K8sObject], guard: SendGuard) -> builtins.list[Outcome]:
        from reaper.k8s.deleter import K8sDeleter

        # A Mongo reader proves it is the right store on its first read (reaper/stores/mongo.py): done here, before
        # any run, so that the re-read before a run's delete is the one query its time budget counts
        # (reaper/k8s/evidence.py reread_timeout), not that query and the proof.
        for read in (self.leases, self.runs):
            owner = getattr(read, "__self__", None)
            if owner is not None and hasattr(owner, "problem"):
                owner.problem  # noqa: B018  (a cached property: read once, remembered)
        return K8sDeleter(self.api_for, self.config, revalidate=self.revalidate).delete(resources, guard)


TARGETS: dict[str, Callable[[Settings], Target[Any]]] = {"gce": GceTarget, "k8s": K8sTarget}
