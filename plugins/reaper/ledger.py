"""The ledger: every decision, delete intent and outcome as a MongoDB document (DESIGN.md section 7).

Writes are acknowledged (``w="majority"``, journaled) and keyed by the fence
``{dag_id, run_id, target, scope, uid, action}`` under a unique index, so a
retried task rewrites the same documents instead of duplicating them. An intent
is durable before its delete is sent: if writing it fails, the caller must not
delete. The ledger also holds one summary per sweep and the per-target sweep
lease that keeps the DAGs of one target from sweeping at the same time.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta

from pymongo import MongoClient, UpdateOne, WriteConcern
from pymongo.errors import DuplicateKeyError

from reaper.config import LedgerConfig

FENCE = ("dag_id", "run_id", "target", "scope", "uid", "action")
ONE_BATCH = 100_000  # documents per cursor batch: above any realistic sweep, so one round trip


class Ledger:
    def __init__(self, client: MongoClient, config: LedgerConfig) -> None:
        ms = int(config.timeout.total_seconds() * 1000)
        concern = WriteConcern(w="majority", j=True, wtimeout=ms)
        db = client[config.database]
        self.records = db.get_collection(config.collection, write_concern=concern)
        self.sweeps = db.get_collection(config.sweeps_collection, write_concern=concern)
        self.locks = db.get_collection(config.locks_collection, write_concern=concern)
        self.retention = int(config.retention.total_seconds())

    def ensure_indexes(self) -> None:
        self.records.create_index([(f, 1) for f in FENCE], unique=True, name="fence")
        self.records.create_index("at", expireAfterSeconds=self.retention, name="retention")
        self.sweeps.create_index([("dag_id", 1), ("run_id", 1)], unique=True, name="sweep")
        self.sweeps.create_index("at", expireAfterSeconds=self.retention, name="retention")

    def write(self, records: Iterable[dict[str, object]]) -> int:
        """Upsert records by their fence; returns how many. Raises if the write is not acknowledged."""
        now = datetime.now(UTC)
        ops = [UpdateOne({f: r[f] for f in FENCE}, {"$set": {**r, "at": now}}, upsert=True) for r in records]
        if ops:
            self.records.bulk_write(ops, ordered=False)
        return len(ops)

    def outcomes(
        self, dag_id: str, run_id: str, uids: Collection[str] | None = None
    ) -> dict[tuple[str, str], dict[str, object]]:
        """Outcomes already recorded in this sweep, by (scope, uid): a retried delete skips them.

        ``uids`` narrows the lookup to one batch's resources. One round trip either way: the
        whole answer comes in the first batch (a delete batch is small; a sweep's outcomes are
        capped by ``max_deletions_per_sweep``), so no ``getMore`` follows.
        """
        query: dict[str, object] = {"dag_id": dag_id, "run_id": run_id, "action": "outcome"}
        if uids is not None:
            query["uid"] = {"$in": sorted(uids)}
        found = self.records.find(query, {"_id": 0}, batch_size=ONE_BATCH)
        return {(str(r["scope"]), str(r["uid"])): r for r in found}

    def summary(self, doc: dict[str, object]) -> None:
        key = {"dag_id": doc["dag_id"], "run_id": doc["run_id"]}
        self.sweeps.update_one(key, {"$set": {**doc, "at": datetime.now(UTC)}}, upsert=True)

    # --- the per-target sweep lease -----------------------------------------------------------

    def acquire(self, target: str, holder: str, ttl: timedelta) -> str | None:
        """Take the target's sweep lease for ``holder``; None if taken, else who held it before (or '')."""
        now = time.time()
        lease = {"holder": holder, "expires_at": now + ttl.total_seconds()}
        try:
            previous = self.locks.find_one_and_update(
                {"_id": target, "$or": [{"holder": holder}, {"expires_at": {"$lt": now}}]},
                {"$set": lease},
                upsert=True,
            )
        except DuplicateKeyError:
            return None  # held by another, unexpired: the upsert collided with it
        return "" if previous is None else str(previous.get("holder", ""))

    def release(self, target: str, holder: str) -> None:
        self.locks.delete_one({"_id": target, "holder": holder})
