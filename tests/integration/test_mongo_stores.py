"""MongoDB run store and leases against SecantusDB: key forms, contradictions and odd values.

A run key is looked up as the exact string and, when it is a 24-hex ObjectId, as that ObjectId too.
Any other stored form of the same key (a number, an upper-case ObjectId spelling, an array) is
never proof of absence: it makes the key unknown. So do two records that disagree and any value
outside the documented forms.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bson import Decimal128, Int64, ObjectId
from pymongo import MongoClient

from include.emulators.http import start_secantusdb
from reaper.config import MongoLeaseConfig, MongoRunStoreConfig, parse_settings
from reaper.k8s.evidence import still_reapable
from reaper.model import Keyed, LeaseState, StoreState
from reaper.policy.k8s import lease_state, run_state
from reaper.stores.mongo import MongoLeases, MongoRunStore
from tests.helpers import FindCounter

TERMINAL = ["succeeded", "failed", "cancelled"]
OID = "65f1c0ffee0000000000abcd"
NOW = time.time()


def runs(mongo: tuple[MongoClient, str], keys: list[str], **config: Any) -> dict[str, StoreState]:
    client, db = mongo
    answer = MongoRunStore(client, MongoRunStoreConfig(database=db, **config)).read(keys)
    return {key: run_state(key, answer, TERMINAL)[0] for key in keys}


def leases(mongo: tuple[MongoClient, str], keys: list[str]) -> dict[str, LeaseState]:
    client, db = mongo
    answer = MongoLeases(client, MongoLeaseConfig(database=db)).read(keys)
    return {key: lease_state(key, answer, NOW, 30) for key in keys}


# --- both key forms ------------------------------------------------------------------------------


def test_a_run_stored_under_its_objectid_is_found(mongo) -> None:
    client, db = mongo
    other = "65f1c0ffee0000000000beef"
    client[db]["runs"].insert_many([{"_id": ObjectId(OID), "status": "running"}, {"_id": other, "status": "failed"}])
    gone = "65f1c0ffee0000000000dead"
    assert runs(mongo, [OID, other, gone]) == {
        OID: StoreState.ACTIVE,  # was not_found: its sandbox was reaped
        other: StoreState.TERMINAL,
        gone: StoreState.NOT_FOUND,  # neither form exists
    }


def test_a_custom_key_field_holding_an_objectid_is_found(mongo) -> None:
    client, db = mongo
    client[db]["jobs"].insert_one({"run_key": ObjectId(OID), "state": "Succeeded"})
    states = runs(mongo, [OID], collection="jobs", key_field="run_key", status_field="state")
    assert states == {OID: StoreState.TERMINAL}


def test_a_lease_stored_under_its_objectid_is_held(mongo) -> None:
    client, db = mongo
    expired = "65f1c0ffee0000000000beef"
    client[db]["run_leases"].insert_many(
        [
            {"_id": ObjectId(OID), "expires_at": datetime.now(UTC) + timedelta(hours=1)},
            {"_id": ObjectId(expired), "expires_at": NOW - 3600},
        ]
    )
    gone = "65f1c0ffee0000000000dead"
    assert leases(mongo, [OID, expired, gone]) == {
        OID: LeaseState.HELD,  # was absent
        expired: LeaseState.ABSENT,
        gone: LeaseState.ABSENT,
    }


NUMERIC_IDS = [123, Int64(2**40), 125.0, Decimal128("126"), Decimal128("1.27E+2"), Decimal128("-128.0")]


def test_a_numeric_form_of_a_decimal_key_is_unknown_never_not_found(mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_many([{"_id": v, "status": "succeeded"} for v in NUMERIC_IDS])
    keys = ["123", str(2**40), "125", "126", "127", "-128"]
    assert runs(mongo, [*keys, "129", "0123"]) == {
        **dict.fromkeys(keys, StoreState.UNKNOWN),
        "129": StoreState.NOT_FOUND,
        "0123": StoreState.NOT_FOUND,  # not a canonical decimal: only its exact string is its key
    }


def test_a_numeric_form_of_a_decimal_lease_key_is_unknown_never_absent(mongo) -> None:
    client, db = mongo
    client[db]["run_leases"].insert_many([{"_id": v, "expires_at": NOW - 3600} for v in NUMERIC_IDS])
    keys = ["123", str(2**40), "125", "126", "127", "-128"]
    assert leases(mongo, [*keys, "129"]) == {**dict.fromkeys(keys, LeaseState.UNKNOWN), "129": LeaseState.ABSENT}


def test_an_upper_case_objectid_key_matching_only_the_objectid_is_unknown(mongo) -> None:
    """ObjectIds print in lower case: an upper-case label is another spelling, not the documented form."""
    client, db = mongo
    client[db]["runs"].insert_one({"_id": ObjectId(OID), "status": "succeeded"})
    assert runs(mongo, [OID.upper()]) == {OID.upper(): StoreState.UNKNOWN}


def test_an_array_valued_key_field_is_unknown(mongo) -> None:
    client, db = mongo
    client[db]["jobs"].insert_one({"run": ["r1", "r2"], "status": "succeeded"})
    assert runs(mongo, ["r1", "r2", "r3"], collection="jobs", key_field="run") == {
        "r1": StoreState.UNKNOWN,
        "r2": StoreState.UNKNOWN,
        "r3": StoreState.NOT_FOUND,
    }


def test_both_forms_cost_one_round_trip_per_batch(mongo_server, mongo) -> None:
    client, db = mongo
    hexes = [f"{i:024x}" for i in range(1000)]
    decimals = [str(i) for i in range(1000)]
    client[db]["runs"].insert_many(
        [{"_id": ObjectId(k), "status": "running"} for k in hexes[::2]]
        + [{"_id": k, "status": "failed"} for k in hexes[1::2]]
    )
    counter = FindCounter()
    counted: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{mongo_server.port}/", event_listeners=[counter]
    )
    answer = MongoRunStore(counted, MongoRunStoreConfig(database=db)).read(hexes + decimals)
    counted.close()
    # The store's proof (once per reader), then 2,000 keys in two batches, each key asked in two to four forms.
    assert counter.commands == ["find", "find", "find"]
    assert run_state(hexes[0], answer, TERMINAL)[0] is StoreState.ACTIVE
    assert run_state(hexes[1], answer, TERMINAL)[0] is StoreState.TERMINAL
    assert run_state("7", answer, TERMINAL)[0] is StoreState.NOT_FOUND


# --- contradictions ------------------------------------------------------------------------------


def test_two_records_that_disagree_are_unknown(mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_many(
        [
            {"_id": OID, "status": "succeeded"},
            {"_id": ObjectId(OID), "status": "running"},
            {"_id": "65f1c0ffee0000000000beef", "status": "failed"},
            {"_id": ObjectId("65f1c0ffee0000000000beef")},
        ]
    )
    client[db]["jobs"].insert_many(
        [
            {"run": "r1", "status": "running"},
            {"run": "r1", "status": "succeeded"},
            {"run": "r2", "status": "failed"},
            {"run": "r2", "status": "failed"},
        ]
    )
    assert runs(mongo, [OID, "65f1c0ffee0000000000beef"]) == {
        OID: StoreState.UNKNOWN,
        "65f1c0ffee0000000000beef": StoreState.UNKNOWN,  # one record has no status at all
    }
    agreeing = runs(mongo, ["r1", "r2"], collection="jobs", key_field="run")
    assert agreeing == {"r1": StoreState.UNKNOWN, "r2": StoreState.TERMINAL}


def test_two_leases_that_disagree_are_unknown(mongo) -> None:
    client, db = mongo
    soon = datetime.fromtimestamp(int(NOW) + 3600, UTC)
    client[db]["run_leases"].insert_many(
        [
            {"_id": OID, "expires_at": NOW - 3600},
            {"_id": ObjectId(OID), "expires_at": soon},
            {"_id": "65f1c0ffee0000000000beef"},  # held while it exists
            {"_id": ObjectId("65f1c0ffee0000000000beef"), "expires_at": NOW - 3600},
            {"_id": "65f1c0ffee0000000000cafe", "expires_at": soon},
            {"_id": ObjectId("65f1c0ffee0000000000cafe"), "expires_at": int(NOW) + 3600},  # the same instant
        ]
    )
    assert leases(mongo, [OID, "65f1c0ffee0000000000beef", "65f1c0ffee0000000000cafe"]) == {
        OID: LeaseState.UNKNOWN,
        "65f1c0ffee0000000000beef": LeaseState.UNKNOWN,
        "65f1c0ffee0000000000cafe": LeaseState.HELD,
    }


# --- odd values ------------------------------------------------------------------------------------


ODD_EXPIRIES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    True,
    False,
    "1700000000",
    Decimal128("1700000000"),
    Decimal128("NaN"),
    {"$date": 1700000000000},
    [NOW - 3600],
]


# An id that does not hold the clock: each pytest-xdist worker collects the same tests.
@pytest.mark.parametrize(
    "expires", ODD_EXPIRIES, ids=lambda v: "an array of a time" if isinstance(v, list) else repr(v)
)
def test_an_odd_lease_expiry_is_unknown_for_that_key_only(mongo, expires: object) -> None:
    client, db = mongo
    client[db]["run_leases"].insert_many(
        [
            {"_id": "odd", "expires_at": expires},
            {"_id": "expired", "expires_at": datetime.fromtimestamp(NOW - 3600, UTC)},
            {"_id": "forever", "expires_at": None},
            {"_id": "no-expiry"},
            {"_id": "int", "expires_at": Int64(int(NOW) + 3600)},
        ]
    )
    keys = ["odd", "expired", "forever", "no-expiry", "int", "none"]
    answer = MongoLeases(client, MongoLeaseConfig(database=db)).read(keys)
    assert answer.failed == {"odd"}  # the decoder's verdict, whatever the policy makes of a value
    assert {key: lease_state(key, answer, NOW, 30) for key in keys} == {
        "odd": LeaseState.UNKNOWN,
        "expired": LeaseState.ABSENT,
        "forever": LeaseState.HELD,
        "no-expiry": LeaseState.HELD,
        "int": LeaseState.HELD,
        "none": LeaseState.ABSENT,
    }


def test_a_status_that_is_not_a_string_is_unknown_for_that_run_only(mongo) -> None:
    client, db = mongo
    odd = {"int": 7, "none": None, "doc": {"name": "succeeded"}, "list": ["succeeded"], "bool": True}
    client[db]["runs"].insert_many(
        [{"_id": key, "status": status} for key, status in odd.items()]
        + [{"_id": "missing"}, {"_id": "good", "status": "failed"}, {"_id": "live", "status": "running"}]
    )
    assert runs(mongo, [*odd, "missing", "good", "live", "gone"]) == {
        **dict.fromkeys([*odd, "missing"], StoreState.UNKNOWN),
        "good": StoreState.TERMINAL,
        "live": StoreState.ACTIVE,
        "gone": StoreState.NOT_FOUND,
    }


# --- the right store: silence counts only from a store that has shown it is the one configured ---------


def counted(mongo_server) -> tuple[MongoClient, FindCounter]:
    counter = FindCounter()
    return MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/", event_listeners=[counter]), counter


# Each: what the config points at, what the server holds there, and what the reason says was found.
WRONG_RUN_STORES: dict[str, tuple[dict[str, Any], list[dict[str, Any]] | None, str]] = {
    "typo in the database": ({"database": "itreion"}, None, "database 'itreion' has no collection 'runs'"),
    "missing collection": ({"collection": "runz"}, None, "has no collection 'runz'"),
    "empty collection": ({}, [], ".runs is empty"),
    "documents without the key field": ({"key_field": "run_id"}, [{"run": "r1", "status": "running"}], "carries"),
    "documents without the status field": ({}, [{"_id": "r1", "state": "running"}], "carries _id and status"),
}


@pytest.mark.parametrize("case", WRONG_RUN_STORES, ids=str)
def test_a_run_store_that_does_not_prove_itself_answers_unknown_for_every_run(mongo_server, mongo, case) -> None:
    client, db = mongo
    config, docs, found = WRONG_RUN_STORES[case]
    client[db]["elsewhere"].insert_one({"_id": "r1", "status": "running"})  # the database exists
    if docs == []:
        client[db].create_collection("runs")
    elif docs:
        client[db]["runs"].insert_many(docs)
    database = config.pop("database", db)
    reading, counter = counted(mongo_server)
    store = MongoRunStore(reading, MongoRunStoreConfig(database=database, **config))
    answers = [store.read(["r1", "gone"]) for _ in range(5)]  # the sweep's read, then the deleter's re-reads
    reading.close()
    for answer in answers:
        assert {key: run_state(key, answer, TERMINAL)[0] for key in ("r1", "gone")} == {
            "r1": StoreState.UNKNOWN,
            "gone": StoreState.UNKNOWN,  # was not_found: its sandbox was deleted
        }
        assert found in answer.problem and answer.problem.startswith("k8s.mongo_run_store: ")
    # The proof (and, failed, what is wrong) once per reader: at most three round trips, never per read.
    assert counter.every[0] == "find" and len(counter.every) <= 3


def test_the_right_run_store_proves_itself_once_per_reader(mongo_server, mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_many([{"_id": "r1", "status": "failed"}, {"_id": "r2", "status": "running"}])
    reading, counter = counted(mongo_server)
    store = MongoRunStore(reading, MongoRunStoreConfig(database=db))
    first = store.read(["r1", "r2", "gone"])
    rereads = [store.read([run]) for run in ("r1", "r2", "gone")]  # the deleter's, one run at a time
    reading.close()
    assert first.complete and not first.problem
    assert [run_state(run, a, TERMINAL)[0] for run, a in zip(("r1", "r2", "gone"), rereads, strict=True)] == [
        StoreState.TERMINAL,
        StoreState.ACTIVE,
        StoreState.NOT_FOUND,
    ]
    assert counter.every == ["find"] + ["find"] * 4  # one proof, then one find per read
    assert store.read([]) == Keyed(complete=True)  # nothing asked: nothing to prove


def test_an_error_while_proving_is_unknown() -> None:
    daemon = start_secantusdb()
    client: MongoClient[dict[str, Any]] = MongoClient(
        f"mongodb://127.0.0.1:{daemon.port}/", serverSelectionTimeoutMS=500
    )
    client["iterion"]["runs"].insert_one({"_id": "r1", "status": "failed"})
    daemon.stop()
    answer = MongoRunStore(client, MongoRunStoreConfig()).read(["r1"])
    assert run_state("r1", answer, TERMINAL)[0] is StoreState.UNKNOWN and "did not answer" in answer.problem


WRONG_LEASES = {
    "missing collection": (None, "has no collection 'run_leases'"),
    "empty collection": ([], ".run_leases is empty"),
    # The run store's documents where leases were expected: every one has an _id, none an expiry.
    "not lease documents": ([{"_id": "r1", "status": "running"}], "no document of"),
}


@pytest.mark.parametrize("case", WRONG_LEASES, ids=str)
def test_a_lease_collection_that_does_not_prove_itself_answers_unknown_for_every_run(mongo, case) -> None:
    client, db = mongo
    docs, found = WRONG_LEASES[case]
    client[db]["elsewhere"].insert_one({"_id": "x"})
    if docs == []:
        client[db].create_collection("run_leases")
    elif docs:
        client[db]["run_leases"].insert_many(docs)
    answer = MongoLeases(client, MongoLeaseConfig(database=db)).read(["r1", "gone"])
    assert {key: lease_state(key, answer, NOW, 30) for key in ("r1", "gone")} == {
        "r1": LeaseState.UNKNOWN,
        "gone": LeaseState.UNKNOWN,  # was absent
    }
    assert found in answer.problem and answer.problem.startswith("k8s.mongo_leases: ")


def test_the_deleters_reread_goes_through_the_proven_reader(mongo) -> None:
    client, db = mongo
    client[db]["runs"].insert_one({"_id": "r1", "status": "failed"})
    config = parse_settings({"k8s": {"mongo_run_store": {"database": db, "collection": "runz"}}}, "test")
    store = MongoRunStore(client, config.k8s.mongo_run_store)
    why = still_reapable("r1", config, lambda keys: Keyed(complete=True), store.read, now=NOW)
    assert why == "run store unknown (None) when read again before the delete"
