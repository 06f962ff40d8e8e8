"""Hypothesis property tests for the invariants of docs/design.md §1, §4, §5 and §6."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from typing import cast

import msgspec
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from reaper.model import (
    Action,
    Evidence,
    GceInstance,
    K8sObject,
    Keyed,
    LeaseState,
    Mode,
    Override,
    Phase,
    Plan,
    StoreState,
    WriterRecord,
)
from reaper.policy import evaluate, gce, liveness
from reaper.policy.k8s import lease_state, run_state, selector_matches
from reaper.records import Verdict, verdict_record
from reaper.vocabulary import Reason
from tests.builders import HB, NOW, D, H, M, settings
from tests.builders import NOW_DT as NOW_DT  # re-exported: bench/plan_digest.py draws its inputs at this time

Q = 4 * H
PHASES = list(Phase)
MODES = ["off", "report", "delete"]
# Biased towards enforcement, permissive budgets and caps near the delete count: the corner where a bug deletes.
phases = st.sampled_from([*PHASES] + [Phase.ENFORCEMENT] * 4)
modes = st.sampled_from(["delete"] * 4 + ["report", "off"])
RULES = ("terminated", "heartbeat_stale", "unlabeled_age", "sandbox_orphan")
PROPS = hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Ages cluster around the boundaries that matter: quarantine, skew, grace, max age, min age.
ages = st.one_of(
    st.sampled_from([0, 1, 5 * M, 10 * M, Q - 1, Q, Q + 1, 3 * D, 3 * D + 1, -5 * M, -5 * M - 1, -D]),
    st.integers(-2 * D, 10 * D),
)


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws: ``integers(0, n) == 0`` is true far more often, hypothesis favours bounds."""
    return st.sampled_from([False] * (n - 1) + [True])


@st.composite
def instances(draw) -> GceInstance:
    labels = {"ci_ephemeral": draw(st.sampled_from(["true", "true", "true", "false"]))}
    hb = draw(st.one_of(st.none(), ages.map(lambda a: str(int(NOW - a))), st.sampled_from(["", "x", "-1", "1.5"])))
    if hb is not None:
        labels[HB] = hb
    if draw(one_in(10)):
        labels["reaper_keep"] = "true"
    if draw(one_in(6)):  # a heartbeat under another name: a renamed label, a second fleet's
        labels["runner_heartbeat"] = draw(ages.map(lambda a: str(int(NOW - a))))
    return GceInstance(
        project=draw(st.sampled_from(["p1", "p2", "p3"])),
        zone="z",
        name=f"vm-{draw(st.uuids())}",
        id=str(draw(st.integers(1, 10**18))),
        status=draw(st.sampled_from(["RUNNING", "TERMINATED", "STOPPING", "PROVISIONING", "SUSPENDED"])),
        labels=labels,
        created=NOW - draw(ages),
        last_stop=draw(st.one_of(st.none(), ages.map(lambda a: NOW - a))),
    )


@st.composite
def beating_elsewhere(draw) -> GceInstance:
    """A VM the configured label calls dead or unlabeled and old, a beat under another name may call alive."""
    instance = draw(instances())
    configured = draw(st.sampled_from([None, "x", str(int(NOW - 2 * D))]))
    labels = {k: v for k, v in instance.labels.items() if k != HB} | ({HB: configured} if configured else {})
    labels["runner_heartbeat"] = str(int(NOW - draw(st.integers(-10 * M, 5 * H))))
    created = NOW - draw(st.integers(3 * D + 1, 10 * D))
    return msgspec.structs.replace(instance, labels=labels, created=created, project="p1")


def instances_fresh(project: str) -> GceInstance:
    """A running VM of ``project`` that stamped the configured label a minute ago."""
    labels = {"ci_ephemeral": "true", HB: str(int(NOW - 60))}
    return GceInstance(project, "z", f"witness-{project}", f"9{len(project)}{project[-1]}", "RUNNING", labels, NOW - H)


writer_health = st.one_of(
    st.none(),
    st.lists(
        st.builds(
            WriterRecord,
            manager=st.sampled_from(["m1", "m2"]),
            project=st.sampled_from(["p1", "p2", "p3"]),
            last_pass=ages.map(lambda a: NOW - a),
            failing=st.booleans(),
        ),
        max_size=4,
    ),
)


@st.composite
def k8s_fleets(draw) -> tuple[list[K8sObject], Evidence]:
    """Runs with per-run lease, store and step states drawn directly, so that deletes are common."""
    old = st.one_of(ages, st.integers(5 * M, 3 * H), st.integers(5 * M, 3 * H))
    runs = [f"r{i}" for i in range(draw(st.integers(0, 8)))]
    objects: list[K8sObject] = []
    lease_known: dict[str, float | None] = {}
    run_known: dict[str, str] = {}
    step_known: dict[str, tuple[str, bool]] = {}
    lease_failed, run_failed = set(), set()
    run: str | None  # a run's id here; None below, for objects of no run
    for run in runs:
        lease = draw(st.sampled_from(["held", "expired", "absent", "absent", "absent", "failed"]))
        if lease == "held":
            lease_known[run] = draw(st.one_of(st.none(), st.integers(1, 600).map(lambda s: NOW + s)))
        elif lease == "expired":
            lease_known[run] = NOW - draw(st.integers(0, 600))
        elif lease == "failed":
            lease_failed.add(run)
        store = draw(st.sampled_from(["succeeded", "failed", "cancelled", "running", "missing", "missing", "error"]))
        if store == "error":
            run_failed.add(run)
        elif store != "missing":
            run_known[run] = store
        step = draw(st.one_of(st.none(), st.tuples(st.sampled_from(["running", "succeeded", "failed"]), st.booleans())))
        if step is not None:
            step_known[f"{run}/s/1"] = step
    for run in [*runs, None]:
        for kind in draw(st.lists(st.sampled_from(["Pod", "Secret", "NetworkPolicy"]), min_size=1, max_size=4)):
            labels = {"iterion.io/managed": "true"}
            if run:
                labels["iterion.io/run-id"] = run
            if kind == "Pod" and draw(st.booleans()):
                labels.update({"iterion.io/step": "s", "iterion.io/attempt": "1"})
            if draw(one_in(30)):
                labels["reaper.io/keep"] = "true"
            sidecar = draw(st.sampled_from(["results-egress"] * 3 + ["results-uploader"]))  # one renamed
            containers = {"sandbox": draw(st.booleans()), sidecar: draw(st.booleans())} if kind == "Pod" else {}
            if kind == "Pod" and draw(st.booleans()):  # a Pod of one container has no sidecar
                del containers[sidecar]
            objects.append(
                K8sObject(
                    kind=kind,
                    cluster=draw(st.sampled_from(["c1", "c1", "c2"])),
                    namespace=draw(st.sampled_from(["ci"] * 7 + ["kube-system"])),
                    name=f"{kind}-{len(objects)}",  # unique: hypothesis draws the same uuid often
                    uid=f"uid-{len(objects)}",
                    labels=labels,
                    created=NOW - draw(old),
                    containers=containers,
                    deleting=draw(one_in(15)),
                )
            )
            if draw(one_in(100)):
                objects.append(objects[-1])  # listed twice: pages moved under the listing
    if draw(st.booleans()):  # half the fleets share Secrets and policies across runs; they rarely delete
        objects = [wire(o, objects, runs, draw) for o in objects]

    def source(known: dict, failed: set) -> Keyed | None:
        shape = draw(st.sampled_from(["complete"] * 6 + ["partial", "down"]))
        if shape == "down":
            return None
        return Keyed(known=known, failed=frozenset(failed), complete=shape == "complete")

    evidence = Evidence(
        leases=source(lease_known, lease_failed),
        runs=source(run_known, run_failed),
        steps=source(step_known, set()),
    )
    return objects, evidence


def wire(obj: K8sObject, objects: list[K8sObject], runs: list[str], draw) -> K8sObject:
    """Some Pods mount Secrets (their run's or another's); NetworkPolicies select their own run's Pods,
    other runs' Pods, every step Pod or the whole namespace."""
    secrets = sorted({o.name for o in objects if o.kind == "Secret"})
    if obj.kind == "Pod" and secrets and draw(st.booleans()):
        return msgspec.structs.replace(obj, uses=tuple(draw(st.lists(st.sampled_from(secrets), max_size=2))))
    if obj.kind == "NetworkPolicy":
        own = obj.labels.get("iterion.io/run-id") or ""
        selectors = {
            "own": (("iterion.io/managed", "In", ("true",)), ("iterion.io/run-id", "In", (own,))),
            "runs": (("iterion.io/managed", "In", ("true",)), ("iterion.io/run-id", "In", tuple(runs))),
            "steps": (("iterion.io/step", "Exists", ()),),
            "namespace": (),
        }
        return msgspec.structs.replace(obj, selects=selectors[draw(st.sampled_from(sorted(selectors)))])
    return obj


configs = st.builds(
    lambda modes, cap, min_stale, frac, step: settings(
        rules=dict(zip(RULES, modes, strict=True)),
        max_deletions_per_sweep=cap,
        budget={"min_stale": min_stale, "max_stale_fraction": frac},
        k8s={"step_store": step},
    ),
    st.tuples(*[modes for _ in RULES]),
    st.one_of(st.just(500), st.integers(0, 4)),
    st.integers(0, 4),
    st.sampled_from([1.0, 1.0, 0.5, 0.25, 0.0]),
    st.sampled_from(["none", "postgres"]),
)


def run(resources, evidence, config, phase) -> Plan:
    return evaluate(resources, evidence, config, phase, NOW_DT)


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=30), writer_health, configs, phases)
def test_gce_fresh_or_future_heartbeat_is_only_ever_deleted_as_terminated(fleet, writers, config, phase) -> None:
    plan = run(fleet, Evidence(writer_health=writers), config, phase)
    for d in plan.deletes():
        raw = d.resource.labels.get(HB)
        if raw is not None and raw.isascii() and raw.isdigit() and NOW - int(raw) <= Q:
            assert d.rule == "terminated" and d.resource.status == "TERMINATED"


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=30), writer_health, configs, phases)
def test_gce_opt_out_and_held_projects_never_delete_heartbeat(fleet, writers, config, phase) -> None:
    plan = run(fleet, Evidence(writer_health=writers), config, phase)
    held = {v.scope for v in plan.scopes if v.target == "gce" and set(v.holds) - {"protected_scope"}}
    for d in plan.deletes():
        assert d.resource.labels.get("reaper_keep") != "true"
        if d.rule == "heartbeat_stale":
            assert d.resource.project not in held


def _fresh(raw: str | None, inst: GceInstance, config) -> bool:
    """A label value that is a fresh valid heartbeat, as docs/design.md §4 defines it, read here without the
    policy's code."""
    if raw is None or not (raw.isascii() and raw.isdigit()):
        return False
    skew = config.gce.clock_skew.total_seconds()
    return NOW - config.gce.quarantine.total_seconds() <= int(raw) <= NOW + skew and int(raw) >= inst.created - skew


def _stamped(inst: GceInstance, config) -> bool:
    """A fresh valid heartbeat under the configured label."""
    return _fresh(inst.labels.get(HB), inst, config)


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(st.one_of(instances(), beating_elsewhere()), max_size=8), configs)
def test_gce_a_fresh_unix_time_under_any_label_is_only_ever_deleted_as_terminated(fleet, config) -> None:
    """heartbeat_elsewhere: a dead owner writes no label, so a fresh beat under any name is something alive.

    Every project is drawn healthy, with a VM stamping the configured label: where the label's absence and the
    heartbeat's age are evidence, which is where the rule has something to decide (rare among free draws)."""
    witnesses = [instances_fresh(p) for p in ("p1", "p2", "p3")]
    healthy = [WriterRecord(f"m-{p}", p, NOW - 60, False) for p in ("p1", "p2", "p3")]
    plan = run([*fleet, *witnesses], Evidence(writer_health=healthy), config, Phase.ENFORCEMENT)
    for d in plan.deletes():
        if any(_fresh(v, cast(GceInstance, d.resource), config) for v in d.resource.labels.values()):
            assert d.rule == "terminated" and d.resource.status == "TERMINATED", d


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=8), writer_health, configs, phases)  # small: projects with no fresh beat
def test_gce_a_vm_without_the_label_goes_only_where_a_vm_not_opted_out_carries_a_fresh_beat(
    fleet, writers, config, phase
) -> None:
    """heartbeat_label_unseen: the label's absence is evidence only where a manager is seen stamping it now."""
    plan = run(fleet, Evidence(writer_health=writers), config, phase)
    for d in plan.deletes():
        if d.rule == "unlabeled_age":
            witnesses = [
                i
                for i in fleet
                if i.project == d.resource.project
                and i.labels.get("ci_ephemeral") == "true"
                and "reaper_keep" not in i.labels
                and _stamped(i, config)
            ]
            assert witnesses, d


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@hsettings(PROPS, max_examples=400)  # the case is rare among the fleets drawn: a cluster with no step Pod
@given(k8s_fleets(), configs.filter(lambda c: c.k8s.step_store != "none"))
def test_k8s_a_cluster_whose_pods_carry_no_step_label_deletes_no_run_with_a_pod(fleet, config) -> None:
    """step_labels_unseen, per cluster: with a step store, a run with a Pod goes only from a cluster where a
    listed Pod carries a step or attempt label."""
    objects, evidence = fleet
    plan = run(objects, evidence, config, Phase.ENFORCEMENT)
    step_keys = ("iterion.io/step", "iterion.io/attempt")
    labelled = {o.cluster for o in objects if o.kind == "Pod" and any(k in o.labels for k in step_keys)}
    for d in plan.deletes():
        run_key, cluster = d.resource.labels.get("iterion.io/run-id"), d.resource.cluster
        has_pod = any(
            o.kind == "Pod" and o.cluster == cluster and o.labels.get("iterion.io/run-id") == run_key for o in objects
        )
        assert cluster in labelled or not has_pod, d


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(k8s_fleets(), configs, phases)
def test_k8s_never_deletes_without_positive_evidence(fleet, config, phase) -> None:
    objects, evidence = fleet
    plan = run(objects, evidence, config, phase)
    for d in plan.deletes():
        obj = d.resource
        run_key = obj.labels.get("iterion.io/run-id")
        assert run_key, "an object without a run label was deleted"
        assert lease_state(run_key, evidence.leases, NOW, 30) is LeaseState.ABSENT
        assert run_state(run_key, evidence.runs, config.k8s.terminal_statuses)[0] in (
            StoreState.TERMINAL,
            StoreState.NOT_FOUND,
        )
        assert not obj.deleting
        siblings = [o for o in objects if o.labels.get("iterion.io/run-id") == run_key and o.cluster == obj.cluster]
        assert all(o.labels.get("reaper.io/keep") != "true" and o.namespace != "kube-system" for o in siblings)
        assert not any(o.deleting for o in siblings if o.kind == "Pod")
        assert all(NOW - o.created >= 5 * M for o in siblings)
        assert not any(o.containers.get("results-egress") is False for o in siblings)
        # In a Pod of several containers and none named as the configured sidecar, any still running may be it.
        unnamed = [o for o in siblings if len(o.containers) > 1 and "results-egress" not in o.containers]
        assert not any(done is False for o in unnamed for done in o.containers.values())
        for sibling in siblings:  # no Pod outside the run uses its Secrets or is isolated by its policy
            strangers = [
                o
                for o in objects
                if o.kind == "Pod" and o.cluster == obj.cluster and o.namespace == sibling.namespace
                if o.labels.get("iterion.io/run-id") != run_key
            ]
            assert not (sibling.kind == "Secret" and any(sibling.name in o.uses for o in strangers))
            if sibling.kind == "NetworkPolicy" and sibling.selects is not None:
                assert not any(selector_matches(sibling.selects, o.labels) for o in strangers)


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(k8s_fleets(), configs, phases)
def test_k8s_every_object_of_a_run_gets_the_same_action(fleet, config, phase) -> None:
    """The per-object bug: an opted-out Pod kept while its Secrets were deleted. Only an object already
    being deleted may differ from its run, and only by being kept."""
    objects, evidence = fleet
    actions: dict[tuple[str, str], set[Action]] = {}
    for d in run(objects, evidence, config, phase).decisions:
        run_key = d.resource.labels.get("iterion.io/run-id")
        if run_key and not d.resource.deleting:
            actions.setdefault((d.resource.cluster, run_key), set()).add(d.action)
    assert all(len(found) == 1 for found in actions.values()), actions


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=20), k8s_fleets(), writer_health, configs, phases, st.data())
def test_a_plan_never_holds_two_deletes_for_one_uid(fleet, k8s, writers, config, phase, data) -> None:
    objects, evidence = k8s
    fleet = fleet + data.draw(st.lists(st.sampled_from(fleet), max_size=3)) if fleet else fleet
    ev = Evidence(writer_health=writers, leases=evidence.leases, runs=evidence.runs, steps=evidence.steps)
    uids = [(d.target, d.scope, _uid_of(d.resource)) for d in run(fleet + objects, ev, config, phase).deletes()]
    assert len(uids) == len(set(uids))


def _uid_of(resource) -> str:
    return resource.id if isinstance(resource, GceInstance) else resource.uid


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=30), k8s_fleets(), writer_health, configs, phases)
def test_budget_tripped_scope_has_no_deletes_and_cap_is_respected(fleet, k8s, writers, config, phase) -> None:
    objects, evidence = k8s
    plan = run(
        fleet + objects, Evidence(writer_health=writers, leases=evidence.leases, runs=evidence.runs), config, phase
    )
    tripped = {(v.target, v.scope) for v in plan.scopes if "budget_exceeded" in v.holds}
    for d in plan.deletes():
        if (d.target, d.scope) in tripped:
            assert d.target == "gce" and d.rule != "heartbeat_stale"
    for target in ("gce", "k8s"):
        assert sum(1 for d in plan.deletes() if d.target == target) <= config.max_deletions_per_sweep


SCOPES = [("gce", p) for p in ("p1", "p2", "p3")] + [("k8s", c) for c in ("c1", "c2")]


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(
    st.lists(instances(), max_size=30),
    k8s_fleets(),
    writer_health,
    configs,
    phases,
    st.sets(st.sampled_from(SCOPES), min_size=1, max_size=len(SCOPES) - 1),
)
def test_a_budget_override_changes_nothing_in_the_scopes_it_does_not_name(
    fleet, k8s, writers, config, phase, named
) -> None:
    objects, evidence = k8s
    ev = Evidence(writer_health=writers, leases=evidence.leases, runs=evidence.runs)
    held = run(fleet + objects, ev, config, phase)
    lifted = evaluate(fleet + objects, ev, config, phase, NOW_DT, Override("INC-42", "sre", frozenset(named)))

    def outside(plan: Plan) -> tuple[dict, set]:
        verdicts = {(v.target, v.scope): v for v in plan.scopes if (v.target, v.scope) not in named}
        deletes = {(d.target, d.scope, _uid_of(d.resource)) for d in plan.deletes() if (d.target, d.scope) not in named}
        return verdicts, deletes

    (held_verdicts, held_deletes), (lifted_verdicts, lifted_deletes) = outside(held), outside(lifted)
    assert lifted_verdicts == held_verdicts  # holds, overridden and details alike: a budget hold there stands
    assert lifted_deletes <= held_deletes  # fewer only when the lifted scopes take the sweep over the cap


def _lower(config, rule: str, mode: str):
    data = config.model_dump()
    data["rules"] = {r: str(m) for r, m in data["rules"].items()}
    data["rules"][rule] = mode
    for section in ("gce", "k8s"):
        for key, value in list(data[section].items()):
            if hasattr(value, "total_seconds"):
                data[section][key] = f"{value.total_seconds()}s"
        data[section]["opt_out_label"] = "=".join(data[section]["opt_out_label"])
    return settings(**data)


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(
    st.lists(instances(), max_size=25),
    k8s_fleets(),
    writer_health,
    configs,
    phases,
    phases,
    st.sampled_from(RULES),
    st.sampled_from(MODES),
)
def test_lowering_a_mode_or_the_phase_never_adds_a_delete(fleet, k8s, writers, config, p1, p2, rule, mode) -> None:
    objects, evidence = k8s
    ev = Evidence(writer_health=writers, leases=evidence.leases, runs=evidence.runs, steps=evidence.steps)
    high_phase, low_phase = sorted([p1, p2], key=PHASES.index, reverse=True)
    low_config = config
    if Mode[mode.upper()] < getattr(config.rules, rule):
        low_config = _lower(config, rule, mode)
    high = run(fleet + objects, ev, config, high_phase)
    low = run(fleet + objects, ev, low_config, low_phase)
    high_actions = {(d.target, _uid(d)): d for d in high.decisions}
    for d in low.deletes():
        h = high_actions[(d.target, _uid(d))]
        assert h.action is Action.DELETE or h.reason == "max_deletions_exceeded"


def _uid(d) -> str:
    return d.resource.name  # generated from UUIDs: unique, unlike the drawn ids


def _summary(plan: Plan) -> tuple:
    decisions = sorted((d.target, _uid(d), d.action.value, d.rule or "", d.reason) for d in plan.decisions)
    scopes = sorted((v.target, v.scope, v.holds, v.overridden) for v in plan.scopes)
    return decisions, scopes, plan.capped


@pytest.mark.slow  # seconds of examples: `make test` runs it, `make check` does not
@PROPS
@given(st.lists(instances(), max_size=25), k8s_fleets(), writer_health, configs, phases, st.randoms())
def test_result_does_not_depend_on_input_order(fleet, k8s, writers, config, phase, rnd: random.Random) -> None:
    objects, evidence = k8s
    ev = Evidence(writer_health=writers, leases=evidence.leases, runs=evidence.runs, steps=evidence.steps)
    resources = fleet + objects
    shuffled = list(resources)
    rnd.shuffle(shuffled)
    assert _summary(run(resources, ev, config, phase)) == _summary(run(shuffled, ev, config, phase))


@PROPS
@given(
    st.sampled_from(["own", "runs", "steps", "namespace"]),
    st.lists(
        st.tuples(
            st.sampled_from(["ci", "other"]),
            st.sampled_from([None, "r2"]),
            st.booleans(),
            st.lists(st.sampled_from(["r1-files", "r1-ca", "r2-files"]), max_size=2),
        ),
        max_size=4,
    ),
)
def test_an_orphaned_run_is_deleted_exactly_when_no_pod_outside_it_uses_it(selector, strangers) -> None:
    """Reaps the orphan unless a Pod outside the run, in its namespace, mounts one of its Secrets or is
    selected by its NetworkPolicy; the oracle spells out each selector by hand."""
    managed = {"iterion.io/managed": "true"}
    selects = {
        "own": (("iterion.io/managed", "In", ("true",)), ("iterion.io/run-id", "In", ("r1",))),
        "runs": (("iterion.io/managed", "In", ("true",)), ("iterion.io/run-id", "In", ("r1", "r2"))),
        "steps": (("iterion.io/step", "Exists", ()),),
        "namespace": (),
    }[selector]
    members = [
        K8sObject("Pod", "c1", "ci", "sandbox-r1", "u-pod", {**managed, "iterion.io/run-id": "r1"}, NOW - H),
        K8sObject("Secret", "c1", "ci", "r1-files", "u-files", {**managed, "iterion.io/run-id": "r1"}, NOW - H),
        K8sObject("Secret", "c1", "ci", "r1-ca", "u-ca", {**managed, "iterion.io/run-id": "r1"}, NOW - H),
        K8sObject(
            "NetworkPolicy", "c1", "ci", "r1", "u-np", {**managed, "iterion.io/run-id": "r1"}, NOW - H, selects=selects
        ),
    ]
    pods = []
    for i, (namespace, run_key, step, uses) in enumerate(strangers):
        labels = {**managed, **({"iterion.io/run-id": run_key} if run_key else {})}
        labels |= {"iterion.io/step": "s"} if step else {}
        pods.append(K8sObject("Pod", "c1", namespace, f"stranger-{i}", f"u-{i}", labels, NOW - H, uses=tuple(uses)))

    def isolates(pod: K8sObject) -> bool:
        return {
            "own": False,  # strangers never carry run r1's label
            "runs": pod.labels.get("iterion.io/run-id") in ("r1", "r2"),
            "steps": "iterion.io/step" in pod.labels,
            "namespace": True,
        }[selector]

    near = [pod for pod in pods if pod.namespace == "ci"]
    used = any({"r1-files", "r1-ca"} & set(pod.uses) for pod in near) or any(isolates(pod) for pod in near)
    evidence = Evidence(
        leases=Keyed(known={"r2": None}, complete=True),
        runs=Keyed(known={"r1": "failed", "r2": "running"}, complete=True),
    )
    config = settings(budget={"min_stale": 100, "max_stale_fraction": 1.0})
    got = {
        (d.action, d.reason)
        for d in run([*members, *pods], evidence, config, Phase.ENFORCEMENT).decisions
        if d.resource in members
    }
    assert got == ({(Action.REPORT, "in_use_outside_run")} if used else {(Action.DELETE, "sandbox_orphan")})


@PROPS
@given(st.lists(instances(), max_size=30), k8s_fleets(), writer_health, configs)
def test_a_summary_records_each_verdict_as_the_ledger_always_held_it(fleet, k8s, writers, config) -> None:
    """The typed verdict (reaper.records.Verdict) writes the document the policy's dict did, key for key in order,
    and reads back equal: ledger documents unchanged by the type."""
    objects, evidence = k8s
    plan = run([*fleet, *objects], msgspec.structs.replace(evidence, writer_health=writers), config, Phase.ENFORCEMENT)
    for v in plan.scopes:
        record = verdict_record(v)
        written = msgspec.to_builtins(record)
        assert list(written.items()) == list(msgspec.to_builtins(v.as_dict()).items())
        assert msgspec.convert(written, Verdict) == record


@PROPS
@given(st.lists(instances(), max_size=30), k8s_fleets(), writer_health, configs, phases)
def test_every_reason_the_policy_gives_is_a_member_of_the_vocabulary(fleet, k8s, writers, config, phase) -> None:
    # A member, not merely an equal string: the report has its sentence (reaper.vocabulary).
    objects, evidence = k8s
    evidence = msgspec.structs.replace(evidence, writer_health=writers)
    resources = [*fleet, *objects]
    plan = run(resources, evidence, config, phase)
    reasons = [d.reason for d in plan.recorded] + [reason for _, reason, _ in plan.kept]
    reasons += [
        r
        for d in plan.recorded
        for r in (
            *cast(Iterable[str], d.evidence.get("findings", ())),
            *cast(Iterable[str], d.evidence.get("holds", ())),
        )
    ]
    reasons += [h for v in plan.scopes for h in (*v.holds, *v.overridden, *v.blocking)]
    reasons += [reading.reason for _, _, reading in liveness(resources, evidence, config, NOW_DT, plan.scopes)]
    assert {r for r in reasons if type(r) is not Reason} == set()


@PROPS
@given(
    st.lists(instances(), max_size=30), configs, st.one_of(st.none(), st.integers(0, 900).map(NOW.__add__)), st.data()
)
def test_the_first_pass_sets_aside_exactly_what_classify_finds_nothing_on(fleet, config, observed, data) -> None:
    # docs/design.md §4: the first pass decides a fresh or young instance in a few comparisons and never
    # classifies it; _classify must find nothing on it, and something on every other plain one it classifies.
    fleet = [
        msgspec.structs.replace(
            inst,
            group_member=data.draw(one_in(10)),
            labels={**inst.labels, **({"reaper_keep": "false"} if data.draw(one_in(10)) else {})},
        )
        for inst in fleet
    ]
    t = gce._Thresholds(config, NOW, observed)
    for project in gce._first_pass(fleet, config, t).values():
        for inst in [*project.fresh, *project.young]:
            candidates, _, beat = gce._classify(inst, t, defaultdict(int))
            assert candidates == [] and (beat is not None) == (inst in project.fresh), inst
        assert project.beats == [int(inst.labels[HB]) for inst in project.fresh]
        for inst in project.rare:
            plain = inst.status != "TERMINATED" and "reaper_keep" not in inst.labels and not inst.group_member
            if plain and inst.created <= t.future_after:
                assert gce._classify(inst, t, defaultdict(int))[0], inst
