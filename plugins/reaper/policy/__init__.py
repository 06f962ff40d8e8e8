"""The policy: a pure function from resources and evidence to a plan (docs/design.md §3 to §6).

No I/O, no clock reads, no globals: the DAGs and the offline CLI call this same
function, so report-only and enforcement pick exactly the same set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import partial
from typing import cast

import msgspec

from reaper.approvals import Approval
from reaper.config import Settings
from reaper.model import (
    Action,
    Decision,
    Evidence,
    GceGroup,
    GceInstance,
    K8sObject,
    Override,
    Phase,
    Plan,
    Reading,
    Resource,
    ScopeVerdict,
)
from reaper.policy import gce, k8s
from reaper.policy.approval import held_unless_approved
from reaper.policy.gce import evaluate_gce
from reaper.policy.k8s import evaluate_k8s
from reaper.policy.modes import blocking, effective_modes
from reaper.vocabulary import Reason

__all__ = ["evaluate", "liveness"]


def evaluate(
    resources: Iterable[Resource],
    evidence: Evidence,
    config: Settings,
    phase: Phase,
    now: datetime,
    override: Override | None = None,
    max_deletions: int | None = None,
    approval: Approval | None = None,
) -> Plan:
    """Decide every in-scope resource.

    ``now`` must be timezone-aware. ``override`` lifts the budget holds of the
    scopes it names only (a manual trigger with a reason); it never lifts health or listing
    holds, opt-outs, protected scopes or the global cap. ``max_deletions``: the
    global cap of this sweep, if not ``max_deletions_per_sweep`` (a manual
    trigger's ``max_deletions``, checked and recorded by the sweep).

    ``approval`` (never with ``override`` or ``max_deletions``): the budget holds of its scopes are lifted, and
    of every delete only those it approved, listed in their approved state, stay deletes
    (:func:`reaper.policy.approval.held_unless_approved`); its cap is its item count, which may exceed
    ``max_deletions_per_sweep`` (incident recovery, docs/design.md §6).
    """
    if approval is not None:
        if override is not None or max_deletions is not None:
            raise ValueError("an approval is evaluated on its own: no budget override, no max_deletions beside it")
        # No item, no scope lifted (the sweep page and `reaper approve` make none such: nothing to delete).
        override, max_deletions = (approval.override() if approval.items else None), len(approval.items)
    cap = config.max_deletions_per_sweep if max_deletions is None else max_deletions
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    at = now.timestamp()
    modes = effective_modes(config, phase)
    resources = resources if isinstance(resources, list) else list(resources)
    # A single-target inventory without fleeting groups (the usual sweep) is read as it is, not copied.
    instances: list[GceInstance]
    others: list[Resource]
    if set(map(type, resources)) <= {GceInstance}:
        # cast: every item's type is GceInstance (the test just above), which mypy does not narrow a list by.
        instances, others = cast("list[GceInstance]", resources), []
    else:
        instances = [r for r in resources if type(r) is GceInstance]
        others = [r for r in resources if type(r) is not GceInstance]
    objects = [r for r in others if type(r) is K8sObject]
    groups = [r for r in others if type(r) is GceGroup]

    plan = Plan(phase, at, recorded=[], kept=[], scopes=[], census={})
    # Each target's evaluation with its own items bound: the two take different resource types.
    targets = (
        ("gce", config.gce.enabled, partial(evaluate_gce, instances, groups=groups)),
        ("k8s", config.k8s.enabled, partial(evaluate_k8s, objects)),
    )
    for target, enabled, evaluate_target in targets:
        if not enabled:
            continue
        result = evaluate_target(evidence, config, modes, at, override)
        if approval is not None:
            result.recorded = held_unless_approved(result.recorded, approval, at, config.k8s.run_label)
        deletes = sum(1 for d in result.recorded if d.action is Action.DELETE)
        if deletes > cap:
            plan.capped[target] = deletes
            result.recorded = [_capped(d, cap) for d in result.recorded]
        plan.recorded += result.recorded
        plan.kept += result.kept
        plan.scopes += [
            msgspec.structs.replace(v, blocking=blocking(target, v.holds, modes)) if v.holds else v
            for v in result.verdicts
        ]
        plan.census[target] = result.census
    return plan


def _capped(decision: Decision, limit: int) -> Decision:
    """docs/design.md §6: past the per-sweep cap nothing is deleted; everything is reported."""
    if decision.action is not Action.DELETE:
        return decision
    evidence = {**(decision.evidence or {}), "finding": decision.reason, "max_deletions_per_sweep": limit}
    return Decision(
        decision.target, decision.resource, Action.REPORT, decision.rule, Reason.MAX_DELETIONS_EXCEEDED, evidence
    )


def liveness(
    resources: Iterable[Resource], evidence: Evidence, config: Settings, now: datetime, verdicts: Iterable[ScopeVerdict]
) -> Iterator[tuple[str, Resource, Reading]]:
    """(target, resource, reading) for every instance and object: what its liveness evidence says of its
    owner under ``config``, read by the same code as the rules, whether or not ``config`` selects it.
    Instances are read one by one (any subset will do); Kubernetes objects by run, so give every object of
    the input (a run is read from all its objects, and a Pod outside it may use it).

    ``verdicts``: the scope verdicts of a plan of this config on this input (their holds do not depend on
    the phase); a hold that says the evidence may mislead (writer health, the budget) makes proof unknown.
    Fleeting groups get no reading: no rule deletes them.
    """
    holds: dict[str, dict[str, tuple[str, ...]]] = {"gce": {}, "k8s": {}}
    for v in verdicts:
        holds[v.target][v.scope] = v.holds
    items = resources if isinstance(resources, list) else list(resources)
    at = now.timestamp()
    instances = [r for r in items if type(r) is GceInstance]
    objects = [r for r in items if type(r) is K8sObject]
    for inst, reading in gce.liveness(instances, evidence, config, at, holds["gce"]):
        yield "gce", inst, reading
    for obj, reading in k8s.liveness(objects, evidence, config, at, holds["k8s"]):
        yield "k8s", obj, reading
