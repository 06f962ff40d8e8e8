"""The data the policy reads and writes: normalized resources, evidence, decisions and the plan.

Everything here is plain data (``msgspec`` structs: compact, fast to build in
the million-instance sweep, and serializable for XCom and the ledger). Times
are unix seconds as floats so the policy compares numbers, never parses dates.
Evidence always has an explicit *unknown*: a source that did not answer is
never mistaken for one that said "gone".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")


class Phase(StrEnum):
    """A rollout phase, in rollout order: each phase's presets delete at least what the one before's do
    (a sweep of an earlier phase may still delete more: under the global cap, its smaller plan can fit)."""

    TELEMETRY = "telemetry"
    TERMINATED_CLEANUP = "terminated-cleanup"
    REPORT_ONLY = "report-only"
    ENFORCEMENT = "enforcement"


def dag_id_of(target: str, phase: Phase) -> str:
    """The id of a target's DAG of a phase (``reaper_gce_report_only``): the factory names them so."""
    return f"reaper_{target}_{phase.value.replace('-', '_')}"


class Mode(IntEnum):
    """A rule's mode (``rules.<rule>`` in the config, a phase's preset). Ordered, so the effective mode is a plain
    ``min()``."""

    OFF = 0
    REPORT = 1
    DELETE = 2

    def __str__(self) -> str:
        return self.name.lower()


class Action(StrEnum):
    KEEP = "keep"
    REPORT = "report"
    DELETE = "delete"


ACTION_OF_MODE = {Mode.OFF: Action.KEEP, Mode.REPORT: Action.REPORT, Mode.DELETE: Action.DELETE}


class LeaseState(StrEnum):
    HELD = "held"
    ABSENT = "absent"
    UNKNOWN = "unknown"


class StoreState(StrEnum):
    """A run's (or a step attempt's) state in its store."""

    ACTIVE = "active"
    TERMINAL = "terminal"
    NOT_FOUND = "not_found"
    UNKNOWN = "unknown"


# --- resources -------------------------------------------------------------------------------


class GceInstance(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="instance"):
    """A GCE VM instance, as much of it as the rules read.

    Tagged (``"type": "instance"``) because a sweep's inventory file holds instances and fleeting
    groups in one list, and msgspec tells tagged structs apart when it decodes the list.
    """

    project: str
    zone: str
    name: str
    id: str
    status: str
    labels: dict[str, str]
    created: float
    last_stop: float | None = None
    deletion_protection: bool = False
    # ``created-by`` metadata: a managed instance group made it and owns its lifecycle (fleeting runners).
    group_member: bool = False
    # A hash of the labels: it changes with any change of them, a heartbeat included; the state an approval
    # was reviewed in (docs/design.md §6).
    # Empty in inventories listed before it was read.
    label_fingerprint: str = ""
    # When it was last suspended (``lastSuspendedTimestamp``), or None: a VM resumed and suspended again since a
    # listing writes no label and keeps its status and its last stop; only this moves.
    last_suspended: float | None = None

    kind = "instance"

    @property
    def uid(self) -> str:
        """The numeric id: unique for the VM's lifetime, unlike its name (a VM recreated under it has another)."""
        return self.id

    @property
    def scope(self) -> str:
        return self.project

    @property
    def location(self) -> str:
        return self.zone


class K8sObject(msgspec.Struct, frozen=True, gc=False):
    """A managed Pod, Secret or NetworkPolicy. Secrets carry metadata only: never ``data``.

    ``containers`` (Pods only) maps every container and init container name to
    whether it has finished for good: terminated and never to be restarted. A
    container that runs, waits, has no status yet, or exited non-zero where the
    kubelet will restart it has not (docs/design.md §5, row 6). ``deleting``:
    ``metadata.deletionTimestamp`` is set (grace period, finalizers): the object is
    already going away, and a Pod in that state may still be running. ``uses`` (Pods):
    the Secrets it mounts or reads. ``selects`` (NetworkPolicies): its pod selector as
    (key, operator, values) requirements; empty selects every Pod of its namespace.
    """

    kind: str
    cluster: str
    namespace: str
    name: str
    uid: str
    labels: dict[str, str]
    created: float
    resource_version: str = ""
    containers: dict[str, bool] = {}
    owner_references: int = 0
    active_deadline_seconds: int | None = None
    deleting: bool = False
    uses: tuple[str, ...] = ()
    selects: tuple[tuple[str, str, tuple[str, ...]], ...] | None = None

    @property
    def scope(self) -> str:
        return self.cluster

    @property
    def location(self) -> str:
        return self.namespace


class GceGroup(msgspec.Struct, frozen=True, gc=False, tag_field="type", tag="group"):
    """A managed instance group of fleeting runners (``gce.group_selector``): only ever reported.

    ``location`` is its zone or region. ``instances``: how many instances it holds (its current
    actions summed: every managed instance has exactly one), at least its target size.
    """

    project: str
    location: str
    name: str
    id: str
    instances: int

    kind = "InstanceGroupManager"

    @property
    def uid(self) -> str:
        """Its numeric id, marked as a group's: ids of instances and groups are not promised distinct."""
        return f"igm/{self.id}"

    @property
    def scope(self) -> str:
        return self.project


Resource = GceInstance | GceGroup | K8sObject
# One kind of resource, for the helpers that take a target's resources and hand the same ones back.
R = TypeVar("R", bound=Resource)


def place(target: str, resource: Resource) -> tuple[str, str, str, str, str]:
    """Where a resource is, as people read a list of them: target, scope, zone or namespace, kind, name."""
    return (target, resource.scope, resource.location, resource.kind, resource.name)


@dataclass
class ScopeListing:
    """What listing one scope (a GCE project, a Kubernetes cluster) found.

    ``problems`` says why the listing is not proven complete (empty: complete); the policy then
    holds every delete in the scope. ``hygiene`` counts report-only findings by kind.
    """

    target: str
    scope: str
    resources: list[Resource] = field(default_factory=list)
    pages: int = 0
    problems: list[str] = field(default_factory=list)
    hygiene: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.problems


class Resolved(msgspec.Struct, frozen=True):
    """One scope of a sweep as its configured names resolved (docs/design.md §4, projects by canonical id).

    A GCE project may be configured by its id or its number; the Compute API takes either and names
    the id in every URL it answers, so ``scope`` is the id: what every listing, hold, protection,
    budget and metric is keyed by. ``configured``: the configured names that resolved to it (two when
    an id and its number are both configured: one scope, listed once). ``numbers``: the project
    numbers it is known by (empty: its number is not known). ``how``: how it was resolved.
    ``problem``: why it could not be; then ``scope`` is the configured name, nothing is listed there
    and its listing is incomplete. Kubernetes clusters are named by their connection: as configured.
    """

    scope: str
    configured: tuple[str, ...]
    numbers: tuple[str, ...] = ()
    how: str = "as configured"
    problem: str = ""


def is_project_number(name: str) -> bool:
    """Whether a project name is a number (ASCII digits); a project id starts with a letter."""
    return name.isascii() and name.isdigit()


def incomplete_scopes(listings: list[ScopeListing]) -> frozenset[tuple[str, str]]:
    """The ``Evidence.incomplete`` entries of these listings: no delete is sent in those scopes."""
    return frozenset((x.target, x.scope) for x in listings if not x.complete)


class Outcome(msgspec.Struct, frozen=True, gc=False):
    """What happened to one planned delete. ``detail`` says why for anything but ``deleted``."""

    resource: Resource
    result: str
    detail: str = ""

    @property
    def kind(self) -> str:
        return self.resource.kind

    @property
    def name(self) -> str:
        return self.resource.name

    @property
    def uid(self) -> str:
        return self.resource.uid


class QuotaUse(msgspec.Struct, frozen=True):
    """What one scope's calls to its API cost: requests per quota group, throttled answers, seconds waited for them
    (reaper.gce.quota: a GCE project's rate quotas)."""

    requests: dict[str, int] = {}
    throttled: int = 0
    waited: float = 0.0

    def __add__(self, other: QuotaUse) -> QuotaUse:
        requests = dict(self.requests)
        for group, n in other.requests.items():
            requests[group] = requests.get(group, 0) + n
        return QuotaUse(requests, self.throttled + other.throttled, self.waited + other.waited)


def merge_use(*uses: dict[str, QuotaUse]) -> dict[str, QuotaUse]:
    """Scope -> use, summed over several tasks' accounts."""
    total: dict[str, QuotaUse] = {}
    for use in uses:
        for scope, part in use.items():
            total[scope] = total[scope] + part if scope in total else part
    return total


# --- evidence --------------------------------------------------------------------------------


class WriterRecord(msgspec.Struct, frozen=True):
    """One heartbeat writer's report: ``last_pass`` in unix seconds, ``failing`` if its passes fail."""

    manager: str
    project: str
    last_pass: float
    failing: bool


class Keyed(msgspec.Struct, Generic[T], frozen=True):
    """Per-key answers of one evidence source.

    ``known`` holds the keys the source answered for, ``failed`` the keys whose
    lookup errored. A key in neither is provably absent only when ``complete``
    (the source listed everything and succeeded); otherwise it is unknown.
    ``problem``: why a source that answered is not complete, in a sentence for the
    sweep's verdicts (a store that did not prove it is the right one); empty when it
    is complete or no reason is known.
    """

    known: dict[str, T] = {}
    failed: frozenset[str] = frozenset()
    complete: bool = False
    problem: str = ""


class Evidence(msgspec.Struct, frozen=True):
    """Everything the policy may consult besides the resources.

    ``None`` for a source means it could not be read at all: every answer from it is unknown.

    - ``writer_health``: heartbeat-writer reports, all projects. A record whose ``last_pass`` is
      not a finite number is an unreadable report: its project's writer health is unknown.
    - ``leases``: run key -> lease expiry (unix seconds, ``None`` = no expiry known; a value
      that is not a finite number is unknown).
    - ``runs``: run key -> raw status string from the run store.
    - ``steps``: ``run/step/attempt`` (the pod's own label values) -> (raw status, results
      durable) from ``step_runs``.
    - ``incomplete``: (target, scope) pairs whose inventory listing is not proven complete.
    - ``swept``: (target, scope) pairs the sweep listed; each gets a verdict and a census even when
      it holds nothing (so an emptied scope reports zeros, and an incomplete empty one its hold).
    - ``observed_until``: when the last of this evidence (and of the listed labels) was read, unix
      seconds. The policy measures ages at its ``now`` (the start of the listing: the youngest
      ages the evidence supports) but judges "in the future" against this later time, so a
      heartbeat stamped while the sweep was reading is not mistaken for a skewed clock.
      ``None``: the same as ``now`` (offline exports read at one instant).
    - ``reporting``: the (manager, project) pairs with any writer-health report within the
      quarantine, from a source proven to hold that much history; ``None``: unknown (not read,
      unreadable, or too little history), and no group is then reported residual.
    - ``resolved``: scope -> how the sweep resolved its configured names (:class:`Resolved`): the
      numbers a GCE project is also known by, for ``gce.protected_projects`` and writer-health
      labels that name numbers. Empty (an offline export): every project's number is unknown.
    """

    writer_health: list[WriterRecord] | None = None
    leases: Keyed[float | None] | None = None
    runs: Keyed[str] | None = None
    steps: Keyed[tuple[str, bool]] | None = None
    incomplete: frozenset[tuple[str, str]] = frozenset()
    swept: frozenset[tuple[str, str]] = frozenset()
    observed_until: float | None = None
    reporting: frozenset[tuple[str, str]] | None = None
    resolved: dict[str, Resolved] = {}


def step_key(run: str, step: str, attempt: str) -> str:
    """The key of one step attempt in ``Evidence.steps``."""
    return f"{run}/{step}/{attempt}"


class SweepData(msgspec.Struct, Generic[T], frozen=True):
    """The file a sweep's ``gather_evidence`` writes to the sweep store: everything the policy reads besides the
    config and the clock. ``as_of``: the policy's ``now``, when the first shard began listing (``None`` in files
    written before it was recorded), so a recorded input can be evaluated again as its sweep saw it."""

    resources: list[T]
    evidence: Evidence
    as_of: float | None = None


class Liveness(StrEnum):
    """What a resource's liveness evidence says of its owner, from the most alive to the least
    (``reaper diff``, docs/config-review.md): of two readings of one resource, the more alive counts."""

    FRESH = "fresh"  # the owner may be alive: a fresh heartbeat, a held lease, an active run, a running sidecar
    UNKNOWN = "unknown"  # missing or surprising evidence: no proof either way
    STALE = "stale"  # proof the owner is gone: a stale heartbeat, TERMINATED, no lease and the run over


class Reading(msgspec.Struct, frozen=True):
    """One resource's liveness evidence as the rules read it under one config: the state, a reason code that
    says why (one of :mod:`reaper.report.reasons`, so it reads as a sentence) and the facts it was read from."""

    state: Liveness
    reason: str
    evidence: dict[str, object] = {}


# --- plan ------------------------------------------------------------------------------------


class Decision(msgspec.Struct, frozen=True, gc=False):
    """What the policy decided for one resource, and why.

    ``rule`` is the rule the decision concerns (``None`` when no rule applies),
    ``reason`` the finding, anomaly, hold or keep cause, and ``evidence`` the
    facts it was made on.
    """

    target: str
    resource: Resource
    action: Action
    rule: str | None
    reason: str
    evidence: dict[str, object] | None = None

    @property
    def scope(self) -> str:
        return self.resource.scope


class ScopeVerdict(msgspec.Struct, frozen=True):
    """Per-scope outcome: ``holds`` lists every hold in force (empty means ok), ``blocking`` those
    of them that stop a delete in the sweep's phase (a hold on a rule that only reports does not)."""

    target: str
    scope: str
    holds: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()
    details: dict[str, object] = {}
    blocking: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        return self.holds[0] if self.holds else "ok"

    def as_dict(self) -> dict[str, object]:
        """The verdict as plain data (CLI output, the sweep summary in the ledger)."""
        return {
            "target": self.target,
            "scope": self.scope,
            "verdict": self.verdict,
            "holds": list(self.holds),
            "blocking": list(self.blocking),
            "overridden": list(self.overridden),
            **self.details,
        }


class Override(msgspec.Struct, frozen=True):
    """A manual trigger's budget override: a non-empty reason, a user, and the scopes it lifts.

    ``scopes``: the (target, scope) pairs, keyed as ``Evidence`` keys them, whose budget hold it
    lifts; a budget hold in any other scope stands (docs/design.md §6). Naming none lifts nothing,
    so it is refused like a missing reason.
    """

    reason: str
    user: str
    scopes: frozenset[tuple[str, str]]

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError("override_reason must be non-empty to override a budget hold")
        if not self.scopes:
            raise ValueError("override_scopes must name the scopes whose budget hold is lifted")

    def lifts(self, target: str, scope: str) -> bool:
        """Whether this override lifts the budget hold of ``scope`` of ``target``."""
        return (target, scope) in self.scopes


@dataclass
class TargetResult:
    """What one target's rules produce before the global cap: the parts of a :class:`Plan`."""

    recorded: list[Decision] = field(default_factory=list)
    kept: list[tuple[str, str, list[Resource]]] = field(default_factory=list)
    verdicts: list[ScopeVerdict] = field(default_factory=list)
    census: dict[str, dict[str, object]] = field(default_factory=dict)


@dataclass
class Plan:
    """The policy's answer for one sweep.

    ``recorded`` holds every decision worth a record: reports, deletes, and keeps
    that have a rule or evidence (opt-out, rule off, a keep row). Plain keeps
    with no finding (a fresh heartbeat, a young unlabeled instance, a protected
    project) are ``kept`` as (target, reason, resources) groups, because a
    million-instance sweep must not build a million records nobody reads.
    ``decisions`` materializes all of them: exactly one per in-scope resource.
    """

    phase: Phase
    now: float
    recorded: list[Decision]
    kept: list[tuple[str, str, list[Resource]]]
    scopes: list[ScopeVerdict]
    census: dict[str, dict[str, dict[str, object]]]
    capped: dict[str, int] = field(default_factory=dict)

    @cached_property
    def decisions(self) -> list[Decision]:
        keeps = [Decision(t, r, Action.KEEP, None, reason) for t, reason, group in self.kept for r in group]
        return self.recorded + keeps

    def deletes(self) -> list[Decision]:
        return [d for d in self.recorded if d.action is Action.DELETE]
