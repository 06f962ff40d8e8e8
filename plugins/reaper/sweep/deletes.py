"""The delete stage of a sweep: batches that never split a run, and one batch executed under the fence.

A plan belongs to one execution of one sweep (docs/design.md §6). ``evaluate_policy`` stamps every
batch with a :class:`PlanRef`: the execution that made it (the DAG run's ``clear_number``), the sweep
lease token it held, and the config it was made under. A ``delete`` task runs a batch only when all
three are still its own; a cleared or re-run task holding someone else's plan deletes nothing and
says so (the next sweep plans again). Inside a batch every send is guarded (:mod:`reaper.fence`):
lease, deadline, SIGTERM; intents are durable before the send, outcomes are written as observed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reaper.commits import GroupCommit, wait_bound
from reaper.config import LedgerConfig, Settings
from reaper.fence import SendGuard, halt_on_sigterm
from reaper.model import R, Resource
from reaper.ratelimit import round_robin
from reaper.records import RECORD_KEY, Intent, LedgerRecord, Outcome, PlanRef
from reaper.sweep.targets import Target
from reaper.vocabulary import GONE

log = logging.getLogger(__name__)


def config_digest(config: Settings) -> str:
    """A short fingerprint of the whole config: a plan made under another config is not run."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


def stale(plan: PlanRef, current: PlanRef) -> str | None:
    """Why a plan may not be run by this task, or None."""
    if plan.execution != current.execution:
        return f"planned by execution {plan.execution} of this run; this is execution {current.execution}"
    if plan.token != current.token:
        return "planned under another sweep lease than the one this task runs under"
    if plan.config != current.config:
        return "planned under another config"
    return None


def units_of(resources: Iterable[R], unit: Callable[[R], Hashable]) -> dict[Hashable, list[R]]:
    """Resources by the unit they are deleted in (a Kubernetes run, a GCE instance), in plan order."""
    grouped: dict[Hashable, list[R]] = {}
    for resource in resources:
        grouped.setdefault(unit(resource), []).append(resource)
    return grouped


def cut_batches(
    resources: Iterable[R], size: int, unit: Callable[[R], Hashable], most: int | None = None
) -> list[list[R]]:
    """Batches that never split a unit (a Kubernetes run: docs/design.md §6), each with at most ``size`` resources
    of any one scope.

    A batch is a delete task, and what sets a task's length is its scopes' rate limits: every send
    waits on its scope's bucket, and the buckets of different scopes run side by side. So a batch is
    bounded per scope, and a plan that sends no more than ``size`` in each scope (ten in each of 200
    projects) is one task, however many scopes it spans. Cutting it further would buy nothing: the
    target's pool runs one batch at a time, and every batch costs a task start.

    A unit larger than ``size`` makes a batch of its own in its scope: splitting it would let a
    retried or reordered batch delete a run's Secrets apart from (or before) its Pod. Units are taken
    round robin over scopes: the policy yields deletes scope by scope, and a batch of a few scopes
    would wait on their rate limits while the others sit idle.

    ``most``: no more batches than that; consecutive batches are merged if need be. Those still
    queued when the run's deadline comes each cost a task start inside the send margin, and an
    incident-scale plan cut at ``size`` would queue dozens (slow operations make that likely: the
    deadline fit bounds the sends by the rate, not by how long each delete takes).
    """
    batches: list[list[R]] = []
    counts: Counter[str] = Counter()  # the last batch's resources per scope
    for members in round_robin(units_of(resources, unit).values(), key=lambda members: members[0].scope):
        scope = members[0].scope
        if batches and counts[scope] + len(members) <= size:
            batches[-1].extend(members)
        else:
            batches.append(list(members))
            counts.clear()
        counts[scope] += len(members)
    if most and len(batches) > most:
        merged = -(-len(batches) // most)  # batches per merged batch: then no more than ``most``
        batches = [[r for batch in batches[i : i + merged] for r in batch] for i in range(0, len(batches), merged)]
    return batches


def outcome_records(
    ids: Mapping[str, Any], target: Target[Any], result: str, details: Iterable[tuple[Resource, str]]
) -> list[Outcome]:
    """The outcome records of resources with one result, each with its detail: one ledger write for them all."""
    return [Outcome(**_fenced(ids, target, r), result=result, detail=detail) for r, detail in details]


def intent(ids: Mapping[str, Any], target: Target[Any], resource: Resource, sent: bool = False) -> Intent:
    """A delete's intent record; ``sent``: its sent mark, written once the delete call went out."""
    return Intent(**_fenced(ids, target, resource), sent=sent)


def _fenced(ids: Mapping[str, Any], target: Target[Any], resource: Resource) -> dict[str, Any]:
    """The fields a delete's records share: the execution's ids, the resource's fence and its name."""
    return {
        **ids,
        "target": target.name,
        "scope": resource.scope,
        "uid": resource.uid,
        "name": target.record_name(resource),
    }


class LeaseLike(Protocol):
    def lease_problem(self, target: str, holder: str, token: str) -> str | None: ...


class LedgerLike(Protocol):
    def write(self, records: Iterable[LedgerRecord | Mapping[str, object]]) -> int: ...

    def outcomes(self, ids: dict[str, object], uids: Collection[str]) -> dict[tuple[str, str], dict[str, object]]: ...

    def intents(self, ids: dict[str, object], uids: Collection[str]) -> set[tuple[str, str]]: ...

    @property
    def sweep_lease(self) -> LeaseLike: ...


# Seconds between a sending batch's reads of its approval's revocation, at most one per commit cycle. Every cycle
# would stop sends a few milliseconds sooner, at the price of a read each cycle that grows with the approval: the
# server fetches an incident's 8,000 items to answer one field (SecantusDB: most of its CPU in bench/incident.py).
REVOCATION_POLL = 0.5


@dataclass(frozen=True)
class SendTerms:
    """The terms one delete task sends under, which its :class:`reaper.fence.SendGuard` enforces: its execution's
    ids, the sweep lease it holds, its deadline; ``withdrawn``: under an approval, why it stands no more (revoked,
    gone) or empty, read with the lease in a group commit cycle every :data:`REVOCATION_POLL` seconds, so a
    revocation stops the batch's sends within that."""

    ids: dict[str, object]  # dag_id, run_id, execution
    holder: str
    token: str
    deadline: float | None
    withdrawn: Callable[[], str] | None = None


class SweepHalted(Exception):
    """The batch stopped sending before its end for a reason the task must fail on (SIGTERM, the ledger)."""


def delete_batch(
    ledger: LedgerLike,
    target: Target[Any],
    terms: SendTerms,
    resources: Sequence[Resource],
    pace: LedgerConfig | None = None,
) -> dict[str, int]:
    """Delete one batch, safely under task retries, timeouts and SIGTERM; the counts of this try's outcomes.

    What an earlier try of this execution recorded is not sent again: a resource with an outcome is
    skipped, and a unit (a Kubernetes run) with any outcome that is not gone is not attempted again
    (its Pod may still be running: its Secrets stay). A 404 for a resource whose delete call an
    earlier try made (its intent is marked sent) is that try's delete: ``deleted``. Raises
    :class:`SweepHalted` after recording what it could when the task was told to stop or the ledger
    failed; reaching the deadline is not an error.

    The deletes' intents, sent marks, outcomes and lease checks go to the ledger in group commits
    (:mod:`reaper.commits`), paced by ``pace``'s ``commit_interval`` and ``commit_records``.
    """
    pace = pace or LedgerConfig()
    uids = {r.uid for r in resources}
    done = ledger.outcomes(terms.ids, uids)
    sent = ledger.intents(terms.ids, uids)
    units = units_of(resources, target.unit)

    def key(resource: Resource) -> tuple[str, str]:
        return resource.scope, resource.uid

    todo: list[Resource] = []
    stopped: list[tuple[Resource, str]] = []
    for members in units.values():
        blocked = [done[key(r)] for r in members if key(r) in done and done[key(r)]["result"] not in GONE]
        for r in members:
            if key(r) in done:
                continue
            if blocked:
                stopped.append((r, f"an earlier try recorded {blocked[0]['result']} for {blocked[0]['name']}"))
            else:
                todo.append(r)

    def failed(exc: BaseException, records: list[dict[str, object]]) -> None:
        kinds = ", ".join(sorted({str(r["kind"]) for r in records})) or "sweep lease"
        guard.halt(f"ledger: {kinds} not {'recorded' if records else 'read'} ({type(exc).__name__})")

    withdrawn: list[str] = []  # once the approval stands no more, it never stands again in this batch
    next_read = [0.0]  # monotonic time of the next approval read: the first cycle reads it

    def lease_problem() -> str | None:
        """Why this task may send no more: its sweep lease, then the approval it sends under (read in the first
        cycle, then in the first cycle at least :data:`REVOCATION_POLL` after the last read)."""
        problem = ledger.sweep_lease.lease_problem(target.name, terms.holder, terms.token)
        if problem is None and terms.withdrawn is not None:
            if not withdrawn and time.monotonic() >= next_read[0]:
                next_read[0] = time.monotonic() + REVOCATION_POLL
                if why := terms.withdrawn():
                    withdrawn.append(f"the approval is {why}: nothing more is sent")
            problem = withdrawn[0] if withdrawn else None
        return problem

    commits = GroupCommit(
        ledger.write,
        lease_problem,
        key=lambda record: tuple(record.get(f) for f in RECORD_KEY),
        failed=failed,
        interval=pace.commit_interval.total_seconds(),
        most=pace.commit_records,
        timeout=wait_bound(
            pace.timeout.total_seconds(), pace.commit_interval.total_seconds(), 1 if terms.withdrawn is None else 2
        ),
    )
    guard = SendGuard(
        deadline=terms.deadline,
        lease=commits.lease_problem,
        # An intent never lowers ``sent``: a retry rewriting its intent keeps an earlier try's call on record.
        intent=lambda r: commits.submit([intent(terms.ids, target, r)]),
        sent=lambda r: commits.submit([intent(terms.ids, target, r, sent=True)]),
        outcome=lambda r, result, detail: commits.submit(outcome_records(terms.ids, target, result, [(r, detail)])),
        sent_before=sent,
    )
    with commits:
        late = guard.check(lease=False)
        if late:  # the deadline passed before this batch began: nothing is started, one write records it all
            stopped += [(r, late) for r in todo]
            todo = []
        by_result: dict[str, list[tuple[Resource, str]]] = defaultdict(list)
        for resource, why in stopped:
            by_result[guard.unsent(resource)].append((resource, why))
        try:
            ledger.write(
                [r for result, rows in by_result.items() for r in outcome_records(terms.ids, target, result, rows)]
            )
        except Exception as exc:
            guard.halt(f"ledger: outcome not recorded ({type(exc).__name__})")
        with halt_on_sigterm(guard):
            try:
                results = target.delete(todo, guard) if todo and not guard.halted else []
            finally:
                guard.settle()  # every outcome durable before it counts, whatever stopped the deletes
    counts = Counter(o.result for o in results)
    counts.update({result: len(rows) for result, rows in by_result.items()})
    if guard.halted:
        raise SweepHalted(f"{guard.halted}; recorded so far: {dict(counts)}")
    return dict(counts)
