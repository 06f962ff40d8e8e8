"""The reaper's configuration: one YAML file validated into typed, frozen settings.

Every key of DESIGN.md sections 4 to 6 lives here with its documented default.
A config that fails validation raises :class:`ConfigError` with one message
naming the file, the key path and what was expected; callers must then run
nothing (an invalid config never reaches the policy, so nothing is deleted).
"""

from __future__ import annotations

import math
import os
import re
from datetime import timedelta
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from reaper.durations import parse_duration, short

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "include" / "reaper.yaml"
CONFIG_ENV = "REAPER_CONFIG"


class ConfigError(Exception):
    """Invalid configuration or input: the message names the file, the key and what was expected."""


class Mode(IntEnum):
    """A rule's mode. Ordered, so the effective mode is a plain ``min()``."""

    OFF = 0
    REPORT = 1
    DELETE = 2

    def __str__(self) -> str:
        return self.name.lower()


def _mode(value: object) -> Mode:
    if isinstance(value, Mode):
        return value
    if isinstance(value, str) and value.lower() in ("off", "report", "delete"):
        return Mode[value.upper()]
    raise ValueError(f"expected one of off, report, delete, got {value!r}")


def _label_pair(value: object) -> tuple[str, str]:
    """``key=value`` (the notation of DESIGN.md) into a (key, value) pair."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, str) and value.count("=") == 1:
        key, val = (part.strip() for part in value.split("="))
        if key:
            return key, val
    raise ValueError(f"expected a label as key=value (e.g. reaper_keep=true), got {value!r}")


def _group_selector(value: object) -> str:
    """A regex with a named group ``manager`` (or empty: no fleeting groups)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a regex string with a named group (?P<manager>...), got {value!r}")
    if not value:
        return value
    try:
        compiled = re.compile(value)
    except re.error as exc:
        raise ValueError(f"expected a valid regex, got {value!r} ({exc})") from None
    if "manager" not in compiled.groupindex:
        raise ValueError(f"expected a regex with a named group (?P<manager>...) naming the manager, got {value!r}")
    return value


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _at_least(least: timedelta, why: str) -> AfterValidator:
    """A lower bound of a duration whose zero (or a tiny value) would remove a safety margin without saying
    so; ``least`` zero means more than zero."""

    def check(span: timedelta) -> timedelta:
        if span < least or span <= timedelta(0):
            bound = f"at least {short(least)}" if least else "more than 0s"
            raise ValueError(f"expected {bound} ({why}), got {short(span)}")
        return span

    return AfterValidator(check)


# Every external call has a timeout; 0 is none to some clients (MongoDB's wtimeout) and fails every call in others.
Timeout = Annotated[
    Duration, _at_least(timedelta(seconds=1), "every call is bounded by it; 0 means no bound to some clients")
]
RuleMode = Annotated[Mode, BeforeValidator(_mode)]
LabelPair = Annotated[tuple[str, str], BeforeValidator(_label_pair)]


def _report_at_most(value: object) -> Mode:
    """A report-only rule's mode: ``off`` or ``report``; ``delete`` is refused, never capped silently."""
    mode = _mode(value)
    if mode is Mode.DELETE:
        raise ValueError("expected off or report: this rule only ever reports (it never deletes)")
    return mode


Selector = Annotated[dict[str, str], Field(min_length=1)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class WriterHealthConfig(_Section):
    """Where the heartbeat writers' pass records come from (DESIGN.md section 4, writer health)."""

    source: Literal["prometheus", "none"] = "prometheus"
    prometheus_url: str = "http://127.0.0.1:9090"
    last_pass_metric: str = "runner_manager_heartbeat_last_pass_timestamp_seconds"
    failed_passes_metric: str = "runner_manager_heartbeat_failed_passes_total"
    passes_metric: str = "runner_manager_heartbeat_passes_total"  # every pass: the alerts' denominator
    manager_label: str = "manager"
    project_label: str = "project"
    # increase() sees a failed pass only with two scrapes inside the window: shorter, a failing writer reads healthy.
    failing_window: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a failed pass counts only with two scrapes within it")
    ] = timedelta(minutes=15)
    timeout: Timeout = timedelta(seconds=10)


class QuotaLimits(_Section):
    """A project's Compute API rate quotas, requests per window per quota group (the documented defaults).

    Raise them to what the project's quota page says where they were raised: the reaper spends a
    share of these, so a limit set too high makes it spend more than its share of the real one.
    """

    list_requests: int = Field(1500, ge=1)
    read_requests: int = Field(1500, ge=1)
    mutation_requests: int = Field(1500, ge=1)
    operation_read_requests: int = Field(1500, ge=1)


QUOTA_WINDOW_ENV = "REAPER_EMULATOR_QUOTA_WINDOW"


def quota_window() -> float:
    """The rate quotas' refill period in seconds: the Compute API's synchronized minute.

    Not a config key (a shorter one would multiply the reaper's spend of the real minute): an
    emulator with a faster clock, as in the tests, sets ``$REAPER_EMULATOR_QUOTA_WINDOW`` instead.
    """
    value = os.environ.get(QUOTA_WINDOW_ENV)
    if not value:
        return 60.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ConfigError(f"invalid ${QUOTA_WINDOW_ENV}: expected a positive number of seconds, got {value!r}")
    return seconds


class QuotaConfig(_Section):
    """How much of each project's rate quotas the reaper may spend (docs/design.md §6, quotas).

    The runner managers of a project spend the same quotas (heartbeat label writes, machine
    creations); the reaper keeps to ``share`` of each group per minute so that autoscaling keeps the
    rest. At most half: the managers are what the fleet runs on.
    """

    limits: QuotaLimits = QuotaLimits()
    share: float = Field(0.2, gt=0.0, le=0.5)

    @model_validator(mode="after")
    def _room_for_a_call(self) -> QuotaConfig:
        for group, limit in self.limits:
            if int(limit * self.share) < 1:
                raise _CrossFieldError(
                    ("gce", "quota", "share"),
                    f"expected a share that leaves the reaper at least one {group} call per minute "
                    f"(limit {limit} x share {self.share} < 1)",
                )
        return self

    def allowance(self, group: str) -> int:
        """Calls of ``group`` the reaper may make in one minute (window) of one project."""
        return int(getattr(self.limits, group) * self.share)

    @property
    def deletes_per_second(self) -> float:
        """The fastest deletes can go in one project within the share: each is a read (the re-read), a
        mutation and at least one operation read."""
        return min(self.allowance(group) for group in QuotaLimits.model_fields) / quota_window()


class GceConfig(_Section):
    enabled: bool = True
    conn_id: str = "google_cloud_default"
    projects: list[str] = []
    selector: Selector = {"ci_ephemeral": "true"}
    heartbeat_label: str = Field("runner_manager_heartbeat", min_length=1)
    max_job_timeout: Annotated[Duration, _at_least(timedelta(0), "a dead manager's last job may run this long")] = (
        timedelta(hours=3)
    )
    slack: Annotated[
        Duration, _at_least(timedelta(0), "a live manager's beats are a heartbeat interval apart, its clock off")
    ] = timedelta(hours=1)
    clock_skew: Duration = timedelta(minutes=5)  # 0 is stricter: more anomalies, more writers unhealthy
    terminated_grace: Annotated[
        Duration, _at_least(timedelta(0), "a VM just seen stopped may be its manager's stop-and-start or delete")
    ] = timedelta(minutes=10)
    unlabeled_max_age: Duration = timedelta(days=3)  # at least the quarantine: Settings._margins
    writer_stale_after: Duration = timedelta(minutes=30)  # 0 is stricter: every writer stale, every beat held
    opt_out_label: LabelPair = ("reaper_keep", "true")
    protected_projects: list[str] = []
    list_concurrency: int = Field(8, ge=1, le=64)
    delete_concurrency: int = Field(8, ge=1, le=64)
    delete_rate_per_project: float = Field(5.0, gt=0)
    max_retries: int = Field(4, ge=0, le=10)
    request_timeout: Timeout = timedelta(seconds=30)
    # An accepted delete not DONE by then is failed (an operation still running when the run must stop is
    # operation_pending): at least the two minutes one zoneOperations.wait may take.
    operation_timeout: Annotated[
        Duration, _at_least(timedelta(minutes=2), "zoneOperations.wait alone may take two minutes")
    ] = timedelta(minutes=5)
    quota: QuotaConfig = QuotaConfig()
    writer_health: WriterHealthConfig = WriterHealthConfig()
    # Fleeting runners' managed instance groups: a regex the whole group name must match, whose named
    # group ``manager`` is the manager as writer health names it; empty: no group is listed.
    group_selector: Annotated[str, BeforeValidator(_group_selector)] = ""

    @property
    def delete_rate(self) -> float:
        """Deletes per second per project: ``delete_rate_per_project``, or less when the quota share allows less."""
        return min(self.delete_rate_per_project, self.quota.deletes_per_second)

    @property
    def quarantine(self) -> timedelta:
        """``Q``: a heartbeat older than this means no live manager tracks the instance."""
        return self.max_job_timeout + self.slack

    def group_manager(self, group: str) -> str | None:
        """The manager of the managed instance group named ``group``, or None: not a fleeting group.

        The one place the group -> manager mapping is decided: the listing selects with it, the
        policy maps with it.
        """
        match = re.fullmatch(self.group_selector, group) if self.group_selector else None
        return (match.group("manager") or None) if match else None


class MongoRunStoreConfig(_Section):
    """The run store: one document per run, ``{key_field: run key, status_field: status}``."""

    conn_id: str = "mongo_default"
    database: str = "iterion"
    collection: str = "runs"
    key_field: str = "_id"
    status_field: str = "status"
    batch_size: int = Field(1000, ge=1, le=1000)
    timeout: Timeout = timedelta(seconds=5)


class MongoLeaseConfig(_Section):
    """Leases as documents ``{_id: run key, expires_at: datetime or unix seconds}``."""

    conn_id: str = "mongo_default"
    database: str = "iterion"
    collection: str = "run_leases"
    batch_size: int = Field(1000, ge=1, le=1000)
    timeout: Timeout = timedelta(seconds=5)


class NatsLeaseConfig(_Section):
    """Leases as keys of a JetStream KV bucket; ``key_template`` maps a run key to a KV key."""

    conn_id: str = "nats_default"
    bucket: str = "run_leases"
    key_template: str = "{run}"
    timeout: Timeout = timedelta(seconds=5)

    @field_validator("key_template")
    @classmethod
    def _has_run(cls, template: str) -> str:
        if template.count("{run}") != 1:
            raise ValueError(f"expected a template containing {{run}} exactly once, got {template!r}")
        return template


class PostgresStepStoreConfig(_Section):
    """The step-run store: ``table (run_id, step, attempt, status, results)``, names configurable."""

    conn_id: str = "postgres_default"
    table: str = Field("step_runs", pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    run_column: str = Field("run_id", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    step_column: str = Field("step", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    attempt_column: str = Field("attempt", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    status_column: str = Field("status", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    results_column: str = Field("results", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    batch_size: int = Field(1000, ge=1, le=10000)
    timeout: Timeout = timedelta(seconds=5)


class K8sConfig(_Section):
    enabled: bool = True
    clusters: list[str] = ["kubernetes_default"]
    # The sandbox namespaces, listed one by one (a namespaced Role suffices); empty: every namespace.
    namespaces: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]] = []
    selector: Selector = {"iterion.io/managed": "true"}
    run_label: str = Field("iterion.io/run-id", min_length=1)
    terminal_statuses: list[str] = Field(["succeeded", "failed", "cancelled"], min_length=1)
    min_age: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a sandbox younger may not have its lease or run record yet")
    ] = timedelta(minutes=5)
    lease_clock_skew: Duration = timedelta(seconds=30)  # 0 when the lease writers' clocks are the reaper's
    results_sidecar: str = "results-egress"
    opt_out_label: LabelPair = ("reaper.io/keep", "true")
    protected_namespaces: list[str] = ["kube-system"]
    lease_source: Literal["nats", "mongo", "none"] = "nats"
    run_store: Literal["mongo", "none"] = "mongo"
    step_store: Literal["postgres", "none"] = "none"
    step_label: str = "iterion.io/step"
    attempt_label: str = "iterion.io/attempt"
    step_failed_statuses: list[str] = ["failed"]
    mongo_run_store: MongoRunStoreConfig = MongoRunStoreConfig()
    mongo_leases: MongoLeaseConfig = MongoLeaseConfig()
    nats_leases: NatsLeaseConfig = NatsLeaseConfig()
    postgres_step_store: PostgresStepStoreConfig = PostgresStepStoreConfig()
    delete_concurrency: int = Field(8, ge=1, le=64)
    delete_rate_per_cluster: float = Field(20.0, gt=0)
    max_retries: int = Field(4, ge=0, le=10)
    request_timeout: Timeout = timedelta(seconds=10)
    pod_gone_timeout: Duration = timedelta(seconds=10)  # 0: no wait; the run's Secrets wait for a later sweep

    @field_validator("terminal_statuses", "step_failed_statuses")
    @classmethod
    def _lower(cls, statuses: list[str]) -> list[str]:
        return [s.lower() for s in statuses]

    @field_validator("namespaces")
    @classmethod
    def _once_each(cls, namespaces: list[str]) -> list[str]:
        """A namespace named twice would be listed twice: the same objects twice in one listing."""
        twice = sorted({n for n in namespaces if namespaces.count(n) > 1})
        if twice:
            raise ValueError(f"each namespace once; named more than once: {', '.join(twice)}")
        return namespaces


class BudgetConfig(_Section):
    min_stale: int = Field(3, ge=0)
    max_stale_fraction: float = Field(0.5, ge=0.0, le=1.0)


class RulesConfig(_Section):
    """Configured mode per rule. Config can only restrict: the phase preset is the ceiling."""

    terminated: RuleMode = Mode.DELETE
    heartbeat_stale: RuleMode = Mode.DELETE
    unlabeled_age: RuleMode = Mode.DELETE
    sandbox_orphan: RuleMode = Mode.DELETE
    residual_group: Annotated[Mode, BeforeValidator(_report_at_most)] = Mode.REPORT


class LedgerConfig(_Section):
    """The audit trail (DESIGN.md section 7): MongoDB, acknowledged and fenced writes."""

    conn_id: str = "mongo_default"
    database: str = "reaper"
    collection: str = "ledger"
    sweeps_collection: str = "sweeps"
    locks_collection: str = "sweep_locks"
    # Each resource's transitions (first seen, kept and why, reported, gone), and each DAG's last states.
    transitions_collection: str = "transitions"
    states_collection: str = "resource_states"
    notices_collection: str = "sweep_notices"  # what each notification channel was last told, per target
    retention: Duration = timedelta(days=400)  # at least the longest run timeout + rerun_window: Settings._margins
    # How old a run an operator may still clear or re-run: the ledger must still know what it sent and lifted.
    rerun_window: Annotated[Duration, _at_least(timedelta(days=1), "a run may be cleared at least the day it ran")] = (
        timedelta(days=7)
    )
    timeout: Timeout = timedelta(seconds=10)


def _schedule(value: object) -> timedelta:
    """A schedule interval; ``0`` (or ``off``) means manual triggers only."""
    if value in (0, "0", "off"):
        return timedelta(0)
    return parse_duration(value)


Schedule = Annotated[timedelta, BeforeValidator(_schedule)]


class AlertsConfig(_Section):
    """Where a failed sweep is announced: always the log; also mail when ``email`` lists addresses."""

    email: list[str] = []
    smtp_conn_id: str = "smtp_default"


NOTIFY_EVENTS = ("held", "failed", "deleted")


class NotifyChannel(_Section):
    """One place owners are told, through Airflow's own notifier of ``kind`` and an Airflow connection.

    ``smtp``: ``SmtpNotifier`` (apache-airflow-providers-smtp), mails ``to``. ``slack``: ``SlackNotifier``, posts
    to ``channel`` with a Slack API token connection. ``slack_webhook``: ``SlackWebhookNotifier``, posts to the
    channel its Incoming Webhook connection was made for. Credentials live in the connection, never here.
    """

    kind: Literal["smtp", "slack", "slack_webhook"]
    # The Airflow connection; empty: the provider's default (smtp_default, slack_api_default, slack_default).
    conn_id: str = ""
    to: list[str] = []  # smtp only: the addresses mailed
    from_email: str = ""  # smtp only; empty: the connection's from_email extra
    channel: str = ""  # slack only: the channel posted to (#name or its id)
    # What this channel is told: held (a scope's deletes are held), failed (deletes failed), deleted (the digest).
    events: list[Literal["held", "failed", "deleted"]] = Field(list(NOTIFY_EVENTS), min_length=1)
    targets: list[Literal["gce", "k8s"]] = Field(["gce", "k8s"], min_length=1)  # whose sweeps it hears of

    @model_validator(mode="after")
    def _addressed(self) -> NotifyChannel:
        if self.kind == "smtp":
            if not self.to:
                raise ValueError("expected to, the addresses a kind smtp entry mails (name@domain), got none")
            bad = [a for a in self.to if not re.fullmatch(r"[^@\s]+@[^@\s]+", a)]
            if bad:
                raise ValueError(f"expected mail addresses (name@domain) in to, got {bad}")
        elif self.to or self.from_email:
            raise ValueError(f"expected no to or from_email for kind {self.kind}: those are smtp's")
        if self.kind == "slack" and not self.channel.strip():
            raise ValueError("expected channel, the Slack channel a kind slack entry posts to (#name or its id)")
        if self.kind != "slack" and self.channel:
            why = "its webhook posts to the channel it was made for" if self.kind == "slack_webhook" else "it mails"
            raise ValueError(f"expected no channel for kind {self.kind}: {why}")
        return self

    @property
    def key(self) -> str:
        """The channel as its notification state and the sweep summaries name it: kind, connection, recipients."""
        return f"{self.kind}:{self.conn_id or 'default'}:{','.join(self.to) or self.channel}"


class NotificationsConfig(_Section):
    """Optional notices to resource owners (docs/notifications.md): off while ``channels`` is empty.

    Sent by ``record`` after the deletes, only by sweeps whose deletes count (the active phase's, and a
    confirmed run of another phase; never a dry run); a notice that fails is logged and counted in the
    sweep's summary, and never fails the sweep or changes a decision.
    """

    channels: list[NotifyChannel] = []
    # A scope that stays held (or whose deletes keep failing) is told again after this long; a change is told at once.
    remind_after: Annotated[
        Duration, _at_least(timedelta(minutes=10), "a hold lasting hours would otherwise be told every sweep")
    ] = timedelta(hours=24)
    # The deleted digest covers windows of this length, aligned to UTC (24h: UTC days), sent by the first sweep
    # after each window ends; 0: each sweep's own deletes, after it.
    digest_every: Schedule = timedelta(hours=24)
    max_listed: int = Field(50, ge=1, le=1000)  # resources named per notice; the rest are counted by scope
    # All of a sweep's notices together wait at most this long (and never past the run's timeout).
    timeout: Timeout = timedelta(seconds=30)

    @model_validator(mode="after")
    def _once_each(self) -> NotificationsConfig:
        first: dict[str, int] = {}
        for i, channel in enumerate(self.channels):
            if channel.key in first:
                raise _CrossFieldError(
                    ("notifications", "channels", str(i)),
                    f"expected each channel once: the same kind, conn_id and recipients as notifications.channels."
                    f"{first[channel.key]} (merge their events and targets)",
                )
            first[channel.key] = i
        return self


class RolloutConfig(_Section):
    """The active rollout phase of each target (DESIGN.md section 8).

    Only the active phase's DAG runs on the target's schedule, and only its sweeps push metrics, so
    the alerts follow it; the other phases' DAGs stay for manual triggers, dry runs unless the trigger
    confirms the phase (``reaper.sweep.steps.phase_gate``).
    Moving through the rollout is a change of this value (the sweep summaries record it).
    """

    gce: Literal["telemetry", "terminated-cleanup", "report-only", "enforcement"] = "telemetry"
    k8s: Literal["telemetry", "report-only", "enforcement"] = "telemetry"


class MetricsConfig(_Section):
    """Where each sweep pushes its metrics (an empty URL means no push), and where the alerts send on-call.

    ``runbook_url``: the runbook's address as the team reads it (a wiki page, the repository's file on its
    forge); each alert's ``runbook_url`` annotation, the key Alertmanager, Grafana and PagerDuty templates
    link, is it plus ``#`` and the alert's name in lower case (its section's anchor in docs/runbook.md).
    """

    pushgateway_url: str = ""
    timeout: Timeout = timedelta(seconds=5)
    runbook_url: str = "docs/runbook.md"
    # The Prometheus that evaluates the reaper's alert rules: the audit overview lists those firing ("" none).
    prometheus_url: str = ""


class AirflowConfig(_Section):
    """How the DAGs run: schedules per target, sharding of the listing, where sweeps keep their files."""

    gce_schedule: Schedule = timedelta(minutes=10)
    k8s_schedule: Schedule = timedelta(minutes=1)
    shards: int = Field(8, ge=1, le=64)
    sweep_store: str = "file:///tmp/reaper-sweeps"
    retries: int = Field(2, ge=0, le=10)
    retry_delay: Duration = timedelta(seconds=30)
    delete_batch_size: int = Field(200, ge=1, le=5000)
    # At most this many delete tasks per sweep (larger batches if need be): see deletes.cut_batches.
    max_delete_batches: int = Field(8, ge=1, le=256)
    # A sweep run's timeout; 0 (the default): 90% of the target's schedule, an hour for manual triggers only.
    run_timeout: Schedule = timedelta(0)
    # How long a run waits for another sweep of its target to end before it ends as skipped
    # (at most a third of its run timeout: Settings.lease_wait).
    lease_wait: Duration = timedelta(minutes=1)
    alerts: AlertsConfig = AlertsConfig()


LABEL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a Prometheus label name
LabelName = Annotated[str, Field(pattern=LABEL_NAME)]


def _matchers(value: object) -> dict[str, str]:
    """Label name -> PromQL regex; names as Prometheus allows them, regexes that compile."""
    if isinstance(value, dict):
        for name, pattern in value.items():
            if not (isinstance(name, str) and re.fullmatch(LABEL_NAME, name)):
                raise ValueError(f"expected Prometheus label names as keys, got {name!r}")
            if not isinstance(pattern, str):
                raise ValueError(f"expected a regex string for label {name}, got {pattern!r}")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"expected a valid regex for label {name}, got {pattern!r} ({exc})") from None
    return value  # type: ignore[return-value]


Matchers = Annotated[dict[str, str], BeforeValidator(_matchers), Field(min_length=1)]


class BurnWindow(_Section):
    """One arm of a multi-window burn-rate alert: the error ratio over ``window`` and over a twelfth of it
    (so the alert stops soon after the errors do) both above ``burn_rate`` times the error budget."""

    window: Annotated[Duration, _at_least(timedelta(minutes=1), "a twelfth of it must still hold two scrapes")]
    burn_rate: float = Field(gt=0)


class MachineCreationConfig(_Section):
    """The ``machine_creation`` SLI: the share of docker+machine creations that fail, against ``objective``."""

    objective: float = Field(0.99, gt=0.0, lt=1.0)
    group_by: list[LabelName] = ["shard"]
    fast: BurnWindow = BurnWindow(window=timedelta(hours=1), burn_rate=14.4)
    slow: BurnWindow = BurnWindow(window=timedelta(hours=6), burn_rate=6.0)


class CauseAlertsConfig(_Section):
    """The runner managers' cause alerts (seed 004): crash loops and the machine_creation SLI.

    ``runner_managers`` is the one selector of the managers' series, label name -> regex, applied to
    kube-state-metrics' restart counter and to the runners' own metrics alike; ``manager_pods`` narrows
    the restart counter, which has every pod of those clusters, to the managers' own containers.
    """

    enabled: bool = True
    runner_managers: Matchers = {"cluster": "runner-managers-.*"}
    # The gitlab-runner chart names the manager's container after its release (`gitlab-runner`,
    # `<release>-gitlab-runner`); the simulated managers' is `runner`.
    manager_pods: Matchers = {"container": ".*runner"}
    """The runner managers' containers among the pods `runner_managers` selects: kube-state-metrics' labels
    (`namespace`, `pod`, `container`) to a PromQL regex, all must match. A logging agent or any other pod
    in the same cluster does not raise `RunnerManagerCrashLooping`."""
    crash_loop_restarts: int = Field(3, ge=1)
    crash_loop_window: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a restart counts only with two scrapes within it")
    ] = timedelta(minutes=30)
    machine_creation: MachineCreationConfig = MachineCreationConfig()


class Settings(_Section):
    gce: GceConfig = GceConfig()
    k8s: K8sConfig = K8sConfig()
    budget: BudgetConfig = BudgetConfig()
    rules: RulesConfig = RulesConfig()
    max_deletions_per_sweep: int = Field(500, ge=0)
    ledger: LedgerConfig = LedgerConfig()
    airflow: AirflowConfig = AirflowConfig()
    metrics: MetricsConfig = MetricsConfig()
    rollout: RolloutConfig = RolloutConfig()
    cause_alerts: CauseAlertsConfig = CauseAlertsConfig()
    notifications: NotificationsConfig = NotificationsConfig()

    @model_validator(mode="after")
    def _room_to_delete(self) -> Settings:
        # DESIGN.md section 6: deletes stop a margin before the run's timeout (one request and one ledger
        # write); a schedule that leaves less than the margin again for the sweep itself could not delete.
        for target in ("gce", "k8s"):
            margin = self.send_margin(target)
            if getattr(self, target).enabled and self.run_timeout(target) < 2 * margin:
                key = "run_timeout" if self.airflow.run_timeout else f"{target}_schedule"
                least = 2 * margin if self.airflow.run_timeout else 2 * margin / RUN_TIMEOUT_FRACTION
                raise _CrossFieldError(
                    ("airflow", key),
                    f"expected at least {least} with {target}.request_timeout "
                    f"{getattr(self, target).request_timeout} and ledger.timeout {self.ledger.timeout}: deletes stop "
                    f"{margin} before the run's timeout",
                )
        return self

    def send_margin(self, target: str) -> timedelta:
        """How long before the run's timeout and the lease's expiry a delete task stops sending.

        After the last send, at most one request (``request_timeout``) is in flight and one ledger
        write (``ledger.timeout``) records its outcome; a few seconds more for the task to end.
        """
        request_timeout: timedelta = getattr(self, target).request_timeout
        return request_timeout + self.ledger.timeout + SEND_MARGIN_SLACK

    def run_timeout(self, target: str) -> timedelta:
        """A sweep run's timeout: ``airflow.run_timeout``, else most of its schedule interval (an hour
        for manual triggers only)."""
        if self.airflow.run_timeout:
            return self.airflow.run_timeout
        schedule: timedelta = getattr(self.airflow, f"{target}_schedule")
        return schedule * RUN_TIMEOUT_FRACTION if schedule else timedelta(hours=1)

    def lease_wait(self, target: str) -> timedelta:
        """How long a run waits for another sweep's lease: ``airflow.lease_wait``, at most a third of its
        run timeout, so that it ends as skipped rather than timed out (a failure that pages) and keeps
        the rest for its own sweep (the Kubernetes default: 18 s of a 54 s run)."""
        return min(self.airflow.lease_wait, self.run_timeout(target) / 3)

    @model_validator(mode="after")
    def _margins(self) -> Settings:
        # docs/design.md §4: an unlabeled VM may run a job of a manager that stamps no heartbeat (yet).
        gce = self.gce
        if gce.enabled and gce.unlabeled_max_age < gce.quarantine:
            raise _CrossFieldError(
                ("gce", "unlabeled_max_age"),
                f"expected at least the quarantine {short(gce.quarantine)} (gce.max_job_timeout + gce.slack): "
                "an unlabeled VM may still run a job",
            )
        # docs/design.md §7: a retried or cleared task must still find what its run sent and lifted.
        targets = [t for t in ("gce", "k8s") if getattr(self, t).enabled] or ["gce"]
        longest = max(self.run_timeout(t) for t in targets)
        least = longest + self.ledger.rerun_window
        if self.ledger.retention < least:
            raise _CrossFieldError(
                ("ledger", "retention"),
                f"expected at least {short(least)} (the longest run timeout {short(longest)} + ledger.rerun_window "
                f"{short(self.ledger.rerun_window)}), got {short(self.ledger.retention)}: a run cleared or "
                "retried within that window must find its intents, outcomes and override in the ledger",
            )
        return self

    @model_validator(mode="after")
    def _liveness_authority(self) -> Settings:
        # DESIGN.md section 5: without a lease source an in-flight run's sandbox could be reaped.
        if self.k8s.enabled and self.k8s.lease_source == "none" and self.rules.sandbox_orphan == Mode.DELETE:
            raise _CrossFieldError(
                ("rules", "sandbox_orphan"),
                "expected report or off while k8s.lease_source is none "
                "(no liveness authority: an in-flight run's sandbox could be reaped)",
            )
        return self


RUN_TIMEOUT_FRACTION = 0.9
SEND_MARGIN_SLACK = timedelta(seconds=5)


class _CrossFieldError(ValueError):
    """A check across several keys failed; ``loc`` is the full key path (from the top) to blame.

    Raised in a model validator, where pydantic would report the error at the model itself (for
    ``Settings``, the top level) rather than at the key to change; :func:`_describe` names ``loc``
    instead. A ValueError because pydantic turns only ValueError and AssertionError raised by a
    validator into a ValidationError: anything else escapes it, and :func:`parse_settings`, which
    turns a ValidationError into a :class:`ConfigError`.
    """

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc


_EXPECTED_BY_TYPE = {
    "string_type": 'expected a string (quote values such as "true")',
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "extra_forbidden": "unknown key",
    "too_short": "expected a non-empty value",
    "missing": "expected this key: it has no default here (e.g. a burn-rate window needs both of its keys)",
}


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "(top level)"
    ctx = error.get("ctx") or {}
    inner = ctx.get("error")
    if isinstance(inner, _CrossFieldError):
        return f"{'.'.join(inner.loc)}: {inner}"
    if error["type"] == "value_error" and inner is not None:
        expected = str(inner)
    elif error["type"] in _EXPECTED_BY_TYPE:
        expected = _EXPECTED_BY_TYPE[error["type"]]
    elif error["type"] == "literal_error":
        expected = f"expected {ctx.get('expected')}"
    else:
        expected = f"expected {error['msg'][0].lower()}{error['msg'][1:]}"
    if error["type"] in ("extra_forbidden", "value_error", "missing"):
        return f"{key}: {expected}"
    return f"{key}: {expected}, got {error['input']!r}"


def parse_settings(data: object, source: str) -> Settings:
    """Validate already-parsed YAML; ``source`` names the file in the error."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: (top level): expected a mapping, got {type(data).__name__}")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
        raise ConfigError(f"invalid config {source}: " + "; ".join(problems)) from None


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: the argument, else ``$REAPER_CONFIG``, else ``include/reaper.yaml``."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read and validate the config file; raise :class:`ConfigError` on any problem."""
    file = config_path(path)
    return parse_settings(_read_yaml(file), str(file))


def _read_yaml(file: Path) -> object:
    """The file's one YAML document, or :class:`ConfigError` for anything a parser would take or crash on."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"invalid config {file}: cannot read the file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"invalid config {file}: (top level): expected UTF-8 text, byte {exc.start} is not") from None
    try:
        return _document(text, file)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        parts = (getattr(exc, "context", None), getattr(exc, "problem", None))
        detail = ", ".join(p for p in parts if p) or str(exc).splitlines()[0]
        raise ConfigError(f"invalid config {file}: not valid YAML{where}: {detail}") from None
    except RecursionError:
        raise ConfigError(f"invalid config {file}: (top level): nested too deeply for a config") from None


def _document(text: str, file: Path) -> object:
    """What ``yaml.safe_load`` does, with the duplicate-key check between composing and constructing."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        duplicates = _duplicate_keys(loader, root)
        if duplicates:
            raise ConfigError(f"invalid config {file}: " + "; ".join(duplicates))
        return loader.construct_document(root)
    finally:
        loader.dispose()


_MERGE = "tag:yaml.org,2002:merge"


def _duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node) -> list[str]:
    """``path: duplicate key at line N (first at line M)`` for each key a mapping names twice.

    YAML parsers keep the last of two equal keys silently, so the value a reviewer
    read higher up may not be the one in force. Keys are compared as constructed
    (``1`` and ``1.0`` are one key, as they would be in the loaded mapping). A key
    that a merge (``<<``) brings in may be overridden: that is what merges are for.
    """
    found: list[tuple[int, str]] = []
    visited: set[int] = set()
    pending: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())]
    while pending:
        node, path = pending.pop()
        if id(node) in visited:  # an alias: checked where it is anchored (and never looped over)
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending += [(item, (*path, str(i))) for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            first: dict[object, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    pending.append((value_node, path))
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: construction refuses it as unhashable
                key = loader.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in first:
                    where = ".".join((*path, str(key)))
                    found.append((line, f"{where}: duplicate key at line {line} (first at line {first[key]})"))
                else:
                    first[key] = line
                pending.append((value_node, (*path, str(key))))
    return [message for _, message in sorted(found)]
