"""The fault and race harness, Kubernetes: the world changes at every point between the listing and the delete.

The real inventory, evidence stores (NATS leases, the MongoDB run store), policy, batching,
``delete_batch`` step, deleter and ledger run against the Kubernetes emulator, as a sweep runs them;
the emulator's request hooks change the world at each point (no monkeypatching of the reaper's
code). For every combination the invariant is asserted: nothing live, changed or opted out is
deleted; every intent has exactly one outcome; a run's Pod goes before its Secrets and
NetworkPolicy, and none of them goes if the Pod's delete failed; the other orphans are reaped.

Residual windows: a lease re-acquired or a run marked active again in the one round trip between
the run's evidence read and its Pod's delete cannot be caught (the lease store and the API server
share no transaction). A run's objects are deleted one after the other: another object of the run
changed or opted out after the run's re-read, while its Pod's delete is on its way, cannot save the
Pod, but the run is read again once the Pod is gone and the rest of it stays. Every change to an
object itself is caught: each delete carries uid and resourceVersion preconditions.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, cast

import pytest
from pymongo import MongoClient

from include.emulators.http import ApiError
from include.emulators.k8s import Cluster
from reaper.config import LedgerConfig, Settings, parse_settings
from reaper.k8s.inventory import list_cluster
from reaper.ledger import Ledger
from reaper.model import K8sObject, Phase
from reaper.policy import evaluate
from reaper.stores.mongo import MongoRunStore
from reaper.stores.nats import NatsLeases
from reaper.sweep.deletes import SendTerms, cut_batches, delete_batch
from reaper.sweep.targets import K8sTarget
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, put_leases, seed_run

IDS = {"dag_id": "reaper_k8s_enforcement", "run_id": "harness", "execution": 0, "lease": "t"}
HOLDER = "reaper_k8s_enforcement/harness#0"
VICTIM = "victim"
ORPHANS = ("orphan-a", "orphan-b")
LIVE = ("live-0", "live-1", "live-2", "live-3")
KINDS = {"pods": "Pod", "secrets": "Secret", "networkpolicies": "NetworkPolicy"}


def config(db: str, **k8s: object) -> Settings:
    return parse_settings(
        {
            "k8s": {
                "clusters": ["c1"],
                "mongo_run_store": {"database": db},
                "delete_rate_per_cluster": 1000.0,
                "delete_concurrency": 1,
                "nats_leases": {"timeout": "1s"},
                **k8s,
            }
        },
        "harness",
    )


class World:
    """The emulated cluster, the runners' leases in NATS, the run store and the ledger in MongoDB."""

    def __init__(self, cluster: Cluster, api, nats_url: str, mongo: MongoClient, db: str, namespaces=()) -> None:
        self.cluster, self.api, self.nats_url, self.mongo, self.db = cluster, api, nats_url, mongo, db
        self.config = config(db, namespaces=list(namespaces))  # named: every list is a namespace's
        self.ledger = Ledger(mongo, LedgerConfig(database=db))
        self.ledger.ensure_indexes()
        for run in (*ORPHANS, VICTIM, *LIVE):
            seed_run(cluster, run)
        asyncio.run(put_leases(nats_url, list(LIVE)))
        mongo[db]["runs"].insert_many(
            [{"_id": r, "status": "failed"} for r in (*ORPHANS, VICTIM)]
            + [{"_id": r, "status": "running"} for r in LIVE]
        )

    def target(self) -> K8sTarget:
        target = K8sTarget(self.config)
        target.api_for = lambda cluster: self.api  # type: ignore[method-assign]  # the test's stub in place of the method
        target.__dict__["_lease_source"] = NatsLeases(self.nats_url, self.config.k8s.nats_leases)
        target.__dict__["runs"] = MongoRunStore(self.mongo, self.config.k8s.mongo_run_store).read
        return target

    def victim(self) -> dict[str, dict[str, object]]:
        """The victim run's objects as the cluster holds them now, by kind."""
        with self.cluster.lock:
            return {
                KINDS[res]: obj
                for (res, _, _), obj in self.cluster.objects.items()
                if obj["metadata"]["labels"].get("iterion.io/run-id") == VICTIM
            }


# --- the mutations: each makes the victim's run live, changed or opted out (or simply gone) ------------


def _relabel(world: World, resource: str, name: str, change: Callable[[dict[str, str]], object]) -> None:
    with world.cluster.lock:
        meta = world.cluster.objects[(resource, "ci", name)]["metadata"]
        labels = dict(meta["labels"])
        change(labels)
        meta["labels"] = labels
        meta["resourceVersion"] = world.cluster._version()


def recreate_pod(world: World) -> None:
    """The Pod's name taken by a new Pod (new uid) of a live run."""
    world.cluster.objects.pop(("pods", "ci", f"sandbox-{VICTIM}"), None)
    world.cluster._sorted.pop("pods", None)
    seed = next(o for o in seed_run(Cluster(), VICTIM) if o["kind"] == "Pod")
    seed["metadata"] = {**seed["metadata"], "uid": "a-new-pod"}
    world.cluster.create("pods", "ci", seed)


def relabel_secret(world: World) -> None:
    _relabel(world, "secrets", f"sandbox-{VICTIM}-files", lambda labels: labels.update({"team": "moved"}))


def opt_out_networkpolicy(world: World) -> None:
    _relabel(world, "networkpolicies", f"sandbox-{VICTIM}", lambda labels: labels.update({"reaper.io/keep": "true"}))


def drop_selector_pod(world: World) -> None:
    _relabel(world, "pods", f"sandbox-{VICTIM}", lambda labels: labels.pop("iterion.io/managed"))


def reacquire_lease(world: World) -> None:
    asyncio.run(put_leases(world.nats_url, [VICTIM]))


def run_active_again(world: World) -> None:
    world.mongo[world.db]["runs"].update_one({"_id": VICTIM}, {"$set": {"status": "running"}})


def vanish(world: World) -> None:
    with world.cluster.lock:
        for key in [k for k in world.cluster.objects if VICTIM in k[2]]:
            world.cluster._remove(key)


MUTATIONS: dict[str, Callable[[World], None]] = {
    "recreate_pod": recreate_pod,
    "relabel_secret": relabel_secret,
    "opt_out_networkpolicy": opt_out_networkpolicy,
    "drop_selector_pod": drop_selector_pod,
    "reacquire_lease": reacquire_lease,
    "run_active_again": run_active_again,
    "vanish": vanish,
}
EVIDENCE = ("reacquire_lease", "run_active_again")
POINTS = (
    "after_listing",
    "after_evaluation",
    "in_rate_limit_wait",
    "between_check_and_delete",
    "between_batches",
    "before_retry",
)
# Evidence cannot be re-read atomically with the delete (see the module docstring).
CASES = [
    (point, mutation)
    for point in POINTS
    for mutation in MUTATIONS
    if not (point == "between_check_and_delete" and mutation in EVIDENCE)
]


# --- one sweep, with the world changed at one point ------------------------------------------------


def plan_batches(world: World, target: K8sTarget, mutate: Callable[[], None], point: str) -> list[list]:
    listing = list_cluster(world.api, "c1", MANAGED, fast_backoff(), 10, namespaces=world.config.k8s.namespaces)
    if point == "after_listing":
        mutate()
    # A cluster's listing holds only its objects.
    evidence = target.evidence(cast("list[K8sObject]", listing.resources), [])
    plan = evaluate(listing.resources, evidence, world.config, Phase.ENFORCEMENT, datetime.now(UTC))
    if point == "after_evaluation":
        mutate()
    deletes = sorted((d.resource for d in plan.deletes()), key=lambda o: o.labels["iterion.io/run-id"] == VICTIM)
    return cut_batches(deletes, 4, target.unit)


def first_try_then_killed(world_args: tuple, batch: list[dict], token: str, q) -> None:
    """The first try of the victim's batch, in a process of its own: killed between its Pod's intent and delete."""
    import msgspec
    from kubernetes import config as kconfig

    from reaper.model import K8sObject

    kubeconfig, nats_url, mongo_port, db = world_args
    cfg = config(db)
    mongo: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://127.0.0.1:{mongo_port}/")
    api = kconfig.new_client_from_config_dict(kubeconfig)
    target = K8sTarget(cfg)
    target.api_for = lambda cluster: api  # type: ignore[method-assign]  # the test's stub in place of the method
    target.__dict__["_lease_source"] = NatsLeases(nats_url, cfg.k8s.nats_leases)
    target.__dict__["runs"] = MongoRunStore(mongo, cfg.k8s.mongo_run_store).read
    q.put(os.getpid())
    resources = [msgspec.convert(r, K8sObject) for r in batch]
    delete_batch(Ledger(mongo, LedgerConfig(database=db)), target, SendTerms(IDS, HOLDER, token, None), resources)


def kill_first_try(world: World, emulator, mongo_port: int, batch: list, token: str) -> None:
    import msgspec

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    q = ctx.Queue()
    pid: list[int] = []

    def kill(_: tuple[str, ...]) -> None:
        os.kill(pid[0], signal.SIGKILL)
        raise ApiError(503, "ServiceUnavailable", "the client is gone")  # never applied: it died first

    world.cluster.on("before", "delete", kill)
    args = (emulator.kubeconfig(), world.nats_url, mongo_port, world.db)
    child = ctx.Process(target=first_try_then_killed, args=(args, msgspec.to_builtins(batch), token, q))
    child.start()
    pid.append(q.get(timeout=60))
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    pod = next(o for o in batch if o.kind == "Pod")
    assert world.ledger.records.count_documents({"action": "delete_intent", "uid": pod.uid}) == 1
    assert world.ledger.records.count_documents({"action": "outcome", "uid": {"$in": [o.uid for o in batch]}}) == 0


def run_sweep(world: World, emulator, mongo_port: int, point: str, mutation: str = "vanish") -> None:
    mutate = lambda: MUTATIONS[mutation](world)  # noqa: E731
    target = world.target()
    batches = plan_batches(world, target, mutate, point)
    if point == "after_listing" and mutation in EVIDENCE:
        # The evidence is read after the listing: the plan itself already keeps the run.
        assert VICTIM not in {o.labels["iterion.io/run-id"] for batch in batches for o in batch}
        batches.append([])
    assert {o.labels["iterion.io/run-id"] for o in batches[-1]} <= {VICTIM}, "the victim's run is not last"
    lease = world.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    fence = SendTerms(IDS, HOLDER, str(lease["token"]), None)
    pod = f"sandbox-{VICTIM}"
    if point == "in_rate_limit_wait":  # after the run's token, its first request: the re-read of its Pod
        world.cluster.on("before", "list_named", lambda args: args[2] == pod and mutate(), times=None)
    if point == "between_check_and_delete":  # everything was read again; the Pod's delete has arrived
        world.cluster.on("before", "delete", lambda args: args[2] == pod and mutate(), times=None)
    for batch in batches[:-1]:
        delete_batch(world.ledger, target, fence, batch)
    if not batches[-1]:
        return
    if point == "between_batches":
        mutate()
    if point == "before_retry":
        kill_first_try(world, emulator, mongo_port, batches[-1], str(lease["token"]))
        mutate()
    delete_batch(world.ledger, target, fence, batches[-1])


# --- the invariant ------------------------------------------------------------------------------


# Between the run's re-read and its Pod's delete, a change to another object of the run cannot save
# the Pod; it is seen when the run is read again once the Pod is gone, and the rest of the run stays.
REST_OF_RUN = {
    ("secrets", f"sandbox-{VICTIM}-egress-ca"),
    ("secrets", f"sandbox-{VICTIM}-files"),
    ("networkpolicies", f"sandbox-{VICTIM}"),
}
SURVIVORS_MID_RUN = {"relabel_secret": REST_OF_RUN, "opt_out_networkpolicy": REST_OF_RUN}


def assert_invariant(world: World, point: str, mutation: str) -> None:
    records = list(world.ledger.records.find({"action": "outcome"}))
    intents = Counter(r["uid"] for r in world.ledger.records.find({"action": "delete_intent"}))
    outcomes = Counter(r["uid"] for r in records)
    assert all(outcomes[uid] == 1 for uid in intents), "an intent without exactly one outcome"
    names = world.cluster.names()
    assert not any(run in name for run in ORPHANS for name in names), "the harness reaped nothing: it proves nothing"
    assert all(f"sandbox-{run}" in names for run in LIVE)
    assert_pod_first(world)
    left = {(resource, name) for (resource, _, name) in world.cluster.objects if VICTIM in name}
    if mutation == "vanish":
        assert left == set()
        return
    if point == "between_check_and_delete" and mutation in SURVIVORS_MID_RUN:
        assert left == SURVIVORS_MID_RUN[mutation], f"{mutation}: the changed object or one after it was deleted"
        return
    assert len(left) == 4, f"{mutation}: part of a live, changed or opted-out run was deleted"
    victim = {r["name"]: r["result"] for r in records if VICTIM in r["name"]}
    assert "deleted" not in victim.values() and set(victim.values()) <= {"changed_since_plan", "not_attempted"}


def assert_pod_first(world: World) -> None:
    """In the API server's own order of deletes: no Secret or NetworkPolicy before its run's Pod."""
    seen_pods: set[str] = set()
    for _, resource, _, name in world.cluster.deletes:
        run = name.removeprefix("sandbox-").removesuffix("-files").removesuffix("-egress-ca")
        if resource == "pods":
            seen_pods.add(run)
        else:
            assert run in seen_pods, f"{resource}/{name} was deleted before its run's Pod"


@pytest.fixture
def world(kube, nats_server, mongo, mongo_server):
    cluster, api, emulator = kube
    client, db = mongo
    yield World(cluster, api, f"nats://127.0.0.1:{nats_server.port}", client, db), emulator, mongo_server.port


@pytest.fixture
def named_world(kube, nats_server, mongo, mongo_server):
    """The world with ``k8s.namespaces`` named, as deploy/ ships it: every list, the deleter's included, is
    a namespace's (``list_namespaced``, ``list_named``), never cluster-wide."""
    cluster, api, emulator = kube
    client, db = mongo
    world = World(cluster, api, f"nats://127.0.0.1:{nats_server.port}", client, db, namespaces=("ci",))
    yield world, emulator, mongo_server.port
    assert cluster.counters["list"] == 0, "a cluster-wide list in the named-namespace mode"


@pytest.mark.parametrize(("point", "mutation"), CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_nothing_changed_live_or_opted_out_is_deleted(world, point: str, mutation: str) -> None:
    w, emulator, mongo_port = world
    run_sweep(w, emulator, mongo_port, point, mutation)
    assert_invariant(w, point, mutation)


# The points inside the deleter, where its reads differ between the modes (the others are the same code).
NAMED_CASES = [(p, m) for p, m in CASES if p in ("in_rate_limit_wait", "between_check_and_delete")]


@pytest.mark.parametrize(("point", "mutation"), NAMED_CASES, ids=[f"{p}-{m}" for p, m in NAMED_CASES])
def test_with_named_namespaces_nothing_changed_live_or_opted_out_is_deleted(
    named_world, monkeypatch, point: str, mutation: str
) -> None:
    w, emulator, mongo_port = named_world
    fired: list[str] = []
    change = MUTATIONS[mutation]
    monkeypatch.setitem(MUTATIONS, mutation, lambda world: (fired.append(mutation), change(world)))  # type: ignore[func-returns-value]  # append returns None: the lambda records, then mutates
    run_sweep(w, emulator, mongo_port, point, mutation)
    assert fired, f"{point}: the world never changed, so the sweep proves nothing"
    assert_invariant(w, point, mutation)


def test_a_pod_whose_delete_fails_keeps_its_secrets_in_this_task_and_its_retries(world) -> None:
    w, emulator, mongo_port = world
    w.cluster.on("before", "delete", lambda args: args[2] == f"sandbox-{VICTIM}" and _fail(), times=None)
    run_sweep(w, emulator, mongo_port, "none")
    victim = {
        r["name"].split("/")[0]: r["result"]
        for r in w.ledger.records.find({"action": "outcome", "name": {"$regex": VICTIM}})
    }
    assert victim == {"Pod": "failed", "Secret": "not_attempted", "NetworkPolicy": "not_attempted"}
    assert len(w.victim()) == 3 or set(w.victim()) == {"Pod", "Secret", "NetworkPolicy"}
    assert_pod_first(w)


def test_a_retry_never_finishes_a_run_an_earlier_try_stopped(world) -> None:
    # Only the Pod's outcome (changed: recreated, live) was written before the task failed;
    # the retry must not go on to the run's Secrets and NetworkPolicy.
    w, _, _ = world
    target = w.target()
    batch = plan_batches(w, target, lambda: None, "none")[-1]
    recreate_pod(w)
    pod = next(o for o in batch if o.kind == "Pod")
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    fence = SendTerms(IDS, HOLDER, str(lease["token"]), None)
    w.ledger.write(
        [
            {
                **IDS,
                "target": "k8s",
                "scope": "c1",
                "uid": pod.uid,
                "action": "outcome",
                "result": "changed_since_plan",
                "name": "Pod",
            }
        ]
    )
    assert delete_batch(w.ledger, target, fence, batch) == {"not_attempted": 3}
    assert set(w.victim()) == {"Pod", "Secret", "NetworkPolicy"} and w.cluster.deletes == []


def _fail() -> NoReturn:
    raise ApiError(500, "InternalError", "etcd leader changed")


def test_a_terminating_pod_keeps_its_run_until_a_later_sweep_finds_it_gone(world) -> None:
    # A graceful delete returns with the Pod still there; its containers may still run.
    w, emulator, mongo_port = world
    with w.cluster.lock:
        w.cluster.objects[("pods", "ci", f"sandbox-{VICTIM}")]["metadata"]["finalizers"] = ["example.com/drain"]
    w.config = config(w.db, pod_gone_timeout="1s")
    run_sweep(w, emulator, mongo_port, "none")
    outcome = {r["name"]: r["result"] for r in w.ledger.records.find({"action": "outcome", "name": {"$regex": VICTIM}})}
    assert outcome == {
        f"Pod/ci/sandbox-{VICTIM}": "terminating",
        f"Secret/ci/sandbox-{VICTIM}-egress-ca": "not_attempted",
        f"Secret/ci/sandbox-{VICTIM}-files": "not_attempted",
        f"NetworkPolicy/ci/sandbox-{VICTIM}": "not_attempted",
    }
    assert set(w.victim()) == {"Pod", "Secret", "NetworkPolicy"}
    target = w.target()

    def next_sweep() -> set[tuple[str, str]]:
        objects = list_cluster(w.api, "c1", MANAGED, fast_backoff(), 10).resources
        plan = evaluate(objects, target.evidence(objects, []), w.config, Phase.ENFORCEMENT, datetime.now(UTC))
        return {(d.action.value, d.reason) for d in plan.decisions if VICTIM in d.resource.name}

    assert next_sweep() == {("keep", "pod_terminating")}
    w.cluster.remove_finalizers(("pods", "ci", f"sandbox-{VICTIM}"))
    assert next_sweep() == {("delete", "sandbox_orphan")}  # the Pod is gone: its Secrets and policy go now


def test_losing_nats_mid_sweep_deletes_nothing_more(world, nats_server) -> None:
    w, _, _ = world
    target = w.target()
    first, *rest = plan_batches(w, target, lambda: None, "none")
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    fence = SendTerms(IDS, HOLDER, str(lease["token"]), None)
    assert delete_batch(w.ledger, target, fence, first) == {"deleted": 4}
    nats_server.stop()
    for batch in rest:
        assert delete_batch(w.ledger, target, fence, batch) == {"changed_since_plan": 4}
    assert len(w.cluster.objects) == 4 * (len(LIVE) + len(rest))
    details = {r["detail"] for r in w.ledger.records.find({"result": "changed_since_plan"})}
    assert details == {"lease unknown when read again before the delete"}


def test_a_lease_taken_again_while_the_pod_terminates_keeps_the_rest_of_the_run(world) -> None:
    # Review finding: the run was read again only before its Pod's delete; the Pod's shutdown can take
    # its whole grace period, and the run's Secrets and NetworkPolicy went after it regardless.
    w, _, _ = world
    w.cluster.faults.pod_shutdown = 0.5
    target = w.target()
    victim = plan_batches(w, target, lambda: None, "none")[-1]
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    pod = f"sandbox-{VICTIM}"
    w.cluster.on("after", "delete", lambda args: args[1] == "pods" and args[2] == pod and reacquire_lease(w))  # type: ignore[func-returns-value]  # the hook runs it for its effect, its value is dropped
    assert delete_batch(w.ledger, target, SendTerms(IDS, HOLDER, str(lease["token"]), None), victim) == {
        "deleted": 1,
        "changed_since_plan": 3,
    }
    assert {kind for kind in w.victim()} == {"Secret", "NetworkPolicy"}


@pytest.mark.parametrize("mode", ["cluster-wide", "named namespaces"])
def test_a_new_pod_of_the_run_after_its_pod_went_keeps_the_rest_of_the_run(request, mode: str) -> None:
    # Review finding: a retried step's new Pod (same name, new uid) read as "the old Pod is gone", and
    # the Secrets it mounts were deleted from under it.
    w, _, _ = request.getfixturevalue("world" if mode == "cluster-wide" else "named_world")
    target = w.target()
    victim = plan_batches(w, target, lambda: None, "none")[-1]
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    key = ("pods", "ci", f"sandbox-{VICTIM}")
    w.cluster.faults.pod_shutdown = 0.0

    def new_pod_once_gone(args: tuple[str, ...]) -> None:
        if "pods" in args and key not in w.cluster.objects:  # the planned Pod is gone: the step is retried
            recreate_pod(w)

    w.cluster.on("before", "list" if mode == "cluster-wide" else "list_namespaced", new_pod_once_gone, times=None)
    result = delete_batch(w.ledger, target, SendTerms(IDS, HOLDER, str(lease["token"]), None), victim)
    assert result == {"deleted": 1, "changed_since_plan": 3}
    assert w.victim()["Pod"]["metadata"]["uid"] == "a-new-pod"
    assert set(w.victim()) == {"Pod", "Secret", "NetworkPolicy"}


def test_a_new_pod_of_a_run_whose_pod_went_in_an_earlier_sweep_keeps_its_secrets(world) -> None:
    # Second review: a run planned without its Pod (gone in an earlier sweep) was never checked for Pods.
    w, _, _ = world
    with w.cluster.lock:
        w.cluster._remove(("pods", "ci", f"sandbox-{VICTIM}"))
    target = w.target()
    victim = plan_batches(w, target, lambda: None, "none")[-1]
    assert {o.kind for o in victim} == {"Secret", "NetworkPolicy"}
    recreate_pod(w)  # between the plan and the delete, the driver retries the step
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    result = delete_batch(w.ledger, target, SendTerms(IDS, HOLDER, str(lease["token"]), None), victim)
    assert result == {"changed_since_plan": 3}
    assert set(w.victim()) == {"Pod", "Secret", "NetworkPolicy"}


def test_a_run_with_two_pods_is_reaped_in_one_sweep_pods_first(world) -> None:
    w, _, _ = world
    second = next(o for o in seed_run(Cluster(), VICTIM) if o["kind"] == "Pod")
    second["metadata"] = {**second["metadata"], "name": f"sandbox-{VICTIM}-2", "uid": "victim-pod-2"}
    w.cluster.create("pods", "ci", second)
    target = w.target()
    victim = plan_batches(w, target, lambda: None, "none")[-1]
    lease = w.ledger.sweep_lease.acquire("k8s", HOLDER, timedelta(minutes=10))
    assert delete_batch(w.ledger, target, SendTerms(IDS, HOLDER, str(lease["token"]), None), victim) == {"deleted": 5}
    assert w.victim() == {}
    assert_pod_first(w)


def _answer_lost(_: tuple[str, ...]) -> None:
    raise ApiError(503, "ServiceUnavailable", "the answer never reached the client")  # the delete was applied


POD_A = "Pod/ci/sandbox-orphan-a"  # the first object deleted
API_FAULTS = {
    "re-read throttled, failing, slow": ("list_named", ["429", "503", "timeout"]),
    "delete throttled, failing, slow": ("delete", ["429", "503", "timeout"]),
    "Pod listing failing": ("list", ["503", "429"]),
    "delete applied, answer lost": ("delete", "lost"),
    "delete 409": ("delete", ["409"]),
    "delete 412": ("delete", ["412"]),
    "every try of a delete failing": ("delete", ["503"] * 5),
}


@pytest.mark.parametrize("case", API_FAULTS)
def test_api_faults_give_one_outcome_per_intent_and_no_second_delete(world, case: str) -> None:
    w, emulator, mongo_port = world
    kind, faults = API_FAULTS[case]
    w.cluster.faults.timeout_delay = 0.2
    if faults == "lost":
        w.cluster.on("after", "delete", _answer_lost)
    elif kind == "list":  # the deleter's Pod listing, not the inventory's: from the first delete on
        w.cluster.on("before", "delete", lambda _: w.cluster.faults.fail_next.update(list=list(faults)))
    else:
        w.cluster.faults.fail_next[kind] = list(faults)
    run_sweep(w, emulator, mongo_port, "none")
    records = list(w.ledger.records.find({"action": "outcome"}))
    intents = Counter(r["uid"] for r in w.ledger.records.find({"action": "delete_intent"}))
    assert all(n == 1 for n in Counter(r["uid"] for r in records).values()) and set(intents) <= {
        r["uid"] for r in records
    }, "an intent without exactly one outcome"
    assert set(Counter(w.cluster.deletes[i][1:] for i in range(len(w.cluster.deletes))).values()) <= {1}
    assert_pod_first(w)
    assert all(f"sandbox-{run}" in w.cluster.names() for run in LIVE)
    by_run: dict[str, dict[str, str]] = {}
    for r in records:
        run = r["name"].split("/")[-1].removeprefix("sandbox-").removesuffix("-files").removesuffix("-egress-ca")
        by_run.setdefault(run, {})[r["name"]] = r["result"]
    stopped = {run: results for run, results in by_run.items() if set(results.values()) != {"deleted"}}
    if case in ("delete 409", "delete 412", "every try of a delete failing"):
        # The first delete is a Pod's: that run alone stops there, whole; the others are reaped.
        ((run, results),) = stopped.items()
        pod = "changed_since_plan" if case == "delete 409" else "failed"  # only a 409 is a failed precondition
        assert sorted(results.values()) == sorted([pod, "not_attempted", "not_attempted", "not_attempted"])
        assert sum(run in name for (_, _, name) in w.cluster.objects) == 4
    elif case == "delete applied, answer lost":
        # The retry finds the Pod gone (404 after its own call: deleted) or still terminating (its
        # resourceVersion changed: 409): then the rest of the run waits for a later sweep.
        assert stopped in ({}, {"orphan-a": {**{n: "not_attempted" for n in by_run["orphan-a"]}, POD_A: "terminating"}})
    else:
        assert stopped == {} and len(by_run) == len((*ORPHANS, VICTIM))
        assert not any(run in name for run in (*ORPHANS, VICTIM) for name in w.cluster.names())
