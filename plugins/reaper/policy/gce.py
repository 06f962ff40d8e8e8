"""GCE rules (docs/design.md §4): heartbeat, TERMINATED and age findings, and the per-project holds.

A first pass sorts each project's instances: the fresh, labeled, running ones
(nearly all of a healthy fleet) take a few comparisons; the rest are classified
against every row. Those with a finding or anomaly are resolved once the
project's holds (writer health, budget, listing) are known.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import NamedTuple, cast

from reaper.config import Settings
from reaper.model import (
    ACTION_OF_MODE,
    Action,
    Decision,
    Evidence,
    GceGroup,
    GceInstance,
    Liveness,
    Mode,
    Override,
    Reading,
    Resource,
    ScopeVerdict,
    TargetResult,
    WriterRecord,
)
from reaper.policy.budget import budget_hold
from reaper.policy.groups import empty_census, evaluate_groups
from reaper.policy.projects import ProjectNames
from reaper.rules import HEARTBEAT_STALE, RESIDUAL_GROUP, RULES, TERMINATED, UNLABELED_AGE
from reaper.vocabulary import Reason

TARGET = "gce"
_ID, _STATUS = attrgetter("id"), attrgetter("status")
KEEP, REPORT, DELETE = Action.KEEP, Action.REPORT, Action.DELETE
_RANK = {KEEP: 0, REPORT: 1, DELETE: 2}
_RULES = tuple(rule for rule in RULES if rule.target == TARGET)
# The holds of the heartbeat rule alone, those that say the writers' silence may be no proof: not the listing's,
# which holds every rule (docs/design.md §4).
HEARTBEAT_HOLDS = tuple(h for h in HEARTBEAT_STALE.held_by if h is not Reason.INVENTORY_INCOMPLETE)

# Digits a label value may have to be read as a unix time: 20 holds any 64-bit number, so nanoseconds too.
_MAX_DIGITS = 20
# Another label's unix time may be in seconds, or (13, 16, 19 digits and more) milli-, micro- or nanoseconds.
_SUBSECOND = (0, 3, 6, 9)
# How far ahead of the clock another label's unix time may be and still read as a beat (:func:`_elsewhere`).
_ELSEWHERE_AHEAD = 86400

# Upper bounds (seconds) of the heartbeat-age census buckets; a last "+Inf" bucket is implied.
AGE_BUCKETS = (600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 86400, 3 * 86400, 7 * 86400)
BUCKET_LABELS = tuple(str(b) for b in AGE_BUCKETS)


class Candidate(NamedTuple):
    """One finding or anomaly of an instance, as a rule's mode and the project's holds resolve it.

    A NamedTuple: the candidates are the module constants below, built once and shared, and
    ``_resolve`` unpacks them as plain tuples. Anomalies are never findings: their most is a
    report, and they belong to the heartbeat rule (docs/design.md §3).
    """

    rule: str  # the rule whose mode decides it, and whose holds stop its delete
    reason: Reason  # what was found: the decision's reason unless a hold or guard replaces it
    is_finding: bool  # a finding acts as the rule's mode says; an anomaly is at most a report


_TERMINATED = Candidate(TERMINATED.name, TERMINATED.finding, True)
_STALE = Candidate(HEARTBEAT_STALE.name, HEARTBEAT_STALE.finding, True)
_UNLABELED = Candidate(UNLABELED_AGE.name, UNLABELED_AGE.finding, True)
_FUTURE = Candidate(HEARTBEAT_STALE.name, Reason.HEARTBEAT_IN_FUTURE, False)
_MALFORMED = Candidate(HEARTBEAT_STALE.name, Reason.HEARTBEAT_MALFORMED, False)
_BEFORE_CREATION = Candidate(HEARTBEAT_STALE.name, Reason.HEARTBEAT_BEFORE_CREATION, False)
# A fresh unix time under another label replaces the heartbeat or age finding it would have been: see _classify.
_ELSEWHERE = {
    HEARTBEAT_STALE.name: Candidate(HEARTBEAT_STALE.name, Reason.HEARTBEAT_ELSEWHERE, False),
    UNLABELED_AGE.name: Candidate(UNLABELED_AGE.name, Reason.HEARTBEAT_ELSEWHERE, False),
}
# A creation time in the future makes every age meaningless: it belongs to the rule that would have used it.
_CREATED_FUTURE_LABELED = Candidate(HEARTBEAT_STALE.name, Reason.CREATED_IN_FUTURE, False)
_CREATED_FUTURE_UNLABELED = Candidate(UNLABELED_AGE.name, Reason.CREATED_IN_FUTURE, False)


def evaluate_gce(
    instances: Iterable[GceInstance],
    evidence: Evidence,
    config: Settings,
    modes: dict[str, Mode],
    now: float,
    override: Override | None,
    groups: list[GceGroup] | None = None,
) -> TargetResult:
    """Decide every in-scope instance: decisions, plain-keep groups, per-project verdicts and census.

    ``groups``: the fleeting groups listed (``gce.group_selector``), decided by the residual-group
    rule alone (:mod:`reaper.policy.groups`): reports at most. With a selector configured every
    project's census counts them, zeros included.
    """
    thresholds = _Thresholds(config, now, evidence.observed_until)
    projects = _first_pass(instances, config, thresholds)
    swept = sorted(projects.keys() | {scope for target, scope in evidence.swept if target == TARGET})
    names = ProjectNames(evidence.resolved)
    writers = None if evidence.writer_health is None else names.writers(evidence.writer_health, swept)
    sweep = _Context(config, modes, thresholds, evidence, writers, override, names)
    result = TargetResult()
    for project in swept:
        part = _evaluate_project(project, projects.get(project) or _Project(), sweep)
        result.recorded += part.recorded
        # cast: the kept groups are only read from here on, where a list of instances is one of resources.
        result.kept += cast("list[tuple[str, str, list[Resource]]]", part.kept)
        result.verdicts.append(part.verdict)
        result.census[project] = part.census
    if config.gce.group_selector:
        reports, kept, census = evaluate_groups(groups or [], evidence, config, modes[RESIDUAL_GROUP.name])
        result.recorded += reports
        # cast: as above, a list of groups read as one of resources.
        result.kept += cast("list[tuple[str, str, list[Resource]]]", kept)
        for project, counts in result.census.items():
            counts["groups"] = census.get(project) or empty_census()
    return result


@dataclass(frozen=True, slots=True)
class _Context:
    """What every project of one sweep is decided against: the same for all of them."""

    config: Settings
    modes: dict[str, Mode]  # the effective mode of each rule
    thresholds: _Thresholds
    evidence: Evidence
    writers: dict[str, list[WriterRecord]] | None  # by project; None: the writer-health source was unreadable
    override: Override | None
    names: ProjectNames  # the numbers each project is also known by


class _ProjectResult(NamedTuple):
    """One project's part of the :class:`TargetResult`."""

    recorded: list[Decision]
    kept: list[tuple[str, Reason, list[GceInstance]]]
    verdict: ScopeVerdict
    census: dict[str, object]


class _Holds(NamedTuple):
    """A project's holds, and what they mean for its instances, worked out once per project."""

    names: tuple[Reason, ...]  # as the verdict records them, in precedence order
    protected: bool  # a protected project: every instance is a plain keep, nothing is decided
    # Per rule, the first of its holds in force (docs/design.md §4): the reason that replaces a delete's.
    of_rule: dict[str, Reason | None]


class _Project:
    """One project's in-scope instances as the first pass sorted them."""

    __slots__ = ("beats", "fresh", "opted", "rare", "young")

    def __init__(self) -> None:
        self.fresh: list[GceInstance] = []  # valid, fresh heartbeat, not TERMINATED
        self.young: list[GceInstance] = []  # no heartbeat label, younger than the max age, not TERMINATED
        self.opted: list[GceInstance] = []  # opt-out label
        self.rare: list[GceInstance] = []  # everything else: classified row by row
        self.beats: list[int] = []  # the valid heartbeat values, for the budget and the census

    def instances(self) -> list[GceInstance]:
        return [*self.fresh, *self.young, *self.opted, *self.rare]

    def duplicated(self) -> bool:
        """An instance id listed twice: the listing is not a complete one. (Before ``_evaluate_project``
        moves rare instances: every in-scope instance is then in exactly one list.)"""
        lists = (self.fresh, self.young, self.opted, self.rare)
        return len(set(map(_ID, chain(*lists)))) != sum(map(len, lists))


def _first_pass(instances: Iterable[GceInstance], config: Settings, t: _Thresholds) -> dict[str, _Project]:
    """Select in-scope instances, group them by project and sort out the ones with nothing to decide.

    This loop touches every instance of the fleet, so it is written for speed: a
    fresh, labeled, running instance (nearly all of a healthy fleet) costs a few
    dict lookups and comparisons. Listings arrive project by project, so the
    project's lists are rebound only when the project changes. A heartbeat is fresh
    by :meth:`_Thresholds.fresh`, as :func:`_classify` decides it; what this pass
    calls fresh or young, ``_classify`` would find nothing on (a property test holds
    the two to that).
    """
    (sel_key, sel_value), *sel_rest = config.gce.selector.items()
    hb_label, opt_key, opt_value, fresh_beat = t.hb_label, t.opt_key, t.opt_value, t.fresh
    future_after, aged_before = t.future_after, t.aged_before
    projects: dict[str, _Project] = {}
    current = None
    for inst in instances:
        labels = inst.labels
        if labels.get(sel_key) != sel_value or (sel_rest and any(labels.get(k) != v for k, v in sel_rest)):
            continue
        if inst.project != current:
            current = inst.project
            group = projects.get(current) or projects.setdefault(current, _Project())
            fresh, young, opted, rare, beats = (
                group.fresh.append,
                group.young.append,
                group.opted.append,
                group.rare.append,
                group.beats.append,
            )
        opt = labels.get(opt_key)
        if opt == opt_value:
            opted(inst)
            continue
        created = inst.created
        if created > future_after or inst.status == "TERMINATED" or opt is not None or inst.group_member:
            rare(inst)
            continue
        raw = labels.get(hb_label)
        if raw is None:
            if created >= aged_before:
                young(inst)
                continue
        elif raw.isdigit() and raw.isascii() and len(raw) <= _MAX_DIGITS:  # _unix, inlined
            beat = int(raw)
            if fresh_beat(beat, created):
                beats(beat)
                fresh(inst)
                continue
        rare(inst)
    return projects


class _Thresholds:
    """The config's durations turned into absolute unix-second cutoffs for this sweep."""

    def __init__(self, config: Settings, now: float, observed_until: float | None) -> None:
        gce = config.gce
        self.now = now
        self.observed = max(now, observed_until or now)  # when the latest evidence was read
        self.hb_label = gce.heartbeat_label
        self.opt_key, self.opt_value = gce.opt_out_label
        self.skew = gce.clock_skew.total_seconds()
        self.stale_before = now - gce.quarantine.total_seconds()  # a beat older than this is stale
        self.future_after = self.observed + gce.clock_skew.total_seconds()  # newer than this: in the future
        self.stopped_before = now - gce.terminated_grace.total_seconds()
        self.aged_before = now - gce.unlabeled_max_age.total_seconds()

    def fresh(self, beat: int, created: float) -> bool:
        """Whether a heartbeat is valid (not in the future, not before its instance's creation) and within the
        quarantine: the one test of a fresh heartbeat, for the first pass and :func:`_classify` alike."""
        return self.stale_before <= beat <= self.future_after and beat >= created - self.skew


def writer_hold(
    records: list[WriterRecord] | None, config: Settings, now: float
) -> tuple[Reason | None, list[dict[str, object]]]:
    """The writer-health hold of one project, and the managers that caused it.

    ``records is None`` means the source could not be read: unknown, so hold. So does a
    record whose ``last_pass`` is not a finite number (NaN would compare false to every
    threshold and pass for healthy), and so do no records at all: a wrong metric name or
    Prometheus URL answers no series, exactly like a project whose every manager died, so
    silence proves no death (docs/design.md §4). A dead manager is one that stopped reporting
    while others of its project still report: it has no record, and its instances go stale and
    are reaped. ``now`` is when the records were read: a later clock only flags more writers stale.
    """
    if not records:
        return Reason.WRITER_HEALTH_UNKNOWN, []
    unreadable: list[dict[str, object]] = [
        {"manager": r.manager, "problem": "unreadable"} for r in records if not math.isfinite(r.last_pass)
    ]
    if unreadable:
        return Reason.WRITER_HEALTH_UNKNOWN, unreadable
    stale_before = now - config.gce.writer_stale_after.total_seconds()
    future_after = now + config.gce.clock_skew.total_seconds()
    bad: list[dict[str, object]] = []
    for r in records:
        if r.failing:
            bad.append({"manager": r.manager, "problem": "failing"})
        elif r.last_pass < stale_before:
            bad.append({"manager": r.manager, "problem": "stale", "last_pass": r.last_pass})
        elif r.last_pass > future_after:
            bad.append({"manager": r.manager, "problem": "last_pass_in_future", "last_pass": r.last_pass})
    return (Reason.WRITER_UNHEALTHY if bad else None), bad


def _writers_unknown(writers: dict[str, list[WriterRecord]] | None, project: str) -> str:
    """Why the project's writer health is unknown as a whole, for its verdict; empty when a record says why."""
    if writers is None:
        return "writer health could not be read (the evidence task's log says why)"
    if writers.get(project):
        return ""
    if not writers:
        return "writer health answered no series at all: a wrong metric name or Prometheus URL looks exactly like this"
    return (
        f"writer health answered no series for this project (it did for {len(writers)} others): a wrong project "
        "label looks like this, and so does a project whose every manager died, which only a person can tell apart"
    )


def _evaluate_project(project: str, group: _Project, sweep: _Context) -> _ProjectResult:
    """Decide one project: its decisions, plain-keep groups, verdict and census.

    ``group`` is this project's alone and is consumed: its rare instances without a finding
    join its fresh and young lists, and their valid beats its beats.
    """
    t = sweep.thresholds
    fresh, young, opted, beats = group.fresh, group.young, group.opted, group.beats
    instances = group.instances()
    duplicated = group.duplicated()
    findings: dict[str, int] = defaultdict(int)
    findings[Reason.OPT_OUT] = len(opted)
    findings["heartbeat_absent"] = len(young)
    pending: list[tuple[GceInstance, list[Candidate], dict[str, object]]] = []
    members: list[GceInstance] = []
    for inst in group.rare:
        candidates, facts, beat = _classify(inst, t, findings)
        if beat is not None:
            beats.append(beat)
        if inst.group_member:  # counted as ever (budget, census), decided by no instance rule
            members.append(inst)
        elif candidates:
            pending.append((inst, candidates, facts))
        else:
            (fresh if beat is not None else young).append(inst)
    findings[Reason.GROUP_MEMBER] = len(members)

    stale = findings.get(Reason.HEARTBEAT_STALE, 0)
    # The label's absence is evidence only where a manager is seen stamping it now: a fresh valid heartbeat on any
    # in-scope VM that is not opted out, whatever else is found on it (TERMINATED since, a group member). A key
    # present with a stale, malformed or placeholder value is a leftover (a label renamed since), not a writer
    # (docs/design.md §4). Fresh VMs come first in ``instances``: a healthy project answers at its first.
    unseen = bool(findings.get(Reason.UNLABELED_AGE)) and not any(_stamped(i, t) for i in instances)
    holds, overridden, details = _project_holds(project, len(beats), stale, duplicated, unseen, sweep)
    recorded: list[Decision] = []
    kept: list[tuple[str, Reason, list[GceInstance]]]
    if holds.protected:
        kept = [(TARGET, Reason.PROTECTED_SCOPE, instances)]
    else:
        recorded = [_resolve(inst, candidates, facts, sweep.modes, holds) for inst, candidates, facts in pending]
        kept = [
            (TARGET, Reason.FRESH, fresh),
            (TARGET, Reason.NO_FINDING, young),
            (TARGET, Reason.OPT_OUT, opted),
            (TARGET, Reason.GROUP_MEMBER, members),
        ]

    census: dict[str, object] = {
        "instances": len(instances),
        "by_status": dict(Counter(map(_STATUS, instances))),
        "by_finding": {k: v for k, v in findings.items() if v},
        "heartbeat_age_seconds": _age_histogram(beats, t.now),
    }
    return _ProjectResult(recorded, kept, ScopeVerdict(TARGET, project, holds.names, overridden, details), census)


def _unix(raw: str | None) -> int | None:
    """A label value as a number, if it is ASCII decimal digits short enough to be a time. More digits are no time
    of any unit (a GCE label value holds up to 63; an export or emulator, any number, which ``int`` refuses past
    4,300): such a value is malformed, never a crash of the plan."""
    if raw is None or not (raw.isdigit() and raw.isascii()) or len(raw) > _MAX_DIGITS:
        return None
    return int(raw)


def _fresh_value(raw: str | None, inst: GceInstance, t: _Thresholds) -> bool:
    """Whether a label value is a valid unix time and a fresh beat for this instance."""
    beat = _unix(raw)
    return beat is not None and t.fresh(beat, inst.created)


def _stamped(inst: GceInstance, t: _Thresholds) -> bool:
    """Whether the instance, not opted out (with any value), carries a fresh valid heartbeat under the configured
    label: what shows that a manager stamps that label now."""
    return t.opt_key not in inst.labels and _fresh_value(inst.labels.get(t.hb_label), inst, t)


def _elsewhere(inst: GceInstance, t: _Thresholds) -> tuple[str, str] | None:
    """The first label of another name, and its value, that reads as a recent beat for this instance, if any.

    A dead owner writes no label: a unix time within the quarantine under any label says something alive wrote
    it recently, most likely a manager that stamps its heartbeat under another name than the configured one
    (renamed in its config, or the reaper's). So the heartbeat and age findings, which read only the configured
    label, are no proof on that instance (docs/design.md §4). What another writer means by its number is not
    known, so this reads it broadly: seconds down to nanoseconds, and up to a day ahead (a clock ahead, a time
    set for later) as well as within the quarantine, never before the instance was created.
    """
    for key, value in inst.labels.items():
        number = _unix(value) if key != t.hb_label else None
        if number is None:
            continue
        for beat in (number // 10**k for k in _SUBSECOND if len(value) >= 10 + k):  # s, ms, µs, ns
            if t.stale_before <= beat <= t.observed + _ELSEWHERE_AHEAD and beat >= inst.created - t.skew:
                return key, value
    return None


def _classify(
    inst: GceInstance, t: _Thresholds, findings: dict[str, int]
) -> tuple[list[Candidate], dict[str, object], int | None]:
    """Every finding and anomaly of one instance (docs/design.md §4), the facts, and its valid beat.

    Each finding is also counted in ``findings``, the project's tally for the census.

    A creation time in the future leaves only ``terminated`` (and that one only once its grace,
    measured from the later of stop and creation, has run out): every other age is meaningless.
    A heartbeat older than the instance was copied or stamped by a wrong clock: it counts as no label.
    """
    candidates: list[Candidate] = []
    raw = inst.labels.get(t.hb_label)
    beat: int | None = None
    age = None
    unlabeled = raw is None
    created_in_future = inst.created > t.future_after
    if created_in_future:
        findings[Reason.CREATED_IN_FUTURE] += 1
        candidates.append(_CREATED_FUTURE_UNLABELED if unlabeled else _CREATED_FUTURE_LABELED)
    elif raw is None:  # unlabeled
        findings["heartbeat_absent"] += 1
    elif (number := _unix(raw)) is not None:
        if t.fresh(number, inst.created):
            beat = number
            age = t.now - beat
        elif number > t.future_after:
            findings[Reason.HEARTBEAT_IN_FUTURE] += 1
            candidates.append(_FUTURE)
        elif number < inst.created - t.skew:
            unlabeled = True
            findings[Reason.HEARTBEAT_BEFORE_CREATION] += 1
            candidates.append(_BEFORE_CREATION)
        else:  # valid, and older than the quarantine
            beat = number
            age = t.now - beat
            findings[Reason.HEARTBEAT_STALE] += 1
            candidates.append(_STALE)
    else:  # not digits, or too many to be a time
        unlabeled = True
        findings[Reason.HEARTBEAT_MALFORMED] += 1
        candidates.append(_MALFORMED)
    stopped = max(inst.last_stop or inst.created, inst.created)
    if inst.status == "TERMINATED" and stopped < t.stopped_before:
        findings[Reason.TERMINATED] += 1
        candidates.insert(0, _TERMINATED)
    if unlabeled and not created_in_future and inst.created < t.aged_before:
        findings[Reason.UNLABELED_AGE] += 1
        candidates.append(_UNLABELED)
    facts: dict[str, object] = {"status": inst.status, "heartbeat": raw, "heartbeat_age_s": age}
    # The finding stays counted (the budget's S, the census): a fleet-wide rename that reached some VMs only is
    # still the writer breakage the budget holds for.
    if (_STALE in candidates or _UNLABELED in candidates) and (elsewhere := _elsewhere(inst, t)):
        findings[Reason.HEARTBEAT_ELSEWHERE] += 1
        candidates = [_ELSEWHERE[c.rule] if c in (_STALE, _UNLABELED) else c for c in candidates]
        facts["heartbeat_elsewhere"], facts["heartbeat_elsewhere_value"] = elsewhere
    if inst.deletion_protection:
        facts["deletion_protection"] = True
    if t.opt_key in inst.labels:  # the opt-out key with another value: surprising, so never deleted
        facts["opt_out_label"] = inst.labels[t.opt_key]
    return candidates, facts, beat


# What makes an instance's evidence say nothing of its owner, whatever else it shows (:func:`liveness`).
_SURPRISING = (Reason.CREATED_IN_FUTURE, Reason.HEARTBEAT_IN_FUTURE, Reason.HEARTBEAT_ELSEWHERE)


def liveness(
    instances: Iterable[GceInstance],
    evidence: Evidence,
    config: Settings,
    now: float,
    holds: Mapping[str, tuple[str, ...]],
) -> Iterator[tuple[GceInstance, Reading]]:
    """What each instance's liveness evidence says of its owner, read by :func:`_classify` as the rules read it.

    TERMINATED past the grace, a stale heartbeat, or no valid heartbeat on a VM older than
    ``gce.unlabeled_max_age`` is proof; a fresh heartbeat says the owner may be alive; a heartbeat or
    creation in the future, a label that cannot be trusted on a younger VM, or no label on one is unknown.
    A stale heartbeat in a project under a heartbeat hold (``holds``: project -> its verdict's holds) is
    unknown too: the hold says the writers' silence may be no proof (docs/design.md §4); and so is no label in a
    project where no VM carries a fresh heartbeat under it (``heartbeat_label_unseen``).
    """
    t = _Thresholds(config, now, evidence.observed_until)
    for inst in instances:
        candidates, facts, beat = _classify(inst, t, defaultdict(int))
        reasons = [c.reason for c in candidates]
        reason: str  # a Reason, or the hold (a str) that makes a stale heartbeat unknown
        if Reason.TERMINATED in reasons:
            state, reason = Liveness.STALE, Reason.TERMINATED
        elif surprising := [r for r in reasons if r in _SURPRISING]:
            state, reason = Liveness.UNKNOWN, surprising[0]
        elif Reason.HEARTBEAT_STALE in reasons:
            held = next((h for h in holds.get(inst.project, ()) if h in HEARTBEAT_HOLDS), None)
            state, reason = (Liveness.UNKNOWN, held) if held else (Liveness.STALE, Reason.HEARTBEAT_STALE)
        elif Reason.UNLABELED_AGE in reasons:
            if Reason.HEARTBEAT_LABEL_UNSEEN in holds.get(inst.project, ()):  # the label's absence proves nothing
                state, reason = Liveness.UNKNOWN, Reason.HEARTBEAT_LABEL_UNSEEN
            else:
                state, reason = Liveness.STALE, Reason.UNLABELED_AGE
        elif reasons:  # a malformed or copied label on a VM younger than the maximum age
            state, reason = Liveness.UNKNOWN, reasons[0]
        elif beat is not None:
            state, reason = Liveness.FRESH, Reason.FRESH
        else:
            state, reason = Liveness.UNKNOWN, Reason.NO_FINDING
        yield inst, Reading(state, reason, facts)


def _age_histogram(beats: list[int], now: float) -> dict[str, object]:
    """Cumulative ``le`` buckets of heartbeat ages, as a Prometheus histogram counts them."""
    beats.sort()  # a list of ints only: the sort's fast path, faster than placing each beat by bisection
    count = len(beats)
    # age <= bound  <=>  beat >= now - bound
    buckets = {
        label: count - bisect_left(beats, now - bound) for label, bound in zip(BUCKET_LABELS, AGE_BUCKETS, strict=True)
    }
    buckets["+Inf"] = count
    return {"buckets": buckets, "sum": count * now - sum(beats), "count": count}


def _project_holds(
    project: str, labeled: int, stale: int, duplicated: bool, label_unseen: bool, sweep: _Context
) -> tuple[_Holds, tuple[Reason, ...], dict[str, object]]:
    """A project's holds, the holds an override lifted, and the verdict's details.

    ``labeled`` counts the valid heartbeats, ``stale`` the stale ones among them: the budget's sides.
    ``label_unseen``: no VM of the project carries a fresh heartbeat under the label, and one has an
    ``unlabeled_age`` finding to decide.
    """
    config = sweep.config
    holds: list[Reason] = []
    protected_by = sweep.names.protected_by(project, config.gce.protected_projects)
    if protected_by is not None:
        holds.append(Reason.PROTECTED_SCOPE)
    # An instance listed twice means the pages moved under the listing: it is not a complete one.
    if (TARGET, project) in sweep.evidence.incomplete or duplicated:
        holds.append(Reason.INVENTORY_INCOMPLETE)
    if label_unseen:
        holds.append(Reason.HEARTBEAT_LABEL_UNSEEN)
    records = None if sweep.writers is None else sweep.writers.get(project, [])
    # No series for a project without a valid heartbeat is no news: it has no heartbeat delete to hold.
    silent = records == [] and not labeled
    writer, bad_writers = (None, []) if silent else writer_hold(records, config, sweep.thresholds.observed)
    if writer:
        holds.append(writer)
    budget, overridden = budget_hold(stale, labeled, config, sweep.override, TARGET, project)
    details: dict[str, object] = {
        "labeled": labeled,
        "stale": stale,
        "stale_fraction": round(stale / labeled if labeled else 0.0, 6),
        "unhealthy_writers": bad_writers,
    }
    if protected_by not in (None, project):  # protected by its number, or by a number that may be its own
        details["protected_by"] = protected_by
    unknown = _writers_unknown(sweep.writers, project) if writer == Reason.WRITER_HEALTH_UNKNOWN else ""
    if unknown:
        details["unknown_evidence"] = [unknown]
    names = (*holds, *budget)
    of_rule = {rule.name: next((h for h in names if h in rule.held_by), None) for rule in _RULES}
    return _Holds(names, Reason.PROTECTED_SCOPE in names, of_rule), overridden, details


def _resolve(
    inst: GceInstance,
    candidates: list[Candidate],
    facts: dict[str, object],
    modes: dict[str, Mode],
    holds: _Holds,
) -> Decision:
    """Pick the strongest action among the instance's candidates after holds; ties go to the first."""
    best: tuple[Action, str | None, Reason] | None = None
    for rule, reason, is_finding in candidates:
        mode = modes[rule]
        if mode is Mode.OFF:
            continue
        action = ACTION_OF_MODE[mode] if is_finding else REPORT
        if action is DELETE:
            if held := holds.of_rule[rule]:
                action, reason = REPORT, held
            elif inst.deletion_protection:
                action, reason = REPORT, Reason.DELETION_PROTECTED  # the API would refuse it every sweep
            elif "opt_out_label" in facts:
                action, reason = REPORT, Reason.OPT_OUT_MALFORMED
        if best is None or _RANK[action] > _RANK[best[0]]:
            best = (action, rule, reason)
    facts["findings"] = [c.reason for c in candidates]
    if holds.names:
        facts["holds"] = list(holds.names)
    if best is None:
        return Decision(TARGET, inst, KEEP, candidates[0].rule, Reason.RULE_OFF, facts)
    return Decision(TARGET, inst, best[0], best[1], best[2], facts)
