"""Each task of a sweep as a plain, typed function; the DAG factory (:mod:`reaper.sweep.factory`) only wires them.

The graph (docs/design.md §8): ``resolve_scopes`` (takes the target's sweep lease) ->
``list_inventory`` (one per shard of scopes) -> ``gather_evidence`` (the one sweep input) ->
``evaluate_policy`` (the plan: decisions in the ledger, candidate batches, the summary) ->
``budget_check`` -> ``delete`` (one per batch) or ``report_only`` -> ``record`` -> ``release_lease``.
What travels between tasks is typed here as msgspec Structs (plain data in XCom); inventories and
evidence travel through files in ``airflow.sweep_store``, never through XCom.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import msgspec
from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from reaper.approvals import Approval, fingerprint_of
from reaper.config import Settings
from reaper.fence import SendGuard
from reaper.model import (
    Action,
    Evidence,
    Mode,
    Phase,
    Plan,
    QuotaUse,
    Resolved,
    Resource,
    ScopeListing,
    SweepData,
    merge_use,
)
from reaper.records import (
    ApprovalUse,
    Census,
    DecisionCount,
    DecisionRecord,
    Notices,
    OverrideRecord,
    PhaseGate,
    PlanRef,
    SweepSummary,
    Verdict,
    verdict_record,
)
from reaper.redact import error_for_log
from reaper.sweep import approved, notices
from reaper.sweep.deadline import fit_before_deadline, resolving_deadline, send_deadline
from reaper.sweep.deletes import (
    SendTerms,
    config_digest,
    cut_batches,
    delete_batch,
    outcome_records,
    stale,
)
from reaper.sweep.gate import acts, check_confirmation, gated, phase_gate, pushes_metrics
from reaper.sweep.overrides import (
    Overrides,
    check_budget_override,
    check_override_scopes,
    check_raised_cap,
    run_overrides,
)
from reaper.sweep.targets import Target
from reaper.transitions import group_of
from reaper.vocabulary import Result

if TYPE_CHECKING:
    from reaper.ledger import Ledger

log = logging.getLogger(__name__)
R = TypeVar("R")
DELETE, REPORT_ONLY = "delete", "report_only"  # the branches of budget_check: task ids


# --- what travels between tasks ----------------------------------------------------------------


class Ids(msgspec.Struct, frozen=True):
    """One execution of a sweep, as the ledger keys it.

    Clearing any task of a DAG run raises its ``clear_number`` (``execution``): each value is one
    execution, with its own plan, ledger records and summary (docs/design.md §6 and §7). That
    alone does not tell executions apart (clearing tasks without resetting the run keeps it), but
    every execution takes the sweep lease anew: ``lease`` is its token (a retried task keeps it).
    """

    dag_id: str
    run_id: str
    execution: int
    lease: str = ""

    @property
    def holder(self) -> str:
        """Who holds the sweep lease: the execution, whatever its token."""
        return f"{self.dag_id}/{self.run_id}#{self.execution}"

    def fields(self) -> dict[str, Any]:
        """The ids as the ledger's documents carry them (the fields of every record and summary)."""
        return msgspec.structs.asdict(self)


class Lease(msgspec.Struct, frozen=True):
    """The target's sweep lease as this execution took it (:meth:`reaper.ledger.Ledger.acquire`)."""

    holder: str
    token: str
    expires_at: float


class Setup(msgspec.Struct, frozen=True):
    """What ``resolve_scopes`` hands on: the shards ``list_inventory`` maps over (scopes by their canonical
    names, :class:`reaper.model.Resolved`), and the lease."""

    shards: list[list[Resolved]]
    lease: Lease
    quota: dict[str, QuotaUse] = {}  # what resolving the scopes cost their API quotas


class Shard(msgspec.Struct, frozen=True):
    """What one ``list_inventory`` task found: its resources (in the file at ``path``) and how listing went.

    ``incomplete``: scope -> why its listing is not proven complete. ``listed_at``: when listing
    began, before any label was read. ``token``: the sweep lease it listed under. ``resolved``: how
    its scopes' configured names resolved. ``quota``: what its calls cost each scope's API quotas.
    """

    path: str
    scopes: list[str]
    count: int
    incomplete: dict[str, list[str]]
    hygiene: dict[str, int]
    listed_at: float
    token: str
    resolved: list[Resolved] = []
    quota: dict[str, QuotaUse] = {}


class SweepInput(msgspec.Struct, frozen=True):
    """``evaluate_policy``'s one input: :class:`SweepData` at ``path``, and the facts of how it was read.

    ``as_of``: when the first shard began listing; ages are measured then, not later (a label read
    then may have been refreshed since: the later the clock, the less conservative every age).
    ``tokens``: the sweep lease tokens the listings and the evidence were read under. ``resolution``:
    how every swept scope's configured names resolved.
    """

    path: str
    as_of: float
    tokens: list[str]
    incomplete: dict[str, list[str]]
    hygiene: dict[str, int]
    warnings: list[str]
    resolution: list[Resolved] = []
    quota: dict[str, QuotaUse] = {}


class Summary(msgspec.Struct, frozen=True):
    """A sweep's plan in numbers and the facts it was made under: the ledger's summary, the metrics' source.

    ``deletes``: how many deletes the policy planned, whether or not this execution may send them.
    ``stale_inputs``: its listing or evidence was read by another execution or under another lease.
    ``max_deletions``: the global cap it was made under. ``left``: planned deletes that could not be
    sent before the run's deadline at the scopes' delete rates, recorded as left for the next sweep.
    ``plan``: the execution and lease it was made under (``record`` files it under those only).
    ``resolution``: each swept scope, the configured names it was resolved from and how
    (docs/design.md §4: a GCE project configured by its number is swept by its id).
    ``quota``: what resolving and listing cost each scope's API quotas (``record`` adds the deletes').
    ``phase_gate``: for a run of a phase other than its target's active one, whether its trigger confirmed
    the phase (:func:`phase_gate`); unconfirmed, the run is a dry run.
    """

    phase: str
    decisions: list[DecisionCount]
    kept: dict[str, int]
    scopes: list[Verdict]
    capped: dict[str, int]
    census: Census
    override: OverrideRecord | None
    triggered_by: str
    dry_run: bool
    stale_inputs: bool
    warnings: list[str]
    hygiene: dict[str, int]
    incomplete: dict[str, list[str]]
    deletes: int
    plan: PlanRef
    # With defaults: a summary planned before they existed still reads (a run in flight during a deploy).
    max_deletions: int | None = None
    left: int = 0
    resolution: list[Resolved] = []
    quota: dict[str, QuotaUse] = {}
    phase_gate: PhaseGate | None = None
    approval: ApprovalUse | None = None  # the run's approval and per item what came of it (sweep.approved)


class Batch(msgspec.Struct, Generic[R], frozen=True):
    """Candidates one ``delete`` task deletes, stamped with the plan they belong to.

    ``phase_confirmed``: the plan's phase gate let it be sent (:func:`phase_gate`). ``delete`` refuses a batch of
    a gated phase without it, also one planned before the field existed (a run in flight across a deploy).
    ``approval``: the approval it was planned under, and when that expires (no batch is started after it).
    """

    plan: PlanRef
    resources: list[R]
    phase_confirmed: bool = False
    approval: str = ""
    approval_expires: float = 0.0


class Deleted(msgspec.Struct, frozen=True):
    """What one ``delete`` task did: its outcomes counted by result (``stale_plan``: a plan not its own,
    refused whole), and what its calls cost each scope's API quotas."""

    outcomes: dict[str, int]
    quota: dict[str, QuotaUse] = {}


class Planned(msgspec.Struct, frozen=True):
    """``evaluate_policy``'s outputs: the batches ``delete`` maps over, and the summary."""

    batches: list[Batch[Resource]]
    summary: Summary


class Branch(msgspec.Struct, frozen=True):
    """``budget_check``'s choice and why."""

    branch: str
    why: str


# --- the sweep as its tasks see it -------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One execution of a sweep of ``target`` in ``phase``: what every task step needs."""

    config: Settings
    target: Target[Any]
    phase: Phase
    ids: Ids

    def ledger(self) -> Ledger:
        from reaper.ledger import Ledger

        return Ledger.connect(self.config.ledger)

    def under(self, lease: Lease | None) -> Ids:
        """The ledger's ids of this execution: its run's, and its sweep lease's token."""
        return msgspec.structs.replace(self.ids, lease=lease.token if lease else "")

    def path(self, name: str) -> ObjectStoragePath:
        """Where this execution keeps the file ``name`` in the sweep store."""
        safe_run = self.ids.run_id.replace(":", "_").replace("+", "_")
        return (
            ObjectStoragePath(self.config.airflow.sweep_store)
            / self.ids.dag_id
            / safe_run
            / str(self.ids.execution)
            / name
        )


@dataclass(frozen=True)
class Terms:
    """What an execution's plan is made under (docs/design.md §6 and §8).

    ``gate``: the phase gate's record (None: the phase is not gated); ``confirmed``: a gated phase's run its
    trigger confirmed, whose decisions and batches say so. ``stale_inputs``: the listing or the evidence was
    read by another execution or under another lease. ``approval``: the run's approval, claimed by this
    execution when its plan may delete.
    """

    overrides: Overrides
    gate: PhaseGate | None
    confirmed: bool
    dry_run: bool
    stale_inputs: bool
    approval: Approval | None = None

    @property
    def may_delete(self) -> bool:
        """Neither a dry run nor a plan of inputs another execution read: what it deletes (the cap allowing) is
        its own, so it claims the approval and records the resources' stories."""
        return not (self.dry_run or self.stale_inputs)

    @property
    def approval_expires(self) -> float | None:
        """When the approval ends, and with it every send under it; None without one."""
        return self.approval.expires_at if self.approval else None


# --- the steps ----------------------------------------------------------------------------------


def resolve_scopes(sweep: Execution, params: dict[str, object]) -> Setup:
    """Check the run's params, take the target's sweep lease (waiting ``airflow.lease_wait``), resolve the
    scopes to their canonical names (:meth:`Target.resolve`) and shard them.

    The DAGs of one target never sweep at once (docs/design.md §8): when another holds the lease past the
    wait, this execution's summary says so and the sweep is skipped, which is no failure.
    """
    target, config = sweep.target, sweep.config
    configured = target.scopes()
    asked = params.get("scopes")  # check_form: a list of scope names, when given
    wanted = list(dict.fromkeys(cast("list[str]", asked) if asked else configured))
    unknown = sorted(set(wanted) - set(configured))
    if unknown:
        raise AirflowFailException(
            f"params.scopes: {unknown} are not configured; expected a subset of "
            f"{configured} (config key {target.name}.{target.scope_key})"
        )
    approved.check_form(params)
    check_budget_override(params, wanted, target)
    check_confirmation(params, sweep.phase)
    check_raised_cap(params, config.max_deletions_per_sweep)
    ledger = sweep.ledger()
    ledger.ensure_indexes()
    approved.check_param(sweep, params, ledger)
    lease = wait_for_lease(
        ledger, target.name, sweep.ids.holder, config.run_timeout(target.name), config.lease_wait(target.name)
    )
    if isinstance(lease, str):
        # Skipping the setup skips the whole sweep: its summary is written here.
        ledger.summary(
            SweepSummary(
                **sweep.under(None).fields(), target=target.name, phase=sweep.phase.value, state="skipped", why=lease
            )
        )
        raise AirflowSkipException(lease)
    try:
        deadline = resolving_deadline(send_deadline(config, target.name, lease.expires_at, None), time.time())
        stop = SendGuard(deadline=deadline).stop_at
        resolved = sorted(target.resolve(wanted, stop), key=lambda r: r.scope)
        check_override_scopes(params, wanted, target, resolved)  # by a configured name or the id it resolved to
    except BaseException:
        ledger.sweep_lease.release(target.name, sweep.ids.holder)  # a failed setup runs no teardown
        raise
    for r in resolved:
        if r.problem or r.configured != (r.scope,):
            outcome = f"unresolved: {r.problem}" if r.problem else f"{r.scope} ({r.how})"
            log.warning("%s.%s %s -> %s", target.name, target.scope_key, ", ".join(r.configured), outcome)
    shards = min(config.airflow.shards, max(1, len(resolved)))
    scope_of = {name: r.scope for r in resolved for name in r.configured}
    spent = merge_use(*({scope_of.get(name, name): use} for name, use in target.quota_use().items()))
    return Setup([s for s in (resolved[i::shards] for i in range(shards)) if s], lease, spent)


def wait_for_lease(ledger: Ledger, target: str, holder: str, ttl: timedelta, wait: timedelta) -> Lease | str:
    """The target's sweep lease, waiting up to ``wait`` for another sweep to end; else why not."""
    give_up = time.monotonic() + wait.total_seconds()
    while True:
        lease = ledger.sweep_lease.acquire(target, holder, ttl)
        if lease is not None:
            return msgspec.convert(lease, Lease)
        if time.monotonic() >= give_up:
            return f"another {target} sweep ({ledger.sweep_lease.holder(target) or '?'}) holds the sweep lease; skipped"
        time.sleep(min(5.0, max(0.0, give_up - time.monotonic())))


def list_inventory(sweep: Execution, shard: list[Resolved], map_index: int, lease: Lease) -> Shard:
    """List one shard of scopes into the sweep store; a scope that could not be resolved is not listed:
    its listing is incomplete, and nothing is deleted there."""
    listed_at = datetime.now(UTC).timestamp()  # before any label is read
    target = sweep.target
    unresolved = [ScopeListing(target.name, r.scope, problems=[r.problem]) for r in shard if r.problem]
    # No wait for a used-up quota past the time the run's deletes must stop: the listing is then incomplete.
    stop = SendGuard(deadline=send_deadline(sweep.config, target.name, lease.expires_at, None)).stop_at
    listings = target.list([r.scope for r in shard if not r.problem], stop) + unresolved
    path = sweep.path(f"inventory-{map_index}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode([r for x in listings for r in x.resources]))
    hygiene = sum((Counter(x.hygiene) for x in listings), Counter())
    if hygiene:
        log.warning("hygiene findings (reported, never acted on): %s", dict(hygiene))
    return Shard(
        path=str(path),
        scopes=[r.scope for r in shard],
        count=sum(len(x.resources) for x in listings),
        incomplete={x.scope: x.problems for x in listings if not x.complete},
        hygiene=dict(hygiene),
        listed_at=listed_at,
        token=lease.token,
        resolved=shard,
        quota=target.quota_use(),
    )


def gather_evidence(
    sweep: Execution, shards: list[Shard], lease: Lease, resolving: dict[str, QuotaUse] | None = None
) -> SweepInput:
    """Read every shard's resources and the target's evidence into one file: the sweep's whole input.

    ``resolving``: what resolving the scopes cost their API quotas (:attr:`Setup.quota`), added to the listings'.
    """
    target = sweep.target
    decode = msgspec.json.Decoder(list[target.resource_type]).decode  # type: ignore[name-defined]  # a run-time type
    resources = [r for s in shards for r in decode(ObjectStoragePath(s.path).read_bytes())]
    incomplete = {scope: problems for s in shards for scope, problems in s.incomplete.items()}
    evidence = target.evidence(resources, list(incomplete))
    # Everything the policy sees was read by now: labels since listing began, the stores just now.
    # Every listed scope gets a verdict, also one that holds nothing.
    resolution = [r for s in shards for r in s.resolved]
    evidence = msgspec.structs.replace(
        evidence,
        swept=frozenset((target.name, scope) for s in shards for scope in s.scopes),
        observed_until=datetime.now(UTC).timestamp(),
        resolved={r.scope: r for r in resolution},
    )
    warnings = target.warnings(resources)
    for warning in warnings:
        log.warning("%s", warning)
    # MessagePack, not JSON: JSON has no NaN, and a non-finite value in the evidence means "unknown"
    # (an ambiguous writer, an odd lease expiry). Written as JSON null, it would not decode, or would
    # read as "no expiry": a lease held.
    as_of = min(s.listed_at for s in shards)
    path = sweep.path("sweep-input.msgpack")
    path.parent.mkdir(parents=True, exist_ok=True)  # a cleared gather_evidence runs in a new execution's folder
    path.write_bytes(msgspec.msgpack.encode(SweepData(resources, evidence, as_of)))
    return SweepInput(
        path=str(path),
        as_of=as_of,
        tokens=sorted({s.token for s in shards} | {lease.token}),
        incomplete=incomplete,
        hygiene=dict(sum((Counter(s.hygiene) for s in shards), Counter())),
        warnings=warnings,
        resolution=sorted(resolution, key=lambda r: r.scope),
        quota=merge_use(resolving or {}, *(s.quota for s in shards)),
    )


def evaluate_policy(
    sweep: Execution,
    sweep_input: SweepInput,
    params: dict[str, object],
    triggered_by: str,
    lease: Lease,
    started: datetime | None = None,
) -> Planned:
    """Evaluate the policy, record its decisions, choose what may be sent, fit it before the deadline and cut it
    into batches.

    No batch is made for a dry run, a capped sweep, or inputs another execution read: their
    decisions are recorded and reported only. Deletes that cannot be sent before the run's deadline
    (:func:`send_deadline`, ``started``: when the run started) at the scopes' delete rates get no
    batch either: their outcome, left for the next sweep, is recorded now (:func:`leave_what_does_not_fit`).
    """
    config = sweep.config
    data = read_sweep_input(sweep, sweep_input)
    ledger = sweep.ledger()
    ids = sweep.under(lease)
    terms = plan_terms(sweep, sweep_input, params, triggered_by, ledger, ids)
    plan = evaluate_under(sweep, data, sweep_input.as_of, terms)
    record_decisions(ledger, ids, plan, config, terms)
    # A what-if changes no resource's story; inputs another execution read are its.
    unrecorded = record_stories(ledger, ids, plan, data.evidence, config) if terms.may_delete else []
    sendable = deletes_to_send(ledger, ids, plan, terms)
    deadline = send_deadline(config, sweep.target.name, lease.expires_at, started, terms.approval_expires)
    fits, left = leave_what_does_not_fit(sweep, ledger, ids, sendable, deadline)
    plan_ref = PlanRef(ids.execution, ids.lease, config_digest(config))
    summary = summary_under(sweep, sweep_input, plan, plan_ref, terms, left, triggered_by, unrecorded)
    return Planned(batches=batches_of(sweep, fits, plan_ref, terms), summary=summary)


def read_sweep_input(sweep: Execution, sweep_input: SweepInput) -> SweepData[Resource]:
    """The resources and evidence ``gather_evidence`` wrote to the sweep store."""
    raw = ObjectStoragePath(sweep_input.path).read_bytes()
    data_type = SweepData[sweep.target.resource_type]  # type: ignore[name-defined]  # a run-time type
    return msgspec.msgpack.decode(raw, type=data_type)


def plan_terms(
    sweep: Execution,
    sweep_input: SweepInput,
    params: dict[str, object],
    triggered_by: str,
    ledger: Ledger,
    ids: Ids,
) -> Terms:
    """What this execution plans under: the trigger's overrides and phase confirmation, which a cleared or
    re-run run (the ledger holds an earlier execution of it) runs without; a dry run or not; inputs read
    under its own lease or not; and the run's approval, claimed by this execution when its plan may delete."""
    config = sweep.config
    rerun = ledger.earlier_execution(ids.fields())
    overrides = run_overrides(
        params, ids, triggered_by, rerun, config.max_deletions_per_sweep, sweep.target.name, sweep_input.resolution
    )
    gate = phase_gate(sweep, params, triggered_by, rerun or ids.execution > 0)
    confirmed = gate is not None and gate.confirmed  # None: not gated
    dry_run = bool(params.get("dry_run")) or (gate is not None and not confirmed)
    stale_inputs = ids.lease == "" or set(sweep_input.tokens) != {ids.lease}
    terms = Terms(overrides, gate, confirmed, dry_run, stale_inputs)
    # Claimed before any decision is recorded under it; a plan that deletes nothing leaves it for a real run.
    return replace(terms, approval=approved.take(sweep, params, ledger, ids, claim=terms.may_delete))


def evaluate_under(sweep: Execution, data: SweepData[Resource], as_of: float, terms: Terms) -> Plan:
    """The policy's plan as of ``as_of`` (when listing began), under the run's approval, else its overrides."""
    from reaper.policy import evaluate

    config, when = sweep.config, datetime.fromtimestamp(as_of, UTC)
    if terms.approval is None:
        budget, cap = terms.overrides.budget, terms.overrides.max_deletions
        return evaluate(data.resources, data.evidence, config, sweep.phase, when, budget, cap)
    return evaluate(data.resources, data.evidence, config, sweep.phase, when, approval=terms.approval)


def record_decisions(ledger: Ledger, ids: Ids, plan: Plan, config: Settings, terms: Terms) -> None:
    """Every decision that is not a keep, one ledger record each (docs/design.md §7), in one write."""
    overrides, confirmed, approval = terms.overrides, terms.confirmed, terms.approval
    ledger.write(
        DecisionRecord.of(d.action)(
            **ids.fields(),
            target=d.target,
            scope=d.resource.scope,
            uid=d.resource.uid,
            rule=d.rule,
            reason=d.reason,
            name=d.resource.name,
            location=d.resource.location,
            resource_kind=d.resource.kind,  # the audit view's kind column and filter
            # The state it was decided in (labelFingerprint, resourceVersion): what an approval of it names.
            fingerprint=fingerprint_of(d.resource),
            approval=approval.id if approval else "",
            group=group_of(d.resource, config.k8s.run_label),  # a Kubernetes run
            evidence=d.evidence,
            # Every decision made under an override, or in a phase its trigger confirmed, says so.
            override=overrides.stamp(d.target, d.scope),
            phase_gate=terms.gate if confirmed else None,
        )
        for d in plan.recorded
        if d.action is not Action.KEEP
    )


def deletes_to_send(ledger: Ledger, ids: Ids, plan: Plan, terms: Terms) -> list[Resource]:
    """The planned deletes this execution may send: none for a dry run, a capped plan or inputs another
    execution read, and none it already has an outcome for."""
    deletes = [] if terms.dry_run or plan.capped or terms.stale_inputs else plan.deletes()
    if deletes:  # one round trip, empty unless this execution planned before: what it recorded stands
        done = ledger.outcomes(ids.fields())
        deletes = [d for d in deletes if (d.resource.scope, d.resource.uid) not in done]
    return [d.resource for d in deletes]


def leave_what_does_not_fit(
    sweep: Execution, ledger: Ledger, ids: Ids, deletes: list[Resource], deadline: float
) -> tuple[list[Resource], int]:
    """The deletes that can be sent before ``deadline`` at the scopes' delete rates (:func:`fit_before_deadline`),
    and how many cannot: those get no batch, and their outcome, left for the next sweep, is recorded now."""
    target = sweep.target
    fits, left = fit_before_deadline(deletes, target.unit, target.delete_rate, deadline - time.time())
    if left:
        why = (
            f"left for the next sweep: at {target.delete_rate:g} deletes/s per scope, no more of its "
            "scope could be sent before this run's deadline"
        )
        log.warning("%d planned deletes %s", len(left), why)
        ledger.write(outcome_records(ids.fields(), target, Result.NOT_ATTEMPTED, ((r, why) for r in left)))
    return fits, len(left)


def batches_of(sweep: Execution, deletes: list[Resource], plan_ref: PlanRef, terms: Terms) -> list[Batch[Resource]]:
    """The deletes cut into the batches ``delete`` maps over (:func:`cut_batches`), each stamped with the plan it
    belongs to, its phase confirmation and its approval."""
    config, target, approval = sweep.config, sweep.target, terms.approval
    units = cut_batches(deletes, config.airflow.delete_batch_size, target.unit, config.airflow.max_delete_batches)
    if approval is None:
        return [Batch(plan_ref, unit, terms.confirmed) for unit in units]
    return [Batch(plan_ref, unit, terms.confirmed, approval.id, approval.expires_at) for unit in units]


def summary_under(
    sweep: Execution,
    sweep_input: SweepInput,
    plan: Plan,
    plan_ref: PlanRef,
    terms: Terms,
    left: int,
    triggered_by: str,
    unrecorded: list[str],
) -> Summary:
    """The plan in numbers (:func:`summarize`) and the terms it was made under; ``unrecorded``: the warnings of
    what the ledger refused, after the sweep input's. Under an approval, with the approval's record (per approved
    item, what the plan made of it) and its cap, the number of its items."""
    warnings = [*sweep_input.warnings, *unrecorded]
    overrides, gate, approval = terms.overrides, terms.gate, terms.approval
    summary = summarize(
        plan, plan_ref, sweep_input, overrides, left, triggered_by, terms.dry_run, terms.stale_inputs, gate, warnings
    )
    if approval is None:
        return summary
    record = approved.summary(approval, plan, sweep.config.max_deletions_per_sweep, terms.may_delete)
    return msgspec.structs.replace(summary, approval=record, max_deletions=len(approval.items))


def record_stories(ledger: Ledger, ids: Ids, plan: Plan, evidence: Evidence, config: Settings) -> list[str]:
    """Record each resource's transitions (:meth:`reaper.ledger.Ledger.record_transitions`); a warning for the
    summary when the ledger refuses them. The audit of keeps does not stop the deletes: their own intents and
    outcomes are separate records, written (or refused) on their own."""
    from pymongo.errors import PyMongoError

    try:
        ledger.record_transitions(ids.fields(), plan, evidence, config.k8s.run_label)
    except PyMongoError as exc:
        why = f"transitions not recorded this sweep: {error_for_log(exc)}"
        log.warning("%s", why)
        return [why]
    return []


def summarize(
    plan: Plan,
    plan_ref: PlanRef,
    sweep_input: SweepInput,
    overrides: Overrides,
    left: int,
    triggered_by: str,
    dry_run: bool,
    stale_inputs: bool,
    phase_gate: PhaseGate | None = None,
    warnings: list[str] | None = None,
) -> Summary:
    """The plan in numbers: decisions counted by (target, scope, rule, reason, action), keeps by reason."""
    counts = Counter((d.target, d.scope, d.rule or "", d.reason, d.action.value) for d in plan.recorded)
    kept: Counter[str] = Counter()
    for _, reason, group in plan.kept:
        kept[reason] += len(group)
    return Summary(
        phase=plan.phase.value,
        decisions=[DecisionCount(*key, count=n) for key, n in sorted(counts.items())],
        kept=dict(kept),
        scopes=[verdict_record(v) for v in plan.scopes],
        capped=plan.capped,
        census=msgspec.convert(plan.census, Census),
        override=overrides.record,
        triggered_by=triggered_by,
        dry_run=dry_run,
        stale_inputs=stale_inputs,
        warnings=sweep_input.warnings if warnings is None else warnings,
        hygiene=sweep_input.hygiene,
        incomplete=sweep_input.incomplete,
        deletes=len(plan.deletes()),
        max_deletions=overrides.max_deletions,
        left=left,
        plan=plan_ref,
        resolution=sweep_input.resolution,
        quota=sweep_input.quota,
        phase_gate=phase_gate,
    )


def budget_check(summary: Summary) -> Branch:
    """Delete, or only report, for the reasons that stop the whole sweep.

    Per-scope holds (budget, writer health, incomplete listings) are already in the plan as reports;
    here: the global cap (``max_deletions_per_sweep``), a dry run, inputs another execution read, or
    nothing to delete.
    """
    if summary.capped:
        why = f"max_deletions_per_sweep exceeded ({summary.capped} > {summary.max_deletions}): everything is reported"
        return Branch(REPORT_ONLY, why)
    gate = summary.phase_gate
    if gate is not None and not gate.confirmed:
        return Branch(REPORT_ONLY, f"phase gate: {gate.why}; nothing is deleted")
    if summary.dry_run:
        return Branch(REPORT_ONLY, "dry_run: nothing is deleted")
    if summary.stale_inputs and summary.deletes:
        why = "the listing or evidence was read by another execution or under another lease: reported only"
        return Branch(REPORT_ONLY, why)
    if summary.deletes == 0:
        return Branch(REPORT_ONLY, "nothing to delete")
    left = f"; {summary.left} left for the next sweep (the run's deadline)" if summary.left else ""
    if summary.deletes == summary.left:
        return Branch(REPORT_ONLY, f"no delete fits before the run's deadline{left}")
    return Branch(DELETE, f"{summary.deletes - summary.left} deletes within the cap ({summary.max_deletions}){left}")


def delete(sweep: Execution, batch: Batch[Resource], lease: Lease, started: datetime | None) -> Deleted:
    """Run one batch of this execution's plan under the fence; another execution's plan is never run, nor a
    batch of a phase other than the active one that its trigger did not confirm (:class:`Batch`).

    Nothing is sent after :func:`send_deadline`; a batch that begins after it records its whole batch
    as left in one write and ends. The next sweep plans again from what it lists.
    """
    config = sweep.config
    why = stale(batch.plan, PlanRef(sweep.ids.execution, lease.token, config_digest(config)))
    if not why and gated(sweep.phase, sweep.target.active_phase) and not batch.phase_confirmed:
        why = f"{sweep.phase.value} is not the active phase and the plan's trigger did not confirm it"
    if why:
        log.warning("not deleting %d planned resources: %s", len(batch.resources), why)
        return Deleted({Result.STALE_PLAN: len(batch.resources)})
    ids = sweep.under(lease).fields()
    # Under an approval, what is deleted is exactly what was approved, to the last label (docs/design.md §6: the
    # policy planned only approved items in their approved state, and every re-read requires the planned state), and
    # nothing after its expiry or its revocation. The expiry is the guard's deadline, so every send and re-read stops
    # there, a batch begun after it sends nothing, and a retried one leaves an earlier try's outcomes as they are. A
    # revocation is read before the batch (then it sends nothing) and with the lease in every cycle of its commits.
    target, ledger = sweep.target, sweep.ledger()
    expires = batch.approval_expires if batch.approval else None
    withdrawn = partial(approved.withdrawn, batch.approval, ledger, target.name, ids) if batch.approval else None
    if withdrawn is not None and (why := withdrawn()):
        log.warning("approval %s is %s: this batch sends nothing", batch.approval, why)
        expires = 0.0  # long past: the batch records its deletes as left
    deadline = send_deadline(config, target.name, lease.expires_at, started, expires)
    terms = SendTerms(ids, sweep.ids.holder, lease.token, deadline, withdrawn)
    try:
        outcomes = delete_batch(ledger, target, terms, batch.resources, sweep.config.ledger)
    finally:
        spent = target.quota_use()  # drained also when the batch halted: the next task's are its own
    return Deleted(outcomes, spent)


def report_only(summary: Summary) -> int:
    """How many decisions were reported (recorded in the ledger by ``evaluate_policy``); nothing is deleted."""
    reported = sum(d.count for d in summary.decisions if d.action != Action.KEEP)
    log.info("report only: %d decisions recorded in the ledger, nothing deleted", reported)
    return reported


def record(
    sweep: Execution,
    summary: Summary | None,
    branch: Branch | None,
    batches: int,
    results: list[Deleted],
    lease: Lease | None,
    started: datetime | None = None,
) -> dict[str, object]:
    """Write this execution's summary, also of one that failed (then raise, after writing it).

    ``branch``: what ``budget_check`` chose (None: it did not run); ``batches``: how many delete
    batches were planned; ``results``: what the delete tasks that ended returned; ``started``: when
    the run started (the metrics' sweep duration).

    A plan another execution made (a run cleared from a later task on: every clear takes the lease
    anew) is not this one's: its summary says so and fails, rather than file that plan as its own.

    With ``notifications.channels`` configured, a sweep that :func:`acts` then tells the owners
    (:func:`reaper.sweep.notices.send`) and adds what it sent to its summary; a notice that fails never fails it.
    """
    ids = sweep.under(lease)
    ledger = sweep.ledger()
    # A delete task that refused another execution's plan ran in this one: its refusal counts here.
    stale_plans = sum(r.outcomes.get(Result.STALE_PLAN, 0) for r in results)
    foreign = summary is not None and (summary.plan.execution, summary.plan.token) != (ids.execution, ids.lease)
    pushes = pushes_metrics(sweep, summary)  # from the plan's own summary: a foreign dry run's is a dry run's too
    if foreign and summary is not None:  # (the second test only narrows the type)
        why = f"no plan of its own: the plan is execution {summary.plan.execution}'s, made under another sweep lease"
        summary, branch, batches, results = None, Branch("", why), 0, []
    planned = batches if branch and branch.branch == DELETE else 0
    completed = summary is not None and branch is not None and len(results) >= planned
    problem = branch.why if foreign and branch else f"{len(results)} of {planned} delete batches ended"
    recorded = list(ledger.outcomes(ids.fields()).values())
    outcomes = Counter(str(o["result"]) for o in recorded)
    facts: dict[str, Any] = {}
    if summary is not None:  # the plan, with the API quotas this execution spent: its listing's and its deletes'
        facts = {**msgspec.structs.asdict(summary), "quota": merge_use(summary.quota, *(r.quota for r in results))}
    if summary is not None and summary.approval is not None:  # per approved item: what came of it
        facts["approval"] = approved.with_outcomes(summary.approval, recorded)
    doc = SweepSummary(
        **ids.fields(),
        target=sweep.target.name,
        active_phase=sweep.target.active_phase.value,
        **(msgspec.structs.asdict(branch) if branch else {}),
        outcomes=dict(outcomes),
        **{"phase": sweep.phase.value, **facts},  # the plan's phase when there is a plan (the same)
        stale_plan=stale_plans,
        state="success" if completed else "failed",
    )
    if pushes:
        failures = push_metrics(sweep, doc, dict(outcomes), completed, started)
        doc = msgspec.structs.replace(doc, metrics_push_failures=failures)
    ledger.summary(doc)
    if summary is not None and sweep.config.notifications.channels and acts(sweep, summary):
        # After the deletes and the summary: a notice that fails is logged and counted, the sweep goes on.
        try:
            told = notices.send(sweep, summary, recorded, started)
        except Exception as exc:
            log.warning("notices not sent: %s", error_for_log(exc))
            told = Notices(error=error_for_log(exc))
        if told != notices.NOTHING:  # a retry with nothing left to tell keeps its first try's record
            ledger.summary(msgspec.structs.replace(doc, notifications=told))
    if not completed:
        raise AirflowFailException(
            f"the sweep did not complete ({problem}); its summary and outcomes so far are in the ledger"
        )
    return {"branch": branch.branch if branch else None, "outcomes": dict(outcomes), "stale_plan": stale_plans}


def push_metrics(
    sweep: Execution, summary: SweepSummary, outcomes: dict[str, int], completed: bool, started: datetime | None
) -> int:
    """Push this sweep's metrics (:mod:`reaper.metrics`); how many pushes failed."""
    from reaper.metrics import PushedSweep, push_sweep
    from reaper.policy.modes import effective_modes

    config, target = sweep.config, sweep.target
    swept = {v.scope for v in summary.scopes or []}
    resolution = summary.resolution or []
    # Every configured name was resolved this sweep, and each scope it resolved to swept: the groups
    # of any other scope (another name of a project, a project no longer configured) can be retired.
    scopes = {r.scope for r in resolution}
    every = {name for r in resolution for name in r.configured} >= set(target.scopes())
    now = datetime.now(UTC).timestamp()
    pushed = PushedSweep(
        target=target.name,
        summary=summary,
        outcomes=outcomes,
        deleting={rule for rule, mode in effective_modes(config, sweep.phase).items() if mode is Mode.DELETE},
        full=every and swept >= scopes,
        completed=completed,
        started_at=started.timestamp() if started else now,
        finished_at=now,
    )
    return push_sweep(config.metrics.pushgateway_url, pushed, config.metrics.timeout.total_seconds(), scopes)


def release_lease(sweep: Execution) -> None:
    """Give the sweep lease back, so the next sweep need not wait for it to expire."""
    sweep.ledger().sweep_lease.release(sweep.target.name, sweep.ids.holder)
