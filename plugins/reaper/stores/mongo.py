"""MongoDB evidence: the run store and the lease collection, read in batches of ``$in`` queries.

One ``$in`` per batch asks for every form a document could hold each run key in (one round trip:
the cursor's first batch holds every document it can match):

- documented forms, whose records are evidence: the exact string, and the ObjectId when the key
  is one, spelled as ObjectIds print (24 lower-case hex digits);
- undocumented forms, whose records make the key unknown, because a type mismatch is never proof
  of absence: the ObjectId of an upper-case spelling, the same integer as any BSON number when the
  key is a canonical decimal, and an array holding any of these.

A key is known when its records are all documented, all decode and all agree; no record at all
proves it absent (the query succeeded). A key with an undocumented, undecodable or contradictory
record is unknown on its own. Any error, timeout, or a returned document that belongs to no
requested key (the server matched something unexpected) makes the whole batch unknown.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from bson import Decimal128, ObjectId
from bson.codec_options import DatetimeConversion
from bson.errors import BSONError
from pymongo import MongoClient, ReadPreference
from pymongo.collection import Collection
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern

from reaper.config import MongoLeaseConfig, MongoRunStoreConfig
from reaper.model import Keyed
from reaper.redact import error_for_log

if TYPE_CHECKING:
    from airflow.sdk import Connection

log = logging.getLogger(__name__)

# pymongo's timeouts, all bounded by the reaper's own: a connection's extras cannot lift them.
_TIMEOUTS = ("serverSelectionTimeoutMS", "connectTimeoutMS", "socketTimeoutMS", "timeoutMS")
_UNBOUNDED = {name.lower() for name in (*_TIMEOUTS, "waitQueueTimeoutMS", "wTimeoutMS")}
# Int64 range, and canonical decimals (no sign on zero, no leading zeros, ASCII digits only).
_INT64 = range(-(2**63), 2**63)
_DECIMAL = re.compile(r"0|-?[1-9][0-9]{0,4000}", re.ASCII)

# pymongo hands documents out as plain dicts.
Document = dict[str, Any]
T = TypeVar("T")

Identity = tuple[str, object]
# Requested keys a stored key value may belong to, each with whether that form is documented.
Owners = dict[Identity | None, list[tuple[str, bool]]]


class MongoConnectionError(RuntimeError):
    """No client could be built for a connection. The message never quotes the connection's fields."""


def mongo_client(conn_id: str, timeout: float) -> MongoClient[Document]:
    """A client for the Airflow connection ``conn_id``, every timeout bounded by ``timeout`` seconds.

    Built from the connection's fields as keyword arguments, never from a URI holding credentials.
    pymongo's own errors may quote a password (``InvalidURI`` for a host URI with an unescaped one),
    so a failure is re-raised naming the connection and the error type only, with no context.
    """
    from airflow.sdk import BaseHook

    try:
        return MongoClient(**client_options(BaseHook.get_connection(conn_id), timeout))
    except Exception as exc:  # neither pymongo's message nor the traceback may leave this function
        failure = str(exc) if isinstance(exc, MongoConnectionError) else type(exc).__name__
    raise MongoConnectionError(
        f"MongoDB connection {conn_id!r}: no client could be built ({failure}); check its fields"
    )


def client_options(conn: Connection, timeout: float) -> dict[str, Any]:
    """``MongoClient`` keyword arguments for ``conn``, read as MongoHook reads it, timeouts bounded.

    The extras are pymongo options (``replicaSet``, ``authSource``, ``tlsCAFile``...) besides
    MongoHook's own ``srv``, ``ssl``/``tls`` and ``allow_insecure``. A host may itself be a
    ``mongodb://`` URI. As the path of a URI would, the schema names the authentication database
    unless ``authSource`` does.
    """
    extras = dict(conn.extra_dejson)
    srv = _flag(extras.pop("srv", False))
    tls = [_flag(extras.pop(name)) for name in ("ssl", "tls") if name in extras]
    insecure = _flag(extras.pop("allow_insecure", False))
    # Any: pymongo options of every type, for ``MongoClient(**options)``.
    options: dict[str, Any] = {name: v for name, v in extras.items() if name.lower() not in _UNBOUNDED}
    host = conn.host or "127.0.0.1"
    if "://" in host:
        options["host"] = host
    elif srv:
        if conn.port:
            raise MongoConnectionError("an SRV connection takes no port")
        options["host"] = f"mongodb+srv://{host}"
    else:
        options.update(host=host, port=conn.port or 27017)
    if conn.login:
        options["username"] = conn.login
        if conn.schema and not any(name.lower() == "authsource" for name in options):
            options["authSource"] = conn.schema
    if conn.password:
        options["password"] = conn.password
    if tls:
        options["tls"] = any(tls)
        if any(tls) and insecure:
            options["tlsAllowInvalidCertificates"] = True
    options.update(dict.fromkeys(_TIMEOUTS, max(1, round(timeout * 1000))))
    return options


def _flag(value: object) -> bool:
    return str(value).lower() == "true"


# --- key forms ---------------------------------------------------------------------------------


def _forms(key: str) -> list[tuple[object, bool]]:
    """Every value a document could hold ``key`` as, each with whether that form is documented."""
    forms: list[tuple[object, bool]] = [(key, True)]
    if ObjectId.is_valid(key):
        forms.append((ObjectId(key), key == key.lower()))
    if _DECIMAL.fullmatch(key):
        forms += [(number, False) for number in _bson_numbers(int(key))]
    return forms


def _bson_numbers(n: int) -> list[object]:
    """``n`` as every BSON number type that holds it exactly.

    Servers compare numbers across types, but not all alike: SecantusDB finds the double 2**63 by
    that double only, not by the Decimal128 of the same value.
    """
    numbers: list[object] = [n] if n in _INT64 else []
    with contextlib.suppress(ArithmeticError):  # more significant digits than a Decimal128 holds
        numbers.append(Decimal128(str(n)))
    with contextlib.suppress(OverflowError):
        if int(float(n)) == n:
            numbers.append(float(n))
    return numbers


def _identity(value: object) -> Identity | None:
    """A stored key value, comparable with the requested forms; ``None`` if it can match none.

    Numbers compare as doubles: a server may match a number to a key in double precision only
    (SecantusDB finds the double 1e40 by the Decimal128 10**40). A number is never a documented
    form, so a match this coarse can only make a key unknown, never give it a record.
    """
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, ObjectId):
        return ("oid", value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ("number", float(value))
    if isinstance(value, Decimal128):
        return ("number", float(value.to_decimal()))
    return None


def _owners_of(value: object, owners: Owners) -> list[tuple[str, bool]]:
    """The requested keys a document's key value belongs to; an array is never documented."""
    if isinstance(value, list):
        return [(key, False) for item in value for key, _ in owners.get(_identity(item), [])]
    return owners.get(_identity(value), [])


# --- batched lookup ----------------------------------------------------------------------------


def batched_lookup(
    collection: Collection[Document],
    key_field: str,
    keys: Iterable[str],
    batch_size: int,
    projection: dict[str, int],
    decode: Callable[[dict[str, object]], T],
) -> Keyed[T]:
    """``{key: decode(record)}`` for every key with agreeing documented records; the rest ``failed``."""
    wanted = sorted(set(keys))
    known: dict[str, T] = {}
    failed: set[str] = set()
    for start in range(0, len(wanted), batch_size):
        batch = wanted[start : start + batch_size]
        try:
            docs = _query(collection, key_field, batch, projection)
            found, unknown = documents_answer(batch, docs, key_field, decode, exhaustive=True)
        except (PyMongoError, BSONError, ValueError, TypeError) as exc:
            log.warning("%s: %d keys unknown: %s", collection.full_name, len(batch), exc)
            failed.update(batch)
            continue
        known.update(found)
        if unknown:
            sample = "; ".join(f"{key!r}: {why}" for key, why in sorted(unknown.items())[:5])
            log.warning("%s: %d keys unknown: %s", collection.full_name, len(unknown), sample)
            failed.update(unknown)
    return Keyed(known=known, failed=frozenset(failed), complete=True)


def _owner_map(keys: Iterable[str]) -> Owners:
    """Each form a document could hold a requested key as -> the (key, documented) pairs it belongs to."""
    owners: Owners = defaultdict(list)
    for key in keys:
        for value, documented in _forms(key):
            owner, same = (key, documented), owners[_identity(value)]
            if owner not in same:  # 7, 7.0 and Decimal128("7") are one number
                same.append(owner)
    return owners


def _query(
    collection: Collection[Document], key_field: str, batch: list[str], projection: dict[str, int]
) -> list[Document]:
    """Every record of the batch's keys, in any of their forms: one round trip."""
    values = [value for key in batch for value, _ in _forms(key)]
    # One more than the query can match when keys are unique (``_id``): a full first batch would
    # leave the cursor open and cost an empty getMore round trip.
    return list(collection.find({key_field: {"$in": values}}, projection).batch_size(len(values) + 1))


def documents_answer(
    keys: Iterable[str],
    docs: Iterable[dict[str, object]],
    key_field: str,
    decode: Callable[[dict[str, object]], T],
    exhaustive: bool,
) -> tuple[dict[str, T], dict[str, str]]:
    """What ``docs`` say of ``keys``: the decoded value of each key whose records agree in documented
    forms, and why each other key with records is unknown. One rule for the store and for exports.

    ``exhaustive``: ``docs`` is a query's answer for ``keys``, so a document no key owns makes the
    whole answer suspect (``ValueError``); otherwise (an export of the whole store) it is ignored.
    """
    owners = _owner_map(keys)
    records: dict[str, list[tuple[bool, dict[str, object]]]] = defaultdict(list)
    for doc in docs:
        owned = _owners_of(doc.get(key_field), owners)
        if not owned and exhaustive:
            value = doc.get(key_field)
            raise ValueError(f"the query returned a document that no requested key owns ({type(value).__name__})")
        for key, documented in owned:
            records[key].append((documented, doc))
    known: dict[str, T] = {}
    unknown: dict[str, str] = {}
    for key, matches in records.items():
        try:
            known[key] = _agreed(matches, decode)
        except (ValueError, TypeError) as exc:
            unknown[key] = str(exc)
    return known, unknown


def _agreed(matches: list[tuple[bool, dict[str, object]]], decode: Callable[[dict[str, object]], T]) -> T:
    """The one value all of a key's records decode to; ``ValueError`` if any is odd or they disagree."""
    if not all(documented for documented, _ in matches):
        raise ValueError("a record holds the key in an undocumented form")
    values = [decode(doc) for _, doc in matches]
    if any(value != values[0] for value in values):
        raise ValueError(f"{len(values)} records disagree")
    return values[0]


def _reading(collection: Collection[Document]) -> Collection[Document]:
    """``collection`` read from the primary, majority-committed (a connection's extras must never make a
    lease or a run state come from a stale secondary), with dates as aware UTC and out-of-range dates as
    ``DatetimeMS``, not errors."""
    codec = collection.codec_options.with_options(tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO)
    return collection.with_options(
        codec_options=codec, read_preference=ReadPreference.PRIMARY, read_concern=ReadConcern("majority")
    )


class _ProvenCollection:
    """A collection read as evidence only once it has shown it is the one configured (docs/design.md §5).

    A ``find`` on a database, collection or field that does not exist succeeds and returns nothing,
    so a typo in the config would read as "every run gone". Before its silence counts, the collection
    must hold a document carrying every one of ``fields``: one ``find_one`` per reader (one reader
    per sweep task), remembered, so the deleter's re-read before each run pays nothing more. Only
    when that fails do one or two more round trips say what is wrong (no such collection, empty,
    no document with the fields). Failed or unproven, every key is unknown (failed, and the answer
    not complete), with the reason as the answer's ``problem``.
    """

    def __init__(
        self, client: MongoClient[Document], database: str, name: str, config_key: str, fields: tuple[str, ...]
    ) -> None:
        self.collection = _reading(client[database][name])
        self.config_key = config_key
        self.fields = fields

    @cached_property
    def problem(self) -> str:
        """Why the collection's answers prove nothing this sweep; empty once it has proven it is the store."""
        coll = self.collection
        fields = " and ".join(self.fields)
        try:
            if coll.find_one({f: {"$exists": True} for f in self.fields}, {"_id": 1}) is not None:
                return ""
            if not coll.database.list_collection_names(filter={"name": coll.name}):
                found = f"database {coll.database.name!r} has no collection {coll.name!r}"
            elif coll.find_one({}, {"_id": 1}) is None:
                found = f"{coll.full_name} is empty"
            else:
                found = f"no document of {coll.full_name} carries {fields}"
            problem = (
                f"{self.config_key}: {found}, so it may not be the store the runners write to: "
                f"all keys unknown until it holds a document with {fields}"
            )
        except (PyMongoError, BSONError) as exc:
            problem = (
                f"{self.config_key}: {coll.full_name} did not answer ({error_for_log(exc):.200}): all keys unknown"
            )
        log.warning("%s", problem)
        return problem

    def lookup(
        self, keys: Iterable[str], key_field: str, batch_size: int, decode: Callable[[dict[str, object]], T]
    ) -> Keyed[T]:
        """:func:`batched_lookup` of ``keys`` once the collection has proven it is the store, else all unknown."""
        wanted = set(keys)
        if wanted and self.problem:
            return Keyed(failed=frozenset(wanted), complete=False, problem=self.problem)
        projection = dict.fromkeys(self.fields, 1)
        return batched_lookup(self.collection, key_field, wanted, batch_size, projection, decode)


class MongoRunStore(_ProvenCollection):
    """Run records ``{key_field: run key, status_field: status}``; proven by one carrying both fields."""

    def __init__(self, client: MongoClient[Document], config: MongoRunStoreConfig) -> None:
        fields = (config.key_field, config.status_field)
        super().__init__(client, config.database, config.collection, "k8s.mongo_run_store", fields)
        self.config = config

    def read(self, keys: Iterable[str]) -> Keyed[str]:
        cfg = self.config
        return self.lookup(keys, cfg.key_field, cfg.batch_size, run_status(cfg.status_field))


def run_status(field: str) -> Callable[[dict[str, object]], str]:
    """A run record's status: a string, or the record is unknown."""

    def decode(doc: dict[str, object]) -> str:
        status = doc.get(field)
        if not isinstance(status, str):
            raise ValueError(f"{field} is a {type(status).__name__}, not a string")
        return status

    return decode


def _expiry(doc: dict[str, object]) -> float | None:
    """Unix seconds from a BSON date or a finite number; ``None`` (no expiry, held) if missing or null."""
    value = doc.get("expires_at")
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"expires_at is a {type(value).__name__} {value!r:.40}, not a date or finite unix seconds")


class MongoLeases(_ProvenCollection):
    """Leases as documents ``{_id: run key, expires_at}`` (BSON dates are UTC).

    Proven by a document carrying ``expires_at``, not only ``_id``: every document of every collection
    has an ``_id``, so that alone would take any collection (the run store's, say) for the leases.
    """

    def __init__(self, client: MongoClient[Document], config: MongoLeaseConfig) -> None:
        super().__init__(client, config.database, config.collection, "k8s.mongo_leases", ("_id", "expires_at"))
        self.config = config

    def read(self, keys: Iterable[str]) -> Keyed[float | None]:
        return self.lookup(keys, "_id", self.config.batch_size, _expiry)
