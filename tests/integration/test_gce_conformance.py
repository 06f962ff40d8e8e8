"""The GCE emulator's answers against the Compute API's published description (the discovery document,
``compute.v1.json`` in google-api-python-client's cache): for every method the reaper and the manager
call, every field the emulator sends exists in the method's response schema with the right JSON type
(``int64``/``uint64`` as strings of digits, as the discovery format says), enums from their lists; and
its errors have the shape of Google's JSON error format (API design guide, "Errors": ``error.code``,
``message``, optional ``status``, and Compute's v1 ``errors[]`` of ``domain``/``reason``/``message``).

The bodies are read raw, as the SDK receives them; the seeded instances are the sample export's, so a
field the samples or the emulator invent fails here, not in production.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

import googleapiclient
import pytest
import requests

from include.emulators.gce import Emulator
from include.emulators.gce.server import _ROUTES
from include.emulators.shapes import gcloud_instance
from tests.helpers import ROOT

DISCOVERY = json.loads(
    (Path(googleapiclient.__file__).parent / "discovery_cache/documents/compute.v1.json").read_text()
)
SCHEMAS = DISCOVERY["schemas"]
METHODS = {
    f"{resource}.{name}": method
    for resource, body in DISCOVERY["resources"].items()
    for name, method in body.get("methods", {}).items()
}
Z = "projects/p/zones/us-east1-b"  # the zone most checks are in
_INTEGER = re.compile(r"^-?[0-9]+$")
# google.rpc.Code names: what ``error.status`` may hold.
_CODES = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
}  # fmt: skip


def violations(value: object, schema: dict, path: str = "$") -> list[str]:
    """Where ``value`` departs from a discovery ``schema``: unknown fields, wrong JSON types, values off an enum."""
    if "$ref" in schema:
        schema = SCHEMAS[schema["$ref"]]
    kind, form = schema.get("type"), schema.get("format")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        found = []
        for key, item in value.items():
            if key in schema.get("properties", {}):
                found += violations(item, schema["properties"][key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                found += violations(item, schema["additionalProperties"], f"{path}[{key!r}]")
            else:
                found.append(f"{path}.{key}: no such field")
        return found
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not an array"]
        return [v for i, item in enumerate(value) for v in violations(item, schema["items"], f"{path}[{i}]")]
    if kind == "string":
        if not isinstance(value, str):
            return [f"{path}: {value!r} is not a string"]
        if form in ("int64", "uint64") and not _INTEGER.match(value):
            return [f"{path}: {value!r} is not an {form} string"]
        if "enum" in schema and value not in schema["enum"]:
            return [f"{path}: {value!r} is not one of its enum"]
        return []
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool) and (form != "uint32" or value >= 0)
        return [] if ok else [f"{path}: {value!r} is not an {form} integer"]
    if kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {value!r} is not a number"]
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: {value!r} is not a boolean"]
    return []  # "any"


def error_violations(body: object, code: int) -> list[str]:
    """Where an error body departs from Google's JSON error format, as the Compute API sends it."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(cast(dict, body)) != {"error"}:  # an error only if body is a dict
        return [f"not {{'error': {{...}}}}: {body!r}"]
    found = [f"error.{key}: no such field" for key in set(error) - {"code", "message", "status", "errors", "details"}]
    if error.get("code") != code:
        found.append(f"error.code {error.get('code')!r} is not the HTTP status {code}")
    if not isinstance(error.get("message"), str):
        found.append("error.message is not a string")
    if "status" in error and error["status"] not in _CODES:
        found.append(f"error.status {error['status']!r} is not a google.rpc.Code")
    entries = error.get("errors")
    if not isinstance(entries, list) or not entries:
        return [*found, "error.errors is not a list of entries"]
    for i, entry in enumerate(entries):
        fields = {"domain", "reason", "message", "location", "locationType", "extendedHelp", "sendReport"}
        if not isinstance(entry, dict) or not {"domain", "reason", "message"} <= set(entry) <= fields:
            found.append(f"error.errors[{i}]: {entry!r}")
        elif not all(isinstance(v, str) for v in entry.values()):
            found.append(f"error.errors[{i}]: a value is not a string")
    return found


@pytest.fixture(scope="module")
def emulator():
    with Emulator() as running:
        fleet = running.fleet
        fleet.load_gcloud_json(ROOT / "include/samples/gce-instances.json")
        for name in ("vm", "other", "failing", "slow"):
            fleet.add(gcloud_instance("p", "us-east1-b", name, 1000 + len(name), "RUNNING", {"a": "b"}, 0))
        fleet.add(gcloud_instance("p", "us-east1-c", "far", 2000, "TERMINATED", None, 0, last_stop=10))
        for zone in ("us-east1-d", "us-east1-e", "us-west1-a"):
            fleet.add_zone("p", zone)
        fleet.faults.unreachable.add(("p", "us-east1-d"))
        fleet.faults.partial_zones.add(("p", "us-east1-e"))
        fleet.faults.failing_operations.add("failing")
        fleet.faults.instance_operation_seconds["slow"] = 60.0
        fleet.faults.operation_wait_cap = 0.1
        members = [gcloud_instance("p", "us-west1-a", f"grp-{i}", 3000 + i, "RUNNING", {}, 0) for i in range(2)]
        fleet.add_group("p", "zones/us-west1-a", "grp", 77, members)
        fleet.add_group("p", "regions/us-west1", "regional", 78, [], target_size=0)
        yield running


def call(emulator: Emulator, method: str, path: str, **kwargs: object) -> requests.Response:
    return requests.request(method, f"{emulator.endpoint}/compute/v1/{path}", timeout=10, **kwargs)  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


def conforms(answer: requests.Response, method: str) -> None:
    """A 200 answer whose body fits the discovery document's response schema of ``method``."""
    assert answer.status_code == 200, answer.text
    schema = METHODS[method]["response"]
    assert violations(answer.json(), schema) == [], f"{method} ({schema['$ref']})"


def test_every_listing_fits_its_schema_with_each_kind_of_warning(emulator) -> None:
    samples = json.loads((ROOT / "include/samples/gce-instances.json").read_text())
    projects = {str(i["zone"]).split("/projects/")[1].split("/")[0] for i in samples}
    for project in sorted(projects):
        conforms(call(emulator, "GET", f"projects/{project}/aggregated/instances"), "instances.aggregatedList")
    first = call(emulator, "GET", "projects/p/aggregated/instances", params={"maxResults": 2})
    conforms(first, "instances.aggregatedList")
    page = first.json()
    codes = {s["warning"]["code"] for s in page["items"].values() if "warning" in s} | {page["warning"]["code"]}
    assert codes >= {"UNREACHABLE", "NO_RESULTS_ON_PAGE", "PARTIAL_SUCCESS"} and "nextPageToken" in page
    then = call(emulator, "GET", "projects/p/aggregated/instances", params={"pageToken": page["nextPageToken"]})
    conforms(then, "instances.aggregatedList")
    masked = {"fields": "items/*/instances(id,name,labels),items/*/warning,warning,nextPageToken,unreachables"}
    conforms(call(emulator, "GET", "projects/p/aggregated/instances", params=masked), "instances.aggregatedList")
    filtered = {"filter": 'labels.a = "b"', "maxResults": 1}
    conforms(call(emulator, "GET", f"{Z}/instances", params=filtered), "instances.list")
    groups = call(emulator, "GET", "projects/p/aggregated/instanceGroupManagers")
    conforms(groups, "instanceGroupManagers.aggregatedList")


def test_instances_and_operations_fit_their_schemas(emulator) -> None:
    conforms(call(emulator, "GET", f"{Z}/instances/vm"), "instances.get")
    conforms(call(emulator, "GET", "projects/p/zones/us-east1-c/instances/2000"), "instances.get")  # by id
    masked = {"X-Goog-FieldMask": "id,name,status,labels,deletionProtection"}
    conforms(call(emulator, "GET", f"{Z}/instances/vm", headers=masked), "instances.get")
    vm = call(emulator, "GET", f"{Z}/instances/vm").json()
    relabel = {"labels": {"a": "c"}, "labelFingerprint": vm["labelFingerprint"]}
    conforms(call(emulator, "POST", f"{Z}/instances/vm/setLabels", json=relabel), "instances.setLabels")
    conforms(call(emulator, "POST", f"{Z}/instances", json={"name": "new", "labels": {"x": "y"}}), "instances.insert")
    operations = []
    for name in ("vm", "failing", "slow"):
        deleted = call(emulator, "DELETE", f"{Z}/instances/{name}")
        conforms(deleted, "instances.delete")
        operations.append(deleted.json()["name"])
    for op in operations:  # DONE, DONE with an error, RUNNING
        conforms(call(emulator, "GET", f"{Z}/operations/{op}"), "zoneOperations.get")
        conforms(call(emulator, "POST", f"{Z}/operations/{op}/wait"), "zoneOperations.wait")
    statuses = [call(emulator, "GET", f"{Z}/operations/{op}").json() for op in operations]
    assert [s["status"] for s in statuses] == ["DONE", "DONE", "RUNNING"] and "error" in statuses[1]
    conforms(call(emulator, "GET", "projects/p"), "projects.get")
    number = emulator.fleet.number("p")
    assert call(emulator, "GET", f"projects/{number}").json() == call(emulator, "GET", "projects/p").json()


def test_errors_have_the_shape_of_googles_json_errors(emulator) -> None:
    fleet = emulator.fleet
    fingerprint = {"labelFingerprint": call(emulator, "GET", f"{Z}/instances/other").json()["labelFingerprint"]}
    answers = [
        call(emulator, "GET", f"{Z}/instances/nothing"),  # 404
        call(emulator, "GET", "projects/nowhere/aggregated/instances"),  # 404
        call(emulator, "GET", "projects/p/aggregated/instances", params={"filter": "name ~ x"}),  # 400
        call(emulator, "GET", "projects/p/aggregated/instances", params={"fields": "items(("}),  # 400
        call(emulator, "POST", f"{Z}/instances/other/setLabels", json={"labelFingerprint": "x"}),
        call(emulator, "POST", f"{Z}/instances", json={"name": "other"}),  # 409
        # Labels no instance may carry (Google Cloud's label requirements), refused in the API's words.
        call(emulator, "POST", f"{Z}/instances", json={"name": "upper", "labels": {"KubernetesCluster": "x"}}),
        call(emulator, "POST", f"{Z}/instances/other/setLabels", json={"labels": {"team": "Helm"}, **fingerprint}),
    ]
    fleet.quotas.limits["read_requests"] = 0
    try:
        answers.append(call(emulator, "GET", f"{Z}/instances/other"))  # 403 rate limit
    finally:
        fleet.quotas.limits.clear()
    assert [a.status_code for a in answers] == [404, 404, 400, 400, 412, 409, 400, 400, 403]
    for answer in answers:
        assert error_violations(answer.json(), answer.status_code) == [], answer.text
    assert answers[4].json()["error"]["errors"][0]["location"] == "If-Match"  # as recorded from the real API
    refused = [a.json()["error"]["errors"][0] for a in answers[6:8]]
    assert [r["reason"] for r in refused] == ["invalid", "invalid"]
    assert refused[0]["message"].startswith("Invalid value for field 'resource.labels': ''. Label key 'Kubern")
    assert refused[1]["message"].startswith("Invalid value for field 'labels': ''. Label value 'Helm' violates")
    assert "upper" not in fleet.names("p")
    quota = answers[-1].json()["error"]
    assert quota["status"] == "PERMISSION_DENIED" and quota["errors"][0]["domain"] == "usageLimits"


def test_every_api_route_of_the_emulator_is_checked_here() -> None:
    """A route added to the emulator without a conformance check fails this."""
    checked = {
        "aggregated_list", "group_list", "list", "get", "insert", "set_labels", "delete", "operation_get",
        "operation_wait", "project_get",
    }  # fmt: skip
    assert {kind for _, _, kind in _ROUTES if not kind.startswith("emulator_")} == checked


@pytest.mark.parametrize(
    ("value", "schema", "found"),
    [
        ({"id": 5}, {"$ref": "Instance"}, ["$.id: 5 is not a string"]),
        ({"id": "x5"}, {"$ref": "Instance"}, ["$.id: 'x5' is not an uint64 string"]),
        ({"status": "ALIVE"}, {"$ref": "Instance"}, ["$.status: 'ALIVE' is not one of its enum"]),
        ({"labelz": {}}, {"$ref": "Instance"}, ["$.labelz: no such field"]),
        ({"labels": {"a": 1}}, {"$ref": "Instance"}, ["$.labels['a']: 1 is not a string"]),
        ({"progress": "100"}, {"$ref": "Operation"}, ["$.progress: '100' is not an int32 integer"]),
    ],
)
def test_the_checker_finds_what_departs_from_a_schema(value, schema, found) -> None:
    assert violations(value, schema) == found
