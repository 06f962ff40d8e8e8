"""Each resource's story as transitions: first seen, kept and why, reported, planned for delete, gone.

The ledger records a decision only where one is worth a record (a report, a delete); a plain keep
(a fresh heartbeat, a live sandbox, an opted-out VM) is a count in the sweep's summary. That keeps a
100,000-resource sweep from writing 100,000 records, and left nobody able to audit why something was
**not** deleted. So each DAG keeps the state of every resource it last saw, per scope, in a few
documents (:class:`ScopeStates`), and a sweep records a transition only where a resource's state
changed: a resource that is kept for the same reason sweep after sweep costs nothing more. Pure:
:meth:`reaper.ledger.Ledger.record_transitions` reads and writes them.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable
from typing import NamedTuple, cast

from reaper.model import Action, Decision, Evidence, K8sObject, Plan, Resource

GONE = "gone"  # no longer listed in a complete listing of its scope: deleted, by the reaper or anyone
PART_SIZE = 20_000  # resources per state document at most: a scope of a million stays far below 16 MB each


class Seen(NamedTuple):
    """What a DAG last knew of a resource: its state (``action:reason``) and what names it."""

    state: str
    name: str
    kind: str
    location: str
    group: str  # the Kubernetes run it belongs to; empty for GCE


def state_of(d: Decision) -> str:
    return f"{d.action.value}:{d.reason}"


def group_of(resource: Resource, run_label: str) -> str:
    """The run a Kubernetes object belongs to (its run label's value), what a search by run id finds."""
    return resource.labels.get(run_label, "") if isinstance(resource, K8sObject) else ""


def seen(plan: Plan, run_label: str) -> dict[tuple[str, str], dict[str, tuple[Seen, Decision | None]]]:
    """Every resource of the plan by (target, scope) and uid: its state now, and its decision when it has
    one worth a record (a keep group's resources have none: their reason is their whole story)."""
    out: dict[tuple[str, str], dict[str, tuple[Seen, Decision | None]]] = {}

    def put(target: str, r: Resource, state: str, d: Decision | None) -> None:
        now = Seen(state, r.name, r.kind, r.location, group_of(r, run_label))
        out.setdefault((target, r.scope), {})[r.uid] = (now, d)

    for d in plan.recorded:
        put(d.target, d.resource, state_of(d), d)
    for target, reason, group in plan.kept:
        for r in group:
            put(target, r, f"{Action.KEEP.value}:{reason}", None)
    return out


class Change(NamedTuple):
    """One transition: ``before`` empty when first seen, ``now`` :data:`GONE` when no longer listed."""

    target: str
    scope: str
    uid: str
    before: str
    now: str
    seen: Seen
    decision: Decision | None

    def record(self) -> dict[str, object]:
        """The transition as the ledger keeps it (beside the run's ids, which the ledger adds)."""
        action, _, reason = self.now.partition(":")
        d = self.decision
        return {
            "kind": "transition",
            "target": self.target,
            "scope": self.scope,
            "uid": self.uid,
            "name": self.seen.name,
            "resource_kind": self.seen.kind,
            "location": self.seen.location,
            "group": self.seen.group,
            "before": self.before,
            "state": self.now,
            "action": action,
            "reason": reason,
            **({"rule": d.rule, "evidence": d.evidence} if d is not None else {}),
        }


def changes(
    now: dict[tuple[str, str], dict[str, tuple[Seen, Decision | None]]],
    before: dict[tuple[str, str], dict[str, Seen]],
    listed: Collection[tuple[str, str]],
    complete: Collection[tuple[str, str]],
) -> tuple[list[Change], dict[tuple[str, str], dict[str, Seen]]]:
    """The transitions since ``before`` and each listed scope's states to keep for the next sweep.

    A resource missing from a scope's listing is :data:`GONE` only when that listing is complete
    (``complete``): absence from a partial answer proves nothing, so its last state stands. A scope
    not listed at all this sweep is left as it was. Only scopes whose states changed are returned.
    """
    found: list[Change] = []
    states: dict[tuple[str, str], dict[str, Seen]] = {}
    for key in listed:
        target, scope = key
        old = before.get(key, {})
        new = {uid: s for uid, (s, _) in now.get(key, {}).items()}
        for uid, (s, d) in now.get(key, {}).items():
            was = old.get(uid)
            if was is None or was.state != s.state:
                found.append(Change(target, scope, uid, was.state if was else "", s.state, s, d))
        if key in complete:
            found += [Change(target, scope, uid, s.state, GONE, s, None) for uid, s in old.items() if uid not in new]
        else:
            new = {**old, **new}
        if new != old:
            states[key] = new
    return found, states


def since(
    before: dict[tuple[str, str], dict[str, Seen]], plan: Plan, evidence: Evidence, run_label: str
) -> tuple[list[Change], dict[tuple[str, str], dict[str, Seen]]]:
    """A sweep's transitions and new states: :func:`changes` of its plan over the scopes its evidence
    says it listed, and listed completely."""
    return changes(seen(plan, run_label), before, evidence.swept, evidence.swept - evidence.incomplete)


class ScopeStates(NamedTuple):
    """One state document: part ``part`` of one scope's states for one DAG."""

    dag_id: str
    target: str
    scope: str
    part: int
    parts: int
    states: dict[str, list[str]]

    @property
    def key(self) -> dict[str, object]:
        return {"dag_id": self.dag_id, "target": self.target, "scope": self.scope, "part": self.part}


def split(dag_id: str, key: tuple[str, str], states: dict[str, Seen]) -> list[ScopeStates]:
    """A scope's states as documents of at most about :data:`PART_SIZE` resources, by a hash of the uid."""
    parts = max(1, -(-len(states) // PART_SIZE))
    docs = [ScopeStates(dag_id, *key, p, parts, {}) for p in range(parts)]
    for uid, s in states.items():
        docs[zlib.crc32(uid.encode()) % parts].states[uid] = list(s)
    return docs


def joined(docs: Iterable[dict[str, object]]) -> dict[tuple[str, str], dict[str, Seen]]:
    """The state documents read back, every part of a scope joined."""
    out: dict[tuple[str, str], dict[str, Seen]] = {}
    for doc in docs:
        key = (str(doc["target"]), str(doc["scope"]))
        states = out.setdefault(key, {})
        # cast: a part's "states" is what split() wrote, uid -> the fields of a Seen (Mongo hands back lists).
        stored = cast("dict[str, list[str]]", doc.get("states") or {})
        for uid, values in dict(stored).items():
            states[uid] = Seen(*values)
    return out


def described(record: dict[str, object]) -> str:
    """A transition in words, e.g. ``kept (heartbeat_fresh), was reported (heartbeat_stale)``."""
    verbs = {"keep": "kept", "report": "reported", "delete": "planned for delete"}

    def one(state: str) -> str:
        if state == GONE:
            return "gone from its scope's listing"
        action, _, reason = state.partition(":")
        return f"{verbs.get(action, action)} ({reason})"

    before = str(record.get("before") or "")
    return f"{one(str(record.get('state', '')))}, " + (f"was {one(before)}" if before else "first seen")
