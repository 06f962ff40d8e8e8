"""MongoDB evidence: the run store and the lease collection, read in batches of ``$in`` queries.

A batch's keys that the successful query did not return are provably absent; any
error, timeout or undecodable document makes that whole batch's keys unknown.
Each batch is one round trip: the cursor's first batch holds every document it can match.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import PyMongoError

from reaper.config import MongoLeaseConfig, MongoRunStoreConfig
from reaper.model import Keyed

log = logging.getLogger(__name__)


def mongo_client(conn_id: str, timeout: float) -> MongoClient:
    """A client for the Airflow connection ``conn_id`` with every timeout bounded."""
    from airflow.providers.mongo.hooks.mongo import MongoHook

    conn = MongoHook(mongo_conn_id=conn_id).get_connection(conn_id)
    if conn.host and conn.host.startswith("mongodb"):
        uri = conn.host
    else:
        auth = f"{conn.login}:{conn.password}@" if conn.login else ""
        uri = f"mongodb://{auth}{conn.host or '127.0.0.1'}:{conn.port or 27017}/"
    ms = int(timeout * 1000)
    return MongoClient(uri, serverSelectionTimeoutMS=ms, socketTimeoutMS=ms, connectTimeoutMS=ms, timeoutMS=ms)


def batched_lookup(
    collection: Collection,
    key_field: str,
    keys: Iterable[str],
    batch_size: int,
    projection: dict[str, int],
    decode: Callable[[dict[str, object]], object],
) -> Keyed:
    """``{key: decode(doc)}`` for every key found; failed batches' keys in ``failed``."""
    wanted = sorted(set(keys))
    known: dict[str, object] = {}
    failed: set[str] = set()
    for start in range(0, len(wanted), batch_size):
        batch = wanted[start : start + batch_size]
        try:
            # One more than the batch can match: a full first batch would leave the cursor open and
            # cost an empty getMore round trip.
            docs = collection.find({key_field: {"$in": batch}}, projection).batch_size(len(batch) + 1)
            found = {}
            for doc in docs:
                key = doc.get(key_field)
                if not isinstance(key, str):
                    raise ValueError(f"document {doc.get('_id')!r}: {key_field} is not a string")
                found[key] = decode(doc)
            known.update(found)
        except (PyMongoError, ValueError, TypeError) as exc:
            log.warning("%s: %d keys unknown: %s", collection.full_name, len(batch), exc)
            failed.update(batch)
    return Keyed(known=known, failed=frozenset(failed), complete=True)


class MongoRunStore:
    def __init__(self, client: MongoClient, config: MongoRunStoreConfig) -> None:
        self.collection = client[config.database][config.collection]
        self.config = config

    def _status(self, doc: dict[str, object]) -> str:
        status = doc.get(self.config.status_field)
        if not isinstance(status, str):
            raise ValueError(f"run {doc.get(self.config.key_field)!r}: {self.config.status_field} is not a string")
        return status

    def read(self, keys: Iterable[str]) -> Keyed[str]:
        cfg = self.config
        projection = {cfg.key_field: 1, cfg.status_field: 1}
        return batched_lookup(self.collection, cfg.key_field, keys, cfg.batch_size, projection, self._status)


def _expiry(doc: dict[str, object]) -> float | None:
    value = doc.get("expires_at")
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"lease {doc.get('_id')!r}: expires_at is neither a date nor unix seconds")


class MongoLeases:
    """Leases as documents ``{_id: run key, expires_at}`` (BSON dates are UTC)."""

    def __init__(self, client: MongoClient, config: MongoLeaseConfig) -> None:
        self.collection = client[config.database][config.collection]
        self.config = config

    def read(self, keys: Iterable[str]) -> Keyed[float | None]:
        projection = {"_id": 1, "expires_at": 1}
        return batched_lookup(self.collection, "_id", keys, self.config.batch_size, projection, _expiry)
