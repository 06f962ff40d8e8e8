"""Sweep metrics for Prometheus, pushed to a Pushgateway at the end of the active phase's sweeps.

Grouped by target and scope, never by DAG, so that the alerts follow the active rollout phase:
its pushes replace what an earlier phase left. Only the active phase's sweeps push, and a run of
another phase its trigger confirmed (``reaper.sweep.gate.phase_gate``; unconfirmed, it is a what-if); a
dry run pushes nothing, and a sweep of some scopes only (the
``scopes`` param) pushes theirs and its attempt, never the target's last success. Groups
(``job="reaper"``), each replaced whole by its next push:

- ``{target, scope}``: one per swept scope: the census (fleeting groups too), findings, decisions,
  holds, held orphans;
- ``{target, scope="_all"}``: a completed sweep of every scope: last success, deletions by outcome,
  the global cap, failed pushes, failed retirements;
- ``{target, scope="_attempt"}``: every sweep that pushes: when it ended and how long it took.

Every value is the last sweep's (a gauge), not a running total. Groups of scopes no longer
configured, and of the DAG-grouped layout before this one, are retired by the next full sweep
(:func:`retire`; ``reaper metrics-retire`` does it by hand, e.g. for a disabled target); a group it
could not delete keeps its last values, so the sweep counts it in its own group
(``reaper_last_sweep_retire_failures``) and the alerts mute it once it is stale (:mod:`reaper.alert_rules`).
Metrics are observability, not data: a failed push is logged and counted, never fails a sweep.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import partial

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import delete_from_gateway, push_to_gateway
from prometheus_client.registry import Collector

from reaper.records import GceCensus, SweepSummary
from reaper.redact import error_for_log, url_for_log
from reaper.vocabulary import Reason, Result

log = logging.getLogger(__name__)
JOB = "reaper"
ALL, ATTEMPT = "_all", "_attempt"  # the target-wide groups' scope label
PUSH_FAILURES = 0  # Pushgateway calls that failed in this process; logged with each failure


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


@dataclass(frozen=True)
class PushedSweep:
    """What one sweep pushes: its summary (the ledger's, :class:`reaper.records.SweepSummary`), outcomes and times.

    ``deleting``: the rules whose mode is ``delete`` in the sweep's phase (an orphan of one of
    them that was reported instead is held). ``full``: every configured scope was swept.
    ``completed``: the sweep ended as planned (a failed one pushes its attempt only).
    """

    target: str
    summary: SweepSummary
    outcomes: dict[str, int]
    deleting: Collection[str]
    full: bool
    completed: bool
    started_at: float
    finished_at: float


def scope_metrics(sweep: PushedSweep, scope: str) -> list[Metric]:
    """The census, decisions, holds and held orphans of one scope of a sweep."""
    target, summary = sweep.target, sweep.summary
    census = summary.census.of(target, scope) if summary.census else None
    by_status = census.counts if census else {}
    findings = census.findings if census else {}
    decisions = [d for d in summary.decisions or [] if d.scope == scope]
    verdict = summary.verdict(scope)
    blocking = set(verdict.blocking)
    # The reasons a finding the phase deletes was reported instead: its scope's holds, and the global cap.
    stopped = {*verdict.holds, Reason.MAX_DELETIONS_EXCEEDED}
    held = sum(d.count for d in decisions if d.action == "report" and d.rule in sweep.deleting and d.reason in stopped)
    metrics: list[Metric] = [
        _gauge(
            "reaper_last_sweep_resources",
            "In-scope resources of the last sweep by status (GCE) or kind (Kubernetes).",
            ["target", "status"],
            [([target, k], v) for k, v in sorted(by_status.items())],
        ),
        _gauge(
            "reaper_last_sweep_findings",
            "Resources (GCE) or runs (Kubernetes) of the last sweep by finding or decision row.",
            ["target", "finding"],
            [([target, k], v) for k, v in sorted(findings.items())],
        ),
        _gauge(
            "reaper_last_sweep_decisions",
            "Decisions of the last sweep by rule, reason and action.",
            ["target", "rule", "reason", "action"],
            [([target, d.rule, d.reason, d.action], d.count) for d in decisions],
        ),
        _gauge(
            "reaper_scope_hold",
            "1 for each hold in force in the scope at the last sweep; blocks_deletes: it stopped a delete "
            "the phase would make (a hold on a rule that only reports is information).",
            ["target", "hold", "blocks_deletes"],
            [([target, h, str(h in blocking).lower()], 1.0) for h in verdict.holds],
        ),
        _gauge(
            "reaper_last_sweep_held_orphans",
            "Findings of rules the phase deletes that the last sweep held instead (a scope hold, the global cap).",
            ["target"],
            [([target], float(held))],
        ),
    ]
    use = (summary.quota or {}).get(scope)
    if use is not None:  # GCE: the project's rate quotas, as the sweep's calls spent them
        metrics += [
            _gauge(
                "reaper_last_sweep_api_requests",
                "Calls the last sweep made to the scope's API by rate-quota group (retries included); the reaper "
                "keeps to gce.quota.share of each group's limit.",
                ["target", "group"],
                [([target, group], n) for group, n in sorted(use.requests.items())],
            ),
            _gauge(
                "reaper_last_sweep_throttled_answers",
                "Answers of the last sweep saying the scope's rate quota was used up (403 rateLimitExceeded, 429).",
                ["target"],
                [([target], float(use.throttled))],
            ),
            _gauge(
                "reaper_last_sweep_throttled_wait_seconds",
                "Seconds the last sweep's calls waited for the scope's rate quotas to refill.",
                ["target"],
                [([target], float(use.waited))],
            ),
        ]
    gce = census if isinstance(census, GceCensus) else None
    groups = msgspec.structs.asdict(gce.groups) if gce and gce.groups else None
    if groups:  # GCE with gce.group_selector: fleeting groups, and those left by a decommissioned manager
        metrics.append(
            _gauge(
                "reaper_last_sweep_groups",
                "Fleeting managed instance groups of the last sweep (listed, residual: holding instances while "
                "their manager reports no writer health for longer than the quarantine; residual_instances: "
                "the instances those hold).",
                ["target", "state"],
                [([target, k], v) for k, v in sorted(groups.items())],
            )
        )
    hist = gce.heartbeat_age_seconds if gce else None
    if hist:
        # Gauges: one sweep's snapshot, not counters; histogram_quantile takes them as they are (no rate).
        metrics.append(
            _gauge(
                "reaper_last_sweep_heartbeat_ages",
                "Valid heartbeat labels of the last sweep at most le seconds old (cumulative).",
                ["target", "le"],
                [([target, le], n) for le, n in hist.buckets.items()],
            )
        )
    return metrics


def target_metrics(sweep: PushedSweep, push_failures: int, retire_failures: int) -> list[Metric]:
    """The target-wide results of a completed sweep of every scope."""
    target = sweep.target
    capped = (sweep.summary.capped or {}).get(target)
    return [
        _gauge(
            "reaper_last_success_timestamp_seconds",
            "End of the last completed sweep of every scope.",
            ["target"],
            [([target], sweep.finished_at)],
        ),
        _gauge(
            "reaper_last_sweep_deletions",
            "Deletions of the last sweep by outcome.",
            ["target", "outcome"],
            [([target, k], v) for k, v in sorted({Result.FAILED: 0, **sweep.outcomes}.items())],
        ),
        _gauge(
            "reaper_last_sweep_capped",
            "1 when the last sweep planned more deletes than max_deletions_per_sweep, and so deleted nothing.",
            ["target"],
            [([target], float(bool(capped)))],
        ),
        _gauge(
            "reaper_last_sweep_push_failures",
            "Pushes of the last sweep's scope groups that failed.",
            ["target"],
            [([target], float(push_failures))],
        ),
        _gauge(
            "reaper_last_sweep_retire_failures",
            "Calls of the last sweep's retirement of groups nothing pushes any more that failed (listing the "
            "groups counts one, each group it could not delete one): those groups' last values stand.",
            ["target"],
            [([target], float(retire_failures))],
        ),
    ]


def attempt_metrics(sweep: PushedSweep) -> list[Metric]:
    return [
        _gauge(
            "reaper_last_attempt_timestamp_seconds",
            "End of the last sweep that pushed metrics, completed or not.",
            ["target"],
            [([sweep.target], sweep.finished_at)],
        ),
        _gauge(
            "reaper_last_sweep_duration_seconds",
            "How long the last sweep that pushed metrics ran.",
            ["target"],
            [([sweep.target], sweep.finished_at - sweep.started_at)],
        ),
    ]


def push_sweep(url: str, sweep: PushedSweep, timeout: float, configured: Collection[str]) -> int:
    """Push one sweep's groups; returns how many of its Pushgateway calls failed. A full sweep retires
    stale groups first."""
    scopes = [v.scope for v in sweep.summary.scopes or []] if sweep.completed else []
    went = [_push(url, sweep.target, s, scope_metrics(sweep, s), timeout) for s in scopes]  # one per call
    retire_failures = 0
    if sweep.completed and sweep.full:  # retired first: the sweep's own group says how that went
        retire_failures = _retire_stale(url, sweep.target, timeout, configured)
        metrics = target_metrics(sweep, went.count(False), retire_failures)
        went.append(_push(url, sweep.target, ALL, metrics, timeout))
    went.append(_push(url, sweep.target, ATTEMPT, attempt_metrics(sweep), timeout))
    if not any(went):
        # Nothing of this sweep arrived, not even the count of failed pushes: ReaperNotSweeping will fire.
        log.error("every metrics push of this %s sweep to %s failed", sweep.target, url_for_log(url))
    return went.count(False) + retire_failures


def _retire_stale(url: str, target: str, timeout: float, keep: Collection[str]) -> int:
    """Retire the groups of scopes no longer configured; how many of its calls failed (logged and counted)."""
    try:
        return len(retire(url, target, timeout, keep=keep).failed)
    except Exception as exc:
        _failed("retirement listing", url, exc)
        return 1  # no group could even be looked at


@dataclass(frozen=True)
class Retired:
    """What a retirement did: the grouping keys it deleted, and those it could not delete (each logged)."""

    gone: list[dict[str, str]]
    failed: list[dict[str, str]]


def retire(
    url: str,
    target: str,
    timeout: float,
    keep: Collection[str] | None = None,
    scopes: Collection[str] | None = None,
) -> Retired:
    """Delete the target's groups that nothing pushes any more, each one tried even when another failed.

    ``keep``: the configured scopes (a full sweep retires every other scope's group); ``scopes``:
    only these scopes' groups (by hand). Neither: every group of the target, as when it is
    disabled. The groups of the DAG-grouped layout before this one (a ``dag_id`` label) go too,
    unless only some scopes are named. A listing that fails raises.
    """
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/metrics", timeout=timeout) as answer:
        groups = json.load(answer).get("data") or []
    gone: list[dict[str, str]] = []
    failed: list[dict[str, str]] = []
    for group in groups:
        labels = dict(group.get("labels") or {})
        if labels.pop("job", None) != JOB:
            continue
        scope = labels.get("scope", "")
        if "dag_id" in labels:
            doomed = scopes is None and labels["dag_id"].startswith(f"reaper_{target}_")
        else:
            doomed = labels.get("target") == target and (scopes is None or scope in scopes)
            doomed = doomed and (keep is None or scope not in {*keep, ALL, ATTEMPT})
        if doomed:
            delete = partial(delete_from_gateway, url, job=JOB, grouping_key=labels, timeout=timeout)
            (gone if _attempt(delete, url, f"retirement of group {labels}") else failed).append(labels)
    return Retired(gone, failed)


def _push(url: str, target: str, scope: str, metrics: list[Metric], timeout: float) -> bool:
    registry = CollectorRegistry()
    registry.register(_Static(metrics))
    grouping = {"target": target, "scope": scope}
    return _attempt(
        lambda: push_to_gateway(url, job=JOB, grouping_key=grouping, registry=registry, timeout=timeout),
        url,
        "push",
    )


def _attempt(call: Callable[[], object], url: str, what: str) -> bool:
    """Run one Pushgateway call; False, logged and counted, when it failed (observability only)."""
    try:
        call()
    except Exception as exc:
        _failed(what, url, exc)
        return False
    return True


def _failed(what: str, url: str, exc: Exception) -> None:
    global PUSH_FAILURES
    PUSH_FAILURES += 1
    log.warning("metrics %s to %s failed (%d so far): %s", what, url_for_log(url), PUSH_FAILURES, error_for_log(exc))
