"""The preflight: what a config points at, checked against the live systems before the first sweep.

A config can validate and still point at nothing: a typo in a database name, a metric name or a
Prometheus URL makes a source answer "nothing", which reads exactly like proof of absence
(docs/design.md §4 and §5). The sweeps treat such answers as unknown, so they delete nothing there;
this makes the mistake visible before anyone wonders why nothing is reaped. ``reaper check`` (the CLI)
and the ``reaper_config_check`` DAG run the same checks. Each answers one line that names the config
key and what was found; nothing is written, listed beyond one page, or deleted.

Checked: the ledger's MongoDB answers; GCE: the connection builds, each configured project resolves
to its id and one page of its listing is readable, and writer health has series for each project
(last passes and failed-pass counters); Kubernetes: each cluster lists Pods, the NATS bucket of the
leases exists or the Mongo lease collection proves itself, the run store proves itself, the step-run
table has the documented schema; the Pushgateway answers; the Prometheus of ``metrics.prometheus_url`` has the
reaper's alert rules loaded and evaluable, and the cause alerts' selectors match series there.
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING

import msgspec

from reaper.config import Settings
from reaper.redact import error_for_log, url_for_log

if TYPE_CHECKING:
    from reaper.decoders import KubeItem
    from reaper.gce.clients import ComputeClients
    from reaper.model import Resolved


class Check(msgspec.Struct, frozen=True):
    """One check's answer: ``key`` the config key it concerns, ``found`` what the live system said."""

    key: str
    ok: bool
    found: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.key}: {self.found}"


def preflight(config: Settings) -> list[Check]:
    """Every check the config calls for, in order: ledger, GCE, Kubernetes, metrics."""
    checks = [*_ledger(config)]
    if config.gce.enabled:
        checks += _gce(config)
    if config.k8s.enabled:
        checks += _k8s(config)
    if config.metrics.pushgateway_url:
        checks += _pushgateway(config)
    if config.metrics.prometheus_url:
        checks += _guarded("metrics.prometheus_url", lambda: _alerting(config))
    return checks


def _guarded(key: str, what: Callable[[], Iterator[Check]]) -> Iterator[Check]:
    """The checks ``what`` yields; an error it raises is one failed check of ``key`` (never a crash)."""
    try:
        yield from what()
    except Exception as exc:
        yield Check(key, False, f"{type(exc).__name__}: {error_for_log(exc):.300}")


# --- the ledger -----------------------------------------------------------------------------------


def _ledger(config: Settings) -> Iterator[Check]:
    def check() -> Iterator[Check]:
        from reaper.stores.mongo import mongo_client

        ledger = config.ledger
        client = mongo_client(ledger.conn_id, ledger.timeout.total_seconds())
        client.admin.command("ping")
        yield Check("ledger.conn_id", True, f"{ledger.conn_id} answers (database {ledger.database})")

    return _guarded("ledger.conn_id", check)


# --- GCE ------------------------------------------------------------------------------------------


def _gce(config: Settings) -> Iterator[Check]:
    gce = config.gce
    try:
        from reaper.gce.clients import clients_from_connection

        clients = clients_from_connection(gce.conn_id)
    except Exception as exc:
        yield Check("gce.conn_id", False, f"{gce.conn_id}: no Compute clients ({type(exc).__name__})")
        return
    if not gce.projects:
        yield Check("gce.projects", False, "empty: nothing would be swept")
        return
    from reaper.gce.projects import resolve_projects
    from reaper.retry import Backoff

    timeout = gce.request_timeout.total_seconds()
    resolved = resolve_projects(clients, gce.projects, gce.selector, gce.list_concurrency, Backoff(1), timeout)
    for r in resolved:
        names = ", ".join(r.configured)
        if r.problem:
            yield Check("gce.projects", False, f"{names}: not resolved to a project id ({r.problem})")
            continue
        yield Check("gce.projects", True, f"{names} is {r.scope} ({r.how})")
        yield from _guarded("gce.conn_id", partial(_first_page, clients, r.scope, config))
    known = {name for r in resolved if not r.problem for name in (r.scope, *r.numbers, *r.configured)}
    for name in gce.protected_projects:
        if name not in known:  # a typo protects nothing: the project it meant is swept like any other
            yield Check("gce.protected_projects", False, f"{name} names no swept project (the swept: {sorted(known)})")
    if gce.writer_health.source == "prometheus":
        yield from _guarded("gce.writer_health.prometheus_url", lambda: _writers(config, resolved))


def carry_any(label_sets: Iterable[Mapping[str, str]], selector: Mapping[str, str]) -> bool:
    """Whether any of these objects carries any of the selector's labels: then a selector none of them matches may
    be a narrower one (another pool, another installation beside an idle one), not a wrong one."""
    return any(labels.get(k) == v for labels in label_sets for k, v in selector.items())


def _first_labels(
    clients: ComputeClients, project: str, selector: dict[str, str], config: Settings
) -> tuple[list[dict[str, str]], str | None]:
    """The labels of the instances of the project's first listing page under ``selector``; or why it failed."""
    from reaper.gce.inventory import instance_pages
    from reaper.gce.quota import ProjectQuota
    from reaper.model import ScopeListing
    from reaper.retry import Backoff

    gce = config.gce
    probe = ScopeListing("gce", project)
    timeout = gce.request_timeout.total_seconds()
    seen: list[dict[str, str]] = []
    for _, scoped in instance_pages(clients, project, selector, probe, Backoff(1), timeout, ProjectQuota(gce.quota)):
        if probe.pages > 1:
            break
        seen += [raw.labels for raw in scoped.instances]
    return seen, probe.problems[0] if probe.problems else None


def _first_page(clients: ComputeClients, project: str, config: Settings) -> Iterator[Check]:
    """The first page of the project's listing (a second's first request at most): the reaper may list its
    instances, the selector matches some when the managers' instances are there (a selector that matches none
    reaps nothing, and says nothing), and they carry the heartbeat label (a typo in its name reads every VM as
    unlabeled, which ``unlabeled_age`` reaps once it is old)."""
    gce = config.gce
    seen, problem = _first_labels(clients, project, gce.selector, config)
    if problem:
        yield Check("gce.conn_id", False, f"listing {project}: {problem}")
        return
    yield Check("gce.conn_id", True, f"{project}: its instances can be listed")
    label = gce.heartbeat_label
    if not seen:  # none in scope: an idle project, or a selector that matches none of the managers' instances
        others, problem = _first_labels(clients, project, {}, config)
        stamped = [labels for labels in others if label in labels]
        # Stamped instances that carry none of the selector's labels: a selector that names them wrongly. One that
        # carries some (another pool of the project, idle pools beside it) says nothing about this one.
        if not problem and stamped and not carry_any(stamped, gce.selector):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(gce.selector.items()))
            theirs = sorted({f"{k}={v}" for labels in stamped for k, v in labels.items() if k != label})
            yield Check(
                "gce.selector",
                False,
                f"no instance first listed in {project} matches {wanted}, but {len(stamped)} carry {label} (their "
                f"other labels: {', '.join(theirs[:10]) or 'none'}): a selector that matches none reaps nothing",
            )
        return
    if not any(label in labels for labels in seen):
        keys = sorted({key for labels in seen for key in labels} - set(gce.selector))
        yield Check(
            "gce.heartbeat_label",
            False,
            f"none of the {len(seen)} in-scope instances first listed in {project} carries {label} (their other "
            f"labels: {', '.join(keys[:10]) or 'none'}): every one would read as unlabeled",
        )


def _writers(config: Settings, resolved: list[Resolved]) -> Iterator[Check]:
    """Writer health answers for each project: at least one manager with a readable last pass and a failed-pass
    counter, under one of the project's names (its id, a number, the name configured)."""
    from reaper.gce.writer_health import PrometheusWriterHealth

    health = config.gce.writer_health
    records = PrometheusWriterHealth(health).read()
    where = url_for_log(health.prometheus_url)
    if records is None:
        yield Check("gce.writer_health.prometheus_url", False, f"{where}: no readable answer (the log says why)")
        return
    if not records:
        yield Check(
            "gce.writer_health.last_pass_metric",
            False,
            f"no series of {health.last_pass_metric} at {where}: a wrong metric name or URL; every heartbeat "
            "delete would be held",
        )
        return
    labels = sorted({r.project for r in records})
    for r in resolved:
        if r.problem:
            continue
        names = {r.scope, *r.numbers, *r.configured}
        mine = [w for w in records if w.project in names]
        if not mine:
            yield Check(
                "gce.writer_health.project_label",
                False,
                f"no writer reports for {r.scope} under label {health.project_label} (it has: "
                f"{', '.join(labels[:10])}{'...' if len(labels) > 10 else ''}): its heartbeat deletes would be held",
            )
        elif not any(math.isfinite(w.last_pass) for w in mine):
            yield Check(
                "gce.writer_health.failed_passes_metric",
                False,
                f"{r.scope}: its writers' health is unreadable (no {health.failed_passes_metric} series, or no "
                "finite last pass): its heartbeat deletes would be held",
            )
        else:
            managers = ", ".join(sorted({w.manager for w in mine}))
            yield Check("gce.writer_health", True, f"{r.scope}: {len(mine)} writer(s) report ({managers})")


# --- Kubernetes -----------------------------------------------------------------------------------


def _k8s(config: Settings) -> Iterator[Check]:
    k8s = config.k8s
    for cluster in k8s.clusters:
        yield from _guarded("k8s.clusters", partial(_cluster, cluster, config))
    if k8s.lease_source == "nats":
        yield from _guarded("k8s.nats_leases.bucket", lambda: _nats_bucket(config))
    elif k8s.lease_source == "mongo":
        yield from _guarded("k8s.mongo_leases", lambda: _mongo_leases(config))
    if k8s.run_store == "mongo":
        yield from _guarded("k8s.mongo_run_store", lambda: _mongo_runs(config))
    if k8s.step_store == "postgres":
        yield from _guarded("k8s.postgres_step_store", lambda: _step_table(config))


def _cluster(cluster: str, config: Settings) -> Iterator[Check]:
    """One page of one Pod of the swept namespaces (metadata only): the reaper may list there; and when no Pod
    matches the selector, none carries the run label either (a selector that matches none of the runs' Pods
    validates, reaps nothing, and says nothing)."""
    from reaper.decoders import KubeList, item_kinds
    from reaper.k8s.client import METADATA_ONLY, api_client_from_connection, call, collection_paths, selector_string

    k8s = config.k8s
    api = api_client_from_connection(cluster)
    timeout = k8s.request_timeout.total_seconds()
    paths = collection_paths("Pod", k8s.namespaces)

    def first(query: list[tuple[str, object]]) -> list[KubeItem]:
        """The first Pod of each swept namespace path under ``query``, as metadata, decoded as the listing decodes a
        page (``"items": null`` is none; an answer of another shape is an error)."""
        pages = (call(api, "GET", path, timeout, [*query, ("limit", 1)], accept=METADATA_ONLY) for path in paths)
        return [pod for raw in pages for pod, _ in item_kinds(msgspec.json.decode(raw, type=KubeList), "Pod")]

    first([])
    where = f"namespaces {', '.join(k8s.namespaces)}" if k8s.namespaces else "every namespace"
    yield Check("k8s.clusters", True, f"{cluster}: Pods of {where} can be listed")
    if first([("labelSelector", selector_string(k8s.selector))]):
        return
    runs = first([("labelSelector", k8s.run_label)])  # an existence selector: any Pod of a run
    # As for GCE: a run's Pod that carries some of the selector's labels (another installation's, beside idle ones)
    # says nothing against it; one that carries none says the selector names them wrongly.
    if runs and not carry_any((r.metadata.labels for r in runs), k8s.selector):
        pod = runs[0].metadata
        labels = ", ".join(f"{k}={v}" for k, v in sorted(pod.labels.items()) if k != k8s.run_label)
        yield Check(
            "k8s.selector",
            False,
            f"no Pod in {cluster} ({where}) matches {selector_string(k8s.selector)}, but Pods carry "
            f"{k8s.run_label} (e.g. {pod.namespace}/{pod.name}: {labels or 'no other labels'}): a "
            "selector that matches none reaps nothing",
        )


def _nats_bucket(config: Settings) -> Iterator[Check]:
    from reaper.stores.nats import nats_bucket_problem, nats_options

    cfg = config.k8s.nats_leases
    problem = asyncio.run(nats_bucket_problem(nats_options(cfg.conn_id), cfg))
    named, sep, said = (problem or "").partition(": ")
    key, found = (named, said) if sep and named.startswith("k8s.nats_leases.") else ("k8s.nats_leases.bucket", problem)
    yield Check(
        key, not problem, found or f"{cfg.bucket} exists (any key it holds is a lease under {cfg.key_template!r})"
    )


def _mongo_leases(config: Settings) -> Iterator[Check]:
    from reaper.stores.mongo import MongoLeases, mongo_client

    cfg = config.k8s.mongo_leases
    problem = MongoLeases(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).problem
    found = problem.removeprefix("k8s.mongo_leases: ") or f"{cfg.database}.{cfg.collection} holds leases"
    yield Check("k8s.mongo_leases", not problem, found)


def _mongo_runs(config: Settings) -> Iterator[Check]:
    from reaper.stores.mongo import MongoRunStore, mongo_client

    cfg = config.k8s.mongo_run_store
    problem = MongoRunStore(mongo_client(cfg.conn_id, cfg.timeout.total_seconds()), cfg).problem
    found = problem.removeprefix("k8s.mongo_run_store: ") or f"{cfg.database}.{cfg.collection} holds run records"
    yield Check("k8s.mongo_run_store", not problem, found)


def _step_table(config: Settings) -> Iterator[Check]:
    from reaper.stores.postgres import PostgresStepStore, postgres_connect

    cfg = config.k8s.postgres_step_store
    store = PostgresStepStore(postgres_connect(cfg.conn_id, cfg.timeout.total_seconds()), cfg)
    problem = store.schema_problem()
    yield Check("k8s.postgres_step_store.table", not problem, problem or f"{cfg.table} has the documented columns")


# --- metrics --------------------------------------------------------------------------------------


def _pushgateway(config: Settings) -> Iterator[Check]:
    def check() -> Iterator[Check]:
        url = config.metrics.pushgateway_url.rstrip("/")
        with urllib.request.urlopen(f"{url}/-/healthy", timeout=config.metrics.timeout.total_seconds()):
            pass
        yield Check("metrics.pushgateway_url", True, f"{url_for_log(url)} answers")

    return _guarded("metrics.pushgateway_url", check)


def _alerting(config: Settings) -> Iterator[Check]:
    """The Prometheus of ``metrics.prometheus_url`` has the reaper's alert rules loaded and can evaluate them,
    and each cause alert's selector matches series there (else that alert can never fire)."""
    from reaper import alerting
    from reaper.alert_rules import cause_series

    try:
        found = alerting.rules(config)
    except alerting.AlertingError as exc:
        yield Check("metrics.prometheus_url", False, str(exc))
        return
    broken = alerting.unhealthy(found)
    where = alerting.shown(config)
    yield Check(
        "metrics.prometheus_url",
        not broken,
        f"{where}: cannot evaluate {'; '.join(broken)}" if broken else f"{where}: {len(found)} reaper alert rules",
    )
    if config.cause_alerts.enabled:
        for key, selector in cause_series(config).items():
            n = alerting.series(config, selector)
            found_words = (
                f"{n} series match {selector}" if n else f"no series matches {selector}: its alert can never fire"
            )
            yield Check(key, n > 0, found_words)
