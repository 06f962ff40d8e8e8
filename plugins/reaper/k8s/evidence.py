"""Gathering the Kubernetes evidence of one sweep: leases, run states and step results, in batches.

The run keys come from the listed objects' run labels; step attempts from step
pods' labels. Sources that are not configured stay ``None`` (unknown), so the
policy keeps or reports, never deletes, what they would have vouched for.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from reaper.config import Settings
from reaper.model import Evidence, K8sObject, Keyed, LeaseState, StoreState
from reaper.policy.k8s import lease_state, run_state, sidecar_seen
from reaper.stores.nats import read_timeout as nats_read_timeout

LeaseReader = Callable[[list[str]], Keyed[float | None] | None]
RunReader = Callable[[list[str]], Keyed[str]]
StepReader = Callable[[list[tuple[str, str, str]]], Keyed[tuple[str, bool]]]


def gather(
    objects: Iterable[K8sObject],
    config: Settings,
    leases: LeaseReader | None,
    runs: RunReader | None,
    steps: StepReader | None,
    incomplete: frozenset[tuple[str, str]] = frozenset(),
) -> Evidence:
    cfg = config.k8s
    keys: set[str] = set()
    attempts: set[tuple[str, str, str]] = set()
    for obj in objects:
        run = obj.labels.get(cfg.run_label)
        if not run:
            continue
        keys.add(run)
        step, attempt = obj.labels.get(cfg.step_label), obj.labels.get(cfg.attempt_label)
        if obj.kind == "Pod" and step and attempt:
            attempts.add((run, step, attempt))
    wanted = sorted(keys)
    return Evidence(
        leases=leases(wanted) if leases else None,
        runs=runs(wanted) if runs else None,
        steps=steps(sorted(attempts)) if steps and cfg.step_store != "none" else None,
        incomplete=incomplete,
    )


def still_reapable(
    run: str, config: Settings, leases: LeaseReader | None, runs: RunReader | None, now: float | None = None
) -> str | None:
    """Read a run's lease and state again right before its first delete: None if it is still an
    orphan (lease absent, run terminal or provably gone), else what changed since the plan."""
    k8s = config.k8s
    at = time.time() if now is None else now
    lease = lease_state(run, leases([run]) if leases else None, at, k8s.lease_clock_skew.total_seconds())
    if lease is not LeaseState.ABSENT:
        return f"lease {lease.value} when read again before the delete"
    store, status = run_state(run, runs([run]) if runs else None, k8s.terminal_statuses)
    if store not in (StoreState.TERMINAL, StoreState.NOT_FOUND):
        return f"run store {store.value} ({status}) when read again before the delete"
    return None


def reread_timeout(config: Settings) -> float:
    """The longest :func:`still_reapable` takes with the configured readers: it retries nothing, and
    each reader is bounded by its own timeout (``reaper/stores/nats.py`` ``read_timeout``; every pymongo
    timeout of a Mongo reader is its ``timeout``, and one run is one query). The deleter starts it only
    when it can end in time (docs/design.md §6)."""
    k8s = config.k8s
    lease = {"nats": nats_read_timeout(k8s.nats_leases), "mongo": k8s.mongo_leases.timeout.total_seconds()}
    store = k8s.mongo_run_store.timeout.total_seconds() if k8s.run_store == "mongo" else 0.0
    return lease.get(k8s.lease_source, 0.0) + store


def unguarded_step_pods(objects: Iterable[K8sObject], config: Settings) -> list[str]:
    """A loud warning when step pods are seen but no step store checks their results (docs/design.md §5, row 7)."""
    k8s = config.k8s
    if k8s.step_store != "none":
        return []
    pods = [o for o in objects if o.kind == "Pod" and (k8s.step_label in o.labels or k8s.attempt_label in o.labels)]
    if not pods:
        return []
    return [
        f"{len(pods)} pods carry step labels ({k8s.step_label}, {k8s.attempt_label}) but k8s.step_store is none: "
        "their results are NOT checked for durability before their sandbox is reaped; set k8s.step_store: postgres"
    ]


def unseen_sidecar(objects: Iterable[K8sObject], config: Settings) -> list[str]:
    """A warning per cluster whose listed Pods have no container named ``k8s.results_sidecar`` (docs/design.md §5,
    row 6, :func:`reaper.policy.k8s.sidecar_seen`). A deployment without a results sidecar looks the same: row 6
    reports a run whose Pod of several containers, none of that name, still runs one (``results_sidecar_unseen``),
    and this says what to set. ``results_sidecar: none`` says there is no sidecar to see."""
    clusters: dict[str, list[K8sObject]] = defaultdict(list)
    for obj in objects:
        if obj.kind == "Pod":
            clusters[obj.cluster].append(obj)
    name = config.k8s.results_sidecar
    return [
        f"none of the {len(pods)} listed pods of cluster {cluster} has a container named {name} (k8s.results_sidecar): "
        "a run whose Pod of several containers still runs one is reported, not deleted (results_sidecar_unseen), as "
        "it may be the results sidecar under another name; set k8s.results_sidecar (none: the runners have none)"
        for cluster, pods in sorted(clusters.items())
        if not sidecar_seen(pods, config)
    ]
