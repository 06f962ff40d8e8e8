"""The Prometheus alert rules, generated from the config (docs/design.md §10; one action each in docs/runbook.md).

Thresholds and names follow the config, so they cannot drift from it: "not sweeping" is three
missed sweeps of the target's schedule, the writers' alerts read the metrics, labels, projects
and windows of ``gce.writer_health``, and a target that is disabled has no alert (one triggered
by hand only, schedule 0, has no sweep-time alert). ``reaper
alert-rules`` prints them for a config; ``include/prometheus/reaper-rules.yml`` is this output
for ``include/reaper.yaml`` (a test keeps the two equal).

The reaper's series come from the active rollout phase's sweeps (and a run of another phase its
trigger confirmed), grouped by target and scope (:mod:`reaper.metrics`): the alerts follow the active
phase, and a what-if run of another phase, a dry run or a removed scope leaves nothing behind that pages:
a removed scope's group the sweeps could not retire is stale once three sweeps went by without it, and
every scope alert leaves it out (ReaperStaleScope names it instead). ReaperNotSweeping, once firing,
stays so while the series it reads is gone (a Pushgateway restarted without persistence): the on-call
never reads RESOLVED before a sweep has succeeded.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import NotRequired, TypedDict

import yaml

from reaper.config import Settings
from reaper.metrics import ALL, ATTEMPT, JOB
from reaper.sweep.targets import TARGETS

SWEEPS = 3  # missed sweeps before a sweep-time alert
SLACK = timedelta(minutes=5)  # a push, a scrape and an evaluation late
FLOOR = timedelta(minutes=15)  # never less: a restart of Airflow or a config deploy is no outage
LAST_SUCCESS = "reaper_last_success_timestamp_seconds"
NOT_SWEEPING = "ReaperNotSweeping"  # its expression reads its own state (ALERTS)
# The Pushgateway's own stamp of each group's last push, labelled with the group's grouping key.
PUSH_TIME = "push_time_seconds"
# ReaperDeletionsFailing's second arm: deletions failing in this share of a window's sweeps (counted in the
# window's minutes whose last sweep had failed deletes), the clean sweeps between them notwithstanding: two
# sweeps of three failing for hours never kept the last sweep's failures up for 30m in a row.
FAILING_WINDOW, FAILING_SHARE = timedelta(hours=3), 0.5
PAGE, TICKET = "page", "ticket"
REGEX_META = set("\\.+*?()|[]{}^$")


def prom_duration(span: timedelta) -> str:
    """A duration as Prometheus writes it, in its largest whole unit (``30m``, ``2h``, ``90s``)."""
    seconds = int(span.total_seconds())
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# One alerting rule as the rule file holds it, its keys in the file's order ("for" is a keyword, hence this form).
Rule = TypedDict(
    "Rule",
    {"alert": str, "expr": str, "for": NotRequired[str], "labels": dict[str, str], "annotations": dict[str, str]},
)


class RuleGroup(TypedDict):
    name: str
    rules: list[Rule]


class RuleFile(TypedDict):
    """The rule file (:func:`rules`)."""

    groups: list[RuleGroup]


def _rule(alert: str, expr: str, severity: str, summary: str, wait: timedelta | None = None, target: str = "") -> Rule:
    """One alerting rule; ``target`` labels the rules written once per target (else promtool sees duplicates)."""
    labels = {"severity": severity, **({"target": target} if target else {})}
    annotations = {"summary": summary}  # and its runbook_url (rules)
    if wait:
        return {"alert": alert, "expr": expr, "for": prom_duration(wait), "labels": labels, "annotations": annotations}
    return {"alert": alert, "expr": expr, "labels": labels, "annotations": annotations}


def _late(config: Settings, target: str) -> timedelta | None:
    """Three missed sweeps of ``target``, counted from the end of its last complete sweep: four intervals,
    plus the time a push, a scrape and an evaluation may take; None for a target triggered by hand only."""
    schedule = TARGETS[target](config).schedule
    return max(FLOOR, (SWEEPS + 1) * schedule + SLACK) if schedule else None


def _held(config: Settings, target: str) -> timedelta:
    """How long a scope's condition lasts before its ticket: three missed sweeps, 30m without a schedule."""
    return _late(config, target) or timedelta(minutes=30)


def _stale(target: str, wait: timedelta) -> str:
    """The scope groups of ``target`` pushed ``wait`` or longer before its own group (``_all``, pushed by
    every complete sweep of every scope): a scope no longer configured whose group the retirement could not
    delete, or one whose pushes keep failing. Against the target's own push, so a dead reaper, whose groups
    all age alike, makes none of them stale."""
    of = f'job="{JOB}",target="{target}"'
    return (
        f'max by (target) ({PUSH_TIME}{{{of},scope="{ALL}"}}) - on (target) group_right '
        f'max by (target, scope) ({PUSH_TIME}{{{of},scope!~"{ALL}|{ATTEMPT}"}}) >= {int(wait.total_seconds())}'
    )


def _fresh(expr: str, config: Settings, target: str) -> str:
    """``expr``, by target and scope, without the stale scope groups: their last values are no news of the
    scope, and ReaperStaleScope says why they stopped."""
    return f"({expr}) unless on (target, scope) ({_stale(target, _held(config, target))})"


def _per_target(config: Settings, target: str) -> list[Rule]:
    """The alerts on one target's sweeps, its series only: a disabled target's last values never page.

    A target triggered by hand only (schedule 0) has no sweep-time alert, and its other alerts are
    tickets: its last values stand until the next manual run. The scope alerts leave out the stale scope
    groups (:func:`_fresh`).
    """
    schedule, late, held = TARGETS[target](config).schedule, _late(config, target), _held(config, target)
    urgent = PAGE if late else TICKET
    of = f'target="{target}"'
    rules = []
    if late:
        w = prom_duration(late)
        rules += [
            _rule(
                NOT_SWEEPING,
                # The last success seen within the wait, so a Pushgateway restarted without persistence (the
                # series gone) does not hide a reaper already dead; once firing, it stays so while the series
                # is absent (ALERTS: its own state), and resolves only when a completed sweep's success arrives.
                f"time() - max by (target) (last_over_time({LAST_SUCCESS}{{{of}}}[{w}])) > {int(late.total_seconds())} "
                f"or (absent({LAST_SUCCESS}{{{of}}}) and on (target) "
                f'ALERTS{{alertname="{NOT_SWEEPING}",alertstate="firing",{of}}})',
                PAGE,
                f"The {target} reaper's active phase has not completed a sweep for {w}",
                target=target,
            ),
            _rule(
                "ReaperNotReporting",
                f"absent({LAST_SUCCESS}{{{of}}})",
                PAGE,
                f"No sweep of the {target} reaper reaches Prometheus: the Pushgateway is unset, restarted or "
                "not scraped, or no sweep of the active phase has succeeded",
                late,
                target,
            ),
        ]
    failed, window = f'reaper_last_sweep_deletions{{{of},outcome="failed"}}', prom_duration(FAILING_WINDOW)
    rules += [
        _rule(
            "ReaperBudgetHold",
            _fresh(
                f'max by (target, scope) (reaper_scope_hold{{{of},hold="budget_exceeded",blocks_deletes="true"}}) == 1',
                config,
                target,
            ),
            # Kubernetes sandboxes are cheap to keep and a few cancelled runs trip a small cluster's budget.
            urgent if target == "gce" else TICKET,
            "Reaper budget hold in {{ $labels.scope }}: most of it went stale at once, nothing stale is deleted there",
            target=target,
        ),
        _rule(
            "ReaperCapped",
            f"max by (target) (reaper_last_sweep_capped{{{of}}}) == 1",
            urgent,
            f"The {target} reaper planned more deletes than max_deletions_per_sweep: it deleted nothing",
            target=target,
        ),
        _rule(
            "ReaperInventoryIncomplete",
            _fresh(
                f'max by (target, scope) (reaper_scope_hold{{{of},hold="inventory_incomplete"}}) == 1', config, target
            ),
            TICKET,
            "The reaper cannot list {{ $labels.scope }} completely: nothing is deleted there",
            held,
            target,
        ),
        _rule(
            "ReaperNotDeleting",
            f'(sum by (target) (reaper_last_sweep_decisions{{{of},action="delete"}}) > 0) unless on (target) '
            f'(max by (target) (reaper_last_sweep_deletions{{{of},outcome="deleted"}}) > 0)',
            TICKET,
            f"The {target} reaper plans deletes but none has gone through for 30m",
            timedelta(minutes=30),
            target,
        ),
        _rule(
            "ReaperDeletionsFailing",
            f"max by (target) ({failed}) > 0 or sum_over_time((max by (target) ({failed}) > bool 0)[{window}:1m]) "
            f">= {int(FAILING_WINDOW * FAILING_SHARE / timedelta(minutes=1))}",
            TICKET,
            f"The {target} reaper's deletions have been failing for 30m, or in {FAILING_SHARE:.0%} or more of "
            f"its sweeps over {window}",
            timedelta(minutes=30),
            target,
        ),
        _rule(
            "ReaperOrphansHeld",
            _fresh(f"max by (target, scope) (reaper_last_sweep_held_orphans{{{of}}}) > 0", config, target),
            TICKET,
            "Orphans the active phase would delete have been held in {{ $labels.scope }} for 2h",
            timedelta(hours=2),
            target,
        ),
        _rule(
            "ReaperMetricsPushFailing",
            f"max by (target) (reaper_last_sweep_push_failures{{{of}}}) > 0",
            TICKET,
            f"Some of the {target} reaper's metric pushes have been failing for 30m",
            timedelta(minutes=30),
            target,
        ),
        _rule(
            "ReaperMetricsRetireFailing",
            f"max by (target) (reaper_last_sweep_retire_failures{{{of}}}) > 0",
            TICKET,
            f"The {target} reaper has failed for 30m to delete the metric groups of scopes it no longer sweeps: "
            "their last values stand (ReaperStaleScope names them)",
            timedelta(minutes=30),
            target,
        ),
        _rule(
            "ReaperStaleScope",
            _stale(target, held),
            TICKET,
            "The reaper's metrics of {{ $labels.scope }} are {{ $value | humanizeDuration }} older than its last "
            "complete sweep: the scope is no longer swept, or its pushes fail; its alerts are muted",
            target=target,
        ),
    ]
    if target == "gce":
        rules.append(
            _rule(
                "ReaperThrottled",
                _fresh(
                    'max by (target, scope) (reaper_last_sweep_throttled_answers{target="gce"}) > 0', config, target
                ),
                TICKET,
                "The reaper met {{ $labels.scope }}'s rate quotas used up in consecutive sweeps: raise the quota "
                "or lower gce.quota.share",
                # A gauge holds until the next push: above 0 for longer than one schedule, two sweeps in a row.
                (schedule + SLACK) if schedule else timedelta(minutes=30),
                target,
            )
        )
    if target == "gce" and config.gce.writer_health.source == "prometheus":
        rules.append(
            _rule(
                "ReaperWriterHold",
                _fresh(
                    'max by (target, scope, hold) (reaper_scope_hold{target="gce",'
                    'hold=~"writer_unhealthy|writer_health_unknown",blocks_deletes="true"}) == 1',
                    config,
                    target,
                ),
                TICKET,
                "Heartbeat deletes in {{ $labels.scope }} are held by writer health ({{ $labels.hold }})",
                held,
                target,
            )
        )
    return rules


def _literal(text: str) -> str:
    """``text`` matched literally by a PromQL regex: metacharacters escaped, the backslash doubled
    for PromQL's string syntax (project ids rarely have any: ``ci-runners-a`` stays as it is)."""
    return "".join(f"\\\\{c}" if c in REGEX_META else c for c in text)


def _writers(config: Settings) -> list[Rule]:
    """The heartbeat writers' cause alerts, on the metrics and labels the reaper reads (``gce.writer_health``),
    for the swept projects only; over windows, so a start or a single failed pass does not page."""
    health = config.gce.writer_health
    if health.source != "prometheus" or not config.gce.projects:
        return []
    manager, project = health.manager_label, health.project_label
    of = f'{project}=~"{"|".join(_literal(p) for p in config.gce.projects)}"'
    last, stale_after = f"{health.last_pass_metric}{{{of}}}", config.gce.writer_stale_after
    by, w = f"by ({manager}, {project})", prom_duration(stale_after)
    window = prom_duration(health.failing_window)
    failing = (
        f"sum {by} (increase({health.failed_passes_metric}{{{of}}}[{window}])) "
        f"/ sum {by} (increase({health.passes_metric}{{{of}}}[{window}])) > 0.5"
    )
    # A manager reports 0 until its first pass: stale once it has passed (> 0) and not since, or once it
    # has been seen for the whole window without a single pass (a crash loop, scraped only now and then).
    stale = (
        f"time() - max {by} ({last} > 0) > {int(stale_after.total_seconds())} "
        f"or (max {by} (max_over_time({last}[{w}])) == 0 and on ({manager}, {project}) "
        f"max {by} (present_over_time({last}[10m] offset {w})))"
    )
    who = f"Runner manager {{{{ $labels.{manager} }}}} in {{{{ $labels.{project} }}}}"
    return [
        _rule(
            "HeartbeatWriterFailing", failing, PAGE, f"{who} fails most of its heartbeat passes", timedelta(minutes=10)
        ),
        _rule(
            "HeartbeatWriterStale",
            stale,
            PAGE,
            f"{who} has not completed a heartbeat pass for {w}",
            timedelta(minutes=5),
        ),
    ]


# The series the cause alerts read, as their exporters name them:
# kube-state-metrics internal/store/pod.go (createPodContainerStatusRestartsTotalFamilyGenerator), a counter
# per (namespace, pod, container); gitlab-runner executors/docker/machine/provider.go (newMachineProvider's
# totalActions, incremented in createWithGrowthCapacity), const label executor="docker+machine".
RESTARTS = "kube_pod_container_status_restarts_total"
ACTIONS = "gitlab_runner_autoscaling_actions_total"
CREATION = 'executor="docker+machine",action=~"created|creation-failed"'
CREATION_FAILED = 'executor="docker+machine",action="creation-failed"'


def _matchers(selector: dict[str, str]) -> str:
    """Label regexes as PromQL matchers, each a double-quoted PromQL string (backslash and quote escaped)."""
    quoted = {name: pattern.replace("\\", "\\\\").replace('"', '\\"') for name, pattern in selector.items()}
    return ",".join(f'{name}=~"{pattern}"' for name, pattern in quoted.items())


def cause_series(config: Settings) -> dict[str, str]:
    """The series each cause alert reads, by the config key that selects them: a selector that matches none
    validates, and its alert can then never fire (the preflight counts them, :mod:`reaper.preflight`)."""
    causes = config.cause_alerts
    managers, pods = _matchers(causes.runner_managers), _matchers(causes.manager_pods)
    return {
        "cause_alerts.manager_pods": f"{RESTARTS}{{{managers},{pods}}}",
        "cause_alerts.runner_managers": f"{ACTIONS}{{{managers},{CREATION}}}",
    }


def _causes(config: Settings) -> list[Rule]:
    """The runner managers' cause alerts (docs/design.md §10): the events that produce orphans, hours before the quota
    alerts. A crash loop counts restarts of any reason; ``increase()`` only extrapolates upwards, so
    N restarts seen in the window always reach N. The machine_creation SLI pages on a multi-window
    burn rate (the SRE workbook's): the error ratio over the window and over a twelfth of it."""
    causes = config.cause_alerts
    if not causes.enabled:
        return []
    managers = _matchers(causes.runner_managers)
    restarts, attempted = cause_series(config).values()
    window = prom_duration(causes.crash_loop_window)
    crash_loop = _rule(
        "RunnerManagerCrashLooping",
        # A runner-managers cluster runs other pods too (a logging agent): only the managers' containers.
        f"increase({restarts}[{window}]) >= {causes.crash_loop_restarts}",
        PAGE,
        "Runner manager {{ $labels.namespace }}/{{ $labels.pod }} (container {{ $labels.container }}) restarted "
        f"{causes.crash_loop_restarts} times or more in {window}: each restart fails the jobs it ran and can "
        "abandon the machines it tracked",
    )
    sli = causes.machine_creation
    by = ", ".join(sli.group_by)
    budget = 1 - sli.objective

    def ratio(span: timedelta) -> str:
        w = prom_duration(span)
        return (
            f"sum by ({by}) (rate({ACTIONS}{{{managers},{CREATION_FAILED}}}[{w}])) "
            f"/ sum by ({by}) (rate({attempted}[{w}]))"
        )

    burns = []
    for arm, burn, severity in (("fast", sli.fast, PAGE), ("slow", sli.slow, TICKET)):
        threshold = f"{burn.burn_rate * budget:.6g}"
        where = " ".join(f"{label} {{{{ $labels.{label} }}}}" for label in sli.group_by)
        # The floor: a shard that attempted fewer creations over the window than one failure alone takes
        # above the threshold (7 an hour for 14.4 x a 1% budget) has no ratio worth an alert yet.
        floor = math.ceil(round(1 / float(threshold), 6))
        attempts = f"sum by ({by}) (increase({attempted}[{prom_duration(burn.window)}]))"
        rule = _rule(
            "MachineCreationBudgetBurn",
            f"({ratio(burn.window)} > {threshold}) and ({ratio(burn.window / 12)} > {threshold}) "
            f"and ({attempts} >= {floor})",
            severity,
            f"Machine creation in {where} fails {burn.burn_rate:g}x its error budget ({budget:.6g} of creations) "
            f"over {prom_duration(burn.window)} and {prom_duration(burn.window / 12)}",
        )
        rule["labels"]["window"] = arm
        burns.append(rule)
    return [crash_loop, *burns]


def _residual_groups(config: Settings) -> list[Rule]:
    """Fleeting groups left holding instances by a decommissioned manager (docs/design.md §10, residual groups).

    On the residual_group reports, so the alert follows the rollout like the rule (nothing in
    telemetry); only where groups are listed and the managers' reports can be read.
    """
    gce = config.gce
    if not (gce.enabled and gce.group_selector and gce.writer_health.source == "prometheus"):
        return []
    return [
        _rule(
            "ReaperResidualGroup",
            _fresh(
                'sum by (target, scope) (reaper_last_sweep_decisions{target="gce",rule="residual_group",'
                'action="report"}) > 0',
                config,
                "gce",
            ),
            TICKET,
            "{{ $value }} fleeting instance group(s) in {{ $labels.scope }} hold instances while their manager "
            f"has reported no writer health for over {prom_duration(gce.quarantine)}",
            timedelta(minutes=30),
        )
    ]


def rules(config: Settings) -> RuleFile:
    """The rule file for ``config`` as data."""
    found: list[Rule] = []
    for target in ("gce", "k8s"):
        if getattr(config, target).enabled:
            found += _per_target(config, target)
    if config.gce.enabled:
        found += _writers(config)
    found += _residual_groups(config)
    found += _causes(config)
    for rule in found:  # each alert's section of the runbook (metrics.runbook_url)
        rule["annotations"]["runbook_url"] = f"{config.metrics.runbook_url}#{str(rule['alert']).lower()}"
    return {"groups": [{"name": "reaper", "rules": found}]}


def render(config: Settings, source: str) -> str:
    """The rule file as YAML, headed by where it came from."""
    head = (
        f"# Generated by `reaper alert-rules` from {source}: do not edit; change the config and generate again.\n"
        "# Each alert's one human action is in docs/runbook.md under its name (annotation runbook_url).\n"
    )
    return head + yaml.safe_dump(rules(config), sort_keys=False, width=1000)
