"""The fault and race harness, GCE: the world changes at every point between the listing and the delete call.

The real inventory, policy, batching, ``delete_batch`` step, deleter and ledger run against the Compute
emulator, exactly as a sweep runs them; the emulator's request hooks change the world at each point
(no monkeypatching of the reaper's code). For every combination the invariant is asserted: nothing
live, changed or opted out is deleted; every intent has exactly one outcome; the other orphans of the
sweep are still reaped (so the harness cannot pass by deleting nothing).

Residual window, by the Compute API's design: a label written between the re-read and the delete by id
(the sweep lease's read and the delete call) cannot be caught (``instances.delete`` takes no precondition). A VM
recreated under the name in that window is caught: the delete goes by numeric id.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from include.emulators.gce import Fleet
from include.emulators.http import ApiError, start_secantusdb
from reaper.config import LedgerConfig, Settings, parse_settings
from reaper.gce.clients import compute_clients
from reaper.gce.inventory import list_project
from reaper.ledger import Ledger
from reaper.model import Evidence, GceInstance, Phase, WriterRecord
from reaper.policy import evaluate
from reaper.records import document
from reaper.sweep.deletes import SendTerms, SweepHalted, cut_batches, delete_batch
from reaper.sweep.targets import GceTarget
from tests.builders import HB
from tests.helpers import fast_backoff
from tests.helpers.gce import STARTED, add_instance

SELECTOR = {"ci_ephemeral": "true"}
ZONE = "us-east1-b"
IDS = {"dag_id": "reaper_gce_enforcement", "run_id": "harness", "execution": 0, "lease": "t"}
HOLDER = "reaper_gce_enforcement/harness#0"
VICTIM = "victim"
BYSTANDERS = ("orphan-a", "orphan-b")


def config() -> Settings:
    return parse_settings({"gce": {"delete_rate_per_project": 1000.0, "delete_concurrency": 1}}, "harness")


LIVE = ("live-0", "live-1", "live-2", "live-3")


def seed(fleet: Fleet, victim_status: str) -> None:
    """Two plain orphans and the victim, all reapable (stale heartbeats, or TERMINATED for the victim),
    among live VMs that keep the project's budget from tripping and must never be touched."""
    for name in LIVE:
        add_instance(fleet, "p", ZONE, name, heartbeat_age=60, instance_id=abs(hash(name)) % 10**15 + 1)
    for name in BYSTANDERS:
        add_instance(fleet, "p", ZONE, name, heartbeat_age=6 * 3600, instance_id=abs(hash(name)) % 10**15 + 1)
    add_instance(fleet, "p", ZONE, VICTIM, heartbeat_age=6 * 3600, status=victim_status, instance_id=424242)


def current_victim(fleet: Fleet) -> dict[str, object] | None:
    with fleet.lock:
        return fleet.projects["p"][ZONE].get(VICTIM)


# --- the mutations: each makes the victim live, changed or opted out (or simply gone) --------------


def recreate(fleet: Fleet) -> None:
    """A new VM under the same name: new id, fresh heartbeat (a live one)."""
    with fleet.lock:
        fleet.projects["p"][ZONE].pop(VICTIM, None)
    add_instance(fleet, "p", ZONE, VICTIM, heartbeat_age=10, instance_id=777777)


def _relabel(fleet: Fleet, change: Callable[[dict[str, str]], object]) -> None:
    with fleet.lock:
        inst = fleet.projects["p"][ZONE][VICTIM]
        labels = dict(inst["labels"])
        change(labels)
        inst["labels"] = labels


def refresh_heartbeat(fleet: Fleet) -> None:
    _relabel(fleet, lambda labels: labels.update({HB: str(int(time.time()))}))


def opt_out(fleet: Fleet) -> None:
    _relabel(fleet, lambda labels: labels.update({"reaper_keep": "true"}))


def drop_selector(fleet: Fleet) -> None:
    _relabel(fleet, lambda labels: labels.pop("ci_ephemeral"))


def restart(fleet: Fleet) -> None:
    with fleet.lock:
        fleet.projects["p"][ZONE][VICTIM]["status"] = "RUNNING"


def odd_opt_out(fleet: Fleet) -> None:
    _relabel(fleet, lambda labels: labels.update({"reaper_keep": "yes"}))  # reported by the policy: kept


def protect(fleet: Fleet) -> None:
    with fleet.lock:
        fleet.projects["p"][ZONE][VICTIM]["deletionProtection"] = True


def vanish(fleet: Fleet) -> None:
    with fleet.lock:
        fleet.projects["p"][ZONE].pop(VICTIM, None)


MUTATIONS: dict[str, Callable[[Fleet], None]] = {
    "recreate": recreate,
    "refresh_heartbeat": refresh_heartbeat,
    "opt_out": opt_out,
    "odd_opt_out": odd_opt_out,
    "drop_selector": drop_selector,
    "restart": restart,
    "protect": protect,
    "vanish": vanish,
}
POINTS = (
    "after_listing",
    "after_evaluation",
    "in_rate_limit_wait",
    "between_reread_and_delete",
    "between_batches",
    "before_retry",
)
# Only a new id is caught between the re-read and the delete (see the module docstring).
CASES = [
    (point, mutation)
    for point in POINTS
    for mutation in MUTATIONS
    if point != "between_reread_and_delete" or mutation in ("recreate", "vanish")
]


# --- one sweep, with the world changed at one point ------------------------------------------------


def plan_batches(clients, cfg: Settings, fleet: Fleet, mutate: Callable[[], None], point: str) -> list[list]:
    listing = list_project(clients, "p", SELECTOR, fast_backoff(), 10)
    if point == "after_listing":
        mutate()
    writers = [WriterRecord("m", "p", STARTED, False)]
    plan = evaluate(listing.resources, Evidence(writer_health=writers), cfg, Phase.ENFORCEMENT, datetime.now(UTC))
    if point == "after_evaluation":
        mutate()
    # One instance per batch, the victim last: "between batches" happens before its batch.
    deletes = sorted((d.resource for d in plan.deletes()), key=lambda r: r.name == VICTIM)
    return cut_batches(deletes, 1, lambda r: (r.project, r.id))


def first_try_then_killed(endpoint: str, mongo_port: int, db: str, batch: list[dict], token: str, q) -> None:
    """The first try of the victim's delete task, in a process of its own: killed between its intent and its delete."""
    import msgspec
    from pymongo import MongoClient

    target = GceTarget(config())
    target.__dict__["clients"] = compute_clients(api_endpoint=endpoint)
    ledger = Ledger(MongoClient(f"mongodb://127.0.0.1:{mongo_port}/"), LedgerConfig(database=db))
    q.put(os.getpid())
    resources = [msgspec.convert(r, GceInstance) for r in batch]
    delete_batch(ledger, target, SendTerms(IDS, HOLDER, token, None), resources)


def run_sweep(fleet: Fleet, clients, ledger: Ledger, mongo_port: int, point: str, mutation: str = "vanish") -> None:
    cfg = config()
    mutate = lambda: MUTATIONS[mutation](fleet)  # noqa: E731
    batches = plan_batches(clients, cfg, fleet, mutate, point)
    assert [r.name for batch in batches for r in batch][-1] == VICTIM, "the victim was not planned"
    target = GceTarget(cfg)
    target.__dict__["clients"] = clients
    lease = ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=10))
    fence = SendTerms(IDS, HOLDER, str(lease["token"]), None)
    victim_id = batches[-1][0].id
    if point == "in_rate_limit_wait":  # the first request after the token is the re-read
        fleet.on("before", "get", lambda args: args[2] == victim_id and mutate(), times=None)
    if point == "between_reread_and_delete":  # handled, its answer not yet out
        fleet.on("after", "get", lambda args: args[2] == victim_id and mutate(), times=None)
    for batch in batches[:-1]:
        delete_batch(ledger, target, fence, batch)
    if point == "between_batches":
        mutate()
    if point == "before_retry":
        kill_first_try(fleet, clients, ledger, mongo_port, batches[-1], str(lease["token"]))
        mutate()
    delete_batch(ledger, target, fence, batches[-1])


def kill_first_try(fleet: Fleet, clients, ledger: Ledger, mongo_port: int, batch: list, token: str) -> None:
    import msgspec

    ctx = multiprocessing.get_context("forkserver")  # the SDKs are imported once, in the fork server
    ctx.set_forkserver_preload([__name__])
    q = ctx.Queue()
    endpoint = clients.instances._transport._host
    pid: list[int] = []

    def kill(_: tuple[str, ...]) -> None:
        os.kill(pid[0], signal.SIGKILL)
        raise ApiError(503, "backendError", "the client is gone")  # never applied: it died first

    fleet.on("before", "delete", kill)
    child = ctx.Process(
        target=first_try_then_killed,
        args=(endpoint, mongo_port, ledger.records.database.name, msgspec.to_builtins(batch), token, q),
    )
    child.start()
    pid.append(q.get(timeout=60))
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert ledger.records.count_documents({"action": "delete_intent", "uid": batch[0].id}) == 1
    assert ledger.records.count_documents({"action": "outcome", "uid": batch[0].id}) == 0


# --- the invariant ------------------------------------------------------------------------------


def assert_invariant(fleet: Fleet, ledger: Ledger, mutation: str) -> None:
    outcomes = {r["name"]: r for r in ledger.records.find({"action": "outcome"})}
    intents = Counter(r["uid"] for r in ledger.records.find({"action": "delete_intent"}))
    outcome_uids = Counter(r["uid"] for r in ledger.records.find({"action": "outcome"}))
    assert all(outcome_uids[uid] == 1 for uid in intents), "an intent without exactly one outcome"
    assert fleet.names("p") & set(BYSTANDERS) == set(), "the harness reaped nothing: it proves nothing"
    assert fleet.names("p") >= set(LIVE)
    assert {outcomes[name]["result"] for name in BYSTANDERS} == {"deleted"}
    now = current_victim(fleet)
    if mutation == "vanish":
        assert now is None and outcomes[VICTIM]["result"] in ("already_gone", "deleted")
        return
    assert now is not None, f"{mutation}: the live, changed or opted-out VM was deleted"
    assert str(now["id"]) not in fleet.deleted_ids
    assert outcomes[VICTIM]["result"] in ("changed_since_plan", "already_gone")


@pytest.fixture
def world(gce, mongo, mongo_server):
    fleet, clients = gce
    client, db = mongo
    ledger = Ledger(client, LedgerConfig(database=db))
    ledger.ensure_indexes()
    return fleet, clients, ledger, mongo_server.port


@pytest.mark.parametrize(("point", "mutation"), CASES, ids=[f"{p}-{m}" for p, m in CASES])
def test_nothing_changed_live_or_opted_out_is_deleted(world, point: str, mutation: str) -> None:
    fleet, clients, ledger, mongo_port = world
    seed(fleet, "TERMINATED" if mutation == "restart" else "RUNNING")
    run_sweep(fleet, clients, ledger, mongo_port, point, mutation)
    assert_invariant(fleet, ledger, mutation)


@pytest.mark.parametrize(
    ("kind", "faults"),
    [
        ("get", ["429", "503", "timeout"]),
        ("delete", ["429", "503"]),
        ("operation_wait", ["503", "429"]),
        ("delete", ["503"] * 5),  # every try of the first delete fails: that instance alone fails
        ("delete", ["409"]),  # refused: by id there is no precondition, so failed (it alerts if it repeats)
        ("delete", ["412"]),
    ],
)
def test_api_faults_give_one_outcome_per_intent_and_no_second_delete(world, kind: str, faults: list[str]) -> None:
    fleet, clients, ledger, mongo_port = world
    seed(fleet, "RUNNING")
    fleet.faults.timeout_delay = 0.2
    fleet.faults.fail_next[kind] = list(faults)
    run_sweep(fleet, clients, ledger, mongo_port, "none")
    outcomes = Counter(r["uid"] for r in ledger.records.find({"action": "outcome"}))
    assert sorted(outcomes.values()) == [1, 1, 1]
    assert set(Counter(fleet.deleted_ids).values()) == {1}, "an instance was deleted twice"
    results = {r["name"]: r["result"] for r in ledger.records.find({"action": "outcome"})}
    if len(faults) == 5 or faults[0] in ("409", "412"):
        assert results == {BYSTANDERS[0]: "failed", BYSTANDERS[1]: "deleted", VICTIM: "deleted"}
        assert fleet.names("p") == {BYSTANDERS[0], *LIVE}
    else:
        assert set(results.values()) == {"deleted"} and fleet.names("p") == set(LIVE)


def planned(world) -> tuple[GceTarget, list[list[GceInstance]], SendTerms]:
    """The harness's fleet seeded and planned: the target, its delete batches (the victim's last), a fence."""
    fleet, clients, ledger, _ = world
    seed(fleet, "RUNNING")
    cfg = config()
    target = GceTarget(cfg)
    target.__dict__["clients"] = clients
    batches = plan_batches(clients, cfg, fleet, lambda: None, "none")
    lease = ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=10))
    return target, batches, SendTerms(IDS, HOLDER, str(lease["token"]), None)


def test_a_delete_applied_before_the_kill_is_recorded_deleted_by_the_retry(world) -> None:
    # The retry's re-read gets 404 for a VM this execution deleted itself.
    fleet, _, ledger, _ = world
    target, batches, fence = planned(world)
    victim = batches[-1][0]
    for batch in batches[:-1]:
        delete_batch(ledger, target, fence, batch)
    # The first try's delete call goes out and its operation completes; the outcome is never written.
    ledger.write([{**IDS, "target": "gce", "scope": "p", "uid": victim.id, "action": "delete_intent", "sent": True}])
    vanish(fleet)
    assert delete_batch(ledger, target, fence, [victim]) == {"deleted": 1}
    assert ledger.records.find_one({"action": "outcome", "uid": victim.id})["detail"].startswith("404 on get after")


def test_losing_the_ledger_mid_batch_stops_every_send_and_the_retry_finishes(gce, tmp_path) -> None:
    fleet, clients = gce
    for i in range(6):
        add_instance(fleet, "p", ZONE, f"orphan-{i}", heartbeat_age=6 * 3600, instance_id=1000 + i)
        add_instance(fleet, "p", ZONE, f"live-{i}", heartbeat_age=60, instance_id=2000 + i)
    daemon = start_secantusdb(storage=tmp_path / "db")
    port = daemon.port
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, socketTimeoutMS=1000
    )
    ledger = Ledger(client, LedgerConfig(database="reaper", timeout=timedelta(seconds=1)))
    ledger.ensure_indexes()
    cfg = config()
    target = GceTarget(cfg)
    target.__dict__["clients"] = clients
    lease = ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=10))
    fence = SendTerms(IDS, HOLDER, str(lease["token"]), None)
    batch = plan_batches(clients, cfg, fleet, lambda: None, "none")
    resources = [r for b in batch for r in b]
    # The ledger goes away as the first delete completes: its outcome cannot be written.
    fleet.on("after", "operation_wait", lambda _: daemon.stop())
    try:
        with pytest.raises(SweepHalted, match="ledger"):
            delete_batch(ledger, target, fence, resources)
        assert len(fleet.deleted_ids) == 1, "a delete was sent without a durable intent"
        daemon = start_secantusdb(port, storage=tmp_path / "db")
        # The first VM's intent (marked sent) survived, its outcome did not: the retry's 404 is its own delete.
        assert delete_batch(ledger, target, fence, resources) == {"deleted": 6}
        assert Counter(r["result"] for r in ledger.records.find({"action": "outcome"})) == {"deleted": 6}
        assert sorted(fleet.deleted_ids) == sorted(r.id for r in resources)
    finally:
        daemon.stop()


def test_a_delete_whose_answer_was_lost_is_unconfirmed_not_unattempted(world) -> None:
    # Review finding: the first delete call was applied, its answer lost (503); the retry was refused by
    # the deadline, and the ledger said the delete was never sent.
    fleet, _, ledger, _ = world
    target, batches, fence = planned(world)
    victim = batches[-1][0]

    def applied_but_lost(_: tuple[str, ...]) -> None:
        time.sleep(1.2)  # past the task's deadline
        raise ApiError(503, "backendError", "the answer is lost")

    fleet.on("after", "delete", applied_but_lost)
    fence = SendTerms(fence.ids, fence.holder, fence.token, time.time() + 1.0)
    assert delete_batch(ledger, target, fence, [victim]) == {"unconfirmed": 1}
    assert fleet.deleted_ids == [victim.id]  # it did go out
    assert ledger.records.find_one({"action": "delete_intent", "uid": victim.id})["sent"] is True


def test_a_retry_never_forgets_that_an_earlier_try_sent_the_delete(world) -> None:
    # Second review: a retry rewrote the intent with sent=False before its re-read; when its own outcome
    # write then failed, the next try took this sweep's delete for someone else's (already_gone).
    fleet, _, ledger, _ = world
    target, batches, fence = planned(world)
    victim = batches[-1][0]
    base = {**IDS, "target": "gce", "scope": "p", "uid": victim.id, "name": VICTIM}
    ledger.write([{**base, "action": "delete_intent", "kind": "intent", "sent": True}])  # try 1 sent it, died
    vanish(fleet)  # its operation completed

    class OutcomeWriteFails:
        def __getattr__(self, name: str):
            return getattr(ledger, name)

        def write(self, records):
            if any(document(r)["action"] == "outcome" for r in records):
                raise RuntimeError("not primary")
            return ledger.write(records)

    with pytest.raises(SweepHalted):
        delete_batch(OutcomeWriteFails(), target, fence, [victim])  # try 2
    assert ledger.records.find_one({"action": "delete_intent", "uid": victim.id})["sent"] is True
    assert delete_batch(ledger, target, fence, [victim]) == {"deleted": 1}  # try 3


@pytest.mark.parametrize("how", ["re-acquired", "released"])
def test_a_sweep_lease_lost_while_the_reread_is_in_flight_stops_the_delete(world, how: str) -> None:
    # Review finding (helper-50): a lease read made in the intent's commit cycle, while the re-read was still in
    # flight, stood for the send's lease check; a lease released (a zombie task's teardown) or taken again (a
    # cleared resolve_scopes: same holder, new token) during a ~100 ms GET did not stop the delete.
    fleet, _, ledger, _ = world
    target, batches, terms = planned(world)
    victim = batches[-1][0].id

    def lose(args: tuple[str, ...]) -> None:
        if args[2] != victim:
            return
        time.sleep(0.08)  # a slow GET: the intent's commit cycle is over by now
        if how == "released":
            ledger.sweep_lease.release("gce", HOLDER)
        else:
            ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=10))

    fleet.on("after", "get", lose, times=None)
    for batch in batches:
        delete_batch(ledger, target, terms, batch)
    outcome = ledger.records.find_one({"action": "outcome", "name": VICTIM})
    assert current_victim(fleet) is not None, f"deleted after the lease was {how}: {outcome}"
    assert outcome is not None and outcome["result"] == "not_attempted"
