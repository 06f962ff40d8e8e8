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
from reaper.model import Action, Decision, Evidence, Liveness, Phase, Reading, Resource
from reaper.policy import CAPPED, evaluate, liveness

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
    """One config's answer on the input: each target's phase, every decision and every liveness reading."""

    phases: dict[str, Phase]
    decisions: dict[Key, Decision] = field(default_factory=dict)
    readings: dict[Key, Reading] = field(default_factory=dict)
    capped: dict[str, int] = field(default_factory=dict)


def judge(resources: list[Resource], evidence: Evidence, config: Settings, phase: Phase | None, now: datetime) -> Side:
    """Evaluate ``config`` on the input, each target in its phase (:func:`phases`)."""
    side = Side(phases(config, phase))
    verdicts = []
    for each in sorted(set(side.phases.values())):
        plan = evaluate(resources, evidence, config, each, now)
        targets = {t for t, p in side.phases.items() if p is each}
        side.decisions.update((key(d.target, d.resource), d) for d in plan.decisions if d.target in targets)
        side.capped.update((t, n) for t, n in plan.capped.items() if t in targets)
        verdicts = plan.scopes  # the holds do not depend on the phase: any plan's will do
    side.readings = {key(t, r): reading for t, r, reading in liveness(resources, evidence, config, now, verdicts)}
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


def compare(old: Side, new: Side) -> list[Change]:
    """Every resource whose action, rule or reason differs; the dangerous ones first, then by place and name."""
    changes = []
    for k in old.decisions.keys() | new.decisions.keys():
        before, after = old.decisions.get(k), new.decisions.get(k)
        if _verdict(before) == _verdict(after):
            continue
        decided = after if after is not None else old.decisions[k]
        reading, read_by = _more_alive(old.readings.get(k), new.readings.get(k))
        changes.append(Change(decided.target, decided.resource, before, after, reading, read_by))
    return sorted(changes, key=_order)


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
    """Evaluate both configs on the same input (each target in ``phase``, or in each config's active phase)."""
    items = list(resources)
    before, after = judge(items, evidence, old, phase, now), judge(items, evidence, new, phase, now)
    return ConfigDiff(before, after, now, compare(before, after))
