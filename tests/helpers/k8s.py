"""Seeding the Kubernetes emulator with sandbox runs shaped like the real driver's, and NATS KV with their leases."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, cast

import nats
import psycopg
from nats.js.api import KeyValueConfig
from pymongo import MongoClient

from include.emulators.k8s import RESOURCE_OF_KIND, Cluster
from include.emulators.shapes import kube_pod, kube_run
from reaper.config import Settings
from reaper.k8s.deleter import K8sDeleter
from reaper.k8s.evidence import gather
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject, Outcome, Phase, Plan, incomplete_scopes
from reaper.policy import evaluate
from reaper.stores.mongo import MongoRunStore
from reaper.stores.nats import NatsLeases
from reaper.stores.postgres import PostgresStepStore
from tests.helpers import fast_backoff

MANAGED = {"iterion.io/managed": "true"}


def seed_run(cluster: Cluster, run: str, age: float = 3600, namespace: str = "ci", **pod: Any) -> list[dict]:
    """A run's Pod, two Secrets and NetworkPolicy in the emulator; returns the stored objects."""
    return [
        cluster.create(RESOURCE_OF_KIND[obj["kind"]], namespace, obj)
        for obj in kube_run(run, namespace, time.time() - age, MANAGED, **pod)
    ]


def seed_pod(cluster: Cluster, name: str, labels: dict[str, str], age: float = 3600, **pod: Any) -> dict:
    return cluster.create("pods", "ci", kube_pod(name, "ci", f"{name}-uid", labels, time.time() - age, **pod))


RELEASED = "released-0"  # a finished run whose lease was released: its delete marker shows the runners write here


async def put_leases(url: str, held: list[str], ttl: float = 0) -> None:
    """Hold these runs' leases in the ``run_leases`` KV bucket (``ttl`` seconds: they expire unless renewed), beside
    the delete marker of a lease released earlier (:data:`RELEASED`), as a bucket the runners use holds: one that
    holds no key proves nothing (reaper.stores.nats ``template_problem``)."""
    client = await nats.connect(url)
    kv = await client.jetstream().create_key_value(KeyValueConfig(bucket="run_leases", ttl=ttl or None))
    await kv.put(RELEASED, b"runner")
    await kv.delete(RELEASED)
    for key in held:
        await kv.put(key, b"runner")
    await client.close()


async def put_kv(url: str, bucket: str, keys: list[str]) -> None:
    """Put these keys in the KV bucket ``bucket``, then delete the last one (a released lease)."""
    client = await nats.connect(url)
    js = client.jetstream()
    kv = await js.create_key_value(bucket=bucket)
    for key in keys:
        await kv.put(key, b"runner-7")
    if keys:
        await kv.delete(keys[-1])  # a released lease
    await client.close()


def sweep(
    api, config: Settings, nats_url: str, mongo: MongoClient, postgres_dsn: str | None
) -> tuple[Plan, list[Outcome]]:
    """One enforcement sweep of the cluster ``c1`` through every adapter, as the DAG's steps chain them."""
    listing = list_cluster(api, "c1", config.k8s.selector, fast_backoff(), 10, namespaces=config.k8s.namespaces)
    leases = NatsLeases(nats_url, config.k8s.nats_leases)
    runs = MongoRunStore(mongo, config.k8s.mongo_run_store)
    steps = (
        PostgresStepStore(lambda: psycopg.connect(postgres_dsn), config.k8s.postgres_step_store)
        if postgres_dsn
        else None
    )
    objects = cast("list[K8sObject]", listing.resources)  # a cluster's listing holds only its objects
    evidence = gather(
        objects, config, leases.read, runs.read, steps.read if steps else None, incomplete_scopes([listing])
    )
    plan = evaluate(objects, evidence, config, Phase.ENFORCEMENT, datetime.now(UTC))
    outcomes = K8sDeleter(lambda _: api, config, fast_backoff()).delete(
        cast("list[K8sObject]", [d.resource for d in plan.deletes()])
    )
    return plan, outcomes
