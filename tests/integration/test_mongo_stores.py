"""MongoDB run store and leases against SecantusDB: key forms, contradictions and odd values (issue 10).

A run key is looked up as the exact string and, when it is a 24-hex ObjectId, as that ObjectId too.
Any other stored form of the same key (a number, an upper-case ObjectId spelling, an array) is
never proof of absence: it makes the key unknown. So do two records that disagree and any value
outside the documented forms.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from bson import Decimal128, Int64, ObjectId
from pymongo import MongoClient

from reaper.config import MongoLeaseConfig, MongoRunStoreConfig
from reaper.model import LeaseState, StoreState
from reaper.policy.k8s import lease_state, run_state
from reaper.stores.mongo import MongoLeases, MongoRunStore
from tests.helpers import FindCounter

TERMINAL = ["succeeded", "failed", "cancelled"]
OID = "65f1c0ffee0000000000abcd"
NOW = time.time()


def runs(mongo: tuple[MongoClient, str], keys: list[str], **config: object) -> dict[str, StoreState]:
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
    counted = MongoClient(f"mongodb://127.0.0.1:{mongo_server.port}/", event_listeners=[counter])
    answer = MongoRunStore(counted, MongoRunStoreConfig(database=db)).read(hexes + decimals)
    counted.close()
    assert counter.commands == ["find", "find"]  # 2,000 keys, each asked in two to four forms
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


@pytest.mark.parametrize("expires", ODD_EXPIRIES, ids=repr)
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
