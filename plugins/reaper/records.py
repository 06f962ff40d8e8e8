"""The ledger's documents as types: the one definition of every record and summary the ledger holds
(docs/design.md §7).

A record's type is its ``action``, the field every ledger document already carries and its fence key ends
with: a decision's is its :class:`reaper.model.Action` (``delete``, ``report``), a delete's records' their
:class:`reaper.vocabulary.RecordAction`. So the Structs here are tagged by it (msgspec's ``tag_field``), and
``kind``, what the audit view reads a record as, follows from the type instead of being written beside it.

The documents are exactly what the ledger has always held, field by field and in the same order (the fence
first, as its upserts name it; one exception: a summary skipped for the lease names ``why`` before ``state``,
as a full summary always has): :func:`document` encodes a record, and a document written before a field
existed still decodes, the field at its default. A key that only some documents carry is ``UNSET`` when
absent (never written), or a default that ``omit_defaults`` leaves out where the writer never wrote it.

This module imports nothing of the reaper's but :mod:`reaper.model`, :mod:`reaper.vocabulary` and
:mod:`reaper.approvals` (an approved item's fields): the writers (the sweep's steps and deletes), the ledger and
its readers (metrics, the report) all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from reaper.approvals import ApprovedItem
from reaper.model import Action, QuotaUse, Resolved, ScopeVerdict
from reaper.vocabulary import RecordAction

# An execution of a sweep: the DAG run, its clear_number and the token of the sweep lease it took
# (clearing tasks without resetting the run keeps the clear_number, never the token). A retried task
# rewrites its own records; a cleared or re-run run never overwrites an earlier execution's.
EXECUTION = ("dag_id", "run_id", "execution", "lease")
# What identifies one delete record (docs/design.md's fence key): one intent, one outcome per execution and object.
RECORD_KEY = (*EXECUTION, "target", "scope", "uid", "action")
# A document as the ledger hands it to MongoDB and reads it back.
Document = dict[str, object]
# A document as stored, read field by field where no type names every field it may carry: the audit view's
# sweep page and overview list what a summary holds, also fields a later version added (docs/audit-view.md).
Stored = dict[str, Any]


class LedgerRecord(msgspec.Struct, tag_field="action", omit_defaults=True, kw_only=True, frozen=True):
    """What every record of the ledger's records collection carries: its fence (docs/design.md §7), whose
    ``action`` is the record's tag. ``kind``: what the audit view reads it as, the type's own."""

    kind: ClassVar[str]

    dag_id: str
    run_id: str
    execution: int
    lease: str
    target: str
    scope: str
    uid: str


class DecisionRecord(LedgerRecord, kw_only=True, frozen=True):
    """A decision that is not a keep (docs/design.md §7): the resource, the rule and reason, its evidence.

    ``fingerprint``: the state it was decided in (labelFingerprint, resourceVersion), what an approval of it names;
    ``approval``: the approval it was planned under; ``group``: a Kubernetes object's run; ``override`` and
    ``phase_gate``: the override it was made under, the phase confirmation of its run. Each is written only when
    there is one. ``resource_kind``: what records written before it existed lack (the report derives it).
    """

    kind: ClassVar[str] = "decision"

    rule: str | None
    reason: str
    name: str
    location: str
    resource_kind: str = ""
    fingerprint: str = ""
    approval: str = ""
    group: str = ""
    evidence: dict[str, Any] | None  # None: a decision the policy gave no evidence
    override: OverrideRecord | None = None
    phase_gate: PhaseGate | None = None

    @staticmethod
    def of(action: Action) -> type[DecisionRecord]:
        """The record type of a decision's action (a keep is never recorded one by one)."""
        return _DECISIONS[action]


class DeleteDecision(DecisionRecord, tag=Action.DELETE.value, kw_only=True, frozen=True):
    """A planned delete."""


class ReportDecision(DecisionRecord, tag=Action.REPORT.value, kw_only=True, frozen=True):
    """A finding reported, or a delete held as a report."""


_DECISIONS: dict[Action, type[DecisionRecord]] = {Action.DELETE: DeleteDecision, Action.REPORT: ReportDecision}


class Intent(LedgerRecord, tag=RecordAction.DELETE_INTENT.value, kw_only=True, frozen=True):
    """A delete's intent, acknowledged before the delete is sent (docs/design.md §6, §7).

    ``sent``: the delete call went out; written only as True (the sent mark), so a retry rewriting the
    intent never lowers an earlier try's mark.
    """

    kind: ClassVar[str] = RecordAction.DELETE_INTENT.kind

    name: str
    sent: bool = False


class Outcome(LedgerRecord, tag=RecordAction.OUTCOME.value, kw_only=True, frozen=True):
    """What came of one planned delete: a :class:`reaper.vocabulary.Result` and its detail."""

    kind: ClassVar[str] = RecordAction.OUTCOME.kind

    name: str
    result: str
    detail: str


# --- the sweep summary --------------------------------------------------------------------------------------


class PlanRef(msgspec.Struct, frozen=True):
    """What a plan was made under; only the same execution, lease token and config may run it."""

    execution: int
    token: str
    config: str


class DecisionCount(msgspec.Struct, frozen=True):
    """The decisions of one (target, scope, rule, reason, action): a summary counts them, keeps included.

    Every field has a default: the audit view reads a summary's counts however partial, as it always did."""

    target: str = ""
    scope: str = ""
    rule: str = ""
    reason: str = ""
    action: str = ""
    count: int = 0


class AgeHistogram(msgspec.Struct, frozen=True):
    """Valid heartbeat ages as a Prometheus histogram counts them: cumulative ``le`` buckets, sum and count."""

    buckets: dict[str, int]
    sum: int | float  # whichever the policy counted: the document keeps its BSON type
    count: int


class GroupCensus(msgspec.Struct, frozen=True):
    """A project's fleeting managed instance groups (docs/design.md §10)."""

    listed: int = 0
    residual: int = 0
    residual_instances: int = 0


class GceCensus(msgspec.Struct, frozen=True):
    """A GCE project's census. ``groups``: only with ``gce.group_selector``."""

    instances: int = 0
    by_status: dict[str, int] = {}
    by_finding: dict[str, int] = {}
    heartbeat_age_seconds: AgeHistogram | None = None
    groups: GroupCensus | UnsetType = UNSET

    @property
    def counts(self) -> dict[str, int]:
        """In-scope resources by status."""
        return self.by_status

    @property
    def findings(self) -> dict[str, int]:
        return self.by_finding


class K8sCensus(msgspec.Struct, frozen=True):
    """A Kubernetes cluster's census: objects by kind, runs by decision row, lease and store states."""

    objects: int = 0
    by_kind: dict[str, int] = {}
    terminating: dict[str, int] = {}
    runs: int = 0
    by_reason: dict[str, int] = {}
    lease: dict[str, int] = {}
    store: dict[str, int] = {}

    @property
    def counts(self) -> dict[str, int]:
        """In-scope objects by kind."""
        return self.by_kind

    @property
    def findings(self) -> dict[str, int]:
        """Runs by the reason their row gave."""
        return self.by_reason


ScopeCensus = GceCensus | K8sCensus


class WriterProblem(msgspec.Struct, frozen=True):
    """A manager whose writer health holds its project (``reaper.policy.gce.writer_hold``)."""

    manager: str = ""
    problem: str = ""  # failing, stale, last_pass_in_future, unreadable
    last_pass: float | UnsetType = UNSET


class Verdict(msgspec.Struct, frozen=True):
    """One scope's verdict as a summary records it (:func:`verdict_record`): the holds in force, those that
    block a delete in the sweep's phase, those an override lifted, and the details the report and the notices
    explain them by. Fields in the order the ledger has always held them; a detail only one target has is
    ``UNSET`` on the other's."""

    target: str = ""
    scope: str = ""
    verdict: str = "ok"  # the first hold, or ok
    holds: list[str] = []
    blocking: list[str] = []
    overridden: list[str] = []
    # GCE: the budget's sides, and why writer health holds
    labeled: int | UnsetType = UNSET
    stale: int | UnsetType = UNSET
    stale_fraction: float | UnsetType = UNSET
    unhealthy_writers: list[WriterProblem] | UnsetType = UNSET
    protected_by: str | UnsetType = UNSET  # the configured number that protects the project, when not its id
    # Kubernetes: the budget's sides
    runs: int | UnsetType = UNSET
    managed_runs: int | UnsetType = UNSET
    orphaned_runs: int | UnsetType = UNSET
    unknown_evidence: list[str] | UnsetType = UNSET  # why a source answered unknown there

    def sides(self) -> str:
        """The budget's two sides where the verdict has them: S stale of L labeled (GCE), orphaned of managed runs
        (Kubernetes); empty otherwise."""
        if self.stale is not UNSET and self.labeled is not UNSET:
            return f"S {self.stale} / L {self.labeled}"
        if self.orphaned_runs is not UNSET and self.managed_runs is not UNSET:
            return f"S {self.orphaned_runs} / L {self.managed_runs} runs"
        return ""

    def facts(self) -> dict[str, Any]:
        """The verdict as plain data: what a hold's sentence reads (:attr:`reaper.vocabulary.Reason.hold_sentence`)."""
        facts: dict[str, Any] = msgspec.to_builtins(self)
        return facts


def verdict_record(verdict: ScopeVerdict) -> Verdict:
    """A policy's scope verdict as its summary records it; a detail :class:`Verdict` has no field for is an error
    (a test holds every detail the policy gives to one)."""
    if extra := verdict.details.keys() - set(Verdict.__struct_fields__):
        raise ValueError(f"scope verdict details without a Verdict field: {sorted(extra)}")
    return msgspec.convert(verdict.as_dict(), Verdict)


class Census(msgspec.Struct, frozen=True):
    """A sweep's census: per target (the one swept), per scope. Counted in every phase (docs/design.md §3)."""

    gce: dict[str, GceCensus] | UnsetType = UNSET
    k8s: dict[str, K8sCensus] | UnsetType = UNSET

    def of(self, target: str, scope: str) -> ScopeCensus | None:
        """One scope's census, None when the sweep has none for it."""
        scopes: Mapping[str, ScopeCensus] = getattr(self, target, None) or {}
        return scopes.get(scope)


class OverrideRecord(msgspec.Struct, kw_only=True, frozen=True):
    """A manual trigger's override (docs/design.md §6): who asked, why, and what it lifts. ``scopes``: the scopes
    whose budget hold a budget override lifts (summaries written before they were recorded lack them);
    ``max_deletions``: a raised cap; ``applied``: False, and ``why``, for a cleared or re-run run. What a record
    lacks stays ``UNSET``, so the sweep page shows a record as written, never a default it did not say."""

    reason: str = ""
    user: str = ""
    budget: bool | UnsetType = UNSET  # the writer always sets it; records before the raised cap existed lack it
    scopes: list[str] | UnsetType = UNSET
    max_deletions: int | UnsetType = UNSET
    applied: bool | UnsetType = UNSET  # likewise; the first records lack it (an override then always applied)
    why: str | UnsetType = UNSET

    @property
    def raises_cap(self) -> bool:
        return not isinstance(self.max_deletions, UnsetType)


class PhaseGate(msgspec.Struct, kw_only=True, frozen=True):
    """A run of a phase other than its target's active one (docs/design.md §8): ``confirmed``: its trigger named
    the phase in ``confirm_phase`` with a ``reason`` (the run deletes); else ``why`` it is a dry run."""

    phase: str = ""
    active: str = ""
    user: str = ""
    reason: str | UnsetType = UNSET
    confirmed: bool = False
    why: str = ""


class Sent(msgspec.Struct, frozen=True):
    """What became of one notice: the channel (``NotifyChannel.key``), its event, and why it failed."""

    channel: str
    event: str
    ok: bool
    error: str = ""


class Notices(msgspec.Struct, kw_only=True, frozen=True):
    """What ``record`` told the owners (docs/notifications.md): how many notices were sent and failed, and each
    one's channel, event and error; ``error``: why none was sent, when sending failed as a whole."""

    sent: int = 0
    failed: int = 0
    notices: list[Sent] | UnsetType = UNSET
    error: str | UnsetType = UNSET


class ItemResult(ApprovedItem, frozen=True):
    """An approved item and what came of it in the run that used the approval (``docs/audit-view.md``): planned,
    then its outcome; or why the plan kept it (a reason), or ``not_listed``."""

    state: str = ""


class ApprovalUse(msgspec.Struct, kw_only=True, frozen=True):
    """The approval a run deleted under (docs/design.md §6): who gave it and why, from which sweep (``from_run``),
    its cap (its item count; ``above_cap``: above ``max_deletions_per_sweep``), whether this execution claimed it,
    and per approved item what came of it."""

    id: str = ""
    user: str = ""
    reason: str = ""
    expires_at: float = 0.0
    from_run: str = ""
    items: int = 0
    max_deletions: int = 0
    above_cap: bool = False
    claimed: bool = True
    results: list[ItemResult] = []


class SweepSummary(msgspec.Struct, frozen=True):
    """One execution's summary (docs/design.md §7, §8): its ids, branch and outcomes, the plan in numbers and the
    terms it was made under (the fields of :class:`reaper.sweep.steps.Summary`), and how ``record`` ended.

    A summary of a sweep skipped for the lease, or one that failed before it planned, has no plan: those fields
    are ``UNSET`` (never written), as are ``branch`` and ``why`` when ``budget_check`` did not run and what
    only some sweeps record (metrics pushes, notifications). Defaults: what summaries written before a field
    existed lack.
    """

    dag_id: str
    run_id: str
    execution: int = 0
    lease: str = ""
    target: str = ""
    phase: str = ""
    active_phase: str | UnsetType = UNSET
    branch: str | UnsetType = UNSET
    why: str | UnsetType = UNSET
    outcomes: dict[str, int] | UnsetType = UNSET
    # the plan (reaper.sweep.steps.Summary)
    decisions: list[DecisionCount] | UnsetType = UNSET
    kept: dict[str, int] | UnsetType = UNSET
    scopes: list[Verdict] | UnsetType = UNSET
    capped: dict[str, int] | UnsetType = UNSET
    census: Census | UnsetType = UNSET
    override: OverrideRecord | UnsetType | None = UNSET
    triggered_by: str | UnsetType = UNSET
    dry_run: bool | UnsetType = UNSET
    stale_inputs: bool | UnsetType = UNSET
    warnings: list[str] | UnsetType = UNSET
    hygiene: dict[str, int] | UnsetType = UNSET
    incomplete: dict[str, list[str]] | UnsetType = UNSET
    deletes: int | UnsetType = UNSET
    plan: PlanRef | UnsetType = UNSET
    max_deletions: int | UnsetType | None = UNSET
    left: int | UnsetType = UNSET
    resolution: list[Resolved] | UnsetType = UNSET
    quota: dict[str, QuotaUse] | UnsetType = UNSET
    phase_gate: PhaseGate | UnsetType | None = UNSET
    approval: ApprovalUse | UnsetType | None = UNSET
    # how ``record`` ended
    stale_plan: int | UnsetType = UNSET
    state: str = ""
    metrics_push_failures: int | UnsetType = UNSET
    notifications: Notices | UnsetType = UNSET
    at: datetime | UnsetType = UNSET  # when the ledger wrote it (its own stamp, never the writer's)

    def verdict(self, scope: str) -> Verdict:
        """The scope's verdict, one without holds when the summary has none."""
        return next((v for v in self.scopes or [] if v.scope == scope), Verdict(self.target, scope))

    def census_of(self, scope: str) -> ScopeCensus | None:
        """The scope's census in this summary's target, None when it has none."""
        return self.census.of(self.target, scope) if self.census else None


def summary_of(doc: Mapping[str, object]) -> SweepSummary:
    """A summary document as the ledger holds it (any age: what it lacks takes its default), typed.

    Lax (``strict=False``): a number a server stored as a double where an int was written still reads."""
    return msgspec.convert(doc, SweepSummary, strict=False)


def document(record: LedgerRecord | SweepSummary | Mapping[str, object]) -> Document:
    """A record or summary as the ledger writes it; a record's fence first (as its upsert names it), then its
    ``kind``, then the rest.

    A mapping is taken as the document it already is (a partial record, or one written as it was before)."""
    if isinstance(record, Mapping):
        return dict(record)
    fields: Document = msgspec.to_builtins(record)  # a record's tag, ``action``, comes first
    if isinstance(record, SweepSummary):
        return fields
    return {**{f: fields.pop(f) for f in RECORD_KEY}, "kind": record.kind, **fields}
