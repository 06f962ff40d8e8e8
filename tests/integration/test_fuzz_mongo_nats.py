"""Evidence-decoder fuzz: every form a database can hold, against the real servers.

One property per evidence source: the MongoDB run store and the MongoDB leases (SecantusDB, so
every BSON type is stored and read back for real) and the NATS KV leases (nats-server). Each
example writes a handful of records in forms drawn around one run key, reads that key (and a
control key) through the store, and compares the state the policy derives with an oracle.

The oracle is the specification of docs/design.md §5, written independently of the decoders, and
it is evaluated on the records as the server stored them (read back), not as they were drawn:

- A record is *about* the run key when its key field is the key's exact string or, for a key of 24
  lower-case hex digits, that ObjectId (the documented forms); or when it holds the key in another
  form: the ObjectId of an upper-case hex key, any BSON number equal to a key that is a canonical
  ASCII decimal, or an array holding any of these. Other records (padded strings, leading zeros,
  other digits, other runs, nested documents, nulls) are about other keys. One tolerance: a number
  equal to a decimal key in double precision only is another number, but a server may match it
  (SecantusDB does), so that key may also read ``unknown``.
- No record about the key: ``not_found`` / ``absent`` (the positive "provably gone").
- Any record in an undocumented form, any value outside its documented forms, or records whose
  values disagree: ``unknown``.
- Otherwise the single agreed value decides: a status string is ``terminal`` when its lower case is
  a terminal status, else ``active``; an expiry (a BSON date or a finite int/double; missing or null
  means no expiry) is ``held`` until it passes (with the clock skew), then ``absent``.
- NATS: a run's lease is held exactly when the key the template makes of it exists (its last
  operation is a put); every other key, however similar, is not that run's lease.

Each property asserts agreement with the oracle, so a decoder that answered ``unknown`` to
everything fails too, and labels a failure UNSAFE when the decoder gave a positive state the oracle
does not. A control key with a plain documented record must keep its state: one odd record spoils
its own key, never its neighbours.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import nats
import pytest
from bson import Decimal128, Int64, ObjectId
from bson.codec_options import CodecOptions, DatetimeConversion
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo.errors import PyMongoError

from reaper.config import MongoLeaseConfig, MongoRunStoreConfig, NatsLeaseConfig
from reaper.model import LeaseState, StoreState
from reaper.policy.k8s import lease_state, run_state
from reaper.stores.mongo import MongoLeases, MongoRunStore
from reaper.stores.nats import NatsLeases

TERMINAL = ["succeeded", "failed", "cancelled"]
NOW, SKEW = 1_700_000_000.0, 30.0
CONTROL = "control-run"
MISSING = object()  # a field the document does not have
FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
READ_BACK: CodecOptions[dict[str, Any]] = CodecOptions(
    tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)
OID = "65f1c0ffee0000000000abcd"
ARABIC_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")

# --- what the database can hold ---------------------------------------------------------------

run_keys = st.one_of(
    st.sampled_from(
        [
            "run-7",
            OID,
            OID.upper(),
            "123",
            "0",
            "-5",
            "007",
            str(2**63),  # beyond Int64
            "1" + "0" * 40,  # a Decimal128 holds it, an Int64 does not
            str(2**70),  # a double holds it exactly
            "123456789012345678901234",  # a canonical decimal and a valid ObjectId at once
            "٣",
        ]
    ),
    st.text(alphabet="0123456789abcdefABCDEF-", min_size=1, max_size=26),
)


def _numbers(key: str) -> list[object]:
    """Every BSON number (and near miss) a decimal-looking key could have been stored as."""
    if not re.fullmatch(r"-?[0-9]{1,60}", key, re.ASCII):
        return []
    n = int(key)
    forms: list[object] = [float(n), float(n) + 0.5, n + 1]
    if -(2**63) <= n < 2**63:
        forms += [n, Int64(n)]
    for text in (key, f"{key}.0", f"{Decimal(n):E}", f"{key}.5"):
        with contextlib.suppress(ArithmeticError):  # more digits than a Decimal128 holds
            forms.append(Decimal128(text))
    return forms


def _key_values(key: str, key_field: str) -> list[object]:
    """The key as every type and lookalike a key field could hold, plus unrelated values.

    No arrays in ``_id``: MongoDB refuses them. SecantusDB stores them, but its ``$in`` on ``_id`` never
    looks inside one, so such a record is invisible to any ``$in`` query (and cannot exist in MongoDB).
    """
    values: list[object] = [
        key,
        f" {key}",
        f"{key} ",
        f"0{key}",
        key.upper(),
        key.lower(),
        key.translate(ARABIC_DIGITS),
    ]
    values += [None, True, {"id": key}, "other-run", MISSING, *_numbers(key)]
    if ObjectId.is_valid(key):
        values.append(ObjectId(key))
    if key_field != "_id":
        values += [[item] for item in values if item is not MISSING] + [[key, "other"]]
    return values


odd_values = st.sampled_from(
    [MISSING, None, True, False, "", 7, 1.5, float("nan"), float("inf"), float("-inf"), Decimal128("1"), {"a": 1}, [1]]
)
statuses = st.one_of(
    st.sampled_from(["succeeded", "Failed", "CANCELLED", "running", "succeeded ", "pending"]),
    odd_values,
    st.datetimes(timezones=st.just(UTC)),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
)
expiries = st.one_of(
    st.sampled_from([NOW - 3600, NOW + 3600, int(NOW) - 3600, int(NOW) + 3600, Decimal128(str(int(NOW) + 3600))]),
    st.sampled_from([-3600, 3600]).map(lambda d: datetime.fromtimestamp(NOW + d, UTC)),
    st.sampled_from([-3600, 3600]).map(lambda d: datetime.fromtimestamp(NOW + d, UTC).replace(tzinfo=None)),
    st.sampled_from([-3600, 3600]).map(lambda d: str(NOW + d)),
    st.sampled_from([-3600, 3600]).map(lambda d: Int64(int(NOW) + d)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
    odd_values,
)


@st.composite
def records(
    draw: st.DrawFn, key: str, key_field: str, values: st.SearchStrategy[object]
) -> list[tuple[object, object]]:
    """Up to four (key value, field value) pairs around ``key``: duplicates and contradictions included."""
    key_value = st.sampled_from(_key_values(key, key_field))
    return draw(st.lists(st.tuples(key_value, values), max_size=4))


def _document(key_field: str, key_value: object, field: str, value: object) -> dict[str, object]:
    doc: dict[str, object] = {}
    if key_value is not MISSING:
        doc[key_field] = key_value
    if value is not MISSING:
        doc[field] = value
    return doc


def _store(collection, docs: list[dict[str, object]]) -> list[dict[str, object]]:
    """Insert what the server accepts (``_id`` is unique, Int64 is the largest integer); return what it holds."""
    collection.delete_many({})
    for doc in docs:
        with contextlib.suppress(PyMongoError, OverflowError):
            collection.insert_one(doc)
    return list(collection.with_options(codec_options=READ_BACK).find({}))


# --- the oracle ---------------------------------------------------------------------------------------


INVALID = object()  # a value outside its documented forms


def _canonical_decimal(key: str) -> bool:
    return key.isascii() and key.lstrip("-").isdigit() and str(int(key)) == key


def _about(value: object, key: str) -> str | None:
    """How a stored key value relates to ``key``: ``documented``, ``other form``, ``near`` or ``None``.

    ``near``: a number equal to a decimal key in double precision only. It is another number, so no
    record of the key, but a server may match it (SecantusDB does), so the key may read unknown.
    """
    if isinstance(value, str):
        return "documented" if value == key else None
    if isinstance(value, ObjectId):
        if str(value) == key:
            return "documented"
        return "other form" if str(value) == key.lower() else None
    if isinstance(value, list):
        kinds = {_about(item, key) for item in value} - {None}
        return "other form" if kinds - {"near"} else ("near" if kinds else None)
    if isinstance(value, int | float | Decimal128) and not isinstance(value, bool) and _canonical_decimal(key):
        number = value.to_decimal() if isinstance(value, Decimal128) else Decimal(value)
        if number.is_finite() and number == Decimal(key):
            return "other form"
        return "near" if float(number) == float(int(key)) else None
    return None


def _verdict(stored: list[dict[str, object]], key_field: str, key: str, field: str, decode) -> tuple[object, bool]:
    """(verdict, near): ``None`` if no record is about ``key``, ``"unknown"``, or ``[the agreed value]``."""
    kinds = [(_about(doc.get(key_field, MISSING), key), doc) for doc in stored]
    near = any(kind == "near" for kind, _ in kinds)
    about = [(kind, doc) for kind, doc in kinds if kind in ("documented", "other form")]
    if not about:
        return None, near
    if any(kind != "documented" for kind, _ in about):
        return "unknown", near
    decoded = [decode(doc.get(field, MISSING)) for _, doc in about]
    if any(value is INVALID for value in decoded) or any(value != decoded[0] for value in decoded):
        return "unknown", near
    return [decoded[0]], near


def _status(value: object) -> object:
    return value if isinstance(value, str) else INVALID


def _expiry(value: object) -> object:
    if value is MISSING or value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):  # int32, Int64, double
        return float(value)
    return INVALID


def allowed_run_states(stored: list[dict[str, object]], key_field: str, key: str) -> set[tuple[StoreState, str | None]]:
    verdict, near = _verdict(stored, key_field, key, "status", _status)
    unknown = (StoreState.UNKNOWN, None)
    if verdict is None:
        expected = (StoreState.NOT_FOUND, None)
    elif verdict == "unknown":
        expected = unknown
    else:
        status = verdict[0]
        expected = ((StoreState.TERMINAL if status.lower() in TERMINAL else StoreState.ACTIVE), status)
    return {expected, unknown} if near else {expected}


def allowed_lease_states(stored: list[dict[str, object]], key: str) -> set[LeaseState]:
    verdict, near = _verdict(stored, "_id", key, "expires_at", _expiry)
    if verdict is None:
        expected = LeaseState.ABSENT
    elif verdict == "unknown":
        expected = LeaseState.UNKNOWN
    else:
        expires = verdict[0]
        expected = LeaseState.HELD if expires is None or expires + SKEW > NOW else LeaseState.ABSENT
    return {expected, LeaseState.UNKNOWN} if near else {expected}


# --- properties -----------------------------------------------------------------------------------------


@pytest.fixture
def fuzz_db(mongo):
    """One database for the whole property; each example empties its collection first."""
    client, db = mongo
    return client[db]


@FUZZ
@given(data=st.data(), key=run_keys, key_field=st.sampled_from(["_id", "run"]))
def test_run_store_decoder(fuzz_db, data: st.DataObject, key: str, key_field: str) -> None:
    pairs = data.draw(records(key, key_field, statuses))
    docs = [_document(key_field, k, "status", s) for k, s in pairs] + [{key_field: CONTROL, "status": "failed"}]
    stored = _store(fuzz_db["runs"], docs)
    config = MongoRunStoreConfig(database=fuzz_db.name, key_field=key_field)
    answer = MongoRunStore(fuzz_db.client, config).read([key, CONTROL])
    state = run_state(key, answer, TERMINAL)
    allowed = allowed_run_states(stored, key_field, key)
    unsafe = state[0] in (StoreState.TERMINAL, StoreState.NOT_FOUND)  # a positive state the oracle denies
    assert state in allowed, f"{'UNSAFE: ' if unsafe else ''}{state} for {key!r}, expected {allowed}: {stored}"
    assert run_state(CONTROL, answer, TERMINAL) == (StoreState.TERMINAL, "failed")


@FUZZ
@given(data=st.data(), key=run_keys)
def test_mongo_lease_decoder(fuzz_db, data: st.DataObject, key: str) -> None:
    pairs = data.draw(records(key, "_id", expiries))
    docs = [_document("_id", k, "expires_at", e) for k, e in pairs] + [{"_id": CONTROL, "expires_at": NOW + 3600}]
    stored = _store(fuzz_db["run_leases"], docs)
    answer = MongoLeases(fuzz_db.client, MongoLeaseConfig(database=fuzz_db.name)).read([key, CONTROL, "gone"])
    state = lease_state(key, answer, NOW, SKEW)
    allowed = allowed_lease_states(stored, key)
    unsafe = state is LeaseState.ABSENT  # a positive state the oracle denies
    assert state in allowed, f"{'UNSAFE: ' if unsafe else ''}{state} for {key!r}, expected {allowed}: {stored}"
    assert lease_state(CONTROL, answer, NOW, SKEW) is LeaseState.HELD
    assert lease_state("gone", answer, NOW, SKEW) is LeaseState.ABSENT


# NATS KV keys: tokens of these characters joined by dots (no empty token, no leading or trailing dot).
KV_KEY = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")
nats_runs = st.one_of(st.sampled_from(["r1", "R1", "run-7", OID]), st.text(alphabet="abXY09-_", min_size=1, max_size=8))


def _kv_keys(template: str, run: str) -> list[str]:
    """The run's lease key and keys that only resemble it: other case, prefix or suffix, other runs."""
    prefix, suffix = template.split("{run}")
    exact = template.format(run=run)
    keys = [exact, exact.upper(), exact.lower(), f"x{exact}", f"{exact}x", f"{prefix}{run}", f"{run}{suffix}"]
    keys += [template.format(run=f"{run}-2"), template.format(run=run.swapcase()), f"{prefix.upper()}{run}{suffix}"]
    return [key for key in dict.fromkeys(keys) if KV_KEY.fullmatch(key)]


async def _write_bucket(port: int, bucket: str, ops: list[tuple[str, str]]) -> None:
    client = await nats.connect(f"nats://127.0.0.1:{port}")
    js = client.jetstream()
    kv = await js.create_key_value(bucket=bucket)
    await js.purge_stream(f"KV_{bucket}")
    for op, key in ops:
        await (kv.put(key, b"runner-7") if op == "put" else getattr(kv, op)(key))
    await client.close()


@FUZZ
@given(
    data=st.data(),
    run=nats_runs,
    template=st.sampled_from(["{run}", "lease.{run}", "lease-{run}-v1", "runs/{run}", "L.{run}.x"]),
)
def test_nats_lease_decoder(nats_server, data: st.DataObject, run: str, template: str) -> None:
    keys = _kv_keys(template, run)
    ops = data.draw(st.lists(st.tuples(st.sampled_from(["put", "put", "delete", "purge"]), st.sampled_from(keys))))
    asyncio.run(_write_bucket(nats_server.port, "fuzz", ops))
    last = {key: op for op, key in ops}
    held = {key for key, op in last.items() if op == "put"}
    answer = NatsLeases(f"nats://127.0.0.1:{nats_server.port}", NatsLeaseConfig(bucket="fuzz", key_template=template))
    leases = answer.read()
    assert leases is not None
    if not any(answer._run(key) is not None for key in last):
        # No key (a bucket nobody writes), or none a run's lease under the template (not the runners' template):
        # every lease is unknown.
        assert not leases.complete and lease_state(run, leases, NOW, SKEW) is LeaseState.UNKNOWN
        return
    assert leases.complete
    assert all(template.format(run=known) in held for known in leases.known), (leases.known, held)
    expected = LeaseState.HELD if template.format(run=run) in held else LeaseState.ABSENT
    assert lease_state(run, leases, NOW, SKEW) is expected, (ops, leases.known)
