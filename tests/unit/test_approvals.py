"""A run carrying an approval deletes only what was approved, as it was reviewed (docs/design.md §6)."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reaper.approvals import Approval, ApprovedItem, check_expiry, choose, fingerprint_of, problem, used_elsewhere
from reaper.model import Action, Evidence, GceInstance, K8sObject, Override, Plan
from tests.builders import NOW, D, H, M, healthy, inst, leases, obj, plan, runs, sandbox, settings


def fp(resource: GceInstance | K8sObject, value: str) -> GceInstance | K8sObject:
    """The resource listed in state ``value`` (its labelFingerprint or resourceVersion)."""
    field = "label_fingerprint" if isinstance(resource, GceInstance) else "resource_version"
    return msgspec.structs.replace(resource, **{field: value})


def rule_of(resource: GceInstance | K8sObject) -> str:
    """The rule the review found it by, as the sweep page records it."""
    if isinstance(resource, K8sObject):
        return "sandbox_orphan"
    return "terminated" if resource.status == "TERMINATED" else "heartbeat_stale"


def approve(*resources: GceInstance | K8sObject, target: str = "gce", expires: float = NOW + 4 * H) -> Approval:
    items = [
        ApprovedItem(
            r.scope,
            r.uid,
            fingerprint_of(r),
            r.name,
            r.kind,
            r.labels.get("iterion.io/run-id", ""),
            rule_of(r),
            r.status if isinstance(r, GceInstance) else "",
        )
        for r in resources
    ]
    return Approval("apr-1", target, f"reaper_{target}_enforcement", "sweep-1", "alice", "incident 42", NOW - H,
                    expires, items)  # fmt: skip


def stale_fleet(project: str = "p1", stale: int = 4, fresh: int = 1) -> list[GceInstance]:
    """A project whose budget trips: ``stale`` stale heartbeats of ``stale + fresh``."""
    fleet = [inst(hb_age=D, project=project) for _ in range(stale)] + [
        inst(hb_age=M, project=project) for _ in range(fresh)
    ]
    return [fp(i, f"fp-{i.id}") for i in fleet]  # type: ignore[misc]  # fp returns the resource it is given, typed as the union


def actions(p: Plan) -> dict[str, tuple[str, str]]:
    return {d.resource.uid: (d.action.value, d.reason) for d in p.decisions}


# --- GCE rows ---------------------------------------------------------------------------------------


def test_without_an_approval_the_budget_holds_everything() -> None:
    fleet = stale_fleet()
    assert not plan(fleet).deletes()


def test_approved_and_unchanged_is_deleted_the_rest_of_the_held_scope_stays_held() -> None:
    fleet = stale_fleet()
    p = plan(fleet, approval=approve(*fleet[:2]))
    got = actions(p)
    assert {d.resource.uid for d in p.deletes()} == {fleet[0].uid, fleet[1].uid}
    assert got[fleet[2].uid] == got[fleet[3].uid] == ("report", "not_approved")
    assert got[fleet[4].uid][0] == "keep"  # fresh: an approval never turns a keep into a delete
    assert all(d.evidence and d.evidence["approval"] == "apr-1" for d in p.deletes())


def test_changed_fingerprint_is_held() -> None:
    fleet = stale_fleet()
    approval = approve(*fleet[:2])
    relisted = [fp(fleet[0], "fp-after-a-heartbeat"), *fleet[1:]]
    p = plan(relisted, approval=approval)
    decision = next(d for d in p.decisions if d.resource.uid == fleet[0].uid)
    assert (decision.action, decision.reason) == (Action.REPORT, "approval_changed")
    assert decision.evidence and decision.evidence["approved_fingerprint"] == f"fp-{fleet[0].id}"
    assert {d.resource.uid for d in p.deletes()} == {fleet[1].uid}


def test_an_item_listed_without_a_fingerprint_is_held_as_changed() -> None:
    fleet = stale_fleet()
    approval = approve(*fleet[:1])
    p = plan([fp(fleet[0], ""), *fleet[1:]], approval=approval)
    assert actions(p)[fleet[0].uid] == ("report", "approval_changed") and not p.deletes()


def test_expired_holds_every_delete() -> None:
    fleet = stale_fleet()
    p = plan(fleet, approval=approve(*fleet, expires=NOW - 1))
    assert not p.deletes()
    assert {actions(p)[i.uid] for i in fleet[:4]} == {("report", "approval_expired")}


def test_an_approval_lifts_the_budget_of_its_scopes_only() -> None:
    p1, p2 = stale_fleet("p1"), stale_fleet("p2")
    items = [*p1, *p2]
    evidence = Evidence(writer_health=healthy("p1", "p2"), leases=leases(), runs=runs())
    p = plan(items, evidence=evidence, approval=approve(*p1[:4]))
    assert {d.resource.uid for d in p.deletes()} == {i.uid for i in p1[:4]}
    assert {actions(p)[i.uid] for i in p2[:4]} == {("report", "budget_exceeded")}  # its hold stands


def test_an_unheld_delete_outside_the_approval_is_held_too() -> None:
    # A run carrying an approval deletes its items only: a terminated VM of another project waits for the next sweep.
    fleet = stale_fleet()
    other = fp(inst(project="p2", status="TERMINATED", stop_age=H), "fp-t")
    evidence = Evidence(writer_health=healthy("p1", "p2"), leases=leases(), runs=runs())
    p = plan([*fleet, other], evidence=evidence, approval=approve(*fleet[:1]))
    assert actions(p)[other.uid] == ("report", "not_approved")
    assert plan([*fleet, other], evidence=evidence).deletes()[0].resource.uid == other.uid  # without: deleted


@pytest.mark.parametrize(
    ("changes", "reason"),
    [({"labels": {"reaper_keep": "true"}}, "opt_out"), ({"project": "kube-prod"}, "protected_scope")],
)
def test_opt_out_and_protected_are_kept_even_approved(changes: dict, reason: str) -> None:
    fleet = stale_fleet("kube-prod" if "project" in changes else "p1")
    target = fleet[0]
    if "labels" in changes:
        target = msgspec.structs.replace(target, labels={**target.labels, **changes["labels"]})
    config = settings(gce={"protected_projects": ["kube-prod"]})
    evidence = Evidence(writer_health=healthy("p1", "kube-prod"), leases=leases(), runs=runs())
    p = plan([target, *fleet[1:]], evidence=evidence, config=config, approval=approve(target))
    assert target.uid not in {d.resource.uid for d in p.deletes()}
    assert actions(p)[target.uid][1] == reason


def test_the_cap_is_the_approvals_item_count_and_may_exceed_max_deletions_per_sweep() -> None:
    fleet = stale_fleet(stale=6, fresh=0)
    config = settings(max_deletions_per_sweep=2)
    assert plan(fleet, config=config, override=Override("x", "u", frozenset({("gce", "p1")}))).capped == {"gce": 6}
    p = plan(fleet, config=config, approval=approve(*fleet))
    assert len(p.deletes()) == 6 and not p.capped


def test_an_approval_is_evaluated_on_its_own() -> None:
    fleet = stale_fleet()
    with pytest.raises(ValueError, match="no budget override"):
        plan(fleet, approval=approve(*fleet), override=Override("x", "u", frozenset({("gce", "p1")})))


# --- Kubernetes: runs are approved whole --------------------------------------------------------------


def k8s_runs(*names: str) -> list[K8sObject]:
    return [fp(o, f"rv-{o.uid}") for r in names for o in sandbox(r)]  # type: ignore[misc]  # fp returns the resource it is given, typed as the union


ORPHANS = Evidence(leases=leases(), runs=runs({}))


def test_k8s_approved_runs_are_deleted_whole() -> None:
    objs = k8s_runs("a", "b", "c")  # three orphaned runs of three: the budget trips
    assert not plan(objs, evidence=ORPHANS).deletes()
    p = plan(objs, evidence=ORPHANS, approval=approve(*objs[:4], target="k8s"))
    assert {d.resource.uid for d in p.deletes()} == {o.uid for o in objs[:4]}
    assert {actions(p)[o.uid] for o in objs[4:]} == {("report", "not_approved")}


def test_k8s_a_relabelled_object_holds_its_whole_run() -> None:
    objs = k8s_runs("a", "b", "c")
    approval = approve(*objs[:4], target="k8s")
    relisted = [objs[0], fp(objs[1], "rv-after-relabel"), *objs[2:]]
    got = actions(plan(relisted, evidence=ORPHANS, approval=approval))
    assert got[objs[1].uid] == ("report", "approval_changed")
    assert {got[o.uid] for o in (objs[0], objs[2], objs[3])} == {("report", "approval_run_partial")}


def test_k8s_a_new_object_in_an_approved_run_holds_the_run() -> None:
    objs = k8s_runs("a", "b", "c")
    approval = approve(*objs[:4], target="k8s")
    extra = fp(obj("Secret", "a"), "rv-new")
    got = actions(plan([*objs, extra], evidence=ORPHANS, approval=approval))
    assert got[extra.uid] == ("report", "not_approved")
    assert {got[o.uid] for o in objs[:4]} == {("report", "approval_run_partial")}


def test_k8s_an_approved_object_gone_holds_the_rest_of_its_run() -> None:
    objs = k8s_runs("a", "b", "c")
    approval = approve(*objs[:4], target="k8s")
    got = actions(plan([objs[0], *objs[2:]], evidence=ORPHANS, approval=approval))
    assert {got[o.uid] for o in (objs[0], objs[2], objs[3])} == {("report", "approval_run_partial")}


# --- the property ----------------------------------------------------------------------------------


@given(
    approved=st.lists(st.booleans(), min_size=6, max_size=6),
    changed=st.lists(st.sampled_from([False, False, True]), min_size=6, max_size=6),
    stale=st.lists(st.booleans(), min_size=6, max_size=6),
    expired=st.sampled_from([False, False, False, True]),
)
def test_an_approval_never_deletes_a_changed_or_unapproved_item(
    approved: list[bool], changed: list[bool], stale: list[bool], expired: bool
) -> None:
    fleet = [fp(inst(hb_age=D if s else M), f"fp-{i}") for i, s in enumerate(stale)]
    approval = approve(*(r for r, a in zip(fleet, approved, strict=True) if a), expires=NOW - 1 if expired else NOW + H)
    listed = [fp(r, "fp-new") if c else r for r, c in zip(fleet, changed, strict=True)]
    items = approval.by_key()
    deleted = plan(listed, approval=approval).deletes()
    for d in deleted:
        item = items.get((d.scope, d.resource.uid))
        assert item is not None and item.fingerprint == fingerprint_of(d.resource) and not expired
    # And it lets through every approved, unchanged, stale item (4+ stale of 6 trips the budget without it).
    expected = {r.uid for r, a, c, s in zip(fleet, approved, changed, stale, strict=True) if a and not c and s}
    assert {d.resource.uid for d in deleted} == (set() if expired else expected)


# --- choosing items, and the checks of a run's param ---------------------------------------------------


def record(r: GceInstance | K8sObject, target: str, fingerprint: str | None = None) -> dict[str, object]:
    return {
        "target": target, "scope": r.scope, "uid": r.uid, "name": r.name, "resource_kind": r.kind,
        "group": r.labels.get("iterion.io/run-id", ""),
        **({"fingerprint": fingerprint_of(r) if fingerprint is None else fingerprint} if fingerprint != "" else {}),
    }  # fmt: skip


def test_choose_all_or_named_and_a_run_whole() -> None:
    objs = k8s_runs("a", "b")
    rows = [record(o, "k8s") for o in objs]
    assert len(choose(rows, None, "k8s")) == 8
    picked = choose(rows, [objs[1].name], "k8s")  # a Secret of run a: the whole run
    assert {i.uid for i in picked} == {o.uid for o in objs[:4]}
    assert {i.uid for i in choose(rows, ["b"], "k8s")} == {o.uid for o in objs[4:]}  # by run id
    with pytest.raises(ValueError, match="not a held candidate"):
        choose(rows, ["nope"], "k8s")


def test_choose_refuses_a_candidate_recorded_without_its_state() -> None:
    vm = inst(hb_age=D)
    rows = [record(vm, "gce", fingerprint="")]
    assert choose(rows, None, "gce") == []
    with pytest.raises(ValueError, match="labelFingerprint"):
        choose(rows, [vm.name], "gce")


def test_param_problems_name_what_was_expected() -> None:
    approval = approve(inst())
    assert "no approval 'x'" in str(problem(None, "x", "reaper_gce_enforcement", "gce", NOW))
    assert "expected an approval made from a sweep of this DAG, reaper_k8s_enforcement" in str(
        problem(approval, "apr-1", "reaper_k8s_enforcement", "k8s", NOW)
    )
    assert "expired" in str(problem(approval, "apr-1", "reaper_gce_enforcement", "gce", NOW + 5 * H))
    assert problem(approval, "apr-1", "reaper_gce_enforcement", "gce", NOW) is None
    used = msgspec.convert({**msgspec.to_builtins(approval), "used_by": {"dag_id": "d", "run_id": "r1",
                            "execution": 0, "lease": "t"}}, Approval)  # fmt: skip
    assert used_elsewhere(used, "d", "r1", 0) is None  # a retried task of the same execution
    assert "was used by d/r1 (execution 0)" in str(used_elsewhere(used, "d", "r2", 0))
    assert "was used by" in str(used_elsewhere(used, "d", "r1", 1))  # a cleared run: another execution


@pytest.mark.parametrize("expiry", [timedelta(seconds=30), timedelta(days=8)])
def test_expiry_is_bounded(expiry: timedelta) -> None:
    with pytest.raises(ValueError, match="expires_in: expected between 1 min and 7 d"):
        check_expiry(expiry)


def test_a_vm_started_since_its_review_is_held_though_its_labels_did_not_change() -> None:
    # Review finding: reviewed TERMINATED (held by the cap), started after the review without a label write: the
    # approval run found it by heartbeat_stale and deleted a booting manager.
    config = settings(max_deletions_per_sweep=2)
    fleet = [
        fp(inst(status="TERMINATED", stop_age=40 * D, hb_age=41 * D, created_age=60 * D), f"fp-{i}") for i in range(5)
    ]
    review = plan(fleet, config=config)
    assert review.capped and {r for _, r in actions(review).values()} == {"max_deletions_exceeded"}
    approval = approve(*fleet)
    started = msgspec.structs.replace(fleet[0], status="RUNNING")
    p = plan([started, *fleet[1:]], config=config, approval=approval)
    assert actions(p)[fleet[0].uid] == ("report", "approval_changed")
    assert sum(a == "delete" for a, _ in actions(p).values()) == 4


def candidate(scope: str, uid: str, name: str, state: str, group: str = "") -> dict[str, object]:
    return {"target": "gce", "scope": scope, "uid": uid, "name": name, "fingerprint": state, "group": group,
            "rule": "heartbeat_stale"}  # fmt: skip


def test_a_name_found_in_several_scopes_approves_none_of_them_a_scope_and_name_one() -> None:
    # Review finding: --item vm-1 approved p1/vm-1 and its twin p2/vm-1, lifting p2's hold too.
    held = [candidate("p1", "1", "vm-1", "a"), candidate("p2", "2", "vm-1", "b")]
    with pytest.raises(ValueError, match=r"names several held candidates \(p1/1, p2/2\); expected scope/uid"):
        choose(held, ["vm-1"], "gce")
    assert [(i.scope, i.uid) for i in choose(held, ["p2/vm-1"], "gce")] == [("p2", "2")]
    assert [(i.scope, i.uid, i.rule) for i in choose(held, ["p1/1"], "gce")] == [("p1", "1", "heartbeat_stale")]


def test_an_item_posted_in_a_state_it_is_no_longer_listed_in_is_refused() -> None:
    # Review finding: the page showed fp-7, a newer execution listed fp-7-AFTER, and the approval pinned that.
    held = [candidate("p2", "7", "runner-7", "fp-7-AFTER")]
    with pytest.raises(ValueError, match="listed since in another state"):
        choose(held, ["p2/7@fp-7"], "gce")
    assert [i.fingerprint for i in choose(held, ["p2/7@fp-7-AFTER"], "gce")] == ["fp-7-AFTER"]


def held_records(p: Plan, uids: set[str]) -> list[dict[str, object]]:
    """The decision records a sweep page lists for these resources, as evaluate_policy writes them."""
    return [
        {"target": d.target, "scope": d.scope, "uid": d.resource.uid, "name": d.resource.name,
         "resource_kind": d.resource.kind, "fingerprint": fingerprint_of(d.resource), "rule": d.rule,
         "reason": d.reason, "evidence": d.evidence, "group": d.resource.labels.get("iterion.io/run-id", "")}
        for d in p.decisions
        if d.resource.uid in uids
    ]  # fmt: skip


@pytest.mark.parametrize("case", ["terminated_rule_off", "stopped_within_grace"])
def test_a_vm_reviewed_stopped_under_heartbeat_stale_and_started_since_is_held(case: str) -> None:
    # Third review: the rule pin missed a VM found by heartbeat_stale while TERMINATED (the terminated rule off, or
    # stopped within its grace), then started: same rule, same labels; only its status class tells.
    config = settings(rules={"terminated": "off"}) if case == "terminated_rule_off" else settings()
    stop_age = 40 * D if case == "terminated_rule_off" else 5 * M
    stopped = fp(inst(status="TERMINATED", stop_age=stop_age, hb_age=D, created_age=3 * D), "fp-t")
    rest = [fp(inst(hb_age=D), f"fp-{i}") for i in range(3)] + [fp(inst(hb_age=M), "fp-fresh")]
    review = plan([stopped, *rest], config=config)
    assert actions(review)[stopped.uid] == ("report", "budget_exceeded")
    items = choose(held_records(review, {stopped.uid, rest[0].uid}), None, "gce")
    approval = Approval("apr-1", "gce", "reaper_gce_enforcement", "s-1", "alice", "inc", NOW - H, NOW + 4 * H, items)
    started = msgspec.structs.replace(stopped, status="RUNNING")
    got = actions(plan([started, *rest], config=config, approval=approval))
    assert got[stopped.uid] == ("report", "approval_changed")
    assert got[rest[0].uid] == ("delete", "heartbeat_stale")
    assert actions(plan([stopped, *rest], config=config, approval=approval))[stopped.uid][0] == "delete"


@pytest.mark.parametrize("reviewed_status", ["TERMINATED", "RUNNING"])
def test_a_vm_started_and_stopped_again_since_its_review_is_held(reviewed_status: str) -> None:
    # Fourth review: a VM someone started, used and stopped again after the review (a TERMINATED one back to
    # TERMINATED, found by heartbeat_stale with the terminated rule off; a RUNNING one stopped and started) writes
    # no label and keeps its status class and rule; only its lastStopTimestamp moved, which its state carries.
    config = settings(rules={"terminated": "off"}) if reviewed_status == "TERMINATED" else settings()
    vm = fp(inst(status=reviewed_status, stop_age=2 * D, hb_age=2 * D, created_age=3 * D), "fp-t")
    rest = [fp(inst(hb_age=D), f"fp-{i}") for i in range(3)] + [fp(inst(hb_age=M), "fp-fresh")]
    review = plan([vm, *rest], config=config)
    assert actions(review)[vm.uid] == ("report", "budget_exceeded")
    items = choose(held_records(review, {vm.uid, rest[0].uid}), None, "gce")
    assert {i.fingerprint for i in items if i.uid == vm.uid} == {f"fp-t;stopped={vm.last_stop:.3f}"}
    approval = Approval("apr-1", "gce", "reaper_gce_enforcement", "s-1", "alice", "inc", NOW - H, NOW + 4 * H, items)
    again = msgspec.structs.replace(vm, last_stop=NOW - 20 * M)
    got = actions(plan([again, *rest], config=config, approval=approval))
    assert got[vm.uid] == ("report", "approval_changed")
    assert got[rest[0].uid] == ("delete", "heartbeat_stale")
    assert actions(plan([vm, *rest], config=config, approval=approval))[vm.uid][0] == "delete"


def test_a_vm_suspended_at_its_review_and_resumed_since_is_held() -> None:
    # Fourth review: SUSPENDED and RUNNING were one status class, so a VM resumed since its review (no label
    # written) passed; the approved status is compared exactly now.
    vm = fp(inst(status="SUSPENDED", hb_age=2 * D, created_age=3 * D), "fp-s")
    rest = [fp(inst(hb_age=D), f"fp-{i}") for i in range(3)] + [fp(inst(hb_age=M), "fp-fresh")]
    review = plan([vm, *rest])
    assert actions(review)[vm.uid] == ("report", "budget_exceeded")
    items = choose(held_records(review, {vm.uid, rest[0].uid}), None, "gce")
    approval = Approval("apr-1", "gce", "reaper_gce_enforcement", "s-1", "alice", "inc", NOW - H, NOW + 4 * H, items)
    resumed = msgspec.structs.replace(vm, status="RUNNING")
    assert actions(plan([resumed, *rest], approval=approval))[vm.uid] == ("report", "approval_changed")
    assert actions(plan([vm, *rest], approval=approval))[vm.uid][0] == "delete"
    # Resumed, used and suspended again: SUSPENDED as reviewed; only lastSuspendedTimestamp moved.
    before = fp(msgspec.structs.replace(vm, last_suspended=NOW - 2 * D), "fp-s")
    review = plan([before, *rest])
    items = choose(held_records(review, {vm.uid, rest[0].uid}), None, "gce")
    assert {i.fingerprint for i in items if i.uid == vm.uid} == {f"fp-s;suspended={NOW - 2 * D:.3f}"}
    approval = Approval("apr-2", "gce", "reaper_gce_enforcement", "s-1", "alice", "inc", NOW - H, NOW + 4 * H, items)
    again = msgspec.structs.replace(before, last_suspended=NOW - 20 * M)
    assert actions(plan([again, *rest], approval=approval))[vm.uid] == ("report", "approval_changed")
    assert actions(plan([before, *rest], approval=approval))[vm.uid][0] == "delete"


def test_a_run_posted_with_states_is_approved_only_with_every_object_in_the_state_reviewed() -> None:
    # Third review: the run's other objects were approved in whatever state the newest execution listed them.
    objects = [fp(o, f"rv-{o.uid}") for o in sandbox("r1")]
    newcomer = fp(msgspec.structs.replace(sandbox("r1")[1], uid="new-secret"), "rv-new")
    review = plan(objects, evidence=ORPHANS)
    rows = held_records(review, {o.uid for o in objects})
    for row in rows:
        row["target"] = "k8s"
    posted = [f"{o.scope}/{o.uid}@{o.resource_version}" for o in objects]
    assert len(choose(rows, posted, "k8s")) == 4
    newer = [*rows, {**rows[1], "uid": newcomer.uid, "fingerprint": "rv-new"}]
    with pytest.raises(ValueError, match="not among the reviewed items"):
        choose(newer, posted, "k8s")
    with pytest.raises(ValueError, match="not among the reviewed items"):
        choose(rows, posted[:1], "k8s")
    assert len(choose(rows, [objects[0].uid], "k8s")) == 4  # the CLI, naming without a state: the run whole
    with pytest.raises(ValueError, match="a state names one resource"):
        choose(rows, [f"{objects[0].scope}/r1@anything"], "k8s")


def test_an_approval_recorded_before_items_carried_their_rule_is_refused_before_it_is_used() -> None:
    old = Approval("apr-1", "gce", "reaper_gce_enforcement", "s-1", "alice", "inc", NOW - H, NOW + H,
                   [ApprovedItem("p1", "1", "fp-1", "vm-1")])  # fmt: skip
    assert "pinned to their rule and status" in str(problem(old, "apr-1", "reaper_gce_enforcement", "gce", NOW))
