"""``reaper diff``: what a config change would change, resource by resource, before it ships (docs/config-review.md).

Both configs are evaluated on the same input by the one policy (:func:`reaper.policy.evaluate`), each
decision is compared by resource, and each changed resource carries its liveness evidence as the rules
read it (:func:`reaper.policy.liveness`). A change is *dangerous* when the new config deletes a resource
the old one kept (reported, kept, or did not select) while that evidence says its owner may be alive or
cannot tell: the invariant of docs/design.md §1, applied to the config itself. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from reaper.config import Settings
from reaper.model import (
    Action,
    Decision,
    Evidence,
    GceGroup,
    GceInstance,
    K8sObject,
    Liveness,
    Phase,
    Reading,
    Resource,
    ScopeVerdict,
)
from reaper.policy import CAPPED, evaluate, liveness

TARGET_OF: dict[type, str] = {GceInstance: "gce", GceGroup: "gce", K8sObject: "k8s"}
TARGETS = ("gce", "k8s")
Key = tuple[str, str, str]  # (target, scope, uid): one resource, whichever config decides it
_ALIVE = list(Liveness)  # most alive first


def key(target: str, resource: Resource) -> Key:
    return (target, resource.scope, resource.uid)


def phases(config: Settings, phase: Phase | None) -> dict[str, Phase]:
    """The phase each target is evaluated in: ``phase`` for both, or (``None``) the config's own active one."""
    return {t: phase or Phase(getattr(config.rollout, t)) for t in TARGETS}


@dataclass
class Side:
    """One config's answer on the input: each target's phase, every decision, the scope verdicts, the cap."""

    config: Settings
    phases: dict[str, Phase]
    decisions: dict[Key, Decision] = field(default_factory=dict)
    verdicts: list[ScopeVerdict] = field(default_factory=list)
    capped: dict[str, int] = field(default_factory=dict)


def judge(resources: list[Resource], evidence: Evidence, config: Settings, phase: Phase | None, now: datetime) -> Side:
    """Evaluate ``config`` on the input, each target on its own resources in its phase (:func:`phases`)."""
    side = Side(config, phases(config, phase))
    for target in TARGETS:
        items = [r for r in resources if TARGET_OF[type(r)] == target]
        plan = evaluate(items, evidence, config, side.phases[target], now)
        side.decisions.update((key(d.target, d.resource), d) for d in plan.decisions if d.target == target)
        side.verdicts += [v for v in plan.scopes if v.target == target]
        side.capped.update((t, n) for t, n in plan.capped.items() if t == target)
    return side


@dataclass(frozen=True)
class Change:
    """One resource whose decision differs: the old and new decision (``None``: that config does not decide it,
    so it keeps it), and the more alive of its two liveness readings, with the side that read it."""

    target: str
    resource: Resource
    old: Decision | None
    new: Decision | None
    liveness: Reading | None
    read_by: str  # "old" or "new": whose reading ``liveness`` is

    @property
    def widens(self) -> bool:
        """The new config deletes what the old one kept."""
        return _deletes(self.new) and not _deletes(self.old)

    @property
    def dangerous(self) -> bool:
        """It widens deletion against evidence that the owner may be alive, or none either way (no reading
        counts as none)."""
        return self.widens and (self.liveness is None or self.liveness.state is not Liveness.STALE)


def _deletes(decision: Decision | None) -> bool:
    """A delete, also one the global cap turned into a report: the cap is a circuit breaker that a manual
    ``max_deletions`` lifts, not the policy (docs/design.md §6)."""
    return decision is not None and (decision.action is Action.DELETE or decision.reason == CAPPED)


def _verdict(decision: Decision | None) -> tuple[object, ...] | None:
    return None if decision is None else (decision.action, decision.rule, decision.reason)


def _more_alive(old: Reading | None, new: Reading | None) -> tuple[Reading | None, str]:
    """The reading that says the owner is more alive; a tie goes to the old config's (the reviewed one)."""
    if old is None or (new is not None and _ALIVE.index(new.state) < _ALIVE.index(old.state)):
        return new, "new"
    return old, "old"


def compare(old: Side, new: Side, changed: Iterable[Key], readings: dict[str, dict[Key, Reading]]) -> list[Change]:
    """The ``changed`` resources (:func:`changed`) with their decisions and readings (``readings``: per side, by
    key); the dangerous ones first, then by place and name."""
    changes = []
    for k in changed:
        before, after = old.decisions.get(k), new.decisions.get(k)
        decided = after if after is not None else old.decisions[k]
        reading, read_by = _more_alive(readings["old"].get(k), readings["new"].get(k))
        changes.append(Change(decided.target, decided.resource, before, after, reading, read_by))
    return sorted(changes, key=_order)


def changed(old: Side, new: Side) -> set[Key]:
    """The resources whose action, rule or reason differs between the two sides."""
    return {
        k
        for k in old.decisions.keys() | new.decisions.keys()
        if _verdict(old.decisions.get(k)) != _verdict(new.decisions.get(k))
    }


def _order(c: Change) -> tuple[bool, str, str, str, str, str]:
    r = c.resource
    return (not c.dangerous, c.target, r.scope, r.location, r.kind, r.name)


@dataclass(frozen=True)
class ConfigDiff:
    """``reaper diff``'s answer: both sides and what changed between them."""

    old: Side
    new: Side
    now: datetime
    changes: list[Change]

    @property
    def dangerous(self) -> list[Change]:
        return [c for c in self.changes if c.dangerous]


def diff(
    resources: Iterable[Resource],
    evidence: Evidence,
    old: Settings,
    new: Settings,
    phase: Phase | None,
    now: datetime,
) -> ConfigDiff:
    """Evaluate both configs on the same input (each target in ``phase``, or in each config's active phase).

    Liveness is read for what changed only: a changed instance on its own, every Kubernetes object (a run is
    read from all its objects, and a Pod outside it may use it).
    """
    items = list(resources)
    before, after = judge(items, evidence, old, phase, now), judge(items, evidence, new, phase, now)
    keys = changed(before, after)
    read = [r for r in items if (type(r) is GceInstance and key("gce", r) in keys) or type(r) is K8sObject]
    readings = {
        name: {key(t, r): x for t, r, x in liveness(read, evidence, side.config, now, side.verdicts)}
        for name, side in (("old", before), ("new", after))
    }
    return ConfigDiff(before, after, now, compare(before, after, keys, readings))
