"""The Prometheus alert rules, generated from the config (DESIGN.md section 10; one action each in docs/runbook.md).

Thresholds follow the config, so they cannot drift from it: "not sweeping" is three of the
target's schedule intervals, a writer is stale after ``gce.writer_stale_after``, and a target
that is disabled, or triggered by hand only (schedule 0), has no sweep-time alert. ``reaper
alert-rules`` prints them for a config; ``include/prometheus/reaper-rules.yml`` is this output
for ``include/reaper.yaml`` (a test keeps the two equal).

The reaper's series come from the active rollout phase's sweeps only, grouped by target and
scope (:mod:`reaper.metrics`): the alerts follow the active phase, and a what-if run of another
phase, a dry run or a removed scope leaves nothing behind that pages.
"""

from __future__ import annotations

from datetime import timedelta

import yaml

from reaper.config import Settings

SWEEPS = 3  # missed or held sweeps before a sweep-time alert
LAST_SUCCESS = "reaper_last_success_timestamp_seconds"
LAST_PASS = "runner_manager_heartbeat_last_pass_timestamp_seconds"
PASSES = "runner_manager_heartbeat_passes_total"
FAILED_PASSES = "runner_manager_heartbeat_failed_passes_total"
PAGE, TICKET = "page", "ticket"


def prom_duration(span: timedelta) -> str:
    """A duration as Prometheus writes it, in its largest whole unit (``30m``, ``2h``, ``90s``)."""
    seconds = int(span.total_seconds())
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _rule(
    alert: str, expr: str, severity: str, summary: str, wait: timedelta | None = None, target: str = ""
) -> dict[str, object]:
    """One alerting rule; ``target`` labels the rules written once per target (else promtool sees duplicates)."""
    rule: dict[str, object] = {"alert": alert, "expr": expr}
    if wait:
        rule["for"] = prom_duration(wait)
    rule["labels"] = {"severity": severity, **({"target": target} if target else {})}
    rule["annotations"] = {"summary": summary, "runbook": f"docs/runbook.md#{alert.lower()}"}
    return rule


def _per_target(target: str, schedule: timedelta) -> list[dict[str, object]]:
    """The alerts on one target's sweeps; those that count missed sweeps only where it is scheduled."""
    held = SWEEPS * schedule if schedule else timedelta(minutes=30)
    rules = []
    if schedule:
        late = SWEEPS * schedule
        rules += [
            _rule(
                "ReaperNotSweeping",
                f'time() - max by (target) ({LAST_SUCCESS}{{target="{target}"}}) > {int(late.total_seconds())}',
                PAGE,
                f"The {target} reaper's active phase has not completed a sweep for {prom_duration(late)}",
                target=target,
            ),
            _rule(
                "ReaperNotReporting",
                f'absent({LAST_SUCCESS}{{target="{target}"}})',
                PAGE,
                f"No sweep of the {target} reaper reaches Prometheus: the Pushgateway is unset, restarted or "
                "not scraped, or no sweep of the active phase has succeeded",
                late,
                target,
            ),
        ]
    rules.append(
        _rule(
            "ReaperInventoryIncomplete",
            f'max by (target, scope) (reaper_scope_hold{{target="{target}",hold="inventory_incomplete"}}) == 1',
            TICKET,
            "The reaper cannot list {{ $labels.scope }} completely: nothing is deleted there",
            held,
            target,
        )
    )
    if target == "gce":
        rules.append(
            _rule(
                "ReaperWriterHealthUnknown",
                'max by (target, scope) (reaper_scope_hold{target="gce",hold="writer_health_unknown",'
                'blocks_deletes="true"}) == 1',
                TICKET,
                "The reaper cannot read the heartbeat writers' health of {{ $labels.scope }}: "
                "its heartbeat deletes are held",
                held,
            )
        )
    return rules


def _writers(config: Settings) -> list[dict[str, object]]:
    """The heartbeat writers' cause alerts: over windows, so a start or a single failed pass does not page."""
    window = config.gce.writer_stale_after
    w = prom_duration(window)
    by = "by (manager, project)"
    failing = f"sum {by} (increase({FAILED_PASSES}[{w}])) / sum {by} (increase({PASSES}[{w}])) > 0.5"
    # A manager reports 0 until its first pass: stale once it has passed (> 0) and not since, or once it
    # has reported for the whole window without a single pass (a crash loop that never gets through one).
    stale = (
        f"time() - max {by} ({LAST_PASS} > 0) > {int(window.total_seconds())} "
        f"or (max {by} (max_over_time({LAST_PASS}[{w}])) == 0 and on (manager, project) "
        f"max {by} ({LAST_PASS} offset {w}) >= 0)"
    )
    return [
        _rule(
            "HeartbeatWriterFailing",
            failing,
            PAGE,
            "Runner manager {{ $labels.manager }} in {{ $labels.project }} fails most of its heartbeat passes",
            timedelta(minutes=10),
        ),
        _rule(
            "HeartbeatWriterStale",
            stale,
            PAGE,
            "Runner manager {{ $labels.manager }} in {{ $labels.project }} has not completed a heartbeat pass "
            f"for {w}",
            timedelta(minutes=5),
        ),
    ]


def rules(config: Settings) -> dict[str, object]:
    """The rule file for ``config`` as data."""
    found: list[dict[str, object]] = []
    for target in ("gce", "k8s"):
        if getattr(config, target).enabled:
            found += _per_target(target, getattr(config.airflow, f"{target}_schedule"))
    if config.gce.enabled:
        found += _writers(config)
    found += [
        _rule(
            "ReaperBudgetHold",
            'max by (target, scope) (reaper_scope_hold{hold="budget_exceeded",blocks_deletes="true"}) == 1',
            PAGE,
            "Reaper budget hold in {{ $labels.scope }}: most of it went stale at once, nothing stale is deleted there",
        ),
        _rule(
            "ReaperCapped",
            "max by (target) (reaper_last_sweep_capped) == 1",
            PAGE,
            "The {{ $labels.target }} reaper planned more deletes than max_deletions_per_sweep: it deleted nothing",
        ),
        _rule(
            "ReaperDeletionsFailing",
            'max by (target) (reaper_last_sweep_deletions{outcome="failed"}) > 0',
            TICKET,
            "The {{ $labels.target }} reaper's deletions have been failing for 30m",
            timedelta(minutes=30),
        ),
        _rule(
            "ReaperOrphansHeld",
            "max by (target, scope) (reaper_last_sweep_held_orphans) > 0",
            TICKET,
            "Orphans the active phase would delete have been held in {{ $labels.scope }} for 2h",
            timedelta(hours=2),
        ),
        _rule(
            "ReaperMetricsPushFailing",
            "max by (target) (reaper_last_sweep_push_failures) > 0",
            TICKET,
            "The {{ $labels.target }} reaper's metric pushes have been failing for 30m",
            timedelta(minutes=30),
        ),
    ]
    return {"groups": [{"name": "reaper", "rules": found}]}


def render(config: Settings, source: str) -> str:
    """The rule file as YAML, headed by where it came from."""
    head = (
        f"# Generated by `reaper alert-rules` from {source}: do not edit; change the config and generate again.\n"
        "# Each alert's one human action is in docs/runbook.md under its name.\n"
    )
    return head + yaml.safe_dump(rules(config), sort_keys=False, width=1000)
