"""The reaper's configuration: one YAML file validated into typed, frozen settings.

Every key of docs/design.md §4 to §6 lives here with its documented default.
A config that fails validation raises :class:`ConfigError` with one message
naming the file, the key path and what was expected; callers must then run
nothing (an invalid config never reaches the policy, so nothing is deleted).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from reaper.approvals import MAX_EXPIRY
from reaper.durations import parse_duration, short
from reaper.gce import labels
from reaper.model import Mode
from reaper.rules import RULE

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "include" / "reaper.yaml"
CONFIG_ENV = "REAPER_CONFIG"


class ConfigError(Exception):
    """Invalid configuration or input: the message names the file, the key and what was expected."""


def _mode(value: object) -> Mode:
    if isinstance(value, Mode):
        return value
    if isinstance(value, str) and value.lower() in ("off", "report", "delete"):
        return Mode[value.upper()]
    raise ValueError(f"expected one of off, report, delete, got {value!r}")


def _label_pair(value: object) -> tuple[str, str]:
    """``key=value`` (the notation of docs/design.md) into a (key, value) pair."""
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


@dataclass(frozen=True)
class Shown:
    """How the config reference names a type whose YAML form is not its Python one (a duration, a mode)."""

    words: str


Duration = Annotated[timedelta, BeforeValidator(parse_duration), Shown("duration")]


@dataclass(frozen=True)
class AtLeast:
    """A lower bound of a duration whose zero (or a tiny value) would remove a safety margin without saying
    so; ``least`` zero means more than zero. A record rather than a closure, so that the config reference
    (:mod:`reaper.config_reference`) states the same bound and reason the error message does."""

    least: timedelta
    why: str

    @property
    def bound(self) -> str:
        return f"at least {short(self.least)}" if self.least else "more than 0s"

    def __call__(self, span: timedelta) -> timedelta:
        if span < self.least or span <= timedelta(0):
            raise ValueError(f"expected {self.bound} ({self.why}), got {short(span)}")
        return span


def _at_least(least: timedelta, why: str) -> AfterValidator:
    return AfterValidator(AtLeast(least, why))


# Every external call has a timeout; 0 is none to some clients (MongoDB's wtimeout) and fails every call in others.
Timeout = Annotated[
    Duration, _at_least(timedelta(seconds=1), "every call is bounded by it; 0 means no bound to some clients")
]


def _modes_up_to(ceiling: Mode) -> str:
    """The modes a rule whose presets reach ``ceiling`` may be set to, as the config reference shows them."""
    shown = [f'`"{mode}"`' if mode is Mode.OFF else f"`{mode}`" for mode in Mode if mode <= ceiling]
    return " or ".join(filter(None, [", ".join(shown[:-1]), shown[-1]]))


RuleMode = Annotated[Mode, BeforeValidator(_mode), Shown(_modes_up_to(Mode.DELETE))]
ReportMode = Annotated[Mode, BeforeValidator(_mode), Shown(_modes_up_to(Mode.REPORT))]  # a rule that only reports
LabelPair = Annotated[tuple[str, str], BeforeValidator(_label_pair), Shown("label `key=value`")]


Selector = Annotated[dict[str, str], Field(min_length=1), Shown("labels `{key: value}`")]


class _Section(BaseModel):
    # The string under a key is its description in the config reference (reaper.config_reference reads it).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class WriterHealthConfig(_Section):
    """Where the heartbeat writers' pass records come from (docs/design.md §4, writer health)."""

    source: Literal["prometheus", "none"] = "prometheus"
    """Where heartbeat-writer health comes from; `none`: unknown, so heartbeat deletes are always held."""
    prometheus_url: str = "http://127.0.0.1:9090"
    """Prometheus HTTP API base URL (logged without its credentials)."""
    last_pass_metric: str = "runner_manager_heartbeat_last_pass_timestamp_seconds"
    """Gauge: the end of the manager's last fully successful heartbeat pass."""
    failed_passes_metric: str = "runner_manager_heartbeat_failed_passes_total"
    """Counter of heartbeat passes with a failed write."""
    passes_metric: str = "runner_manager_heartbeat_passes_total"
    """Counter of every heartbeat pass: the denominator of the `HeartbeatWriterFailing` alert."""
    manager_label: str = "manager"
    """The metrics' label naming the runner manager."""
    project_label: str = "project"
    """The metrics' label naming the manager's project (its id or its number)."""
    # increase() sees a failed pass only with two scrapes inside the window: shorter, a failing writer reads healthy.
    failing_window: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a failed pass counts only with two scrapes within it")
    ] = timedelta(minutes=15)
    """A manager with a failed pass within this window is failing."""
    timeout: Timeout = timedelta(seconds=10)
    """Timeout of each Prometheus query."""


class QuotaLimits(_Section):
    """A project's Compute API rate quotas, requests per window per quota group (the documented defaults).

    Raise them to what the project's quota page says where they were raised: the reaper spends a
    share of these, so a limit set too high makes it spend more than its share of the real one.
    """

    list_requests: int = Field(default=1500, ge=1)
    """List requests per minute: every page of the instance and instance-group listings."""
    read_requests: int = Field(default=1500, ge=1)
    """Read requests per minute: `instances.get` (the re-read before each delete), `projects.get`."""
    mutation_requests: int = Field(default=1500, ge=1)
    """Mutation requests per minute: `instances.delete` (the managers' label writes and creations count here too)."""
    operation_read_requests: int = Field(default=1500, ge=1)
    """Operation reads per minute: `zoneOperations.wait` and `get`, the polls of a delete's operation."""


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
    """The project's Compute API rate quotas, requests per minute per quota group: the documented defaults;
    set what the project's quota page says (a limit set too high makes the reaper spend more than its share)."""
    share: float = Field(default=0.2, gt=0.0, le=0.5)
    """The share of each group's limit the reaper may spend per project and minute: every list page, get,
    delete and operation poll counts, paced evenly; the runner managers (heartbeat label writes, machine
    creations) keep the rest. It must leave at least one call of each group per minute."""

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


def gce_label_problem(key: str, value: str) -> str | None:
    """Why no Compute instance can carry the label ``key=value`` (:mod:`reaper.gce.labels`), or None."""
    if not labels.key_ok(key):
        expected = "1 to 63 lowercase letters, digits, _ or -, starting with a lowercase letter"
        return f"expected a GCE label key ({expected}: the Compute API refuses any other), got {key!r}"
    if not labels.value_ok(value):
        return f"expected a GCE label value (at most 63 lowercase letters, digits, _ or -), got {value!r} for {key}"
    return None


class GceConfig(_Section):
    enabled: bool = True
    """Sweep GCE at all."""
    conn_id: str = "google_cloud_default"
    """The Airflow connection of the Compute API (docs/gce.md, "Connection")."""
    projects: list[str] = []
    """The projects (scopes) the DAGs sweep, each by its id or its number. Every sweep resolves each to its id
    (`compute.projects.get`) and keys holds, protection, budgets, metrics and the ledger by the id; an id and its
    number both listed are one project, listed once. A number that cannot be resolved is not listed and its scope
    (named by the number) is held `inventory_incomplete` (docs/gce.md, "Projects by id")."""
    selector: Selector = {"ci_ephemeral": "true"}
    """Label equalities an instance must all match to be in scope. GCE labels as the Compute API takes them, here
    and in `heartbeat_label` and `opt_out_label`: lowercase letters, digits, `_` and `-`, a key starting with a
    letter (any other matches no instance, so it is refused)."""
    heartbeat_label: str = Field(default="runner_manager_heartbeat", min_length=1)
    """The label the live runner manager stamps on each instance it tracks: unix seconds as a decimal string."""
    max_job_timeout: Annotated[Duration, _at_least(timedelta(0), "a dead manager's last job may run this long")] = (
        timedelta(hours=3)
    )
    """The longest job; with `slack` it makes the quarantine `Q`."""
    slack: Annotated[
        Duration, _at_least(timedelta(0), "a live manager's beats are a heartbeat interval apart, its clock off")
    ] = timedelta(hours=1)
    """`Q = max_job_timeout + slack`: a heartbeat older than `Q` is stale."""
    clock_skew: Duration = timedelta(minutes=5)
    """A heartbeat (or a creation time) further than this in the future is an anomaly: reported, never reaped by
    the heartbeat or the age rule. 0 is stricter: more anomalies, more writers unhealthy."""
    terminated_grace: Annotated[
        Duration, _at_least(timedelta(0), "a VM just seen stopped may be its manager's stop-and-start or delete")
    ] = timedelta(minutes=10)
    """How long an instance must have been `TERMINATED` (from `lastStopTimestamp`, else `creationTimestamp`)."""
    unlabeled_max_age: Duration = timedelta(days=3)  # at least the quarantine: Settings._margins
    """Age after which an instance without a valid heartbeat label is reaped. At least `Q` (an unlabeled VM may
    run a job of a manager that stamps no heartbeat yet)."""
    writer_stale_after: Duration = timedelta(minutes=30)
    """A manager whose last heartbeat pass is older than this holds heartbeat deletes in its project. 0 is
    stricter: every writer stale, every heartbeat delete held."""
    opt_out_label: LabelPair = ("reaper_keep", "true")
    """An instance carrying it is always kept; the same key with another value is reported, never deleted."""
    protected_projects: list[str] = []
    """Projects where nothing is ever deleted, each by its id or its number: either protects the project. A
    number the sweep cannot tie to a project (its `projects.get` is denied, or `reaper evaluate`, which knows no
    numbers) protects every project whose number is unknown. Prefer ids."""
    list_concurrency: int = Field(default=8, ge=1, le=64)
    """Projects listed at once."""
    delete_concurrency: int = Field(default=8, ge=1, le=64)
    """Deletes in flight at once, all projects together."""
    delete_rate_per_project: float = Field(default=5.0, gt=0)
    """Deletes per second per project (a token bucket of one), at most what the quota share allows (each delete
    is a read, a mutation and an operation read)."""
    max_retries: int = Field(default=4, ge=0, le=10)
    """Retries of a 5xx or timeout (exponential backoff and jitter) or of a used-up quota (403
    `rateLimitExceeded`, 429: after the next minute begins), before that call fails; no retry is made that would
    end past the run's deadline."""
    request_timeout: Timeout = timedelta(seconds=30)
    """Timeout of every Compute API call."""
    operation_timeout: Annotated[
        Duration, _at_least(timedelta(minutes=2), "zoneOperations.wait alone may take two minutes")
    ] = timedelta(minutes=5)
    """How long a delete operation may take before that delete counts as failed; one still running when the run
    must stop is `operation_pending` (the next sweep's re-read settles it)."""
    quota: QuotaConfig = QuotaConfig()
    """How much of each project's Compute API rate quotas the reaper may spend (docs/gce.md, "Rate quotas")."""
    writer_health: WriterHealthConfig = WriterHealthConfig()
    """Where the heartbeat writers' health comes from (docs/gce.md, "Writer health")."""
    group_selector: Annotated[
        str, BeforeValidator(_group_selector), Shown("regex with `(?P<manager>...)`, or empty")
    ] = ""
    """Fleeting runners' managed instance groups: a regex the whole group name must match, whose named group
    `manager` is the group's runner manager as writer health names it (e.g. `"fleeting-(?P<manager>.+)"`);
    empty: no group is listed (docs/gce.md, "Residual fleeting groups")."""

    @field_validator("selector", "heartbeat_label", "opt_out_label")
    @classmethod
    def _gce_labels(cls, value: dict[str, str] | str | tuple[str, str]) -> dict[str, str] | str | tuple[str, str]:
        """Labels an instance can carry: a selector or label name the Compute API refuses on any instance matches
        no instance, and a sweep would read its empty listing as an empty fleet."""
        pairs = value.items() if isinstance(value, dict) else [value] if isinstance(value, tuple) else [(value, "")]
        for key, label_value in pairs:
            if why := gce_label_problem(key, label_value):
                raise ValueError(why)
        return value

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
    """The Airflow connection of the run store's MongoDB."""
    database: str = "iterion"
    """The database the CI engine keeps its runs in (`iterion` is the engine the defaults follow)."""
    collection: str = "runs"
    """The collection of run records."""
    key_field: str = "_id"
    """The field holding the run key, a string (or, for 24 hex digits, its ObjectId)."""
    status_field: str = "status"
    """The field holding the run's status, compared with `k8s.terminal_statuses`."""
    batch_size: int = Field(default=1000, ge=1, le=1000)
    """Run keys per query (one `$in`, one round trip each)."""
    timeout: Timeout = timedelta(seconds=5)
    """Timeout of each query."""


class MongoLeaseConfig(_Section):
    """Leases as documents ``{_id: run key, expires_at: datetime or unix seconds}``."""

    conn_id: str = "mongo_default"
    """The Airflow connection of the leases' MongoDB."""
    database: str = "iterion"
    """The database of the lease collection."""
    collection: str = "run_leases"
    """The lease collection; one with no document carrying `expires_at` (missing, empty, the wrong one) makes
    every lease unknown."""
    batch_size: int = Field(default=1000, ge=1, le=1000)
    """Run keys per query (one `$in` each)."""
    timeout: Timeout = timedelta(seconds=5)
    """Timeout of each query."""


class NatsLeaseConfig(_Section):
    """Leases as keys of a JetStream KV bucket; ``key_template`` maps a run key to a KV key."""

    conn_id: str = "nats_default"
    """The Airflow connection of the NATS server: its host and port (or a `nats://` URL as host), login and
    password or a `token` extra."""
    bucket: str = "run_leases"
    """The runners' JetStream KV bucket of leases; the reaper never creates it (missing: every lease unknown)."""
    key_template: str = "{run}"
    """The KV key of a run's lease, containing `{run}` exactly once."""
    timeout: Timeout = timedelta(seconds=5)
    """Timeout of each NATS request."""
    max_silence: Annotated[
        Duration, _at_least(timedelta(minutes=10), "shorter than a runner's renewal, every lease would read unknown")
    ] = timedelta(hours=24)
    """The longest the runners leave the bucket unwritten: when its newest key under the template (a lease, or a
    released one's marker) is older, nothing shows they still write it (a bucket they left, or an old one a typo
    names, keeps its markers for ever without `max_age`), and every lease is unknown. A fleet idle longer reaps
    no sandbox until a runner writes again."""

    @field_validator("key_template")
    @classmethod
    def _has_run(cls, template: str) -> str:
        if template.count("{run}") != 1:
            raise ValueError(f"expected a template containing {{run}} exactly once, got {template!r}")
        return template


class PostgresStepStoreConfig(_Section):
    """The step-run store: ``table (run_id, step, attempt, status, results)``, names configurable."""

    conn_id: str = "postgres_default"
    """The Airflow connection of the step-run store's PostgreSQL."""
    table: str = Field(default="step_runs", pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    """The table (optionally `schema.table`; a table, partitioned table or view) of step attempts."""
    run_column: str = Field(default="run_id", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The run key column: `text`, `varchar(n)` or `char(n)`."""
    step_column: str = Field(default="step", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The step name column: `text`, `varchar(n)` or `char(n)`."""
    attempt_column: str = Field(default="attempt", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The attempt column: `smallint`, `integer`, `bigint` or `numeric`."""
    status_column: str = Field(default="status", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The attempt's status column: `text`, `varchar(n)` or `char(n)`."""
    results_column: str = Field(default="results", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The results column: `json` or `jsonb`; durable when neither SQL NULL nor JSON `null`."""
    batch_size: int = Field(default=1000, ge=1, le=10000)
    """Runs per query."""
    timeout: Timeout = timedelta(seconds=5)
    """Timeout of each query."""


class K8sConfig(_Section):
    enabled: bool = True
    """Sweep Kubernetes at all."""
    clusters: list[str] = ["kubernetes_default"]
    """The Airflow connection ids of the clusters (scopes) the DAGs sweep; each id is its scope's name."""
    namespaces: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]] = []
    """The sandbox namespaces, each named once, so that a namespaced `Role` suffices
    (`deploy/rbac-swept-cluster.yaml`); every object of a run must live in them (objects elsewhere are
    invisible). Empty: every namespace, which needs a `ClusterRole`."""
    selector: Selector = {"iterion.io/managed": "true"}
    """Label equalities of the managed Pods, Secrets and NetworkPolicies (the label the Iterion CI engine's
    sandbox driver puts on them)."""
    run_label: str = Field(default="iterion.io/run-id", min_length=1)
    """The label carrying the run key."""
    terminal_statuses: list[str] = Field(default=["succeeded", "failed", "cancelled"], min_length=1)
    """Run-store statuses that mean the run is over (case-insensitive)."""
    min_age: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a sandbox younger may not have its lease or run record yet")
    ] = timedelta(minutes=5)
    """A run with any object younger than this is kept (creation races the lease)."""
    lease_clock_skew: Duration = timedelta(seconds=30)
    """A lease counts as held until this long after its expiry time; 0 when the lease writers' clocks are the
    reaper's."""
    results_sidecar: str = "results-egress"
    """Container name of the results-egress sidecar; while it has not terminated for good, the run is kept. In a
    Pod of several containers and none of this name, any container still running is taken for it. ``none`` where
    the runners have no such sidecar."""
    opt_out_label: LabelPair = ("reaper.io/keep", "true")
    """An object carrying it is always kept, and with it every object of its run."""
    protected_namespaces: list[str] = ["kube-system"]
    """Namespaces where nothing is ever deleted; an object of a run in one keeps the whole run."""
    lease_source: Literal["nats", "mongo", "none"] = "nats"
    """The liveness authority; `none` requires `rules.sandbox_orphan` to be `report` or `off`."""
    run_store: Literal["mongo", "none"] = "mongo"
    """The run store; `none`: every run's state is unknown."""
    step_store: Literal["postgres", "none"] = "none"
    """The step-run store; `postgres` enables the results-durability guard (docs/design.md §5, row 7). With
    `none`, step pods are reaped without it, and the sweep log, `reaper_config_check` and the summary's
    `warnings` say so."""
    step_label: str = "iterion.io/step"
    """The label of a step pod's step name."""
    attempt_label: str = "iterion.io/attempt"
    """The label of a step pod's attempt (ASCII digits: `01` is attempt 1)."""
    step_failed_statuses: list[str] = ["failed"]
    """Step statuses that are terminal without a results row."""
    mongo_run_store: MongoRunStoreConfig = MongoRunStoreConfig()
    """The MongoDB run store (`run_store: mongo`). It must hold a document with `key_field` and
    `status_field`, or every run is unknown (docs/kubernetes.md, "Evidence")."""
    mongo_leases: MongoLeaseConfig = MongoLeaseConfig()
    """Leases as documents `{_id: run key, expires_at: date or unix seconds}` (`lease_source: mongo`)."""
    nats_leases: NatsLeaseConfig = NatsLeaseConfig()
    """Leases as keys of a JetStream KV bucket (`lease_source: nats`)."""
    postgres_step_store: PostgresStepStoreConfig = PostgresStepStoreConfig()
    """The step-run store (`step_store: postgres`): one row per (run, step, attempt), its schema checked once
    per sweep (docs/kubernetes.md, "Evidence")."""
    delete_concurrency: int = Field(default=8, ge=1, le=64)
    """Runs deleted at once (a run's objects go one after another)."""
    delete_rate_per_cluster: float = Field(default=20.0, gt=0)
    """Deletes per second per cluster."""
    max_retries: int = Field(default=4, ge=0, le=10)
    """Retries of a call answered 429 or 5xx (after its `Retry-After` when it gives seconds, at most 30 s, else
    exponential backoff) or cut by a timeout or a dropped connection; before and after a delete, only a retry
    that can begin before the deadline is made, else the run is left `not_attempted`."""
    request_timeout: Timeout = timedelta(seconds=10)
    """Timeout of every Kubernetes API call, each one request (the client library's own retries are off); the
    send margin leaves it for the last call started before the deadline."""
    pod_gone_timeout: Duration = timedelta(seconds=10)
    """How long a delete waits for a gracefully deleted Pod to go before it records `terminating` (its Secrets
    and NetworkPolicy then wait for the next sweep); 0: no wait."""

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
    min_stale: int = Field(default=3, ge=0)
    """A scope's budget trips only with at least this many stale instances (or reapable runs)..."""
    max_stale_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """... and when more than this fraction of them are stale (`S / L`: docs/design.md §4); then the scope only
    reports, and alerts."""


class RulesConfig(_Section):
    """Configured mode per rule (one key per rule of :data:`reaper.rules.RULES`). Config can only restrict: the
    phase preset is the ceiling."""

    terminated: RuleMode = Mode.DELETE
    """Mode of the GCE `TERMINATED` rule."""
    heartbeat_stale: RuleMode = Mode.DELETE
    """Mode of the GCE stale-heartbeat rule."""
    unlabeled_age: RuleMode = Mode.DELETE
    """Mode of the GCE unlabeled-age rule."""
    sandbox_orphan: RuleMode = Mode.DELETE
    """Mode of the Kubernetes orphaned-sandbox rule."""
    residual_group: ReportMode = Mode.REPORT
    """Mode of the residual fleeting-group rule (`delete` is refused: it only ever reports)."""

    @field_validator("*")
    @classmethod
    def _within_presets(cls, mode: Mode, info: ValidationInfo) -> Mode:
        """A mode above every preset of the rule (:attr:`reaper.rules.Rule.ceiling`) is refused, never capped
        silently: a rule that only ever reports is never set to delete (docs/design.md §3)."""
        ceiling = RULE[str(info.field_name)].ceiling
        if mode > ceiling:
            allowed = " or ".join(str(m) for m in Mode if m <= ceiling)
            raise ValueError(f"expected {allowed}: this rule only ever reports (it never deletes)")
        return mode


class LedgerConfig(_Section):
    """The audit trail (docs/design.md §7): MongoDB, acknowledged and fenced writes."""

    conn_id: str = "mongo_default"
    """The Airflow connection of the ledger's MongoDB."""
    database: str = "reaper"
    """The ledger's database."""
    collection: str = "ledger"
    """One document per decision that is not keep, per delete intent and per outcome."""
    sweeps_collection: str = "sweeps"
    """One summary per execution of a sweep."""
    locks_collection: str = "sweep_locks"
    """The per-target sweep lease."""
    transitions_collection: str = "transitions"
    """Each resource's transitions: first seen, kept and why, reported, planned for delete, gone."""
    states_collection: str = "resource_states"
    """Each DAG's last state of every resource per scope, which a sweep compares to record only the changes."""
    notices_collection: str = "sweep_notices"
    """What each notification channel was last told, per target (docs/notifications.md)."""
    approvals_collection: str = "approvals"
    """Operators' approvals of held deletes, each used by one run (docs/runbook.md, docs/audit-view.md)."""
    retention: Duration = timedelta(days=400)  # at least the longest run timeout + rerun_window: Settings._margins
    """How long ledger records, summaries, transitions and resource states are kept (a change is applied to the TTL
    indexes in place). At least the longest run timeout plus `ledger.rerun_window`: a retried or cleared task must
    still find its intents, outcomes and override, or it re-sends and re-applies them; and at least 7 days (an
    approval's longest expiry) plus the longest run timeout, so that no approval leaves the ledger while in use."""
    rerun_window: Annotated[Duration, _at_least(timedelta(days=1), "a run may be cleared at least the day it ran")] = (
        timedelta(days=7)
    )
    """How old a run operators may still clear or re-run. Clearing an older one may find the ledger has forgotten
    what it sent and which override it used."""
    timeout: Timeout = timedelta(seconds=10)
    """Timeout of each ledger read and write."""
    commit_interval: Duration = timedelta(milliseconds=10)
    """How long a delete's record waits for those of the other deletes, to go to the ledger in one write (a group
    commit: docs/design.md §7). At most 1s: every send waits for its intent's write."""
    commit_records: int = Field(default=64, ge=1, le=10_000)
    """As many records waiting go to the ledger at once, before `ledger.commit_interval` has passed."""

    @field_validator("commit_interval")
    @classmethod
    def _commit_interval_short(cls, value: timedelta) -> timedelta:
        if value > timedelta(seconds=1):
            raise ValueError(f"expected at most 1s (every send waits for its intent's write), got {short(value)}")
        return value

    @model_validator(mode="after")
    def _collections_apart(self) -> LedgerConfig:
        """Two kinds of document in one collection would collide on its unique indexes at every sweep."""
        seen: dict[str, str] = {}
        for field in ("collection", *(f for f in type(self).model_fields if f.endswith("_collection"))):
            name = getattr(self, field)
            if name in seen:
                raise _CrossFieldError(
                    ("ledger", field), f"expected a collection of its own, got {name!r}, which is ledger.{seen[name]}"
                )
            seen[name] = field
        return self


def _schedule(value: object) -> timedelta:
    """A schedule interval; ``0`` (or ``off``) means manual triggers only."""
    if value in (0, "0", "off"):
        return timedelta(0)
    return parse_duration(value)


Schedule = Annotated[timedelta, BeforeValidator(_schedule), Shown("duration, or `0`")]


class AlertsConfig(_Section):
    """Where a failed sweep is announced: always the log; also mail when ``email`` lists addresses."""

    email: list[str] = []
    """Addresses a failed task or run is mailed to, in addition to the ERROR log line it always gets."""
    smtp_conn_id: str = "smtp_default"
    """The Airflow connection those mails go through."""


NOTIFY_EVENTS: tuple[Literal["held", "failed", "deleted"], ...] = ("held", "failed", "deleted")


class NotifyChannel(_Section):
    """One place owners are told, through Airflow's own notifier of ``kind`` and an Airflow connection.

    ``smtp``: ``SmtpNotifier`` (apache-airflow-providers-smtp), mails ``to``. ``slack``: ``SlackNotifier``, posts
    to ``channel`` with a Slack API token connection. ``slack_webhook``: ``SlackWebhookNotifier``, posts to the
    channel its Incoming Webhook connection was made for. Credentials live in the connection, never here.
    """

    kind: Literal["smtp", "slack", "slack_webhook"]
    """Which of Airflow's notifiers tells this channel: `SmtpNotifier`, `SlackNotifier` or `SlackWebhookNotifier`."""
    conn_id: str = ""
    """The Airflow connection it sends through; empty: the provider's default (`smtp_default`,
    `slack_api_default`, `slack_default`)."""
    to: list[str] = []
    """smtp only: the addresses mailed."""
    from_email: str = ""
    """smtp only: the sender; empty: the connection's `from_email` extra."""
    channel: str = ""
    """slack only: the channel posted to (`#name` or its id)."""
    events: list[Literal["held", "failed", "deleted"]] = Field(default=list(NOTIFY_EVENTS), min_length=1)
    """What this channel is told: `held` (a scope's deletes are held), `failed` (deletes failed), `deleted`
    (the digest of what was deleted)."""
    targets: list[Literal["gce", "k8s"]] = Field(default=["gce", "k8s"], min_length=1)
    """Whose sweeps it hears of."""

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
    """Where owners are told; empty (the default): nobody is."""
    remind_after: Annotated[
        Duration, _at_least(timedelta(minutes=10), "a hold lasting hours would otherwise be told every sweep")
    ] = timedelta(hours=24)
    """A scope that stays held (or whose deletes keep failing) is told again after this long; a change is told
    at once."""
    digest_every: Schedule = timedelta(hours=24)
    """The deleted digest covers windows of this length, aligned to UTC (24h: UTC days), sent by the first sweep
    after each window ends; 0: each sweep's own deletes, after it."""
    max_listed: int = Field(default=50, ge=1, le=1000)
    """Resources named per notice; the rest are counted by scope."""
    timeout: Timeout = timedelta(seconds=30)
    """All of a sweep's notices together wait at most this long (and never past the run's timeout)."""

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
    """The active rollout phase of each target (docs/design.md §8).

    Only the active phase's DAG runs on the target's schedule, and only its sweeps push metrics, so
    the alerts follow it; the other phases' DAGs stay for manual triggers, dry runs unless the trigger
    confirms the phase (``reaper.sweep.gate.phase_gate``).
    Moving through the rollout is a change of this value (the sweep summaries record it).
    """

    gce: Literal["telemetry", "terminated-cleanup", "report-only", "enforcement"] = "telemetry"
    """The GCE target's active phase: only its DAG runs on the schedule and pushes metrics; a manual run of
    another phase is a dry run unless its trigger confirms the phase (`confirm_phase`)."""
    k8s: Literal["telemetry", "report-only", "enforcement"] = "telemetry"
    """The Kubernetes target's active phase, as `rollout.gce` (Kubernetes has no `terminated-cleanup`)."""


class MetricsConfig(_Section):
    """Where each sweep pushes its metrics (an empty URL means no push), and where the alerts send on-call.

    ``runbook_url``: the runbook's address as the team reads it (a wiki page, the repository's file on its
    forge); each alert's ``runbook_url`` annotation, the key Alertmanager, Grafana and PagerDuty templates
    link, is it plus ``#`` and the alert's name in lower case (its section's anchor in docs/runbook.md).
    """

    pushgateway_url: str = ""
    """The Prometheus Pushgateway the active phase's sweeps push their metrics to; empty: no push."""
    timeout: Timeout = timedelta(seconds=5)
    """Timeout of each push."""
    runbook_url: str = "docs/runbook.md"
    """The runbook's address as your team reads it (a wiki page, the file on your forge): each alert's
    `runbook_url` annotation, which Alertmanager, Grafana and PagerDuty templates link, is it plus `#` and the
    alert's name in lower case (its section in `docs/runbook.md`). Generate the rules again after changing it
    (`reaper alert-rules`). The audit overview links each thing that needs a human to its section here."""
    prometheus_url: str = ""
    """The Prometheus that evaluates the reaper's alert rules: the audit overview lists the reaper's alerts
    firing there (an unreachable one is said so); empty: the overview shows no alerts."""


class AirflowConfig(_Section):
    """How the DAGs run: schedules per target, sharding of the listing, where sweeps keep their files."""

    gce_schedule: Schedule = timedelta(minutes=10)
    """How often the GCE sweep DAG of the active phase runs; `0`: manual triggers only."""
    k8s_schedule: Schedule = timedelta(minutes=1)
    """How often the Kubernetes sweep DAG of the active phase runs; `0`: manual triggers only."""
    shards: int = Field(default=8, ge=1, le=64)
    """At most this many mapped `list_inventory` tasks, whatever the number of scopes."""
    sweep_store: str = "file:///tmp/reaper-sweeps"
    """Where a sweep's inventory and evidence files go (an ObjectStoragePath URL: `gs://CONN_ID@BUCKET/PATH`,
    `s3://...`); a local path with an executor that runs tasks on other machines (anything but the Local and
    Sequential executors, also in a list) is an import error naming this key."""
    retries: int = Field(default=2, ge=0, le=10)
    """Task retries, with exponential backoff."""
    retry_delay: Duration = timedelta(seconds=30)
    """The first retry's delay; each next one waits longer (exponential backoff), at most a quarter of the run
    timeout."""
    delete_batch_size: int = Field(default=200, ge=1, le=5000)
    """Resources of any one scope (project or cluster) per mapped `delete` task: a task's length is set by its
    scopes' rate limits, which run side by side, so a plan within this size in every scope is one task (a
    Kubernetes run is never split: a larger one is a batch of its own)."""
    # See deletes.cut_batches.
    max_delete_batches: int = Field(default=8, ge=1, le=256)
    """At most this many `delete` tasks per sweep, with larger batches if need be: a batch still queued at the
    run's deadline costs a task start inside the send margin, and an incident-scale plan at 200 a batch would
    queue dozens."""
    run_timeout: Schedule = timedelta(0)
    """A sweep run's timeout; `0`: 90% of the target's schedule, an hour for manual triggers only. It must leave
    twice the send margin (`<target>.request_timeout` + `ledger.timeout` + 5 s)."""
    lease_wait: Duration = timedelta(minutes=1)  # at most a third of its run timeout: Settings.lease_wait
    """How long a run waits for another sweep of its target to end before it ends as skipped; at most a third of
    its run timeout (Kubernetes default: 18 s)."""
    alerts: AlertsConfig = AlertsConfig()
    """Failure mails, in addition to the log alert."""


LABEL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a Prometheus label name
LabelName = Annotated[str, Field(pattern=LABEL_NAME)]


def _matchers(value: object) -> object:
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
    return value  # a dict checked here, or anything else for the dict[str, str] check after it to refuse


Matchers = Annotated[dict[str, str], BeforeValidator(_matchers), Field(min_length=1), Shown("`{label: regex}`")]


class BurnWindow(_Section):
    """One arm of a multi-window burn-rate alert: the error ratio over ``window`` and over a twelfth of it
    (so the alert stops soon after the errors do) both above ``burn_rate`` times the error budget."""

    window: Annotated[Duration, _at_least(timedelta(minutes=1), "a twelfth of it must still hold two scrapes")]
    """The long window; the short one is a twelfth of it. A window given in the config needs both its keys."""
    burn_rate: float = Field(gt=0)
    """How many times the error budget both windows' error ratios must exceed."""


class MachineCreationConfig(_Section):
    """The ``machine_creation`` SLI: the share of docker+machine creations that fail, against ``objective``."""

    objective: float = Field(default=0.99, gt=0.0, lt=1.0)
    """Share of docker+machine creations that must succeed; the error budget is the rest."""
    group_by: list[LabelName] = ["shard"]
    """Labels the SLI is computed and alerted per."""
    fast: BurnWindow = BurnWindow(window=timedelta(hours=1), burn_rate=14.4)
    """`MachineCreationBudgetBurn` with `window="fast"`: a page."""
    slow: BurnWindow = BurnWindow(window=timedelta(hours=6), burn_rate=6.0)
    """`MachineCreationBudgetBurn` with `window="slow"`: a ticket."""


class CauseAlertsConfig(_Section):
    """The runner managers' cause alerts (docs/design.md §10): crash loops and the machine_creation SLI.

    ``runner_managers`` is the one selector of the managers' series, label name -> regex, applied to
    kube-state-metrics' restart counter and to the runners' own metrics alike; ``manager_pods`` narrows
    the restart counter, which has every pod of those clusters, to the managers' own containers.
    """

    enabled: bool = True
    """Generate the runner managers' cause alerts."""
    runner_managers: Matchers = {"cluster": "runner-managers-.*"}
    """The one selector of the managers' series (kube-state-metrics' restarts and the runners' own metrics):
    label name to a PromQL regex, all must match."""
    # The gitlab-runner chart names the manager's container after its release (`gitlab-runner`,
    # `<release>-gitlab-runner`); the simulated managers' is `runner`.
    manager_pods: Matchers = {"container": ".*runner"}
    """The runner managers' containers among the pods `runner_managers` selects: kube-state-metrics' labels
    (`namespace`, `pod`, `container`) to a PromQL regex, all must match. A logging agent or any other pod
    in the same cluster does not raise `RunnerManagerCrashLooping`."""
    crash_loop_restarts: int = Field(default=3, ge=1)
    """`RunnerManagerCrashLooping`: that many container restarts, of any reason, within `crash_loop_window`."""
    crash_loop_window: Annotated[
        Duration, _at_least(timedelta(minutes=1), "a restart counts only with two scrapes within it")
    ] = timedelta(minutes=30)
    """The window `crash_loop_restarts` counts in."""
    machine_creation: MachineCreationConfig = MachineCreationConfig()
    """The `machine_creation` SLI (gitlab-runner's `gitlab_runner_autoscaling_actions_total`): the error ratio
    over each arm's window and over a twelfth of it both above `burn_rate` times the budget."""


class Settings(_Section):
    gce: GceConfig = GceConfig()
    """The GCE target: VM instances of docker+machine runner managers (docs/gce.md)."""
    k8s: K8sConfig = K8sConfig()
    """The Kubernetes target: sandbox Pods, Secrets and NetworkPolicies of CI runs (docs/kubernetes.md)."""
    budget: BudgetConfig = BudgetConfig()
    """The staleness budget each scope of both targets is held by (docs/design.md §4)."""
    rules: RulesConfig = RulesConfig()
    """Each rule's configured mode. Its effective mode is the lower of its rollout phase's preset and this: the
    config can restrict a phase, never extend it (docs/design.md §3). Quote `"off"`: YAML reads a bare off as
    false, which is refused."""
    max_deletions_per_sweep: int = Field(default=500, ge=0)
    """Per target and sweep; a plan with more deletes deletes nothing and reports everything."""
    ledger: LedgerConfig = LedgerConfig()
    """The audit trail in MongoDB (docs/operating.md, "The ledger")."""
    airflow: AirflowConfig = AirflowConfig()
    """How the DAGs run: schedules, sharding, the sweep store, retries, delete batches (docs/operating.md)."""
    metrics: MetricsConfig = MetricsConfig()
    """Sweep metrics, and the runbook the alerts link (docs/operating.md, "Metrics and alerts")."""
    rollout: RolloutConfig = RolloutConfig()
    """The active rollout phase of each target (docs/operating.md, "Moving through the rollout")."""
    cause_alerts: CauseAlertsConfig = CauseAlertsConfig()
    """The runner managers' cause alerts (docs/operating.md, "Metrics and alerts")."""
    notifications: NotificationsConfig = NotificationsConfig()
    """Optional notices to resource owners when a scope is held, deletes fail, and a digest of what was deleted
    (docs/notifications.md); off by default."""

    @model_validator(mode="after")
    def _room_to_delete(self) -> Settings:
        # docs/design.md §6: deletes stop a margin before the run's timeout (one request and one ledger
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
        approval_life = MAX_EXPIRY + longest  # the retention index counts from the approval's recording
        if self.ledger.retention < approval_life:
            raise _CrossFieldError(
                ("ledger", "retention"),
                f"expected at least {short(approval_life)} (an approval's longest expiry "
                f"{short(MAX_EXPIRY)} + the longest run timeout {short(longest)}), got "
                f"{short(self.ledger.retention)}: a run using an approval must still find it in the ledger",
            )
        return self

    @model_validator(mode="after")
    def _liveness_authority(self) -> Settings:
        # docs/design.md §5: without a lease source an in-flight run's sandbox could be reaped.
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


def _describe(error: ErrorDetails) -> str:
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
