"""The ledger: every decision, delete intent and outcome as a MongoDB document (docs/design.md §7).

Writes are acknowledged (``w="majority"``, journaled) and keyed by the fence
``{dag_id, run_id, target, scope, uid, action}`` under a unique index, so a
retried task rewrites the same documents instead of duplicating them. An intent
is durable before its delete is sent: if writing it fails, the caller must not
delete. The ledger also holds one summary per sweep, the approvals, and (in its database, with its
concerns: :mod:`reaper.sweep_lease`) the per-target sweep lease that keeps the DAGs of one target from
sweeping at the same time.

Its readers go through read methods, never its collections: its own for what a sweep reads, the audit
view's in :mod:`reaper.report.queries`; a process reuses one client per connection (:meth:`Ledger.connect`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import DeleteMany, MongoClient, ReadPreference, ReturnDocument, UpdateOne, WriteConcern
from pymongo.collection import Collection as MongoCollection
from pymongo.errors import BulkWriteError, OperationFailure
from pymongo.read_concern import ReadConcern

from reaper.config import LedgerConfig
from reaper.model import Action, Evidence, Plan
from reaper.records import EXECUTION, RECORD_KEY, LedgerRecord, SweepSummary, document, summary_of
from reaper.stores.mongo import Document as MongoDocument
from reaper.stores.mongo import mongo_client
from reaper.sweep_lease import SweepLease
from reaper.vocabulary import RecordAction, Result

ONE_BATCH = 100_000  # documents per cursor batch: above any realistic sweep, so one round trip
# A run's decision records in the audit view's default order: the ``sweep_rows`` index, whole, so that
# a page in that order is read off the index (no sort in memory, whatever the sweep's size).
ROW_PREFIX = ("dag_id", "run_id", "kind")
ROW_ORDER = ("scope", "name", "uid", "execution")
TTL = "expireAfterSeconds"
DUPLICATE_KEY = 11000  # MongoDB's error code of a unique index refusing a second document with its key
# What listIndexes reports besides the definition: the format version, and fields of old servers.
_NOT_DEFINITION = ("v", "ns", "background")

log = logging.getLogger(__name__)


def ensure_index(
    collection: MongoCollection[MongoDocument],
    keys: list[tuple[str, int]],
    name: str,
    *,
    unique: bool = False,
    ttl: int | None = None,
) -> None:
    """Make ``name`` exactly this index, whatever an earlier config or version of the reaper left.

    ``createIndex`` refuses a name or a key pattern that exists with other options, and
    would go on refusing at every sweep until someone fixed the index by hand. So an
    index that differs only in its TTL gets the new one in place (``collMod``); any
    other difference, or a ``collMod`` the server refuses, drops and rebuilds it; and
    another index on the same keys, which would block ours, is dropped.
    """
    wanted: dict[str, object] = {
        "key": keys,
        **({"unique": True} if unique else {}),
        **({TTL: ttl} if ttl is not None else {}),
    }
    indexes = {index: _definition(info) for index, info in collection.index_information().items()}
    for other, definition in indexes.items():
        if other != name and definition["key"] == keys:
            log.warning("%s: dropping index %s, which has the keys of index %s", collection.full_name, other, name)
            collection.drop_index(other)
    have = indexes.get(name)
    if have == wanted:
        return
    if have is not None:
        if ttl is not None and TTL in have and {**have, TTL: ttl} == wanted and _set_ttl(collection, name, ttl):
            return
        log.warning("%s: rebuilding index %s as %s (it was %s)", collection.full_name, name, wanted, have)
        collection.drop_index(name)
    options: dict[str, Any] = {k: v for k, v in wanted.items() if k != "key"}
    collection.create_index(keys, name=name, **options)


def _definition(info: dict[str, object]) -> dict[str, object]:
    """An index as ``index_information`` reports it, reduced to what ``createIndex`` would be given."""
    return {k: v for k, v in info.items() if k not in _NOT_DEFINITION and v is not False}


def _set_ttl(collection: MongoCollection[MongoDocument], name: str, ttl: int) -> bool:
    """Change a TTL index's expiry in place; False when refused (MongoDB's readWrite role lacks ``collMod``)."""
    try:
        collection.database.command("collMod", collection.name, index={"name": name, TTL: ttl})
    except OperationFailure as exc:
        log.warning("%s: collMod of index %s refused (%s); rebuilding it", collection.full_name, name, exc.code)
        return False
    return True


# This process's clients, by (pid, connection id, timeout): see process_client.
_clients: dict[tuple[int, str, float], MongoClient[MongoDocument]] = {}
_clients_lock = threading.Lock()


def _forget_clients() -> None:
    """In a forked child: the parent's clients are not the child's to use, and the lock may be held."""
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def process_client(conn_id: str, timeout: float) -> MongoClient[MongoDocument]:
    """This process's client of the Airflow connection ``conn_id``, timeouts bounded by ``timeout`` seconds.

    Built on first use and then reused: a client holds a connection pool and monitor threads,
    too much to build per request. pymongo clients are not fork-safe, so the cache is keyed by
    the process id as well: a forked child (a worker of Airflow's API server) builds its own and
    never uses, or closes, one it inherited.
    """
    key = (os.getpid(), conn_id, timeout)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            for inherited in [k for k in _clients if k[0] != key[0]]:
                del _clients[inherited]
            client = _clients[key] = mongo_client(conn_id, timeout)
    return client


class Ledger:
    @classmethod
    def connect(cls, config: LedgerConfig) -> Ledger:
        """The ledger of ``config``, on this process's client of its connection (:func:`process_client`)."""
        return cls(process_client(config.conn_id, config.timeout.total_seconds()), config)

    def __init__(self, client: MongoClient[MongoDocument], config: LedgerConfig) -> None:
        ms = int(config.timeout.total_seconds() * 1000)
        # Reads from the primary, of majority-committed data: a connection's extras (a read preference
        # of secondary) must never let a lease check or an outcome lookup read a stale copy.
        db = client.get_database(
            config.database,
            write_concern=WriteConcern(w="majority", j=True, wtimeout=ms),
            read_preference=ReadPreference.PRIMARY,
            read_concern=ReadConcern("majority"),
        )
        self.records = db.get_collection(config.collection)
        self.sweeps = db.get_collection(config.sweeps_collection)
        self.locks = db.get_collection(config.locks_collection)
        self.transitions = db.get_collection(config.transitions_collection)
        self.states = db.get_collection(config.states_collection)
        self.notices = db.get_collection(config.notices_collection)
        self.approvals = db.get_collection(config.approvals_collection)
        self.retention = int(config.retention.total_seconds())
        self.sweep_lease = SweepLease(self.locks)

    def ensure_indexes(self) -> None:
        """The fence and retention indexes as this version and config define them, changed in place if need be.

        The unique index on :data:`RECORD_KEY` keeps the name ``fence`` it has in every deployed ledger."""
        ensure_index(self.records, [(f, 1) for f in RECORD_KEY], "fence", unique=True)
        ensure_index(self.records, [("at", 1)], "retention", ttl=self.retention)
        # A delete task's reads of what an earlier try of its execution recorded (outcomes, intents): equality on
        # the execution and the action, then its batch's uids. The fence index names the target and scope between
        # them, so without this one a server scans the execution's records (SecantusDB: the collection) per read.
        ensure_index(self.records, [(f, 1) for f in (*EXECUTION, "action", "uid")], "by_execution")
        ensure_index(self.sweeps, [(f, 1) for f in EXECUTION], "sweep", unique=True)
        ensure_index(self.sweeps, [("at", 1)], "retention", ttl=self.retention)
        # The audit view's reads: a run's decisions by page, a resource's history, the overview's window.
        ensure_index(self.records, [(f, 1) for f in (*ROW_PREFIX, *ROW_ORDER)], "sweep_rows")
        ensure_index(self.records, [("name", 1), ("dag_id", 1)], "by_name")
        ensure_index(self.records, [("uid", 1), ("dag_id", 1)], "by_uid")
        ensure_index(self.sweeps, [("dag_id", 1), ("at", 1)], "timeline")
        ensure_index(self.sweeps, [("run_id", 1)], "by_run")
        # A resource's transitions, found by uid, name (or its prefix) and Kubernetes run; each DAG's states.
        ensure_index(self.transitions, [(f, 1) for f in (*EXECUTION, "target", "uid")], "fence", unique=True)
        ensure_index(self.transitions, [("at", 1)], "retention", ttl=self.retention)
        for field in ("uid", "name", "group"):
            ensure_index(self.transitions, [(field, 1)], f"by_{field}")
        ensure_index(self.states, [(f, 1) for f in ("dag_id", "target", "scope", "part")], "scope", unique=True)
        ensure_index(self.states, [("at", 1)], "retention", ttl=self.retention)
        ensure_index(self.approvals, [("dag_id", 1), ("created_at", 1)], "by_dag")
        ensure_index(self.approvals, [("at", 1)], "retention", ttl=self.retention)

    def write(self, records: Iterable[LedgerRecord | Mapping[str, object]]) -> int:
        """Upsert records by their fence, each encoded as :func:`reaper.records.document` makes it; returns how
        many. Raises if the write is not acknowledged."""
        now = datetime.now(UTC)
        docs = map(document, records)
        ops = [UpdateOne({f: d[f] for f in RECORD_KEY}, {"$set": {**d, "at": now}}, upsert=True) for d in docs]
        if ops:
            self.records.bulk_write(ops, ordered=False)
        return len(ops)

    def outcomes(
        self, ids: dict[str, object], uids: Collection[str] | None = None
    ) -> dict[tuple[str, str], dict[str, object]]:
        """Outcomes already recorded by this execution, by (scope, uid): a retried delete skips them.

        ``uids`` narrows the lookup to one batch's resources. One round trip either way: the
        whole answer comes in the first batch (a delete batch is small; a sweep's outcomes are
        capped by ``max_deletions_per_sweep``), so no ``getMore`` follows.
        """
        return {(str(r["scope"]), str(r["uid"])): r for r in self._find(ids, RecordAction.OUTCOME, uids)}

    def intents(self, ids: dict[str, object], uids: Collection[str]) -> set[tuple[str, str]]:
        """(scope, uid) of the intents of this execution whose delete call went out (marked ``sent``)."""
        return {
            (str(r["scope"]), str(r["uid"])) for r in self._find(ids, RecordAction.DELETE_INTENT, uids) if r.get("sent")
        }

    def _find(self, ids: dict[str, object], action: str, uids: Collection[str] | None) -> Iterable[dict[str, object]]:
        query: dict[str, object] = {f: ids[f] for f in EXECUTION}
        query["action"] = action
        if uids is not None:
            query["uid"] = {"$in": sorted(uids)}
        return self.records.find(query, {"_id": 0}, batch_size=ONE_BATCH)

    def earlier_execution(self, ids: dict[str, object]) -> bool:
        """Whether the ledger holds a record or summary of another execution of this DAG run."""
        other = {"dag_id": ids["dag_id"], "run_id": ids["run_id"], "lease": {"$ne": ids["lease"]}}
        return any(c.find_one(other, {"_id": 1}) is not None for c in (self.records, self.sweeps))

    def record_transitions(self, ids: dict[str, object], plan: Plan, evidence: Evidence, run_label: str) -> int:
        """Record what changed for each resource since this DAG's last sweep of its scope; returns how many.

        A few round trips, however large the sweep (2 to 5 at 100,000 resources: bench/audit.py): the DAG's
        states of the plan's targets, the transitions, and the states of the scopes that changed. Transitions
        first: a retry after a failure between the two finds the same ones, which their fence (the unique index)
        refuses.
        """
        from reaper.transitions import joined, since, split

        dag_id = ids["dag_id"]
        targets = sorted({t for t, _ in evidence.swept})
        stored = self.states.find({"dag_id": dag_id, "target": {"$in": targets}}, {"_id": 0}, batch_size=ONE_BATCH)
        before = joined(stored)
        found, states = since(before, plan, evidence, run_label)
        now = datetime.now(UTC)
        if found:  # inserts, not upserts (a first sweep writes one per resource); a retry's are there already
            try:
                self.transitions.insert_many([{**ids, **c.record(), "at": now} for c in found], ordered=False)
            except BulkWriteError as exc:
                refused = {e.get("code") for e in exc.details.get("writeErrors", [])}
                if refused - {DUPLICATE_KEY} or exc.details.get("writeConcernErrors"):
                    raise
        writes: list[UpdateOne | DeleteMany] = []
        for key, scope_states in states.items():
            docs = split(str(dag_id), key, scope_states)
            writes += [UpdateOne(d.key, {"$set": {**d._asdict(), "at": now}}, upsert=True) for d in docs]
            writes.append(
                DeleteMany({"dag_id": dag_id, "target": key[0], "scope": key[1], "part": {"$gte": len(docs)}})
            )
        if writes:
            self.states.bulk_write(writes, ordered=False)
        return len(found)

    def summary(self, summary: SweepSummary | Mapping[str, object]) -> None:
        """One summary per execution: a cleared run adds its own, the first one stays."""
        doc = document(summary)
        key = {f: doc[f] for f in EXECUTION}
        self.sweeps.update_one(key, {"$set": {**doc, "at": datetime.now(UTC)}}, upsert=True)

    # --- notifications (reaper.sweep.notify) ---------------------------------------------------

    def deleted_between(self, target: str, since: float, until: float) -> list[dict[str, object]]:
        """The ``deleted`` outcomes of ``target``'s sweeps written in [since, until) (unix seconds), oldest first.

        Read once per digest window (docs/notifications.md), on the ``retention`` index.
        """
        query = {
            "at": {"$gte": datetime.fromtimestamp(since, UTC), "$lt": datetime.fromtimestamp(until, UTC)},
            "kind": "outcome",
            "target": target,
            "result": Result.DELETED,
        }
        return list(self.records.find(query, {"_id": 0}, batch_size=ONE_BATCH).sort("at", 1))

    def deciding(self, outcomes: Sequence[Mapping[str, object]]) -> list[dict[str, object] | None]:
        """The delete decision behind each of these outcomes, in their order (None: not in the ledger).

        One round trip by uid (``by_uid`` answers it whole), narrowed here to each outcome's own execution: a
        resource decided in several sweeps is told with the reason of the one that deleted it.
        """
        if not outcomes:
            return []
        query = {"uid": {"$in": sorted({str(o["uid"]) for o in outcomes})}, "kind": "decision", "action": "delete"}
        found = self.records.find(query, {"_id": 0}, batch_size=ONE_BATCH)
        by_key = {(*(r.get(f) for f in EXECUTION), r["uid"]): r for r in found}
        return [by_key.get((*(o.get(f) for f in EXECUTION), o["uid"])) for o in outcomes]

    def notice_state(self, key: str) -> dict[str, object] | None:
        """What the notification channel ``key`` was last told (None: never)."""
        return self.notices.find_one({"_id": key}, {"_id": 0})

    def save_notice_state(self, key: str, state: dict[str, object]) -> None:
        self.notices.replace_one({"_id": key}, {**state, "at": datetime.now(UTC)}, upsert=True)

    # --- reads: the summaries and the demo's tally (the audit view's reads: reaper.report.queries) ---

    def summaries(self, dag_id: str | None = None, run_id: str | None = None, limit: int = 50) -> list[SweepSummary]:
        """The sweeps' summaries, newest first, at most ``limit``: all, one DAG's, or one run's executions; typed
        (:func:`reaper.records.summary_of`), whatever version of the reaper wrote them.

        Without the census (the counts of every resource listed), which no reader shows.
        """
        query = {field: value for field, value in (("dag_id", dag_id), ("run_id", run_id)) if value}
        return [summary_of(s) for s in self.sweeps.find(query, {"_id": 0, "census": 0}).sort("at", -1).limit(limit)]

    def tally(self) -> Counter[tuple[str, str, str]]:
        """Every record counted by (target, action, why): why is its reason, else its result, else empty."""
        projection = {"_id": 0, "target": 1, "action": 1, "reason": 1, "result": 1}
        return Counter(
            (str(r.get("target", "")), str(r["action"]), str(r.get("reason") or r.get("result") or ""))
            for r in self.records.find({}, projection, batch_size=ONE_BATCH)
        )

    # --- approvals (docs/design.md §6): recorded, read, used by one execution -------------------

    def held(self, dag_id: str, run_id: str) -> list[dict[str, object]]:
        """The candidates an approval may cover, of the newest execution of a DAG run, in the audit view's order,
        each with ``held_by`` (why it is one): its held deletes (their reason, one of
        :data:`reaper.approvals.APPROVABLE`) and its planned deletes never sent (:data:`reaper.approvals.LEFT` and
        the outcome's detail: the run's deadline, a lost lease, a stop, a revocation; without them, what an
        approval's run leaves could only wait for the next scheduled sweep to hold it again). A Kubernetes run's
        unsent objects are candidates only when none of its planned deletes went further (a run is approved
        whole: its Pod terminating or refused, its Secrets cannot be approved without it). The newest execution is
        the newest that recorded a decision or a summary: one that kept everything holds no candidate. Three round
        trips."""
        from reaper.approvals import APPROVABLE, LEFT

        run = {"dag_id": dag_id, "run_id": run_id}
        delete = Action.DELETE.value
        query = {**run, "kind": "decision", "$or": [{"reason": {"$in": list(APPROVABLE)}}, {"action": delete}]}
        found = list(self.records.find(query, {"_id": 0}, batch_size=ONE_BATCH).sort([(f, 1) for f in ROW_ORDER]))
        if not found:
            return []
        # The newest summary: by execution, then time (a clear may keep the execution number under a new lease); a
        # summary of an execution skipped for the lease decided nothing and hides nothing.
        ran = {**run, "state": {"$ne": "skipped"}}
        summaries = self.sweeps.find(ran, {"_id": 0, "execution": 1, "lease": 1, "at": 1}).sort(
            [("execution", -1), ("at", -1)]
        )
        newest = max(
            [*found, *summaries.limit(1)], key=lambda r: (int(r.get("execution") or 0), str(r.get("at") or ""))
        )
        execution = {"execution": newest.get("execution"), "lease": newest.get("lease")}
        found = [r for r in found if all(r.get(f) == v for f, v in execution.items())]
        outcomes = {**run, **execution, "action": RecordAction.OUTCOME.value, "result": LEFT.value}
        projection = {"_id": 0, "scope": 1, "uid": 1, "detail": 1}
        left = {
            (r.get("scope"), r.get("uid")): f"{LEFT.value}: {r.get('detail') or ''}"
            for r in self.records.find(outcomes, projection, batch_size=ONE_BATCH)
        }
        gone_further = {  # Kubernetes runs with a planned delete that was sent, or ended otherwise
            (r.get("scope"), r.get("group"))
            for r in found
            if r.get("action") == delete and r.get("group") and (r.get("scope"), r.get("uid")) not in left
        }
        candidates = []
        for r in found:
            if r.get("group") and (r.get("scope"), r.get("group")) in gone_further:
                continue  # part of a run whose Pod was sent, or refused: never approved without it
            if r.get("reason") in APPROVABLE:
                candidates.append({**r, "held_by": r["reason"]})
            elif unsent := left.get((r.get("scope"), r.get("uid"))):
                candidates.append({**r, "held_by": unsent})
        return candidates

    def record_approval(self, approval: dict[str, object]) -> None:
        """Insert one approval (its ``id`` is its key: a duplicate is refused, never overwritten)."""
        self.approvals.insert_one({**approval, "_id": approval["id"], "at": datetime.now(UTC)})

    def approval(self, approval_id: str) -> dict[str, object] | None:
        """One approval by its id, or None."""
        return self.approvals.find_one({"_id": approval_id}, {"_id": 0, "at": 0})

    def revocation(self, approval_id: str) -> dict[str, object] | None:
        """What a sending batch reads of its approval (:data:`reaper.approvals.STANDING`: its revocation, and what
        makes it the approval it claimed), without the items (an incident's approval names thousands, which the
        server would copy and send, and the client decode, at every read); None when there is no such approval."""
        from reaper.approvals import STANDING

        return self.approvals.find_one({"_id": approval_id}, {"_id": 0, **dict.fromkeys(STANDING, 1)})

    def approvals_of(
        self, dag_ids: Collection[str], limit: int = 50, items: bool = False, run_id: str | None = None
    ) -> list[dict[str, object]]:
        """The newest approvals made from sweeps of these DAGs (of the sweep ``run_id`` only, when given), at most
        ``limit``, with their items when ``items`` (the audit view's approvals), else their count. One round trip."""
        query: dict[str, object] = {"dag_id": {"$in": sorted(dag_ids)}}
        if run_id is not None:
            query["run_id"] = run_id
        cursor = self.approvals.find(query, {"_id": 0, "at": 0}).sort("created_at", -1).limit(limit)
        return [a if items else {**a, "items": len(a.get("items") or [])} for a in cursor]

    def revoke_approval(self, approval_id: str, revoked: dict[str, object]) -> dict[str, object] | None:
        """Mark an approval revoked (``revoked``: who, why, when), atomically with :meth:`claim_approval` (one
        ``findAndModify`` each): after it, no claim succeeds. The approval after it, or None when there is none or it
        was revoked already."""
        return self.approvals.find_one_and_update(
            {"_id": approval_id, "revoked": None},
            {"$set": {"revoked": revoked}},
            projection={"_id": 0, "at": 0},
            return_document=ReturnDocument.AFTER,
        )

    def claim_approval(self, approval_id: str, ids: Mapping[str, object]) -> dict[str, object] | None:
        """Mark an approval used by the execution ``ids`` (dag_id, run_id, execution, lease), atomically (one
        ``findAndModify``): only an unused one, or one this same execution claimed (a retried task). The approval
        after it, or None when another execution used it (or it does not exist)."""
        mine = {f"used_by.{f}": ids[f] for f in EXECUTION}
        unused = {"used_by": None}  # absent or null: never used
        used_by = {**{f: ids[f] for f in EXECUTION}, "at": time.time()}
        return self.approvals.find_one_and_update(
            {"_id": approval_id, "revoked": None, "$or": [unused, mine]},  # a revoked one is claimed by no one
            {"$set": {"used_by": used_by}},  # a retry of the same execution rewrites its own claim
            projection={"_id": 0, "at": 0},
            return_document=ReturnDocument.AFTER,
        )
