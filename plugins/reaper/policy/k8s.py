"""Kubernetes rules (DESIGN.md section 5): one decision per run, lease first, store as backstop.

A run's Pods, Secrets and NetworkPolicies share one decision, taken by the
first matching row of the table in DESIGN.md section 5. Every evidence lookup
has an explicit unknown, and every unknown leads to keep or report, never delete.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from reaper.config import Mode, Settings
from reaper.model import (
    ACTION_OF_MODE,
    Action,
    Decision,
    Evidence,
    K8sObject,
    Keyed,
    LeaseState,
    Override,
    ScopeVerdict,
    StoreState,
    TargetResult,
    step_key,
)
from reaper.policy.gce import budget_tripped

TARGET = "k8s"
RULE = "sandbox_orphan"
KEEP, REPORT, DELETE = Action.KEEP, Action.REPORT, Action.DELETE
# Row outcomes: reason -> whether it is the orphan finding (rows 1-2 keep, 3-7 report, 8 finding).
KEEP_ROWS = ("min_age", "lease_held")
ORPHAN = "sandbox_orphan"


def lease_state(key: str, leases: Keyed[float | None] | None, now: float, skew: float) -> LeaseState:
    """Held while the key exists and has not expired (with ``skew`` of grace for the writer's clock)."""
    if leases is None or key in leases.failed:
        return LeaseState.UNKNOWN
    if key in leases.known:
        expires = leases.known[key]
        return LeaseState.HELD if expires is None or expires + skew > now else LeaseState.ABSENT
    return LeaseState.ABSENT if leases.complete else LeaseState.UNKNOWN


def _lookup(key: str, source: Keyed | None) -> tuple[bool, object]:
    """(answered, value): value is the record, or the state a missing key has."""
    if source is None or key in source.failed:
        return True, StoreState.UNKNOWN
    if key in source.known:
        return False, source.known[key]
    return True, StoreState.NOT_FOUND if source.complete else StoreState.UNKNOWN


def run_state(key: str, runs: Keyed[str] | None, terminal: list[str]) -> tuple[StoreState, str | None]:
    """The run's store state and its raw status; a status that is not terminal means active."""
    missing, value = _lookup(key, runs)
    if missing:
        return value, None  # type: ignore[return-value]
    status = str(value)
    return (StoreState.TERMINAL if status.lower() in terminal else StoreState.ACTIVE), status


def step_state(key: str, steps: Keyed[tuple[str, bool]] | None, config: Settings) -> StoreState:
    """Terminal only when the attempt is terminal and its results are durable (or it failed)."""
    missing, value = _lookup(key, steps)
    if missing:
        return value  # type: ignore[return-value]
    status, has_results = value  # type: ignore[misc]
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
    result = TargetResult()
    for cluster in sorted(by_cluster.keys() | {scope for target, scope in evidence.swept if target == TARGET}):
        verdict, result.census[cluster] = _evaluate_cluster(
            cluster, by_cluster[cluster], evidence, config, modes, now, override, result.acted
        )
        result.verdicts.append(verdict)
    return result


def _evaluate_cluster(
    cluster: str,
    objects: list[K8sObject],
    evidence: Evidence,
    config: Settings,
    modes: dict[str, Mode],
    now: float,
    override: Override | None,
    out: list[Decision],
) -> tuple[ScopeVerdict, dict[str, object]]:
    k8s = config.k8s
    mode = modes[RULE]
    runs: dict[str, list[K8sObject]] = defaultdict(list)
    by_kind: dict[str, int] = defaultdict(int)
    unlabeled: list[K8sObject] = []
    for obj in objects:
        by_kind[obj.kind] += 1
        key = obj.labels.get(k8s.run_label)
        if key:
            runs[key].append(obj)
        else:
            unlabeled.append(obj)

    rows = {key: _run_row(key, members, evidence, config, now) for key, members in runs.items()}
    orphans = sum(1 for reason, _ in rows.values() if reason == ORPHAN)
    holds: list[str] = []
    overridden: list[str] = []
    if (TARGET, cluster) in evidence.incomplete:
        holds.append("inventory_incomplete")
    if budget_tripped(orphans, len(runs), config):
        (overridden if override else holds).append("budget_exceeded")

    by_reason: dict[str, int] = defaultdict(int)
    for key, members in runs.items():
        reason, facts = rows[key]
        by_reason[reason] += 1
        action = _row_action(reason, mode)
        if action is DELETE and holds:
            action, reason = REPORT, holds[0]
            facts = {**facts, "holds": list(holds)}
        for obj in members:
            out.append(_member_decision(obj, action, reason, facts, config))
    for obj in unlabeled:
        by_reason["run_label_missing"] += 1
        action = KEEP if mode is Mode.OFF else REPORT
        out.append(_member_decision(obj, action, "run_label_missing", {"run_label": k8s.run_label}, config))

    census: dict[str, object] = {
        "objects": len(objects),
        "by_kind": dict(by_kind),
        "runs": len(runs),
        "by_reason": dict(by_reason),
        "lease": _count(facts.get("lease") for _, facts in rows.values()),
        "store": _count(facts.get("store") for _, facts in rows.values()),
    }
    details = {"runs": len(runs), "orphaned_runs": orphans}
    return ScopeVerdict(TARGET, cluster, tuple(holds), tuple(overridden), details), census


def _count(values: Iterable[object]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        if value is not None:
            counts[str(value)] += 1
    return dict(counts)


def _row_action(reason: str, mode: Mode) -> Action:
    if mode is Mode.OFF or reason in KEEP_ROWS:
        return KEEP
    return ACTION_OF_MODE[mode] if reason == ORPHAN else REPORT


def _member_decision(
    obj: K8sObject, action: Action, reason: str, facts: dict[str, object], config: Settings
) -> Decision:
    """The run's decision for one of its objects, unless the object itself opts out or is protected."""
    opt_key, opt_value = config.k8s.opt_out_label
    if obj.labels.get(opt_key) == opt_value:
        return Decision(TARGET, obj, KEEP, RULE, "opt_out", facts)
    if obj.namespace in config.k8s.protected_namespaces:
        return Decision(TARGET, obj, KEEP, RULE, "protected_scope", facts)
    return Decision(TARGET, obj, action, RULE, reason, facts)


def _run_row(
    key: str, members: list[K8sObject], evidence: Evidence, config: Settings, now: float
) -> tuple[str, dict[str, object]]:
    """The first matching row of DESIGN.md section 5 for one run, and the evidence it used."""
    k8s = config.k8s
    facts: dict[str, object] = {"run": key}
    youngest = max(obj.created for obj in members)
    facts["youngest_age_s"] = now - youngest
    if now - youngest < k8s.min_age.total_seconds():
        return "min_age", facts  # row 1: creation races the lease
    lease = lease_state(key, evidence.leases, now, k8s.lease_clock_skew.total_seconds())
    facts["lease"] = lease.value
    if lease is LeaseState.HELD:
        return "lease_held", facts  # row 2
    if lease is LeaseState.UNKNOWN:
        return "lease_unknown", facts  # row 3
    store, status = run_state(key, evidence.runs, k8s.terminal_statuses)
    facts["store"] = store.value
    facts["status"] = status
    if store is StoreState.ACTIVE:
        return "lease_absent_run_active", facts  # row 4
    if store is StoreState.UNKNOWN:
        return "store_unknown", facts  # row 5
    pods = [obj for obj in members if obj.kind == "Pod"]
    if any(pod.containers.get(k8s.results_sidecar) is False for pod in pods):
        return "results_egress_in_progress", facts  # row 6
    if k8s.step_store != "none":
        pending = _undurable_steps(key, pods, evidence, config)
        if pending:
            facts["steps"] = pending
            return "results_not_durable", facts  # row 7
    return ORPHAN, facts  # row 8


def _undurable_steps(key: str, pods: list[K8sObject], evidence: Evidence, config: Settings) -> dict[str, str]:
    """Step attempts of the run's pods whose results are not proven durable, with their state."""
    k8s = config.k8s
    pending: dict[str, str] = {}
    for pod in pods:
        step = pod.labels.get(k8s.step_label)
        attempt = pod.labels.get(k8s.attempt_label)
        if step is None and attempt is None:
            continue  # not a step pod
        if not step or not attempt:
            pending[pod.name] = "step_labels_incomplete"
            continue
        state = step_state(step_key(key, step, attempt), evidence.steps, config)
        if state in (StoreState.ACTIVE, StoreState.UNKNOWN):
            pending[step_key(key, step, attempt)] = state.value
    return pending
