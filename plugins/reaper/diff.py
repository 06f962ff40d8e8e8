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
    place,
)
from reaper.policy import evaluate, liveness
from reaper.policy.k8s import object_guard
from reaper.vocabulary import Reason

TARGET_OF: dict[type, str] = {GceInstance: "gce", GceGroup: "gce", K8sObject: "k8s"}
TARGETS = ("gce", "k8s")
Key = tuple[str, str, str]  # (target, scope, uid): one resource, whichever config decides it
_ALIVE = list(Liveness)  # most alive first
# The keeps that are a person's or the config's word, not evidence: an opt-out label (or a malformed one),
# a protected project or namespace, GCE's deletion protection. Deleting past one is never proof-driven.
GUARDS = frozenset({"opt_out", "opt_out_malformed", "protected_scope", "deletion_protection"})


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
    old_guard: str | None = None  # what the old config would have kept it by, had it selected it

    @property
    def widens(self) -> bool:
        """The new config deletes what the old one kept."""
        return _deletes(self.new) and not _deletes(self.old)

    @property
    def dangerous(self) -> bool:
        """It widens deletion against evidence that the owner may be alive, or none either way (no reading
        counts as none); or against what kept the resource whatever its evidence: an opt-out or a protection
        the old config honoured (the new one renamed the label, emptied the list); or it deletes a VM the old
        config did not select on proof that holds only for the runner managers' VMs (TERMINATED, no heartbeat
        label and old), where only a stale heartbeat label says a manager owned it."""
        if not self.widens:
            return False
        if self.liveness is None or self.liveness.state is not Liveness.STALE:
            return True
        if (self.old is not None and self.old.reason in GUARDS) or self.old_guard is not None:
            return True
        return self.old is None and self.target == "gce" and self.liveness.reason != Reason.HEARTBEAT_STALE


def _deletes(decision: Decision | None) -> bool:
    """A delete, also one the global cap turned into a report: the cap is a circuit breaker that a manual
    ``max_deletions`` lifts, not the policy (docs/design.md §6)."""
    return decision is not None and (
        decision.action is Action.DELETE or decision.reason == Reason.MAX_DELETIONS_EXCEEDED
    )


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
        guard = guard_of(decided.resource, old.config) if before is None else None
        changes.append(Change(decided.target, decided.resource, before, after, reading, read_by, guard))
    return sorted(changes, key=_order)


def guard_of(resource: Resource, config: Settings) -> str | None:
    """The guard ``config`` would keep ``resource`` by, whatever its evidence, had it selected it: its opt-out
    label (or a malformed one), GCE's deletion protection, a protected project or namespace (by name: an
    offline input has no project numbers). A wider selector that also drops the opt-out must still fail."""
    if isinstance(resource, GceInstance):
        key, value = config.gce.opt_out_label
        if key in resource.labels:
            return "opt_out" if resource.labels[key] == value else "opt_out_malformed"
        if resource.deletion_protection:
            return "deletion_protection"
        return "protected_scope" if resource.project in config.gce.protected_projects else None
    if isinstance(resource, K8sObject):
        return object_guard(resource, config)
    return None


def changed(old: Side, new: Side) -> set[Key]:
    """The resources whose action, rule or reason differs between the two sides."""
    return {
        k
        for k in old.decisions.keys() | new.decisions.keys()
        if _verdict(old.decisions.get(k)) != _verdict(new.decisions.get(k))
    }


def _order(c: Change) -> tuple[bool, str, str, str, str, str]:
    return (not c.dangerous, *place(c.target, c.resource))


def unlisted(old: Settings, new: Settings) -> list[str]:
    """What the new config takes in that a sweep listed under the old one never read: a recorded input (the
    listing filters by selector, projects, clusters and namespaces on the server) cannot show what it would
    delete, so such a diff proves nothing there."""
    found = []
    for target in TARGETS:
        before, after = getattr(old, target), getattr(new, target)
        if not after.enabled:
            continue
        if not before.enabled:
            found.append(f"{target}: the target, disabled in the old config")
            continue
        if not set(before.selector.items()) <= set(after.selector.items()):
            found.append(f"{target}.selector: {after.selector} selects beyond {before.selector}")
        scopes = "projects" if target == "gce" else "clusters"
        if extra := sorted(set(getattr(after, scopes)) - set(getattr(before, scopes))):
            found.append(f"{target}.{scopes}: {', '.join(extra)}")
    if old.k8s.namespaces and (not new.k8s.namespaces or set(new.k8s.namespaces) - set(old.k8s.namespaces)):
        found.append(f"k8s.namespaces: {new.k8s.namespaces or 'all'} beyond {old.k8s.namespaces}")
    return found


@dataclass(frozen=True)
class ConfigDiff:
    """``reaper diff``'s answer: both sides, what changed between them, and (a recorded input) what the new
    config would take in that the input never listed (:func:`unlisted`)."""

    old: Side
    new: Side
    now: datetime
    changes: list[Change]
    unlisted: list[str] = field(default_factory=list)

    @property
    def dangerous(self) -> list[Change]:
        return [c for c in self.changes if c.dangerous]

    @property
    def fails(self) -> bool:
        """Whether the change must not ship as it is: a dangerous change, or one the input cannot show."""
        return bool(self.dangerous or self.unlisted)


def diff(
    resources: Iterable[Resource],
    evidence: Evidence,
    old: Settings,
    new: Settings,
    phase: Phase | None,
    now: datetime,
    recorded: bool = False,
) -> ConfigDiff:
    """Evaluate both configs on the same input (each target in ``phase``, or in each config's active phase);
    ``recorded``: the input is a sweep's own, listed under the old config's selection.

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
    return ConfigDiff(
        before, after, now, compare(before, after, keys, readings), unlisted(old, new) if recorded else []
    )
