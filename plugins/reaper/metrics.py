"""Sweep metrics for Prometheus, pushed to a Pushgateway at the end of every sweep.

One push per (DAG, scope) grouping; plus one per DAG with the last success time.
Metrics are observability, not data: a failed push is logged and counted, and
never fails the sweep (the ledger is the record).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import push_to_gateway
from prometheus_client.registry import Collector

from reaper.redact import error_for_log, url_for_log

log = logging.getLogger(__name__)
PUSH_FAILURES = 0  # pushes that failed in this process; logged with each failure


class _Static(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


def _gauge(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def scope_metrics(summary: dict[str, object], target: str, scope: str) -> list[Metric]:
    """The census, decisions and holds of one scope of a sweep summary."""
    census = ((summary.get("census") or {}).get(target) or {}).get(scope) or {}  # type: ignore[union-attr]
    metrics: list[Metric] = []
    by_status = census.get("by_status") or census.get("by_kind") or {}
    metrics.append(
        _gauge(
            "reaper_resources",
            "In-scope resources by status (GCE) or kind (Kubernetes).",
            ["target", "status"],
            [([target, k], v) for k, v in sorted(by_status.items())],
        )
    )
    findings = census.get("by_finding") or census.get("by_reason") or {}
    metrics.append(
        _gauge(
            "reaper_findings",
            "Resources (GCE) or runs (Kubernetes) by finding or decision row.",
            ["target", "finding"],
            [([target, k], v) for k, v in sorted(findings.items())],
        )
    )
    hist = census.get("heartbeat_age_seconds")
    if hist:
        family = HistogramMetricFamily(
            "reaper_heartbeat_age_seconds", "Age of valid heartbeat labels.", labels=["target"]
        )
        family.add_metric([target], [(le, n) for le, n in hist["buckets"].items()], sum_value=hist["sum"])
        metrics.append(family)
    decisions = [d for d in summary.get("decisions", []) if d["scope"] == scope]  # type: ignore[union-attr]
    metrics.append(
        _gauge(
            "reaper_decisions",
            "Decisions of the last sweep by rule, reason and action.",
            ["target", "rule", "reason", "action"],
            [([target, d["rule"], d["reason"], d["action"]], d["count"]) for d in decisions],
        )
    )
    verdict = next((v for v in summary.get("scopes", []) if v["scope"] == scope), {})  # type: ignore[union-attr]
    holds = set(verdict.get("holds", []))
    metrics.append(
        _gauge(
            "reaper_budget_hold",
            "1 when the scope's budget held its deletes in the last sweep.",
            ["target"],
            [([target], float("budget_exceeded" in holds))],
        )
    )
    writer = float(bool(holds & {"writer_unhealthy", "writer_health_unknown"}))
    metrics.append(
        _gauge(
            "reaper_writer_health_hold",
            "1 when heartbeat-writer health held heartbeat deletes.",
            ["target"],
            [([target], writer)],
        )
    )
    return metrics


def push_sweep(
    url: str,
    dag_id: str,
    target: str,
    summary: dict[str, object],
    outcomes: dict[str, int],
    finished_at: float,
    timeout: float,
) -> int:
    """Push the sweep's metrics; returns the number of failed pushes (0 when all went through)."""
    global PUSH_FAILURES
    failures = 0
    groups: list[tuple[dict[str, str], list[Metric]]] = [
        ({"dag_id": dag_id, "scope": v["scope"]}, scope_metrics(summary, target, v["scope"]))
        for v in summary.get("scopes", [])  # type: ignore[union-attr]
    ]
    groups.append(
        (
            {"dag_id": dag_id, "scope": "_all"},
            [
                _gauge(
                    "reaper_last_success_timestamp_seconds",
                    "End of the DAG's last successful sweep.",
                    ["target"],
                    [([target], finished_at)],
                ),
                _gauge(
                    "reaper_deletions",
                    "Deletions of the last sweep by outcome.",
                    ["target", "outcome"],
                    [([target, k], v) for k, v in sorted(outcomes.items())],
                ),
            ],
        )
    )
    for grouping, metrics in groups:
        registry = CollectorRegistry()
        registry.register(_Static(metrics))
        try:
            push_to_gateway(url, job="reaper", grouping_key=grouping, registry=registry, timeout=timeout)
        except Exception as exc:  # observability only: never fail the sweep
            failures += 1
            PUSH_FAILURES += 1
            log.warning(
                "metrics push to %s failed (%d so far): %s", url_for_log(url), PUSH_FAILURES, error_for_log(exc)
            )
    return failures
