"""Kubernetes rules (docs/design.md §5): one decision per run, lease first, store as backstop.

A run's Pods, Secrets and NetworkPolicies share one decision, taken by the
first matching row of the table in docs/design.md §5, never per object: an
opted-out or protected object keeps its whole run, because deleting the Secrets
or NetworkPolicy of a kept Pod would strip a live sandbox of its credentials or
its network isolation. Every evidence lookup has an explicit unknown, and every
unknown leads to keep or report, never delete.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, cast

import msgspec

from reaper.config import Settings
from reaper.model import (
    ACTION_OF_MODE,
    Action,
    Decision,
    Evidence,
    K8sObject,
    Keyed,
    LeaseState,
    Liveness,
    Mode,
    Override,
    Reading,
    ScopeVerdict,
    StoreState,
    TargetResult,
    step_key,
)
from reaper.policy.budget import budget_hold
from reaper.rules import SANDBOX_ORPHAN
from reaper.vocabulary import Reason

_T = TypeVar("_T")

TARGET = "k8s"
# The target's one rule, and its one finding (row 8: the run is an orphan, reapable): one name for both.
RULE, ORPHAN = SANDBOX_ORPHAN.name, SANDBOX_ORPHAN.finding
KEEP, REPORT, DELETE = Action.KEEP, Action.REPORT, Action.DELETE
# The run-wide guards before the table, in precedence order: they count in neither side of the budget.
# An opt-out label with another value than the configured one is surprising: reported, never deleted.
KEPT_RUNS = (Reason.OPT_OUT, Reason.PROTECTED_SCOPE, Reason.OPT_OUT_MALFORMED)
# Run outcomes that keep: two of the guards, a terminating Pod, rows 1-2. Everything else but row 8 reports.
KEEP_ROWS = (Reason.OPT_OUT, Reason.PROTECTED_SCOPE, Reason.POD_TERMINATING, Reason.MIN_AGE, Reason.LEASE_HELD)


def lease_state(key: str, leases: Keyed[float | None] | None, now: float, skew: float) -> LeaseState:
    """Held while the key exists and has not expired (with ``skew`` of grace for the writer's clock).

    An expiry that is not a finite number (NaN compares false to everything) is unknown, never absent.
    """
    if leases is None or key in leases.failed:
        return LeaseState.UNKNOWN
    if key in leases.known:
        expires = leases.known[key]
        if expires is None:
            return LeaseState.HELD
        if not isinstance(expires, int | float) or not math.isfinite(expires):
            return LeaseState.UNKNOWN
        return LeaseState.HELD if expires + skew > now else LeaseState.ABSENT
    return LeaseState.ABSENT if leases.complete else LeaseState.UNKNOWN


def cross_checked(keys: Iterable[str], evidence: Evidence, config: Settings, now: float) -> Keyed[str] | None:
    """The run store's answer, no longer complete when a run holds a live lease but is absent from it, or when
    the listed runs (``keys``) are names neither the store nor the leases know.

    A run is recorded (queued) before a runner claims it and takes its lease, so such a run means the
    run store read is not the one the runners write to (docs/design.md §5): none of its ``not_found`` is proof this
    sweep. Its records stand. Nor does it when it knows none of the listed runs while none of them holds a lease
    and other runs do (a lease source that lists every lease): the listing's run label is then not the runs'
    id. A single run read again before its delete cannot be cross-checked.
    """
    runs = evidence.runs
    if runs is None or not runs.complete:
        return runs
    keys = set(keys)
    skew = config.k8s.lease_clock_skew.total_seconds()
    elsewhere = evidence.leases.known.keys() - keys if evidence.leases is not None else set()
    live = [key for key in elsewhere if lease_state(key, evidence.leases, now, skew) is LeaseState.HELD]
    if keys and live and not any(key in runs.known for key in keys):  # a failed lookup is no record
        # Runs are alive (their leases are held), yet the listing names none of them, and the store knows none
        # of the runs it names: the run label is not the runs' id (a label every sandbox shares folds them all
        # into one "run" nobody knows), so the store's silence about those names proves nothing.
        problem = (
            f"run store: none of the {len(keys)} runs the listing names by k8s.run_label "
            f"({config.k8s.run_label}) has a record in it, and none of them holds a lease while "
            f"{len(live)} other runs do: that label is not the runs' id, so no run missing from the store counts as "
            "gone this sweep"
        )
        return Keyed(known=runs.known, failed=runs.failed, complete=False, problem=problem)
    contradicting = sorted(
        key
        for key in keys
        if key not in runs.known
        and key not in runs.failed
        and lease_state(key, evidence.leases, now, skew) is LeaseState.HELD
    )
    if not contradicting:
        return runs
    sample = ", ".join(contradicting[:3]) + (", ..." if len(contradicting) > 3 else "")
    runs_hold = "1 run holds" if len(contradicting) == 1 else f"{len(contradicting)} runs hold"
    problem = (
        f"run store: {runs_hold} a live lease but no record in it ({sample}), so it is not the store the "
        "runners write to: no run missing from it counts as gone this sweep"
    )
    return Keyed(known=runs.known, failed=runs.failed, complete=False, problem=problem)


def sidecar_seen(objects: Iterable[K8sObject], config: Settings) -> bool:
    """Whether a listed Pod of one cluster has a container named ``k8s.results_sidecar`` (or it is ``none``: the
    runners have none). A name no Pod has (a typo, a container renamed) validates and would make row 6 see no upload
    at all (docs/design.md §5): the sweep warns of it; row 6 itself looks at each Pod (:func:`evidence_row`)."""
    name = config.k8s.results_sidecar
    return name == "none" or any(o.kind == "Pod" and name in o.containers for o in objects)


def step_labels_seen(objects: Iterable[K8sObject], config: Settings) -> bool:
    """Whether the step labels prove anything in one cluster: no step store is configured, or a listed Pod of it
    carries ``k8s.step_label`` or ``k8s.attempt_label``. A step store with labels no Pod carries is a config that
    validates and makes row 7 see no step Pod at all (docs/design.md §5): then no run's results count as
    durable. Per cluster: runners of one cluster with renamed labels are not vouched for by another's."""
    k8s = config.k8s
    if k8s.step_store == "none":
        return True
    return any(o.kind == "Pod" and (k8s.step_label in o.labels or k8s.attempt_label in o.labels) for o in objects)


def unknown_sources(evidence: Evidence) -> list[str]:
    """Why the lease source or the run store answers unknown for every key it did not answer, if it says."""
    return [source.problem for source in (evidence.leases, evidence.runs) if source is not None and source.problem]


def _lookup(key: str, source: Keyed[_T] | None) -> tuple[bool, object]:
    """(missing, value): ``(False, record)`` when the source answered the key with a record, else
    ``(True, state)``: the :class:`StoreState` that the lack of a usable record stands for.

    That state is ``NOT_FOUND`` only when the source is complete (it listed everything);
    ``UNKNOWN`` when the source could not be read, its lookup of this key failed (a record
    alongside the failure is not trusted), or the key is simply absent from a partial answer.
    """
    if source is None or key in source.failed:
        return True, StoreState.UNKNOWN
    if key in source.known:
        return False, source.known[key]
    return True, StoreState.NOT_FOUND if source.complete else StoreState.UNKNOWN


def run_state(key: str, runs: Keyed[str] | None, terminal: list[str]) -> tuple[StoreState, str | None]:
    """The run's store state and its raw status; a status that is not terminal means active."""
    missing, value = _lookup(key, runs)
    if missing:
        return cast(StoreState, value), None  # cast: what _lookup gives for a missing key is a StoreState
    status = str(value)
    return (StoreState.TERMINAL if status.lower() in terminal else StoreState.ACTIVE), status


def step_state(key: str, steps: Keyed[tuple[str, bool]] | None, config: Settings) -> StoreState:
    """Terminal only when the attempt is terminal and its results are durable (or it failed)."""
    missing, value = _lookup(key, steps)
    if missing:
        return cast(StoreState, value)  # cast: what _lookup gives for a missing key is a StoreState
    status, has_results = cast("tuple[str, bool]", value)  # cast: a record of `steps`, a Keyed[tuple[str, bool]]
    status = status.lower()
    k8s = config.k8s
    if status in k8s.terminal_statuses and (has_results or status in k8s.step_failed_statuses):
        return StoreState.TERMINAL
    return StoreState.ACTIVE


def evaluate_k8s(
    objects: Iterable[K8sObject],
    evidence: Evidence,
    config: Settings,
    modes: dict[str, Mode],
    now: float,
    override: Override | None,
) -> TargetResult:
    """Decide every in-scope object: decisions, per-cluster verdicts and census."""
    selector = tuple(config.k8s.selector.items())
    by_cluster: dict[str, list[K8sObject]] = defaultdict(list)
    for obj in objects:
        labels = obj.labels
        for key, value in selector:
            if labels.get(key) != value:
                break
        else:
            by_cluster[obj.cluster].append(obj)
    guards = _run_guards((o for members in by_cluster.values() for o in members), config)
    keys = {
        run_key for members in by_cluster.values() for o in members if (run_key := o.labels.get(config.k8s.run_label))
    }
    evidence = msgspec.structs.replace(evidence, runs=cross_checked(keys, evidence, config, now))
    sweep = _Context(config, modes[RULE], now, evidence, override, guards, unknown_sources(evidence))
    result = TargetResult()
    for cluster in sorted(by_cluster.keys() | {scope for target, scope in evidence.swept if target == TARGET}):
        part = _evaluate_cluster(cluster, by_cluster[cluster], sweep)
        result.recorded += part.recorded
        result.verdicts.append(part.verdict)
        result.census[cluster] = part.census
    return result


@dataclass(frozen=True, slots=True)
class _Context:
    """What every cluster of one sweep is decided against: the same for all of them."""

    config: Settings
    mode: Mode  # the effective mode of the sandbox_orphan rule
    now: float
    evidence: Evidence
    override: Override | None
    guards: dict[str, tuple[Reason, list[str]]]  # run key -> the guard that keeps it in every cluster
    unknown: list[str]  # why a source answers unknown for every key it did not answer (the verdicts say so)


class _ClusterResult(NamedTuple):
    """One cluster's part of the :class:`TargetResult` (Kubernetes has no plain-keep groups)."""

    recorded: list[Decision]
    verdict: ScopeVerdict
    census: dict[str, object]


def _evaluate_cluster(cluster: str, objects: list[K8sObject], sweep: _Context) -> _ClusterResult:
    """Decide one cluster: every object's decision (one per run), its verdict and census."""
    k8s = sweep.config.k8s
    runs: dict[str, list[K8sObject]] = defaultdict(list)
    by_kind: dict[str, int] = defaultdict(int)
    terminating: dict[str, int] = defaultdict(int)
    unlabeled: list[K8sObject] = []
    uids: set[str] = set()
    duplicated = False
    for obj in objects:
        by_kind[obj.kind] += 1
        if obj.deleting:
            terminating[obj.kind] += 1
        duplicated = duplicated or obj.uid in uids
        uids.add(obj.uid)
        key = obj.labels.get(k8s.run_label)
        if key:
            runs[key].append(obj)
        else:
            unlabeled.append(obj)

    step_labels = step_labels_seen(objects, sweep.config)
    rows = {key: _run_row(key, members, sweep, step_labels) for key, members in runs.items()}
    pods = _PodIndex(obj for obj in objects if obj.kind == "Pod")  # who uses a run's Secrets and policy
    for key, (reason, facts) in rows.items():
        if reason == ORPHAN:
            user = _used_outside_run(key, runs[key], pods, k8s.run_label)
            if user:
                rows[key] = Reason.IN_USE_OUTSIDE_RUN, {**facts, "used_by": user}
    orphans = sum(1 for reason, _ in rows.values() if reason == ORPHAN)
    managed = sum(1 for reason, _ in rows.values() if reason not in KEPT_RUNS)
    # The same object listed twice means the listing moved under us (docs/design.md §4, applied to lists).
    incomplete = (TARGET, cluster) in sweep.evidence.incomplete or duplicated
    budget, overridden = budget_hold(orphans, managed, sweep.config, sweep.override, TARGET, cluster)
    # Step labels unseen: the runs row 7 reports say so; the hold stops the cluster's other deletes and pages.
    unseen = not step_labels and any(reason is Reason.RESULTS_NOT_DURABLE for reason, _ in rows.values())
    holds = (
        *((Reason.INVENTORY_INCOMPLETE,) if incomplete else ()),
        *((Reason.STEP_LABELS_UNSEEN,) if unseen else ()),
        *budget,
    )

    recorded: list[Decision] = []
    by_reason: dict[Reason, int] = defaultdict(int)
    for key, members in runs.items():
        reason, facts = rows[key]
        by_reason[reason] += 1
        action = _row_action(reason, sweep.mode)
        if action is DELETE and holds:
            action, reason = REPORT, holds[0]
            facts = {**facts, "holds": list(holds)}
        recorded += [_member_decision(obj, action, reason, facts) for obj in members]
    for obj in unlabeled:
        reason = object_guard(obj, sweep.config) or Reason.RUN_LABEL_MISSING
        by_reason[reason] += 1
        recorded.append(_member_decision(obj, _row_action(reason, sweep.mode), reason, {"run_label": k8s.run_label}))

    census: dict[str, object] = {
        "objects": len(objects),
        "by_kind": dict(by_kind),
        "terminating": dict(terminating),
        "runs": len(runs),
        "by_reason": dict(by_reason),
        "lease": _count(facts.get("lease") for _, facts in rows.values()),
        "store": _count(facts.get("store") for _, facts in rows.values()),
    }
    details: dict[str, object] = {"runs": len(runs), "managed_runs": managed, "orphaned_runs": orphans}
    if sweep.unknown:
        details["unknown_evidence"] = sweep.unknown
    return _ClusterResult(recorded, ScopeVerdict(TARGET, cluster, holds, overridden, details), census)


def _count(values: Iterable[object]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        if value is not None:
            counts[str(value)] += 1
    return dict(counts)


def _row_action(reason: Reason, mode: Mode) -> Action:
    if mode is Mode.OFF or reason in KEEP_ROWS:
        return KEEP
    return ACTION_OF_MODE[mode] if reason == ORPHAN else REPORT


def _member_decision(obj: K8sObject, action: Action, reason: Reason, facts: dict[str, object]) -> Decision:
    """The run's decision for one of its objects; an object already being deleted is never sent a delete."""
    if obj.deleting and action is not KEEP:
        return Decision(TARGET, obj, KEEP, RULE, Reason.TERMINATING, facts)
    return Decision(TARGET, obj, action, RULE, reason, facts)


def object_guard(obj: K8sObject, config: Settings) -> Reason | None:
    """Why this object alone keeps its run (opt-out label, protected namespace), or None."""
    opt_key, opt_value = config.k8s.opt_out_label
    if obj.labels.get(opt_key) == opt_value:
        return Reason.OPT_OUT
    if obj.namespace in config.k8s.protected_namespaces:
        return Reason.PROTECTED_SCOPE
    if opt_key in obj.labels:
        return Reason.OPT_OUT_MALFORMED
    return None


def _run_guards(objects: Iterable[K8sObject], config: Settings) -> dict[str, tuple[Reason, list[str]]]:
    """Run key -> the guard that holds the whole run, and the objects that carry it.

    Across every cluster of the sweep: a run key (and its lease) is global, so an opted-out Pod in
    one cluster keeps the run's Secrets in another.
    """
    found: dict[str, dict[Reason, list[str]]] = defaultdict(lambda: defaultdict(list))
    run_label = config.k8s.run_label
    for obj in objects:
        guard = object_guard(obj, config)
        key = obj.labels.get(run_label)
        if guard and key:
            found[key][guard].append(f"{obj.kind} {obj.cluster}/{obj.namespace}/{obj.name}")
    return {key: next((g, sorted(by_guard[g])) for g in KEPT_RUNS if g in by_guard) for key, by_guard in found.items()}


def selector_matches(requirements: tuple[tuple[str, str, tuple[str, ...]], ...], labels: dict[str, str]) -> bool:
    """Whether a label selector selects these labels; an operator it does not know may select anything."""
    for key, operator, values in requirements:
        if operator == "In":
            ok = labels.get(key) in values
        elif operator == "NotIn":
            ok = labels.get(key) not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            ok = True
        if not ok:
            return False
    return True


class _PodIndex:
    """A cluster's Pods by the Secrets they use and by their labels, per namespace: a run's users in O(1)."""

    def __init__(self, pods: Iterable[K8sObject]) -> None:
        self.by_namespace: dict[str, list[K8sObject]] = defaultdict(list)
        self.by_secret: dict[tuple[str, str], list[K8sObject]] = defaultdict(list)
        self.by_label: dict[tuple[str, str, str], list[K8sObject]] = defaultdict(list)
        for pod in pods:
            self.by_namespace[pod.namespace].append(pod)
            for name in pod.uses:
                self.by_secret[(pod.namespace, name)].append(pod)
            for key, value in pod.labels.items():
                self.by_label[(pod.namespace, key, value)].append(pod)

    def selected(self, policy: K8sObject) -> Iterable[K8sObject]:
        """The Pods a NetworkPolicy may select: narrowed by its rarest single-value ``In`` requirement.

        The rarest, because a run's policy also requires labels every sandbox carries (managed=true).
        """
        shortlists = [
            self.by_label.get((policy.namespace, key, values[0]), [])
            for key, operator, values in policy.selects or ()
            if operator == "In" and len(values) == 1
        ]
        candidates = min(shortlists, key=len, default=self.by_namespace.get(policy.namespace, []))
        return (pod for pod in candidates if selector_matches(policy.selects or (), pod.labels))


def _used_outside_run(key: str, members: list[K8sObject], pods: _PodIndex, run_label: str) -> str | None:
    """A Pod outside the run that mounts one of its Secrets or is isolated by its NetworkPolicy, or None.

    A Pod that lost its run label still runs with its run's Secrets and network policy: deleting
    them would strip a live sandbox of its credentials or its isolation.
    """
    for obj in members:
        if obj.kind == "Secret":
            users: Iterable[K8sObject] = pods.by_secret.get((obj.namespace, obj.name), ())
            what = "is used by"
        elif obj.kind == "NetworkPolicy" and obj.selects is not None:
            users, what = pods.selected(obj), "selects"
        else:
            continue
        for pod in users:
            if pod.labels.get(run_label) != key:
                return f"{obj.kind} {obj.namespace}/{obj.name} {what} Pod {pod.name}"
    return None


def _run_row(
    key: str, members: list[K8sObject], sweep: _Context, step_labels: bool
) -> tuple[Reason, dict[str, object]]:
    """The first matching row of docs/design.md §5 for one run, and the evidence it used.

    Before the table, run-wide guards hold every object of the run: any object (in any cluster)
    opted out, in a protected namespace or with an odd opt-out label, and a Pod already terminating
    (its containers may still run; its Secrets and NetworkPolicy wait for a sweep that finds it gone).
    """
    facts: dict[str, object] = {"run": key}
    if key in sweep.guards:
        guard, facts["kept_by"] = sweep.guards[key]
        return guard, facts
    pods = [obj for obj in members if obj.kind == "Pod"]
    if any(pod.deleting for pod in pods):
        facts["terminating"] = [pod.name for pod in pods if pod.deleting]
        return Reason.POD_TERMINATING, facts
    return evidence_row(key, members, sweep.evidence, sweep.config, sweep.now, step_labels)


def evidence_row(
    key: str,
    members: list[K8sObject],
    evidence: Evidence,
    config: Settings,
    now: float,
    step_labels: bool,
) -> tuple[Reason, dict[str, object]]:
    """Rows 1 to 8 of docs/design.md §5 for one run (``evidence`` cross-checked), and the evidence they used:
    what the run's age, lease, run store, sidecar and step results say, whatever guards its objects carry.
    ``step_labels``: :func:`step_labels_seen` of the run's cluster (False: every Pod of the run is a step Pod whose
    labels cannot be read, row 7)."""
    k8s = config.k8s
    facts: dict[str, object] = {"run": key}
    pods = [obj for obj in members if obj.kind == "Pod"]
    if shared := _not_one_run(members, config):
        facts["pods"] = shared
        return Reason.RUN_KEY_SHARED, facts  # the run label is not this run's id: no store's answer is about it
    youngest = max(obj.created for obj in members)
    facts["youngest_age_s"] = now - youngest
    if now - youngest < k8s.min_age.total_seconds():
        return Reason.MIN_AGE, facts  # row 1: creation races the lease
    lease = lease_state(key, evidence.leases, now, k8s.lease_clock_skew.total_seconds())
    facts["lease"] = lease.value
    if lease is LeaseState.HELD:
        return Reason.LEASE_HELD, facts  # row 2
    if lease is LeaseState.UNKNOWN:
        return Reason.LEASE_UNKNOWN, facts  # row 3
    store, status = run_state(key, evidence.runs, k8s.terminal_statuses)
    facts["store"] = store.value
    facts["status"] = status
    if store is StoreState.ACTIVE:
        return Reason.LEASE_ABSENT_RUN_ACTIVE, facts  # row 4
    if store is StoreState.UNKNOWN:
        return Reason.STORE_UNKNOWN, facts  # row 5
    if any(pod.containers.get(k8s.results_sidecar) is False for pod in pods):
        return Reason.RESULTS_EGRESS_IN_PROGRESS, facts  # row 6: a container status always beats the phase
    if k8s.results_sidecar != "none":  # row 6 for a Pod without a container of the sidecar's name
        running = sorted(
            f"{pod.name}/{name}"
            for pod in pods
            # Per Pod: another Pod with the name (an older runner's) vouches nothing for this one's; a Pod of one
            # container has no sidecar, of any name.
            if len(pod.containers) > 1 and k8s.results_sidecar not in pod.containers
            for name, done in pod.containers.items()
            if not done
        )
        if running:  # any of them may be the sidecar under another name
            facts["running"] = running[:6]
            return Reason.RESULTS_SIDECAR_UNSEEN, facts
    if k8s.step_store != "none":
        if step_labels:
            pending = _undurable_steps(key, pods, evidence, config)
        else:
            pending = {pod.name: Reason.STEP_LABELS_UNSEEN for pod in pods}
        if pending:
            facts["steps"] = pending
            return Reason.RESULTS_NOT_DURABLE, facts  # row 7
    return ORPHAN, facts  # row 8


def _not_one_run(members: list[K8sObject], config: Settings) -> list[str]:
    """The objects that say a run key is not one run's id, or none: a run has one NetworkPolicy (its
    isolation) and one Pod per step attempt. A label every sandbox shares (a release stamping a constant)
    folds many runs into one "run" no lease or record knows, which rows 2 to 8 would read as gone. (A run may
    have several Pods: their count alone proves nothing.)"""
    k8s = config.k8s
    live = [o for o in members if not o.deleting]
    policies = [o.name for o in live if o.kind == "NetworkPolicy"]
    stepped = [
        (o.labels.get(k8s.step_label), o.labels.get(k8s.attempt_label))
        for o in live
        if o.kind == "Pod" and o.labels.get(k8s.step_label)
    ]
    if len(policies) > 1 or len(stepped) != len(set(stepped)):
        return sorted(f"{o.kind} {o.name}" for o in live if o.kind in ("Pod", "NetworkPolicy"))[:6]
    return []


# What each row says of the run's owner (``reaper diff``): only row 8 is proof it is gone. A run too young for
# its lease to count, or whose results are not proven durable, is unknown; a held lease, an active run or a
# running results sidecar says it may be alive.
ROW_LIVENESS = {
    Reason.MIN_AGE: Liveness.UNKNOWN,
    Reason.LEASE_HELD: Liveness.FRESH,
    Reason.LEASE_UNKNOWN: Liveness.UNKNOWN,
    Reason.LEASE_ABSENT_RUN_ACTIVE: Liveness.FRESH,
    Reason.STORE_UNKNOWN: Liveness.UNKNOWN,
    Reason.RUN_KEY_SHARED: Liveness.UNKNOWN,
    Reason.RESULTS_EGRESS_IN_PROGRESS: Liveness.FRESH,
    Reason.RESULTS_SIDECAR_UNSEEN: Liveness.UNKNOWN,
    Reason.RESULTS_NOT_DURABLE: Liveness.UNKNOWN,
    ORPHAN: Liveness.STALE,
}


# The cluster holds that make a run at row 8 no proof of its owner's absence: unreadable step labels, a budget.
_UNPROVEN = (Reason.STEP_LABELS_UNSEEN, Reason.BUDGET_EXCEEDED)


def liveness(
    objects: Iterable[K8sObject], evidence: Evidence, config: Settings, now: float, holds: Mapping[str, tuple[str, ...]]
) -> Iterator[tuple[K8sObject, Reading]]:
    """What each object's liveness evidence says of its run's owner: its run's row (:func:`evidence_row`), as the
    rules read it, whatever the selector, guards or modes. A Pod outside the run that uses it makes it fresh; a
    run reaching row 8 in a cluster held by its budget or by unseen step labels (``holds``: cluster -> its verdict's
    holds) is unknown, since a mass of absent leases is more likely a broken source than a broken fleet, and
    unreadable step labels prove no results durable; no run label is unknown."""
    label = config.k8s.run_label
    runs: dict[tuple[str, str], list[K8sObject]] = defaultdict(list)
    clusters: dict[str, list[K8sObject]] = defaultdict(list)
    for obj in objects:
        clusters[obj.cluster].append(obj)
        if key := obj.labels.get(label):
            runs[(obj.cluster, key)].append(obj)
        else:
            yield obj, Reading(Liveness.UNKNOWN, Reason.RUN_LABEL_MISSING, {"run_label": label})
    evidence = msgspec.structs.replace(evidence, runs=cross_checked({k for _, k in runs}, evidence, config, now))
    pods = {c: _PodIndex(o for o in members if o.kind == "Pod") for c, members in clusters.items()}
    seen = {cluster: step_labels_seen(members, config) for cluster, members in clusters.items()}
    for (cluster, key), members in runs.items():
        reason, facts = evidence_row(key, members, evidence, config, now, seen[cluster])
        state = ROW_LIVENESS[reason]
        if reason == ORPHAN:
            if user := _used_outside_run(key, members, pods[cluster], label):
                state, reason, facts = Liveness.FRESH, Reason.IN_USE_OUTSIDE_RUN, {**facts, "used_by": user}
            elif held := next((h for h in _UNPROVEN if h in holds.get(cluster, ())), None):
                state, reason = Liveness.UNKNOWN, held
        for obj in members:
            yield obj, Reading(state, reason, facts)


def valid_attempt(label: str | None) -> bool:
    """An attempt label the step store can match by value: ASCII decimal digits (``"01"`` is attempt 1)."""
    return label is not None and label.isascii() and label.isdigit()


def _undurable_steps(key: str, pods: list[K8sObject], evidence: Evidence, config: Settings) -> dict[str, str]:
    """Step attempts of the run's pods whose results are not proven durable, with why (docs/design.md §5, row 7).

    Only a terminal row for the pod's own (run, step, attempt) with durable results (or a failed
    status) proves it: no row, an unknown one, or missing or malformed labels all count as not durable.
    """
    k8s = config.k8s
    pending: dict[str, str] = {}
    for pod in pods:
        step = pod.labels.get(k8s.step_label)
        attempt = pod.labels.get(k8s.attempt_label)
        if step is None and attempt is None:
            continue  # not a step pod
        if not step or attempt is None:
            pending[pod.name] = "step_labels_incomplete"
            continue
        if not valid_attempt(attempt):
            pending[pod.name] = "attempt_label_malformed"
            continue
        state = step_state(step_key(key, step, attempt), evidence.steps, config)
        if state is not StoreState.TERMINAL:
            pending[step_key(key, step, attempt)] = state.value
    return pending
