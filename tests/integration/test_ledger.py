"""The ledger and the delete step under retries: fenced, acknowledged, idempotent, intent before delete."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from pymongo.monitoring import CommandFailedEvent, CommandListener, CommandStartedEvent, CommandSucceededEvent

from include.emulators.http import start_secantusdb
from reaper.config import LedgerConfig
from reaper.ledger import Ledger
from reaper.model import Outcome, Resource
from reaper.records import RECORD_KEY
from reaper.report.queries import AuditQueries, RowFilter
from reaper.sweep.deletes import SendTerms, SweepHalted, delete_batch
from reaper.sweep.targets import Target
from tests.builders import inst

IDS: dict[str, Any] = {"dag_id": "reaper_gce_enforcement", "run_id": "manual__1", "execution": 0, "lease": "t"}
HOLDER = "reaper_gce_enforcement/manual__1#0"


class FakeTarget:
    """Deletes by name through the guard and remembers every delete it sent (the adapters are tested elsewhere)."""

    name = "gce"
    calls: list[str]

    def __init__(self, existing: set[str], crash_after: int | None = None) -> None:
        self.existing, self.calls, self.crash_after = existing, [], crash_after

    def unit(self, r):
        return r.project, r.id

    def record_name(self, r):
        return r.name

    def delete(self, resources, guard):
        out = []
        for r in resources:
            why = guard.before_send(r) or guard.ready(r)
            if why:
                result, detail = "not_attempted", why
            else:
                self.calls.append(r.name)
                gone = r.name not in self.existing
                self.existing.discard(r.name)
                guard.sent(r)
                if self.crash_after is not None and len(self.calls) >= self.crash_after:
                    raise RuntimeError("worker killed")  # after the delete, before its outcome is written
                result = ("deleted" if guard.sent_earlier(r) else "already_gone") if gone else "deleted"
                detail = ""
            guard.record(r, result, detail)
            out.append(Outcome(r, result, detail))
        return out


def fence(ledger: Ledger, deadline: float | None = None) -> SendTerms:
    lease = ledger.sweep_lease.acquire("gce", HOLDER, timedelta(minutes=5))
    return SendTerms(IDS, HOLDER, str(lease["token"]), deadline)


@pytest.fixture
def ledger(mongo) -> Ledger:
    client, db = mongo
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    return led


def test_a_delete_tasks_reads_of_an_earlier_try_are_answered_by_an_index_not_a_scan(ledger) -> None:
    """``outcomes`` and ``intents`` of a batch's uids: at incident scale, a scan of the ledger per read and per
    batch cost the recovery more than a third of its time (docs/benchmarks.md)."""
    rows = [
        {**IDS, "target": "gce", "scope": "p1", "uid": str(i), "action": action, "kind": kind, "result": "deleted"}
        for i in range(20)
        for action, kind in (("delete_intent", "intent"), ("outcome", "outcome"))
    ]
    ledger.write(rows)
    for action in ("outcome", "delete_intent"):
        query = {**{f: IDS[f] for f in ("dag_id", "run_id", "execution", "lease")}, "action": action}
        plan = ledger.records.find({**query, "uid": {"$in": ["3", "4"]}}).explain()["queryPlanner"]["winningPlan"]
        assert plan.get("inputStage", {}).get("indexName") == "by_execution", plan
    assert set(ledger.outcomes(IDS, ["3", "4"])) == {("p1", "3"), ("p1", "4")}


def test_fenced_writes_upsert_instead_of_duplicating(ledger, mongo) -> None:
    record = {**IDS, "target": "gce", "scope": "p1", "uid": "1", "action": "delete", "reason": "terminated"}
    assert ledger.write([record]) == 1
    ledger.write([{**record, "reason": "terminated (retried)"}])
    docs = list(ledger.records.find({}))
    assert len(docs) == 1 and docs[0]["reason"] == "terminated (retried)"
    assert ledger.records.write_concern.document == {"w": "majority", "j": True, "wtimeout": 10000}
    unique = ledger.records.index_information()["fence"]
    assert unique["unique"] and [k for k, _ in unique["key"]] == list(RECORD_KEY)
    assert ledger.records.index_information()["retention"]["expireAfterSeconds"] == 400 * 86400


def test_retry_after_a_crash_between_intent_and_delete(ledger) -> None:
    resources = [inst(name=f"vm-{i}") for i in range(3)]
    # The first try wrote its intents, then died before sending any delete.
    ledger.write(
        [{**IDS, "target": "gce", "scope": r.scope, "uid": r.id, "action": "delete_intent"} for r in resources]
    )
    target = FakeTarget({r.name for r in resources})
    assert delete_batch(ledger, cast("Target[Any]", target), fence(ledger), resources) == {"deleted": 3}
    assert sorted(target.calls) == ["vm-0", "vm-1", "vm-2"]
    assert ledger.records.count_documents({"action": "delete_intent"}) == 3  # rewritten, not duplicated
    assert ledger.records.count_documents({"action": "outcome", "result": "deleted"}) == 3


def test_retry_after_a_crash_between_delete_and_outcome(ledger) -> None:
    resources = [inst(name=f"vm-{i}") for i in range(3)]
    target = FakeTarget({r.name for r in resources}, crash_after=2)
    with pytest.raises(RuntimeError):
        delete_batch(ledger, cast("Target[Any]", target), fence(ledger), resources)
    # Outcomes are written as each delete completes: the first one survived the crash of the second.
    assert ledger.records.count_documents({"action": "outcome"}) == 1
    target.crash_after = None
    # vm-1's delete call went out before the crash: the 404 is this sweep's own delete (18.4).
    assert delete_batch(ledger, cast("Target[Any]", target), fence(ledger), resources) == {"deleted": 2}
    # A third try (e.g. the task retried again) sends nothing: every outcome is recorded.
    assert delete_batch(ledger, cast("Target[Any]", target), fence(ledger), resources) == {}
    assert target.calls == ["vm-0", "vm-1", "vm-1", "vm-2"]
    outcomes = {r["name"]: r["result"] for r in ledger.records.find({"action": "outcome"})}
    assert outcomes == {"vm-0": "deleted", "vm-1": "deleted", "vm-2": "deleted"}


def test_no_delete_without_a_durable_intent() -> None:
    daemon = start_secantusdb()
    port = daemon.port
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=1000, socketTimeoutMS=1000
    )
    ledger = Ledger(client, LedgerConfig(database="reaper", timeout=timedelta(seconds=1)))
    ledger.ensure_indexes()
    target = FakeTarget({"vm-0"})
    batch_fence = fence(ledger)
    daemon.stop()  # the ledger can no longer acknowledge the intent
    with pytest.raises(PyMongoError):
        delete_batch(ledger, cast("Target[Any]", target), batch_fence, [inst(name="vm-0")])
    assert target.calls == []


def test_an_intent_that_cannot_be_written_sends_nothing_and_fails_the_task(ledger) -> None:
    target = FakeTarget({"vm-0", "vm-1"})
    resources = [inst(name="vm-0"), inst(name="vm-1")]
    batch_fence = fence(ledger)
    ledger.records.drop_index("fence")
    ledger.records.create_index([("name", 1)], unique=True, name="clash")
    ledger.records.insert_one({"name": "vm-0"})  # the intent of vm-0 now collides: the write fails
    with pytest.raises(SweepHalted, match="intent not recorded"):
        delete_batch(ledger, cast("Target[Any]", target), batch_fence, resources)
    assert target.calls == []


def test_nothing_is_sent_without_the_lease_or_after_the_deadline(ledger) -> None:
    target = FakeTarget({"vm-0", "vm-1", "vm-2"})
    late = [inst(name="vm-0"), inst(name="vm-1")]
    assert delete_batch(ledger, cast("Target[Any]", target), fence(ledger, deadline=time.time() - 1), late) == {
        "not_attempted": 2
    }
    ledger.locks.delete_many({})  # the lease expired and was taken over by another sweep
    ledger.sweep_lease.acquire("gce", "someone-else", timedelta(minutes=5))
    assert delete_batch(
        ledger, cast("Target[Any]", target), SendTerms(IDS, HOLDER, "old-token", None), [inst(name="vm-2")]
    ) == {"not_attempted": 1}
    # No call, and no intent marked sent: vm-2's intent went out with the lease read that refused it (one commit
    # cycle), a record of a send that never happened; the late ones were stopped before their intents.
    assert target.calls == [] and ledger.records.count_documents({"action": "delete_intent", "sent": True}) == 0
    assert [r["name"] for r in ledger.records.find({"action": "delete_intent"})] == ["vm-2"]
    details = {r["name"]: r["detail"] for r in ledger.records.find({"action": "outcome"})}
    assert details["vm-0"].startswith("deadline reached") and "held by someone-else" in details["vm-2"]


def test_sweep_lease_is_fenced_by_a_token(ledger) -> None:
    a = ledger.sweep_lease.acquire("gce", "a", timedelta(minutes=5))
    assert a is not None and ledger.sweep_lease.lease_problem("gce", "a", a["token"]) is None
    assert ledger.sweep_lease.acquire("gce", "b", timedelta(minutes=5)) is None
    # The same holder again (resolve_scopes retried or cleared): a new token; the old one covers nothing.
    again = ledger.sweep_lease.acquire("gce", "a", timedelta(minutes=5))
    assert again["token"] != a["token"] and again["expires_at"] >= a["expires_at"]
    assert "under another token" in ledger.sweep_lease.lease_problem("gce", "a", a["token"])
    ledger.locks.update_one({"_id": "gce"}, {"$set": {"expires_at": time.time() - 1}})
    assert ledger.sweep_lease.lease_problem("gce", "a", again["token"]) == "the sweep lease has expired"
    b = ledger.sweep_lease.acquire("gce", "b", timedelta(minutes=5))  # an expired lease is taken over, with a new token
    assert b["token"] != again["token"]
    assert "held by b" in ledger.sweep_lease.lease_problem("gce", "a", again["token"])
    ledger.sweep_lease.release("gce", "a")  # not the holder: no effect
    assert ledger.sweep_lease.acquire("gce", "a", timedelta(minutes=5)) is None
    ledger.sweep_lease.release("gce", "b")
    assert ledger.sweep_lease.lease_problem("gce", "b", b["token"]) == "the sweep lease was released"


# --- indexes across config and version changes ------------------------------------------------

DAY = 86400
WANTED = {
    "ledger": {
        "fence": (list(RECORD_KEY), True, None),
        "retention": (["at"], False, 400 * DAY),
        "sweep_rows": (["dag_id", "run_id", "kind", "scope", "name", "uid", "execution"], False, None),
        "by_name": (["name", "dag_id"], False, None),
        "by_uid": (["uid", "dag_id"], False, None),
        "by_execution": (["dag_id", "run_id", "execution", "lease", "action", "uid"], False, None),
    },
    "sweeps": {
        "sweep": (["dag_id", "run_id", "execution", "lease"], True, None),
        "retention": (["at"], False, 400 * DAY),
        "timeline": (["dag_id", "at"], False, None),
        "by_run": (["run_id"], False, None),
    },
    "transitions": {
        "fence": (["dag_id", "run_id", "execution", "lease", "target", "uid"], True, None),
        "retention": (["at"], False, 400 * DAY),
        "by_uid": (["uid"], False, None),
        "by_name": (["name"], False, None),
        "by_group": (["group"], False, None),
    },
    "resource_states": {
        "scope": (["dag_id", "target", "scope", "part"], True, None),
        "retention": (["at"], False, 400 * DAY),
    },
    "approvals": {
        "by_dag": (["dag_id", "created_at"], False, None),
        "retention": (["at"], False, 400 * DAY),
    },
}


class Commands(CommandListener):
    """The names of the commands a client sends, to tell an in-place change from a rebuild."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass


def _indexes(led: Ledger) -> dict[str, dict[str, tuple[list[str], bool, int | None]]]:
    """(key fields, unique, TTL) of every index but ``_id_``, per collection."""
    return {
        c.name: {
            name: ([k for k, _ in info["key"]], bool(info.get("unique")), info.get("expireAfterSeconds"))
            for name, info in c.index_information().items()
            if name != "_id_"
        }
        for c in (led.records, led.sweeps, led.transitions, led.states, led.approvals)
    }


def _watched(port: int, db: str, retention: timedelta) -> tuple[Ledger, Commands]:
    commands = Commands()
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=3000, event_listeners=[commands]
    )
    return Ledger(client, LedgerConfig(database=db, retention=retention)), commands


def test_a_retention_change_is_applied_in_place(ledger, mongo, mongo_server) -> None:
    changed, commands = _watched(mongo_server.port, mongo[1], timedelta(days=30))
    changed.ensure_indexes()
    ttl = {name: indexes["retention"][2] for name, indexes in _indexes(changed).items()}
    assert ttl == dict.fromkeys(WANTED, 30 * DAY)
    assert "collMod" in commands.names and not {"dropIndexes", "createIndexes"} & set(commands.names)


def test_indexes_already_in_shape_are_left_alone(ledger, mongo, mongo_server) -> None:
    again, commands = _watched(mongo_server.port, mongo[1], timedelta(days=400))
    again.ensure_indexes()
    assert set(commands.names) == {"listIndexes"}
    assert _indexes(again) == WANTED


@pytest.mark.parametrize(
    ("collection", "keys", "options"),
    [
        ("ledger", [("dag_id", 1), ("run_id", 1)], {"name": "fence", "unique": True}),  # an older fence
        ("ledger", [(f, 1) for f in RECORD_KEY], {"name": "fence"}),  # the fence without uniqueness
        ("ledger", [("written", 1)], {"name": "retention", "expireAfterSeconds": 60}),  # TTL on another field
        ("sweeps", [("dag_id", 1), ("run_id", 1)], {"name": "sweep", "unique": True, "expireAfterSeconds": 60}),
        ("ledger", [("at", 1)], {"name": "at_1", "expireAfterSeconds": 60}),  # same keys, another name
    ],
)
def test_an_index_that_differs_otherwise_is_rebuilt(mongo, collection: str, keys: list, options: dict) -> None:
    client, db = mongo
    client[db][collection].create_index(keys, **options)
    led = Ledger(client, LedgerConfig(database=db))
    led.ensure_indexes()
    assert _indexes(led) == WANTED


def test_a_refused_collmod_falls_back_to_a_rebuild() -> None:
    # MongoDB's readWrite role may drop and create indexes but not run collMod (SecantusDB's may).
    daemon = start_secantusdb(options=("--enable-test-commands",))
    port = daemon.port
    assert port is not None
    try:
        Ledger(MongoClient(f"mongodb://127.0.0.1:{port}/"), LedgerConfig(database="reaper")).ensure_indexes()
        changed, commands = _watched(port, "reaper", timedelta(days=30))
        unauthorized = {"failCommands": ["collMod"], "errorCode": 13}
        changed.records.database.client.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 2}, data=unauthorized
        )
        changed.ensure_indexes()
        assert {name: indexes["retention"][2] for name, indexes in _indexes(changed).items()} == dict.fromkeys(
            WANTED, 30 * DAY
        )
        # The first two refused and rebuilt, the other three changed in place.
        assert commands.names.count("collMod") == 5 and commands.names.count("dropIndexes") == 2
    finally:
        daemon.stop()


def test_lease_and_outcome_reads_come_from_the_primary_whatever_the_connection_says(mongo_server) -> None:
    # Review finding: a connection's extras (readPreference=secondary) could make a lease check read a stale copy.
    from pymongo import ReadPreference

    from reaper.config import MongoLeaseConfig
    from reaper.stores.mongo import MongoLeases

    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{mongo_server.port}/", readPreference="secondaryPreferred"
    )
    ledger = Ledger(client, LedgerConfig(database="reaper_reads"))
    leases = MongoLeases(client, MongoLeaseConfig(database="reaper_reads"))
    for collection in (ledger.locks, ledger.records, leases.collection):
        assert collection.read_preference == ReadPreference.PRIMARY
        assert collection.read_concern.level == "majority"


# --- reads: the audit view and the demo -------------------------------------------------------


def _record(run_id: str, scope: str, uid: str, action: str, **fields: object) -> dict[str, object]:
    return {**IDS, "run_id": run_id, "target": "gce", "scope": scope, "uid": uid, "action": action, **fields}


def test_summaries_newest_first_by_dag_and_run_without_the_census(ledger) -> None:
    for run_id, dag_id in (("manual__1", "reaper_gce_enforcement"), ("manual__2", "reaper_gce_report_only")):
        ledger.summary({**IDS, "dag_id": dag_id, "run_id": run_id, "why": run_id, "census": {"p1": 5}})
        time.sleep(0.01)  # distinct "at"
    ledger.summary({**IDS, "run_id": "manual__1", "execution": 1, "lease": "t2", "why": "cleared"})
    assert [s.why for s in ledger.summaries()] == ["cleared", "manual__2", "manual__1"]
    assert [s.why for s in ledger.summaries(limit=1)] == ["cleared"]
    assert [s.why for s in ledger.summaries("reaper_gce_enforcement")] == ["cleared", "manual__1"]
    assert [s.why for s in ledger.summaries("reaper_gce_enforcement", "manual__1", limit=1)] == ["cleared"]
    assert ledger.summaries("reaper_gce_enforcement", "manual__9") == []
    assert all(s.census is msgspec.UNSET for s in ledger.summaries())


def test_decision_page_of_one_run_ordered_filtered_and_counted(ledger) -> None:
    decision = {"kind": "decision", "rule": "heartbeat_stale"}
    ledger.write(
        [
            _record("manual__1", "p2", "3", "delete", name="runner-b", **decision),
            _record("manual__1", "p1", "2", "outcome", kind="outcome", result="deleted", name="runner-a"),
            _record("manual__1", "p1", "2", "delete", name="runner-a", **decision),
            _record("manual__1", "p1", "1", "report", name="run.ner", **{**decision, "rule": "budget"}),
            _record("manual__2", "p1", "9", "delete", name="runner-z", **decision),
        ]
    )
    queries = AuditQueries(ledger)
    dag, every = IDS["dag_id"], RowFilter()
    page, total = queries.decision_page(dag, "manual__1", every)
    assert [(r["scope"], r["name"]) for r in page] == [("p1", "run.ner"), ("p1", "runner-a"), ("p2", "runner-b")]
    assert total == 3 and all("_id" not in r for r in page)
    assert [r["uid"] for r in queries.decision_page(dag, "manual__1", every, "-name", skip=1, limit=1)[0]] == ["2"]
    assert queries.decision_page(dag, "manual__1", every, limit=1)[1] == 3  # the count is of all matches
    assert [r["uid"] for r in queries.decision_page(dag, "manual__1", RowFilter(scope="p1", action="delete"))[0]] == [
        "2"
    ]
    assert [r["uid"] for r in queries.decision_page(dag, "manual__1", RowFilter(rule="budget"))[0]] == ["1"]
    assert [r["uid"] for r in queries.decision_page(dag, "manual__1", RowFilter(outcome="deleted"))[0]] == ["2"]
    assert [r["uid"] for r in queries.decision_page(dag, "manual__1", RowFilter(name="n.n"))[0]] == ["1"]  # literally
    assert queries.decision_page(dag, "manual__1", RowFilter(name=".*")) == ([], 0)
    assert queries.decision_page("reaper_k8s_enforcement", "manual__1", every) == ([], 0)
    assert [r["uid"] for r in queries.companions(dag, "manual__1")] == ["2"]
    assert {r["run_id"] for r in queries.history("runner-a", {dag}).records} == {"manual__1"}
    assert queries.history("runner-a", {"reaper_k8s_enforcement"}).records == []


def test_tally_counts_records_by_target_action_and_why(ledger) -> None:
    ledger.write(
        [
            _record("manual__1", "p1", "1", "delete", reason="terminated"),
            _record("manual__1", "p1", "2", "delete", reason="terminated"),
            _record("manual__1", "p1", "1", "outcome", result="deleted"),
            _record("manual__1", "p1", "3", "keep"),
            {**_record("manual__1", "c1", "u1", "report", reason="lease_unknown"), "target": "k8s"},
        ]
    )
    assert ledger.tally() == {
        ("gce", "delete", "terminated"): 2,
        ("gce", "outcome", "deleted"): 1,
        ("gce", "keep", ""): 1,
        ("k8s", "report", "lease_unknown"): 1,
    }


def test_one_client_per_process_and_connection(monkeypatch, mongo_server, mongo) -> None:
    import reaper.ledger
    import reaper.stores.mongo

    built: list[dict[str, object]] = []

    def counted(**options: Any) -> MongoClient:
        built.append(options)
        return MongoClient(**options)

    monkeypatch.setattr(reaper.stores.mongo, "MongoClient", counted)
    monkeypatch.setattr(reaper.ledger, "_clients", {})
    monkeypatch.setenv(
        "AIRFLOW_CONN_LEDGER_TEST", f'{{"conn_type": "mongo", "host": "127.0.0.1", "port": {mongo_server.port}}}'
    )
    config = LedgerConfig(conn_id="ledger_test", database=mongo[1], timeout=timedelta(seconds=3))
    first, second = Ledger.connect(config), Ledger.connect(config)
    assert first.records.database.client is second.records.database.client and len(built) == 1
    assert built[0]["serverSelectionTimeoutMS"] == 3000
    Ledger.connect(config.model_copy(update={"timeout": timedelta(seconds=2)}))  # other timeouts: another client
    assert len(built) == 2
    pid = os.getpid()
    # A forked child (as the ledger module sees it; pymongo keeps the real pid): never its parent's client.
    monkeypatch.setattr(reaper.ledger, "os", SimpleNamespace(getpid=lambda: pid + 1))
    child = Ledger.connect(config)
    assert len(built) == 3 and child.records.database.client is not first.records.database.client
    assert {key[0] for key in reaper.ledger._clients} == {pid + 1}  # the parent's are dropped, not used
    assert child.summaries() == []


def test_a_retry_after_the_transitions_were_written_but_not_the_states_writes_each_once(ledger) -> None:
    from reaper.model import Evidence, Phase, Plan
    from tests.builders import inst

    vms: list[Resource] = [inst(project="p1") for _ in range(3)]
    plan = Plan(Phase.ENFORCEMENT, 0.0, [], [("gce", "fresh", vms)], [], {})
    ids = {"dag_id": "reaper_gce_enforcement", "run_id": "scheduled__1", "execution": 0, "lease": "t"}
    evidence = Evidence(swept=frozenset({("gce", "p1")}))
    assert ledger.record_transitions(ids, plan, evidence, "run") == 3
    ledger.states.delete_many({})  # the task died between its two writes
    assert ledger.record_transitions(ids, plan, evidence, "run") == 3  # the same ones, refused by their fence
    assert ledger.transitions.count_documents({}) == 3
    assert ledger.record_transitions(ids, plan, evidence, "run") == 0  # and now the states are there


def test_a_sweep_of_many_scopes_reads_their_states_in_one_round_trip(mongo_server, mongo) -> None:
    """More state documents than a cursor's default first batch (101): still one find, no getMore (the benchmark's
    200 projects made one getMore per sweep before)."""
    from reaper.model import Evidence, Phase, Plan
    from tests.builders import inst
    from tests.helpers import FindCounter

    _, db = mongo
    counter = FindCounter()
    counted: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{mongo_server.port}/", event_listeners=[counter]
    )
    led = Ledger(counted, LedgerConfig(database=db))
    led.ensure_indexes()
    vms: list[Resource] = [inst(project=f"p{p:03d}") for p in range(120)]
    plan = Plan(Phase.ENFORCEMENT, 0.0, [], [("gce", "fresh", vms)], [], {})
    ids = {"dag_id": "reaper_gce_enforcement", "execution": 0, "lease": "t"}
    evidence = Evidence(swept=frozenset(("gce", f"p{p:03d}") for p in range(120)))
    assert led.record_transitions({**ids, "run_id": "scheduled__1"}, plan, evidence, "run") == 120
    assert led.states.count_documents({}) == 120
    counter.commands.clear()
    assert led.record_transitions({**ids, "run_id": "scheduled__2"}, plan, evidence, "run") == 0
    assert counter.commands == ["find"]
