"""Answers the Compute SDK's own parser refused, which the listing's msgspec structs must refuse too (review of the
listing's move off protobuf): a key repeated in one object (JSON parsers keep the last value), an id beyond a
uint64, and an id with leading zeros beside the same id without. Each makes the project's listing incomplete, so
nothing in it is deleted; before the fix each listed as complete."""

from __future__ import annotations

import json

import pytest

from reaper.decoders import numeric_id
from reaper.gce.inventory import list_project
from tests.helpers import fast_backoff
from tests.helpers.gce import add_instance

SELECTOR = {"ci_ephemeral": "true"}


def compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def listed(gce, rewrite):
    fleet, clients = gce
    for i in range(3):
        add_instance(fleet, "p", "us-east1-b", f"b-{i}")
        add_instance(fleet, "p", "us-east1-c", f"c-{i}")
    fleet.rewrites["aggregated_list"] = rewrite
    return list_project(clients, "p", SELECTOR, fast_backoff(0), 10)


def zone_twice(body: dict) -> bytes:
    """``zones/us-east1-c`` twice in one page, its instances split between the two: the first would vanish."""
    items = body["items"]
    c = items["zones/us-east1-c"]["instances"]
    return (
        '{"items":{"zones/us-east1-b":' + compact(items["zones/us-east1-b"])
        + ',"zones/us-east1-c":' + compact({"instances": c[:1]})
        + ',"zones/us-east1-c":' + compact({"instances": c[1:]}) + "}}"
    ).encode()  # fmt: skip


def warning_erased(body: dict) -> bytes:
    """A partial answer's warning, then ``"warning": null``: the last one would say the page is whole."""
    partial = compact({"code": "PARTIAL_SUCCESS", "message": "Some results may be missing."})
    return ('{"warning":' + partial + ',"items":' + compact(body["items"]) + ',"warning":null}').encode()


def label_twice(body: dict) -> bytes:
    """An instance's opt-out label twice, ``"true"`` then ``"no"``: the last would read as not opted out."""
    text = compact(body)
    return text.replace('"labels":{', '"labels":{"reaper_keep":"true","reaper_keep":"no",', 1).encode()


def escaped_colons(text: str) -> str:
    """Label values written ``"\\u003a"`` (a colon, escaped): an earlier count of key ends took each re-encoded
    one for a key, which offset the keys a repeated key hides (second review)."""
    return text.replace('"labels":{', '"labels":{"o1":"\\u003a","o2":"\\u003a","o3":"\\u003a",', 1)


def warning_erased_offset(body: dict) -> bytes:
    partial = compact({"code": "PARTIAL_SUCCESS", "message": "Some results may be missing."})
    items = escaped_colons(compact(body["items"]))
    return ('{"warning":' + partial + ',"items":' + items + ',"warning":null}').encode()


def label_twice_offset(body: dict) -> bytes:
    text = compact(body).replace('"labels":{', '"labels":{"reaper_keep":"true","reaper_keep":"no","o":"\\u003a",', 1)
    return text.encode()


@pytest.mark.parametrize(
    "rewrite", [zone_twice, warning_erased, label_twice, warning_erased_offset, label_twice_offset]
)
def test_a_key_repeated_in_one_object_makes_the_listing_incomplete(gce, rewrite) -> None:
    listing = listed(gce, rewrite)
    assert not listing.complete
    assert any("repeated" in p for p in listing.problems), listing.problems


def test_the_same_answer_without_a_repeated_key_is_complete(gce) -> None:
    """The check counts keys, so it must not refuse an ordinary page: a value with an escaped quote before a
    colon, and one ending in an escaped backslash, are not keys."""
    # Escaped in values: a quote before a colon, a backslash at the end, a colon; an escaped backslash ends a key.
    note = '"labels":{"note":"a\\":b\\\\","c":"\\u003a","k\\u005c":"v",'
    listing = listed(gce, lambda body: compact(body).replace('"labels":{', note, 1).encode())
    assert listing.complete, listing.problems
    assert len(listing.resources) == 6
    assert listing.resources[0].labels["note"] == 'a":b\\'
    assert listing.resources[0].labels["c"] == ":" and listing.resources[0].labels["k\\"] == "v"


def with_id(index: int, ident: object):
    def rewrite(body: dict) -> dict:
        body["items"]["zones/us-east1-b"]["instances"][index]["id"] = ident
        return body

    return rewrite


@pytest.mark.parametrize("ident", [str(2**64), 2**64, "٧", "1_0"])
def test_an_id_that_is_not_a_uint64_in_ascii_digits_makes_the_listing_incomplete(gce, ident) -> None:
    assert not listed(gce, with_id(0, ident)).complete


def test_an_id_with_leading_zeros_is_the_same_instance_as_without(gce) -> None:
    def twin(body: dict) -> dict:
        instances = body["items"]["zones/us-east1-b"]["instances"]
        instances[1]["id"] = "0" + str(instances[0]["id"])
        return body

    listing = listed(gce, twin)
    assert not listing.complete and any("listed twice" in p for p in listing.problems), listing.problems


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", "1"), (1, "1"), ("007", "7"), (str(2**64 - 1), str(2**64 - 1)), (str(2**64), None), ("0", None),
     ("", None), (" 7", None), ("٧", None), ("1_0", None), ("-1", None)],
)  # fmt: skip
def test_numeric_id(value: object, expected: str | None) -> None:
    assert numeric_id(value) == expected  # type: ignore[arg-type]  # values of every JSON type, on purpose
