"""Every row of docs/design.md §5, run grouping, and the Kubernetes parts of section 6."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import pytest

from reaper.model import Evidence, Keyed, Override, Phase
from reaper.policy import evaluate
from reaper.policy.k8s import ORPHAN
from reaper.vocabulary import Reason
from tests.builders import NOW, NOW_DT, H, M, leases, obj, plan, runs, sandbox, settings


def decide(resources, evidence: Evidence, **kwargs) -> dict[str, set[tuple[str, str]]]:
    """run -> the set of (action, reason) its objects got (a set of one when the run shares a decision)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for d in plan(resources, evidence=evidence, **kwargs).decisions:
        run = d.resource.labels.get("iterion.io/run-id", "-")
        out.setdefault(run, set()).add((d.action.value, d.reason))
    return out


def ev(held=(), statuses=None, **kwargs) -> Evidence:
    """Leases held for ``held`` (each run recorded as running unless ``statuses`` says otherwise: a run that
    holds a lease is in the run store), and the run store's ``statuses``."""
    return Evidence(
        leases=leases(list(held)), runs=runs({**dict.fromkeys(held, "running"), **(statuses or {})}), **kwargs
    )


def test_row1_young_resource_keeps_the_whole_run() -> None:
    res = [*sandbox("r1"), obj("Secret", "r1", age=5 * M - 1)]
    assert decide(res, ev(statuses={"r1": "failed"})) == {"r1": {("keep", "min_age")}}


def test_row1_exactly_min_age_is_old_enough() -> None:
    assert decide(sandbox("r1", age=5 * M), ev()) == {"r1": {("delete", "sandbox_orphan")}}


def test_row2_lease_held_keeps() -> None:
    assert decide(sandbox("r1"), ev(held=["r1"], statuses={"r1": "failed"})) == {"r1": {("keep", "lease_held")}}


def test_row2_unexpired_lease_is_held_and_expired_is_absent() -> None:
    live: Keyed[float | None] = Keyed(known={"r1": NOW + 10, "r2": NOW - 60}, complete=True)
    got = decide(sandbox("r1") + sandbox("r2"), Evidence(leases=live, runs=runs({"r1": "running"})))
    assert got == {"r1": {("keep", "lease_held")}, "r2": {("delete", "sandbox_orphan")}}


def test_row2_lease_within_clock_skew_of_expiry_is_held() -> None:
    live: Keyed[float | None] = Keyed(known={"r1": NOW - 29}, complete=True)
    assert decide(sandbox("r1"), Evidence(leases=live, runs=runs())) == {"r1": {("keep", "lease_held")}}


@pytest.mark.parametrize(
    "lease_evidence",
    [None, Keyed(known={}, failed=frozenset({"r1"}), complete=True), Keyed(known={}, complete=False)],
    ids=["source-unreachable", "key-lookup-failed", "listing-incomplete"],
)
def test_row3_lease_unknown_reports(lease_evidence) -> None:
    got = decide(sandbox("r1"), Evidence(leases=lease_evidence, runs=runs()))
    assert got == {"r1": {("report", "lease_unknown")}}


def test_row4_lease_absent_but_run_active_reports() -> None:
    assert decide(sandbox("r1"), ev(statuses={"r1": "running"})) == {"r1": {("report", "lease_absent_run_active")}}


@pytest.mark.parametrize("status", ["", "RUNNING", "queued", "succeeded?"])
def test_row4_any_non_terminal_status_is_active(status: str) -> None:
    assert decide(sandbox("r1"), ev(statuses={"r1": status}))["r1"] == {("report", "lease_absent_run_active")}


@pytest.mark.parametrize(
    "store",
    [None, Keyed(known={}, failed=frozenset({"r1"}), complete=True), Keyed(known={}, complete=False)],
    ids=["store-down", "batch-failed", "answer-incomplete"],
)
def test_row5_store_unknown_reports(store) -> None:
    got = decide(sandbox("r1"), Evidence(leases=leases(), runs=store))
    assert got == {"r1": {("report", "store_unknown")}}


UNPROVEN = "k8s.mongo_run_store: database 'iterion' has no collection 'runz', so it may not be the store ..."


def test_row5_a_run_store_that_did_not_prove_itself_is_unknown_and_the_verdict_says_why() -> None:
    got = plan(sandbox("r1"), evidence=Evidence(leases=leases(), runs=Keyed(complete=False, problem=UNPROVEN)))
    assert {(d.action.value, d.reason) for d in got.decisions} == {("report", "store_unknown")}
    assert got.scopes[0].details["unknown_evidence"] == [UNPROVEN]


def test_row3_a_lease_source_that_did_not_prove_itself_is_unknown_and_the_verdict_says_why() -> None:
    unproven = "k8s.mongo_leases: iterion.run_leases is empty, so ..."
    got = plan(sandbox("r1"), evidence=Evidence(leases=Keyed(complete=False, problem=unproven), runs=runs()))
    assert {(d.action.value, d.reason) for d in got.decisions} == {("report", "lease_unknown")}
    assert got.scopes[0].details["unknown_evidence"] == [unproven]


def test_row5_a_live_lease_missing_from_the_run_store_makes_every_not_found_unknown() -> None:
    # r1 holds a lease, yet the run store has no record of it: not the store the runners write to.
    res = sandbox("r1") + sandbox("gone") + sandbox("done")
    evidence = Evidence(leases=leases(["r1"]), runs=runs({"done": "failed"}))
    assert decide(res, evidence) == {
        "r1": {("keep", "lease_held")},
        "gone": {("report", "store_unknown")},  # was sandbox_orphan: its sandbox was deleted
        "done": {("delete", "sandbox_orphan")},  # a record it does hold is still evidence
    }
    (why,) = cast(list[str], plan(res, evidence=evidence).scopes[0].details["unknown_evidence"])
    assert why.startswith("run store: 1 run holds a live lease but no record in it (r1)")


def test_the_cross_check_spans_clusters_and_ignores_expired_leases() -> None:
    res = [obj("Pod", "live", cluster="c2"), *sandbox("gone")]
    # A live lease without a record in another cluster: the run store is one for every cluster.
    assert decide(res, Evidence(leases=leases(["live"]), runs=runs()))["gone"] == {("report", "store_unknown")}
    # An expired lease is no live run: a run gone from the store may have left it behind.
    expired: Keyed[float | None] = Keyed(known={"live": NOW - 60}, complete=True)
    assert decide(res, Evidence(leases=expired, runs=runs()))["gone"] == {("delete", "sandbox_orphan")}


def test_the_cross_check_reads_the_lease_at_the_policys_now() -> None:
    # Pure: the lease is live or not at the ``now`` the policy is given, never at the wall clock.
    res = [obj("Pod", "live", cluster="c2"), *sandbox("gone")]
    evidence = Evidence(leases=Keyed(known={"live": NOW + 60}, complete=True), runs=runs())
    assert decide(res, evidence)["gone"] == {("report", "store_unknown")}
    later = evaluate(res, evidence, settings(), Phase.ENFORCEMENT, NOW_DT + timedelta(minutes=5))
    assert {d.reason for d in later.decisions if d.resource.labels["iterion.io/run-id"] == "gone"} == {ORPHAN}


def test_row6_running_egress_sidecar_reports() -> None:
    res = sandbox("r1", containers={"sandbox": True, "results-egress": False})
    assert decide(res, ev(statuses={"r1": "succeeded"})) == {"r1": {("report", "results_egress_in_progress")}}


def test_row6_terminated_sidecar_does_not_block() -> None:
    res = sandbox("r1", containers={"sandbox": True, "results-egress": True})
    assert decide(res, ev(statuses={"r1": "succeeded"})) == {"r1": {("delete", "sandbox_orphan")}}


def test_row6_sidecar_name_follows_config() -> None:
    res = sandbox("r1", containers={"uploader": False})
    cfg = settings(k8s={"results_sidecar": "uploader"})
    assert decide(res, ev(), config=cfg) == {"r1": {("report", "results_egress_in_progress")}}


def test_row6_a_pod_without_the_sidecars_name_may_run_it_under_another() -> None:
    """k8s.results_sidecar naming no container of a Pod of several (the runners' is results-uploader): row 6 cannot
    see its upload, so a run whose containers still run is reported, not deleted; one whose containers all finished,
    or where the config says there is no sidecar, goes as ever; so does one whose Pod has one container (no sidecar,
    of any name). Per Pod: an older runner's Pod with the configured name, in the same cluster or another, vouches
    for nothing."""
    uploading = sandbox("r1", containers={"sandbox": True, "results-uploader": False})
    done = sandbox("r2", containers={"sandbox": True, "results-uploader": True})
    statuses = ev(statuses={"r1": "succeeded", "r2": "succeeded"})
    got = decide([*uploading, *done], statuses)
    assert got == {"r1": {("report", "results_sidecar_unseen")}, "r2": {("delete", "sandbox_orphan")}}
    p = plan([*uploading, *done], evidence=statuses)
    (pod,) = [d for d in p.decisions if d.resource.kind == "Pod" and d.resource.labels["iterion.io/run-id"] == "r1"]
    assert pod.evidence["running"] == [f"{pod.resource.name}/results-uploader"]
    assert decide(uploading, statuses, config=settings(k8s={"results_sidecar": "none"})) == {
        "r1": {("delete", "sandbox_orphan")}
    }
    alone = sandbox("r4", containers={"sandbox": False})
    assert decide(alone, ev(statuses={"r4": "succeeded"})) == {"r4": {("delete", "sandbox_orphan")}}
    for cluster in ("c1", "c2"):
        older = sandbox(
            "r3", cluster=cluster, namespace="ci-legacy", containers={"sandbox": True, "results-egress": True}
        )
        assert decide([*uploading, *older], ev(statuses={"r1": "succeeded", "r3": "succeeded"}))["r1"] == {
            ("report", "results_sidecar_unseen")
        }


STEP = {"iterion.io/step": "build", "iterion.io/attempt": "2"}
STEP_CFG = {"k8s": {"step_store": "postgres"}}


def _step_run(steps: Keyed | None) -> dict[str, set[tuple[str, str]]]:
    res = [obj("Pod", "r1", labels=STEP), obj("Secret", "r1")]
    return decide(res, ev(statuses={"r1": "succeeded"}, steps=steps), config=settings(**STEP_CFG))


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (("running", False), ("report", "results_not_durable")),
        (("succeeded", False), ("report", "results_not_durable")),
        (("succeeded", True), ("delete", "sandbox_orphan")),
        (("failed", False), ("delete", "sandbox_orphan")),
        (("FAILED", False), ("delete", "sandbox_orphan")),
    ],
)
def test_row7_results_durability(row: tuple[str, bool], expected: tuple[str, str]) -> None:
    assert _step_run(Keyed(known={"r1/build/2": row}, complete=True)) == {"r1": {expected}}


def test_row7_step_store_unknown_reports() -> None:
    assert _step_run(None) == {"r1": {("report", "results_not_durable")}}
    assert _step_run(Keyed(failed=frozenset({"r1/build/2"}), complete=True)) == {
        "r1": {("report", "results_not_durable")}
    }


def test_row7_no_row_for_the_pods_own_attempt_is_not_durable() -> None:
    assert _step_run(Keyed(complete=True)) == {"r1": {("report", "results_not_durable")}}
    # Attempt 1's row is durable, but the pod is attempt 2's.
    assert _step_run(Keyed(known={"r1/build/1": ("succeeded", True)}, complete=True)) == {
        "r1": {("report", "results_not_durable")}
    }


@pytest.mark.parametrize("attempt", ["abc", "", "1.5", " 1", "١", "-1"])
def test_row7_malformed_attempt_label_is_not_durable(attempt: str) -> None:
    res = [obj("Pod", "r1", labels={"iterion.io/step": "build", "iterion.io/attempt": attempt})]
    steps = Keyed(known={f"r1/build/{attempt}": ("succeeded", True)}, complete=True)
    got = decide(res, ev(statuses={"r1": "failed"}, steps=steps), config=settings(**STEP_CFG))
    assert got == {"r1": {("report", "results_not_durable")}}


def test_row7_half_labelled_step_pod_reports() -> None:
    res = [obj("Pod", "r1", labels={"iterion.io/step": "build"})]
    got = decide(res, ev(statuses={"r1": "failed"}, steps=Keyed(complete=True)), config=settings(**STEP_CFG))
    assert got == {"r1": {("report", "results_not_durable")}}


def test_row7_a_step_store_whose_labels_no_pod_carries_proves_no_results_durable() -> None:
    """k8s.step_label/attempt_label naming labels the runners do not put on their step Pods (a typo, a renamed
    label) validate, and row 7 would see no step Pod at all: a run whose step is still uploading its results was
    reaped. With a step store configured and no listed Pod of the cluster carrying either label, every run that
    reaches row 7 is reported (its Pods ``step_labels_unseen``), and the cluster is held by step_labels_unseen:
    a run without Pods is reported too, and the hold blocks deletes (it pages)."""
    runner_labels = {"iterion.io/step-name": "build", "iterion.io/step-attempt": "2"}
    res = [obj("Pod", "r1", labels=runner_labels), obj("Secret", "r1"), *sandbox("r2"), obj("Secret", "r3")]
    steps = Keyed(known={"r1/build/2": ("running", False)}, complete=True)
    evidence = ev(statuses={"r1": "succeeded", "r2": "failed", "r3": "failed"}, steps=steps)
    p = plan(res, evidence=evidence, config=settings(**STEP_CFG))
    got = {(d.resource.labels["iterion.io/run-id"], d.action.value, d.reason) for d in p.decisions}
    assert got == {
        ("r1", "report", "results_not_durable"),
        ("r2", "report", "results_not_durable"),
        ("r3", "report", "step_labels_unseen"),
    }
    pod = next(
        d for d in p.decisions if d.resource.kind == "Pod" and d.resource.labels.get("iterion.io/run-id") == "r1"
    )
    assert pod.evidence["steps"] == {pod.resource.name: "step_labels_unseen"}
    (verdict,) = p.scopes
    assert verdict.holds == (Reason.STEP_LABELS_UNSEEN,) and verdict.blocking == (Reason.STEP_LABELS_UNSEEN,)


def test_row7_step_labels_are_seen_per_cluster() -> None:
    """Runners of one cluster with renamed step labels are not vouched for by another cluster's Pods that carry
    the configured ones: c2 is held, c1 deletes its orphan whose step results are durable."""
    renamed = {"iterion.io/step-name": "build", "iterion.io/step-attempt": "2"}
    res = [obj("Pod", "r1", cluster="c1", labels=STEP), obj("Pod", "r2", cluster="c2", labels=renamed)]
    durable = Keyed(known={"r1/build/2": ("succeeded", True), "r2/build/2": ("running", False)}, complete=True)
    p = plan(
        res, evidence=ev(statuses={"r1": "succeeded", "r2": "succeeded"}, steps=durable), config=settings(**STEP_CFG)
    )
    got = {d.resource.cluster: (d.action.value, d.reason) for d in p.decisions}
    assert got == {"c1": ("delete", "sandbox_orphan"), "c2": ("report", "results_not_durable")}
    assert {v.scope: v.holds for v in p.scopes} == {"c1": (), "c2": (Reason.STEP_LABELS_UNSEEN,)}


def test_a_cluster_without_pods_is_not_held_by_unseen_step_labels() -> None:
    """Only Secrets and policies left of finished runs: no Pod whose step labels could be read, so none unseen."""
    res = [obj("Secret", "r1"), obj("NetworkPolicy", "r1")]
    p = plan(res, evidence=ev(statuses={"r1": "failed"}, steps=Keyed(complete=True)), config=settings(**STEP_CFG))
    assert {(d.action.value, d.reason) for d in p.decisions} == {("delete", "sandbox_orphan")}
    assert p.scopes[0].holds == ()


def test_row7_a_run_without_step_pods_goes_where_another_pod_carries_the_labels() -> None:
    durable = Keyed(known={"r1/build/2": ("succeeded", True)}, complete=True)
    res = [obj("Pod", "r1", labels=STEP), *sandbox("r2")]  # r2: a sandbox that runs no step
    got = decide(res, ev(statuses={"r1": "succeeded", "r2": "failed"}, steps=durable), config=settings(**STEP_CFG))
    assert got == {"r1": {("delete", "sandbox_orphan")}, "r2": {("delete", "sandbox_orphan")}}


def test_row7_is_skipped_without_a_step_store() -> None:
    res = [obj("Pod", "r1", labels=STEP)]
    assert decide(res, ev(statuses={"r1": "succeeded"})) == {"r1": {("delete", "sandbox_orphan")}}


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled", "Cancelled"])
def test_row8_terminal_run_is_an_orphan(status: str) -> None:
    assert decide(sandbox("r1"), ev(statuses={"r1": status})) == {"r1": {("delete", "sandbox_orphan")}}


def test_row8_provably_missing_run_is_an_orphan() -> None:
    assert decide(sandbox("r1"), ev()) == {"r1": {("delete", "sandbox_orphan")}}


def test_terminal_statuses_follow_config() -> None:
    cfg = settings(k8s={"terminal_statuses": ["done"]})
    got = decide(sandbox("r1") + sandbox("r2"), ev(statuses={"r1": "done", "r2": "failed"}), config=cfg)
    assert got == {"r1": {("delete", "sandbox_orphan")}, "r2": {("report", "lease_absent_run_active")}}


def test_all_of_a_runs_resources_share_the_decision() -> None:
    res = sandbox("r1") + sandbox("r2")
    p = plan(res, evidence=ev(held=["r2"]))
    assert {
        (d.resource.kind, d.action.value) for d in p.decisions if d.resource.labels["iterion.io/run-id"] == "r1"
    } == {
        ("Pod", "delete"),
        ("Secret", "delete"),
        ("NetworkPolicy", "delete"),
    }
    assert len(p.deletes()) == 4


def test_run_label_missing_is_reported_never_deleted() -> None:
    got = decide([obj("Secret", None), obj("Pod", "")], ev())
    assert got == {"-": {("report", "run_label_missing")}, "": {("report", "run_label_missing")}}


def test_unmanaged_objects_are_not_in_the_plan() -> None:
    assert plan([*sandbox("r1"), obj("Pod", "r2", managed=False)], evidence=ev()).decisions.__len__() == 4


@pytest.mark.parametrize("kind", ["Pod", "Secret", "NetworkPolicy"])
def test_opt_out_on_any_object_keeps_the_whole_run(kind: str) -> None:
    # Deleting the Secrets or NetworkPolicy of a kept Pod would strip a live sandbox of its
    # credentials or its isolation: the decision is per run (docs/design.md §5).
    res = [*sandbox("r1"), obj(kind, "r1", labels={"reaper.io/keep": "true"}), *sandbox("r2")]
    got = decide(res, ev())
    assert got == {"r1": {("keep", "opt_out")}, "r2": {("delete", "sandbox_orphan")}}


def test_protected_namespace_of_any_object_keeps_the_whole_run() -> None:
    res = [*sandbox("r1"), obj("Pod", "r1", namespace="kube-system")]
    assert decide(res, ev()) == {"r1": {("keep", "protected_scope")}}


def test_opt_out_wins_over_protection_whatever_the_order() -> None:
    opted, protected = obj("Secret", "r1", labels={"reaper.io/keep": "true"}), obj("Pod", "r1", namespace="kube-system")
    assert decide([opted, protected], ev()) == decide([protected, opted], ev()) == {"r1": {("keep", "opt_out")}}


def test_kept_runs_count_in_neither_side_of_the_budget() -> None:
    # Two orphans of three managed runs trip the budget (min_stale 2); six opted-out runs must not dilute it.
    opted = [o for r in range(6) for o in sandbox(f"keep{r}") if o.kind != "Pod"]
    opted += [obj("Pod", f"keep{r}", labels={"reaper.io/keep": "true"}) for r in range(6)]
    res = sandbox("a") + sandbox("b") + sandbox("live") + opted
    p = plan(res, evidence=ev(held=["live"]), config=settings(budget={"min_stale": 2}))
    assert p.scopes[0].holds == ("budget_exceeded",)
    assert p.scopes[0].details["managed_runs"] == 3


def test_terminating_pod_keeps_its_run_until_a_sweep_finds_it_gone() -> None:
    res = [obj("Pod", "r1", deleting=True), obj("Secret", "r1"), obj("NetworkPolicy", "r1")]
    p = plan(res, evidence=ev(statuses={"r1": "failed"}))
    assert {(d.action.value, d.reason) for d in p.decisions} == {("keep", "pod_terminating")}
    assert p.census["k8s"]["c1"]["terminating"] == {"Pod": 1}


def test_terminating_secret_is_kept_while_the_rest_of_its_run_is_reaped() -> None:
    res = [obj("Pod", "r1"), obj("Secret", "r1", deleting=True), obj("NetworkPolicy", "r1")]
    got = {(d.resource.kind, d.action.value, d.reason) for d in plan(res, evidence=ev()).decisions}
    assert got == {
        ("Pod", "delete", "sandbox_orphan"),
        ("Secret", "keep", "terminating"),
        ("NetworkPolicy", "delete", "sandbox_orphan"),
    }


def test_the_same_object_listed_twice_holds_the_cluster() -> None:
    pod = obj("Pod", "r1")
    p = plan([pod, pod, obj("Secret", "r1")], evidence=ev())
    assert p.scopes[0].holds == ("inventory_incomplete",) and p.deletes() == []


@pytest.mark.parametrize("expiry", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_lease_expiry_is_unknown(expiry: float) -> None:
    got = decide(sandbox("r1"), Evidence(leases=Keyed(known={"r1": expiry}, complete=True), runs=runs()))
    assert got == {"r1": {("report", "lease_unknown")}}


def test_budget_over_runs_holds_the_cluster() -> None:
    res = sandbox("a") + sandbox("b") + sandbox("c") + sandbox("live")
    p = plan(res, evidence=ev(held=["live"]))
    assert not p.deletes()
    assert p.scopes[0].holds == ("budget_exceeded",)
    assert {d.reason for d in p.decisions if d.action.value == "report"} == {"budget_exceeded"}


def test_budget_is_per_cluster() -> None:
    res = [o for r in "abc" for o in sandbox(r)]
    res += [obj("Pod", f"x{i}", cluster="c2") for i in range(4)]
    p = plan(res, evidence=ev(held=["x1", "x2", "x3"]))
    assert {d.resource.cluster for d in p.deletes()} == {"c2"}


def test_budget_override() -> None:
    res = [o for r in "abc" for o in sandbox(r)]
    override = Override("cleanup after outage", "bob", frozenset({("k8s", "c1")}))
    assert len(plan(res, evidence=ev(), override=override).deletes()) == 12


def test_budget_override_lifts_only_the_clusters_it_names() -> None:
    # Both clusters trip their budget (three orphaned runs of three); the operator reviewed c1 only.
    res = [obj(kind, f"{c}-{r}", cluster=c) for c in ("c1", "c2") for r in "abc" for kind in ("Pod", "Secret")]
    override = Override("INC-7: c1's runner restarted", "bob", frozenset({("k8s", "c1")}))
    p = plan(res, evidence=ev(), override=override)
    assert {d.resource.cluster for d in p.deletes()} == {"c1"} and len(p.deletes()) == 6
    verdicts = {v.scope: v for v in p.scopes}
    assert verdicts["c1"].overridden == ("budget_exceeded",) and verdicts["c1"].holds == ()
    assert verdicts["c2"].holds == ("budget_exceeded",) and verdicts["c2"].overridden == ()
    assert {d.reason for d in p.decisions if d.resource.cluster == "c2"} == {"budget_exceeded"}


def test_incomplete_cluster_listing_holds_deletes() -> None:
    e = ev(incomplete=frozenset({("k8s", "c1")}))
    assert decide(sandbox("r1"), e) == {"r1": {("report", "inventory_incomplete")}}


def test_report_only_reports_orphans() -> None:
    assert decide(sandbox("r1"), ev(), phase=Phase.REPORT_ONLY) == {"r1": {("report", "sandbox_orphan")}}


@pytest.mark.parametrize("phase", [Phase.TELEMETRY, Phase.TERMINATED_CLEANUP])
def test_phases_without_the_rule_keep_everything(phase: Phase) -> None:
    res = [*sandbox("r1"), obj("Secret", None), *sandbox("r2")]
    got = decide(res, ev(statuses={"r2": "running"}), phase=phase)
    assert {a for v in got.values() for a, _ in v} == {"keep"}


def test_global_cap_applies_to_k8s_objects() -> None:
    res = sandbox("r1") + sandbox("r2") + [o for i in range(6) for o in sandbox(f"l{i}")]
    p = plan(res, evidence=ev(held=[f"l{i}" for i in range(6)]), config=settings(max_deletions_per_sweep=7))
    assert not p.deletes() and p.capped == {"k8s": 8}


def test_census_counts_runs_by_row() -> None:
    res = sandbox("a") + sandbox("b") + [obj("Secret", None)]
    p = plan(res, evidence=ev(held=["a"], statuses={"b": "failed"}))
    c = p.census["k8s"]["c1"]
    assert c["objects"] == 9 and c["runs"] == 2
    assert c["by_kind"] == {"Pod": 2, "Secret": 5, "NetworkPolicy": 2}
    assert c["by_reason"] == {"lease_held": 1, "sandbox_orphan": 1, "run_label_missing": 1}
    assert c["lease"] == {"held": 1, "absent": 1}


def test_k8s_decision_evidence() -> None:
    d = plan(sandbox("r1"), evidence=ev(statuses={"r1": "failed"})).decisions[0]
    assert d.evidence["run"] == "r1" and d.evidence["lease"] == "absent"
    assert d.evidence["store"] == "terminal" and d.evidence["status"] == "failed"


def test_young_unknown_lease_still_keeps() -> None:
    assert decide(sandbox("r1", age=H / 60), Evidence()) == {"r1": {("keep", "min_age")}}


def test_swept_cluster_without_objects_gets_a_verdict_and_a_zero_census() -> None:
    p = plan(sandbox("r1"), ev(statuses={"r1": "running"}, swept=frozenset({("k8s", "c1"), ("k8s", "empty")})))
    assert [v.scope for v in p.scopes] == ["c1", "empty"]
    assert p.census["k8s"]["empty"]["objects"] == 0 and p.scopes[1].holds == ()


# --- review findings: objects a run shares with Pods outside it, odd opt-out labels, other clusters ---


def test_a_pod_that_lost_its_run_label_keeps_the_secrets_it_mounts() -> None:
    pod = obj("Pod", None, uses=("sandbox-r1-files",))
    secrets = [obj("Secret", "r1", name="sandbox-r1-files"), obj("Secret", "r1", name="sandbox-r1-ca")]
    got = decide([pod, *secrets], ev())
    assert got == {"-": {("report", "run_label_missing")}, "r1": {("report", "in_use_outside_run")}}


def test_a_networkpolicy_selecting_a_pod_outside_its_run_keeps_the_run() -> None:
    policy = obj("NetworkPolicy", "r1", selects=(("sandbox", "In", ("r1",)),))
    stray = obj("Pod", None, labels={"sandbox": "r1"})
    assert decide([policy, stray], ev())["r1"] == {("report", "in_use_outside_run")}
    # A policy that selects only its own run's Pod (or nothing outside it) does not hold the run.
    own = obj("Pod", "r1", labels={"sandbox": "r1"})
    assert decide([policy, own, obj("Pod", None, labels={"sandbox": "r2"})], ev())["r1"] == {
        ("delete", "sandbox_orphan")
    }


def test_users_outside_the_run_are_looked_for_in_the_objects_namespace_only() -> None:
    secret = obj("Secret", "r1", name="files")
    elsewhere = obj("Pod", None, namespace="other", uses=("files",), labels={"sandbox": "r1"})
    policy = obj("NetworkPolicy", "r1", selects=(("sandbox", "In", ("r1", "r2")),))
    assert decide([secret, policy, elsewhere], ev())["r1"] == {("delete", "sandbox_orphan")}
    # The same Pod in the run's namespace holds it, through a selector with several values too.
    stray = obj("Pod", None, labels={"sandbox": "r2"})
    assert decide([secret, policy, stray], ev())["r1"] == {("report", "in_use_outside_run")}
    narrow = obj("NetworkPolicy", "r1", selects=(("tier", "In", ("db",)), ("sandbox", "In", ("r2",))))
    assert decide([narrow, obj("Pod", None, labels={"sandbox": "r2"})], ev())["r1"] == {("delete", "sandbox_orphan")}
    assert decide([narrow, obj("Pod", None, labels={"sandbox": "r2", "tier": "db"})], ev())["r1"] == {
        ("report", "in_use_outside_run")
    }


@pytest.mark.parametrize(
    ("requirements", "selected"),
    [
        ((), True),  # an empty selector selects every Pod of its namespace
        ((("a", "NotIn", ("x",)),), True),
        ((("a", "Exists", ()),), False),
        ((("b", "DoesNotExist", ()),), True),
        ((("a", "Gt", ("1",)),), True),  # an operator the reaper does not know may select anything
    ],
)
def test_selector_requirements(requirements: tuple, selected: bool) -> None:
    from reaper.policy.k8s import selector_matches

    assert selector_matches(requirements, {"c": "1"}) is selected


@pytest.mark.parametrize("value", ["True", "TRUE", "yes", "1", "", "false"])
def test_an_opt_out_label_with_another_value_reports_the_whole_run(value: str) -> None:
    res = [*sandbox("r1"), obj("Secret", "r1", labels={"reaper.io/keep": value})]
    assert decide(res, ev()) == {"r1": {("report", "opt_out_malformed")}}


def test_an_opt_out_in_one_cluster_keeps_the_run_in_every_cluster() -> None:
    res = [obj("Pod", "r1", cluster="a", labels={"reaper.io/keep": "true"}), *sandbox("r1")]  # sandbox: cluster c1
    assert {(d.resource.cluster, d.action.value, d.reason) for d in plan(res, evidence=ev()).decisions} == {
        ("a", "keep", "opt_out"),
        ("c1", "keep", "opt_out"),
    }


def test_step_pods_without_a_step_store_are_said_loudly() -> None:
    # With k8s.step_store none, step pods are reaped with no durability check: the sweep says so.
    from reaper.k8s.evidence import unguarded_step_pods

    pods = [obj("Pod", "r1", labels=STEP), obj("Pod", "r2"), obj("Secret", "r1", labels=STEP)]
    warned = unguarded_step_pods(pods, settings())
    assert len(warned) == 1 and warned[0].startswith("1 pods carry step labels") and "NOT checked" in warned[0]
    assert unguarded_step_pods(pods, settings(**STEP_CFG)) == []


@pytest.mark.parametrize(
    ("source", "state", "status"),
    [
        (None, "unknown", None),  # the store could not be read
        (Keyed(known={"r1": "failed"}, complete=True), "terminal", "failed"),  # a record: its status decides
        (Keyed(known={"r1": "running"}, complete=True), "active", "running"),
        (Keyed(known={"r1": "failed"}, failed=frozenset({"r1"}), complete=True), "unknown", None),  # failed wins
        (Keyed(known={"r2": "failed"}, complete=True), "not_found", None),  # missing from a complete listing
        (Keyed(known={"r2": "failed"}, complete=False), "unknown", None),  # missing from a partial one
    ],
)
def test_a_store_lookup_has_a_record_or_the_state_its_absence_means(
    source: Keyed | None, state: str, status: str | None
) -> None:
    """The run and step stores share one lookup: a record, or the state a missing one stands for."""
    from reaper.policy.k8s import run_state, step_state

    assert run_state("r1", source, ["failed"]) == (state, status)
    steps = (
        None
        if source is None
        else Keyed({k: (v, True) for k, v in source.known.items()}, source.failed, source.complete)
    )
    assert step_state("r1", steps, settings()) == state  # "failed" with results is terminal, "running" active


def test_a_run_label_every_sandbox_shares_deletes_nothing_as_the_live_runs_leases_expose_it() -> None:
    # Review finding: k8s.run_label naming a label all sandboxes share folds every live sandbox into one
    # "run" that no lease and no run record knows: lease absent, run not found, row 8. The leases held by runs
    # the listing does not name, and a store that knows none of its runs, say the label is not the runs' id.
    objects = [o for r in ("r1", "r2", "r3") for o in sandbox(r, labels={"app": "sandbox"})]
    evidence = Evidence(leases=leases(["r1", "r2", "r3"]), runs=runs({k: "running" for k in ("r1", "r2", "r3")}))
    wrong = plan(objects, evidence, settings(rollout={"k8s": "enforcement"}, k8s={"run_label": "app"}))
    assert not wrong.deletes()
    assert {d.reason for d in wrong.decisions} <= {"run_key_shared", "store_unknown", "run_label_missing"}
    (verdict,) = wrong.scopes
    assert any("k8s.run_label (app)" in why for why in cast(list[str], verdict.details["unknown_evidence"]))


def test_a_run_key_several_sandboxes_share_is_no_run_whatever_the_lease_source_and_the_other_runs() -> None:
    # Second review: the sweep-wide rule needs a lease source that lists every lease (NATS; MongoDB leases
    # answer only the keys asked) and no listed run with a record. One run has one NetworkPolicy and one Pod
    # per step attempt: more under one key means the label is not a run id, whatever else the sweep holds.
    shared = [obj(kind, "undefined") for _ in range(2) for kind in ("Pod", "Secret", "Secret", "NetworkPolicy")]
    real = sandbox("old-1")  # a runner of the previous release, its run over: an orphan indeed
    only_asked = Evidence(leases=leases(), runs=runs({"old-1": "succeeded"}))
    p = plan([*shared, *real], only_asked, settings(rollout={"k8s": "enforcement"}))
    assert {d.resource.name for d in p.deletes()} == {o.name for o in real}
    assert {d.reason for d in p.decisions if d.resource in shared} == {"run_key_shared"}
    stepped = [
        *sandbox("r3"),
        obj("Pod", "r3", labels={"iterion.io/step": "build", "iterion.io/attempt": "1"}),
        obj("Pod", "r3", labels={"iterion.io/step": "build", "iterion.io/attempt": "1"}),
    ]
    again = plan(stepped, Evidence(leases=leases(), runs=runs()), settings(rollout={"k8s": "enforcement"}))
    assert not again.deletes() and {d.reason for d in again.decisions} == {"run_key_shared"}
    steps = [*sandbox("r4"), obj("Pod", "r4", labels={"iterion.io/step": "build", "iterion.io/attempt": "1"}),
             obj("Pod", "r4", labels={"iterion.io/step": "test", "iterion.io/attempt": "1"})]  # fmt: skip
    one = plan(steps, Evidence(leases=leases(), runs=runs()), settings(rollout={"k8s": "enforcement"}))
    assert {d.reason for d in one.decisions} != {"run_key_shared"}  # distinct attempts: one run
    two_pods = [*sandbox("r5"), obj("Pod", "r5")]  # a run of two Pods, one NetworkPolicy: one run, reaped
    both = plan(
        two_pods, Evidence(leases=leases(), runs=runs({"r5": "failed"})), settings(rollout={"k8s": "enforcement"})
    )
    assert len(both.deletes()) == len(two_pods)


def test_runs_no_store_knows_are_still_orphans_when_no_other_run_holds_a_lease() -> None:
    # The check needs live runs elsewhere: a cluster of orphans whose records are gone, with no lease held
    # anywhere, is still reaped (row 8), and so is one with a live run the listing names.
    gone = [o for r in ("g1", "g2") for o in sandbox(r)]
    alone = plan(gone, Evidence(leases=leases(), runs=runs()), settings(rollout={"k8s": "enforcement"}))
    assert {d.reason for d in alone.deletes()} == {"sandbox_orphan"} and len(alone.deletes()) == len(gone)
    live = sandbox("live-1")
    beside = Evidence(leases=leases(["live-1", "elsewhere"]), runs=runs({"live-1": "running"}))
    mixed = plan([*gone, *live], beside, settings(rollout={"k8s": "enforcement"}))
    assert len(mixed.deletes()) == len(gone)


def test_a_results_sidecar_name_no_listed_pod_has_is_warned_of() -> None:
    """k8s.results_sidecar naming no container of the listed Pods (the runners' is results-uploader): row 6 cannot
    see an upload in progress. A deployment without a sidecar looks the same, so the sweep warns what to set (and
    reports the runs whose containers still run, above)."""
    from reaper.k8s.evidence import unseen_sidecar

    uploader = sandbox("r1", containers={"sandbox": True, "results-uploader": False})
    (warning,) = unseen_sidecar(uploader, settings())
    assert "results-egress (k8s.results_sidecar)" in warning
    assert unseen_sidecar(uploader, settings(k8s={"results_sidecar": "results-uploader"})) == []
    assert unseen_sidecar([obj("Secret", "r1")], settings()) == []  # no Pod listed: nothing to say
    assert unseen_sidecar(uploader, settings(k8s={"results_sidecar": "none"})) == []  # no sidecar, said so
    # Per cluster: c2's Pods having the sidecar vouch nothing for c1's.
    elsewhere = sandbox("r2", cluster="c2", containers={"sandbox": True, "results-egress": False})
    (warning,) = unseen_sidecar([*uploader, *elsewhere], settings())
    assert "cluster c1 " in warning
