"""One row per resource: its decision, the reason in words, and what became of it.

The ledger keeps a resource's decision, its delete intent and its outcome as three records (docs/design.md
§7), named differently (a Kubernetes intent is ``Pod/ci/sandbox-4``, its decision ``sandbox-4``
in namespace ``ci``). A reader wants them as one row: :func:`ledger_row` joins them on the execution
and (scope, uid); :func:`plan_row` makes the same row from a policy decision (the what-if report).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from reaper.report.reasons import Limits, explain
from reaper.vocabulary import RecordAction

if TYPE_CHECKING:
    from reaper.model import Decision

# The columns of a row, in the order the table and the CSV export show them.
COLUMNS = (
    "target",
    "scope",
    "kind",
    "location",
    "name",
    "uid",
    "action",
    "rule",
    "reason",
    "why",
    "intent_at",
    "outcome",
    "detail",
    "outcome_at",
    "execution",
)


class Row(msgspec.Struct, frozen=True):
    """A resource's story in one sweep (one execution of it)."""

    target: str
    scope: str
    kind: str
    location: str
    name: str
    uid: str
    action: str
    rule: str
    reason: str
    why: str
    evidence: dict[str, object]
    intent_at: str = ""
    outcome: str = ""
    detail: str = ""
    outcome_at: str = ""
    execution: int = 0
    dag_id: str = ""
    run_id: str = ""
    at: str = ""
    run: str = ""  # the Kubernetes run the object belongs to

    def cells(self) -> dict[str, object]:
        return msgspec.structs.asdict(self)


def when(at: object) -> str:
    """A ledger time for people: to the second, with its zone, always UTC (``2026-11-30 12:04:21 UTC``)."""
    if isinstance(at, datetime):
        at = at if at.tzinfo else at.replace(tzinfo=UTC)
        return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if isinstance(at, int | float):
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return ""


def execution_key(record: dict[str, object]) -> tuple[object, ...]:
    """What ties a resource's decision, intent and outcome of one execution together."""
    return (record.get("execution"), record.get("lease"), record.get("scope"), record.get("uid"))


def resource_kind(decision: dict[str, object], companions: Iterable[dict[str, object]] = ()) -> str:
    """The resource's kind: recorded with the decision (``resource_kind``); for records written before it
    was, a GCE resource is an instance and a Kubernetes object's kind heads its intent's name."""
    if decision.get("resource_kind"):
        return str(decision["resource_kind"])
    if decision.get("target") == "gce":
        return "instance"
    for record in companions:
        name = str(record.get("name", ""))
        if name.count("/") >= 2:
            return name.split("/", 1)[0]
    return ""


def ledger_row(decision: dict[str, object], companions: list[dict[str, object]], limits: Limits | None = None) -> Row:
    """The row of one decision record and its intent and outcome records (``companions``)."""
    intent = next((r for r in companions if r.get("action") == RecordAction.DELETE_INTENT), {})
    outcome = next((r for r in companions if r.get("action") == RecordAction.OUTCOME), {})
    evidence = decision.get("evidence") or {}
    reason = str(decision.get("reason") or "")
    return Row(
        target=str(decision.get("target", "")),
        scope=str(decision.get("scope", "")),
        kind=resource_kind(decision, companions),
        location=str(decision.get("location") or ""),
        name=str(decision.get("name", "")),
        uid=str(decision.get("uid", "")),
        action=str(decision.get("action", "")),
        rule=str(decision.get("rule") or ""),
        reason=reason,
        why=explain(reason, evidence if isinstance(evidence, dict) else {}, limits),
        evidence=evidence if isinstance(evidence, dict) else {},
        intent_at=when(intent.get("at")),
        outcome=str(outcome.get("result", "")),
        detail=str(outcome.get("detail") or ""),
        outcome_at=when(outcome.get("at")),
        execution=int(decision.get("execution") or 0),  # type: ignore[call-overload]  # an int, as the ledger wrote it
        dag_id=str(decision.get("dag_id", "")),
        run_id=str(decision.get("run_id", "")),
        at=when(decision.get("at")),
        run=str(decision.get("group") or ""),
    )


def ledger_rows(
    decisions: list[dict[str, object]], companions: list[dict[str, object]], limits: Limits | None = None
) -> list[Row]:
    """Rows of decision records, in their order, each joined with its own execution's intent and outcome."""
    by_key: dict[tuple[object, ...], list[dict[str, object]]] = {}
    for record in companions:
        by_key.setdefault(execution_key(record), []).append(record)
    return [ledger_row(d, by_key.get(execution_key(d), []), limits) for d in decisions]


def plan_row(decision: Decision, limits: Limits | None = None) -> Row:
    """The row of a policy decision that nothing has acted on yet (``reaper evaluate``)."""
    r = decision.resource
    evidence = decision.evidence or {}
    return Row(
        target=decision.target,
        scope=r.scope,
        kind=r.kind,
        location=r.location,
        name=r.name,
        uid=r.uid,
        action=decision.action.value,
        rule=decision.rule or "",
        reason=decision.reason,
        why=explain(decision.reason, evidence, limits),
        evidence=evidence,
    )
