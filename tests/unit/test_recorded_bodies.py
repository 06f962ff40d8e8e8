"""Recorded answers of the real Compute and Kubernetes APIs (``tests/data/recorded``, provenance in its README),
decoded by both of the reaper's readers: the DAG's listing decoders and ``reaper evaluate``'s export readers.

Each body decodes to what the rules read (the project from ``selfLink``, the numeric id, status, labels, times,
container states, ``deletionTimestamp``...), both readers give the same records for the same input, and where one
refuses an input the other refuses it too (one difference is left, and pinned here: a key repeated in one object):
the readers share their structs and their refusals, so that an export evaluated offline is judged as the sweep would
judge the fleet it was taken from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from google.cloud import compute_v1

from reaper.decoders import InputError, gce_instance, load_gce, load_k8s, rfc3339
from reaper.gce.deleter import GET_FIELD_MASK
from reaper.gce.inventory import HARMLESS_WARNINGS, INSTANCE_PAGE, decode_once_each
from reaper.k8s.inventory import read_page
from reaper.model import GceInstance, K8sObject
from tests.helpers.recorded import (
    api_list,
    gcloud_export,
    instances_of,
    kubectl_list,
    metadata_list,
    recorded,
    recorded_object,
    utc,
)

PROJECT = "cloud-custodian"
EMPTY = "42WmSpB8rSM="  # the labelFingerprint of no labels, as the Compute API answers it

# --- Compute Engine ------------------------------------------------------------------------------------------


def listed(page: bytes) -> list[GceInstance] | str:
    """What the DAG's listing reads from one aggregated page: its records, or why it is not complete (a page
    it cannot decode, or an instance it cannot normalize: either leaves the project's listing incomplete)."""
    try:
        decoded = decode_once_each(INSTANCE_PAGE, page)
        return [gce_instance(inst) for scoped in decoded.items.values() for inst in scoped.instances]
    except ValueError as exc:
        return str(exc)


def page_of(*instances: str) -> bytes:
    """An aggregated page holding these instance texts in one zone."""
    return ('{"items": {"zones/us-central1-a": {"instances": [' + ", ".join(instances) + "]}}}").encode()


def exported(tmp_path: Path, instances: bytes) -> list[GceInstance] | str:
    """What ``reaper evaluate --gce`` reads from a ``gcloud compute instances list --format=json`` export."""
    path = tmp_path / "gcloud.json"
    path.write_bytes(instances)
    try:
        return load_gce(path)
    except InputError as exc:
        return str(exc)


def gce(
    name: str, zone: str, ident: str, status: str, labels: dict[str, str], created: str, **more: object
) -> GceInstance:
    """An instance of the recorded project, created at ``created`` (UTC); its labelFingerprint that of no labels
    unless ``more`` says otherwise."""
    more.setdefault("label_fingerprint", EMPTY)
    return GceInstance(PROJECT, zone, name, ident, status, labels, utc(created), **more)  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


RECORDED_PAGES = {
    # The instance's metadata holds one item without a key (`{}`): read, and no group member.
    "gce/aggregated-keyless-metadata.json": [
        gce(
            "test-ingwar", "us-central1-c", "8759471929923434140", "TERMINATED",
            {"custodian_status": "resource_policy-stop-2019_10_10__0_0"}, "2019-10-31 11:41:40.541",
            label_fingerprint="Mjad3HjNiLE=",
        ),
    ],
    # Two TERMINATED instances from before the API wrote lastStopTimestamp; labels with empty values.
    "gce/aggregated-four-instances.json": [
        gce("custodian-dev", "us-east1-b", "4158127351007949610", "TERMINATED", {}, "2017-05-01 19:34:32.859"),
        gce("c7n-jenkins", "us-central1-b", "2966820606951926687", "RUNNING", {}, "2018-05-19 12:15:46.024"),
        gce("drone", "us-central1-b", "4913675096949006093", "TERMINATED", {}, "2017-11-01 10:28:50.885"),
        gce(
            "custodian", "us-east1-d", "4179518482904332734", "RUNNING",
            {"http-server": "", "https-server": "", "ci": "", "drone": "", "custodian": ""}, "2016-04-24 08:44:01.573",
            label_fingerprint="YLj7N4sJwYI=",
        ),
    ],
    # Created at -08:00, stopped at -07:00 (daylight saving time): both offsets applied.
    "gce/aggregated-restarted.json": [
        gce(
            "iap-test-webapp", "us-east4-c", "402279439148739539", "RUNNING", {}, "2021-03-12 02:43:09.644",
            last_stop=utc("2021-03-23 14:55:46.731"),
        ),
    ],
    "gce/aggregated-no-results-warnings.json": [
        gce(
            "test-ingwar", "us-central1-a", "3532009896116593480", "TERMINATED",
            {"os": "linux", "running_schedule": "always_on"}, "2020-10-30 14:05:27.513",
            last_stop=utc("2020-10-30 14:07:51.232"), label_fingerprint="Vo5Kpyl1teY=",
        ),
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECORDED_PAGES))
def test_a_recorded_aggregated_page_reads_alike_in_the_listing_and_the_export(tmp_path: Path, name: str) -> None:
    page = recorded(name)
    assert listed(page) == RECORDED_PAGES[name]
    assert exported(tmp_path, gcloud_export(instances_of(page))) == RECORDED_PAGES[name]


def test_a_recorded_page_of_no_results_warnings_is_a_complete_page() -> None:
    decoded = decode_once_each(INSTANCE_PAGE, recorded("gce/aggregated-no-results-warnings.json"))
    assert decoded.warning is None and decoded.unreachables == [] and decoded.nextPageToken == ""
    warnings = [scoped.warning for scoped in decoded.items.values() if scoped.warning is not None]
    assert len(warnings) == 3 and {w.code for w in warnings} <= set(HARMLESS_WARNINGS)


def test_a_recorded_instance_whose_urls_name_no_project_is_refused_by_both(tmp_path: Path) -> None:
    """Cloud Custodian cut the project out of this recording's URLs: an instance filed under no project."""
    page = recorded("gce/aggregated-scrubbed-urls.json")
    for outcome in (listed(page), exported(tmp_path, gcloud_export(instances_of(page)))):
        assert isinstance(outcome, str) and "instance name-123: no project in selfLink or zone URL" in outcome


def test_a_recorded_instances_list_reads_as_an_export(tmp_path: Path) -> None:
    body = json.loads(recorded("gce/instances-list.json"))
    expected = gce(
        "instance-1",
        "us-central1-c",
        "991745007860431209",
        "PROVISIONING",
        {"env": "dev"},
        "2018-11-08 09:53:13.463",
        label_fingerprint="GHZ1Un204L0=",
    )
    assert exported(tmp_path, json.dumps(body["items"]).encode()) == [expected]


def test_a_recorded_instance_get_reads_alike_in_the_listing_the_export_and_the_deleters_sdk(tmp_path: Path) -> None:
    """The deleter re-reads an instance with the SDK before its delete and compares what the listing read."""
    text = recorded("gce/instance-get-terminated.json")
    expected = gce(
        "instance-1", "us-central1-a", "1116531078760334288", "TERMINATED", {"env": "dev"}, "2023-06-28 14:01:36.536",
        last_stop=utc("2023-07-08 02:08:51.836"), label_fingerprint="GHZ1Un204L0=",
    )  # fmt: skip
    assert listed(page_of(text.decode())) == exported(tmp_path, b"[" + text + b"]") == [expected]
    # What the SDK's REST transport does with an answer: unknown fields ignored.
    current = compute_v1.Instance.from_json(text, ignore_unknown_fields=True)
    assert set(GET_FIELD_MASK.split(",")) == {
        "id",
        "name",
        "status",
        "labels",
        "labelFingerprint",
        "lastStopTimestamp",
        "lastSuspendedTimestamp",
        "deletionProtection",
    }
    assert (
        str(current.id), current.name, current.status, dict(current.labels), current.deletion_protection,
        current.label_fingerprint, rfc3339(current.last_stop_timestamp, "lastStopTimestamp"),
    ) == (
        expected.id, expected.name, expected.status, expected.labels, expected.deletion_protection,
        expected.label_fingerprint, expected.last_stop,
    )  # fmt: skip


def test_a_recorded_delete_operation_reads_as_not_done_and_names_its_target() -> None:
    operation = compute_v1.Operation.from_json(recorded("gce/operation-delete.json"), ignore_unknown_fields=True)
    assert operation.status == compute_v1.Operation.Status.PENDING != compute_v1.Operation.Status.DONE
    assert (operation.operation_type, operation.target_id) == ("delete", 997635173265677245)
    assert not operation.error.errors


# Variants of a recorded instance, each given to both readers, with the outcome both must agree on.
BASE = instances_of(recorded("gce/aggregated-restarted.json"))[0]
LABELLED = json.dumps({**BASE, "labels": {"ci_ephemeral": "true"}})
OPT_OUT_TWICE = '"reaper_keep": "true", "reaper_keep": "no"'


def _with(**fields: object) -> str:
    return json.dumps({**BASE, **fields})


def _without(field: str) -> str:
    return json.dumps({k: v for k, v in BASE.items() if k != field})


VARIANTS: dict[str, tuple[str, bool]] = {
    "as-recorded": (json.dumps(BASE), True),
    "created-by-key": (_with(metadata={"items": [{"key": "created-by", "value": "projects/1/zones/z/x"}]}), True),
    "keyless-metadata-item": (_with(metadata={"items": [{}]}), True),  # as in aggregated-keyless-metadata.json
    "id-as-a-number": (_with(id=402279439148739539), True),
    "empty-last-stop": (_with(lastStopTimestamp=""), True),  # the protobuf default: never stopped
    "no-zone": (_without("zone"), False),
    "no-id": (_without("id"), False),
    "no-creation-time": (_without("creationTimestamp"), False),
    "creation-time-without-offset": (_with(creationTimestamp="2021-03-11T18:43:09.644"), False),
    "creation-time-lowercase-z": (_with(creationTimestamp="2021-03-11T18:43:09.644z"), False),  # the export read it
    "null-last-stop": (_with(lastStopTimestamp=None), False),
    "null-metadata": (_with(metadata=None), False),
    "null-metadata-items": (_with(metadata={"items": None}), False),
    "null-labels": (_with(labels=None), False),
    "id-beyond-uint64": (_with(id=str(2**64)), False),
}  # fmt: skip


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_listing_and_the_export_accept_and_refuse_the_same_instances(tmp_path: Path, variant: str) -> None:
    inst, readable = VARIANTS[variant]
    from_listing = listed(page_of(inst))
    from_export = exported(tmp_path, f"[{inst}]".encode())
    if readable:
        assert isinstance(from_listing, list) and from_listing == from_export, (from_listing, from_export)
    else:
        assert isinstance(from_listing, str) and isinstance(from_export, str), (from_listing, from_export)


def test_a_repeated_key_refuses_a_listed_page_and_reads_as_its_last_value_in_an_export(tmp_path: Path) -> None:
    """The one difference left (``reaper.decoders.load_gce``): an opt-out label written twice, "true" then "no"."""
    inst = LABELLED.replace('"labels": {', f'"labels": {{{OPT_OUT_TWICE}, ')
    assert listed(page_of(inst)) == "a key is repeated in one object of the answer"
    (record,) = cast(list[GceInstance], exported(tmp_path, f"[{inst}]".encode()))  # a str only for a refused page
    assert record.labels["reaper_keep"] == "no"


def test_a_created_by_key_marks_a_group_member_in_both_readers(tmp_path: Path) -> None:
    inst = VARIANTS["created-by-key"][0]
    for records in (listed(page_of(inst)), exported(tmp_path, f"[{inst}]".encode())):
        assert [r.group_member for r in records] == [True]


# --- Kubernetes ----------------------------------------------------------------------------------------------


def k8s_listed(page: bytes, kind: str) -> list[K8sObject] | str:
    """What the DAG's listing reads from one answer of a list of ``kind``: its objects, or why it is unreadable."""
    try:
        return read_page(page, "c1", kind)[0]
    except ValueError as exc:
        return str(exc)


def k8s_exported(tmp_path: Path, listing: bytes) -> list[K8sObject] | str:
    """What ``reaper evaluate --k8s`` reads from a ``kubectl get ... -o json`` export."""
    path = tmp_path / "kubectl.json"
    path.write_bytes(listing)
    try:
        return load_k8s(path, "c1")
    except InputError as exc:
        return str(exc)


def pod_of(listing: str) -> dict[str, object]:
    return {"kind": "Pod", "apiVersion": "v1", **json.loads(recorded(f"k8s/{listing}"))["items"][0]}


def k8s(
    kind: str, name: str, uid: str, labels: dict[str, str], created: str, version: str, **more: object
) -> K8sObject:
    return K8sObject(kind, "c1", "default", name, uid, labels, utc(created), version, **more)  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


RUNNING = k8s(
    "Pod", "hello-world-54764dfbf8-q6l82", "484cb929-8f29-11e8-99d2-067cac34e79c",
    {"app": "hello-world", "pod-template-hash": "1032089694"}, "2018-07-24 10:06:50.0", "4066",
    containers={"hello-world": False}, owner_references=1, uses=("default-token-ncvts",),
)  # fmt: skip
# Each: the kind listed, the API's answer (as the listing asks for it), the kubectl export, the record both must read.
RECORDED_OBJECTS: dict[str, tuple[str, bytes, bytes, K8sObject]] = {
    "podlist": ("Pod", recorded("k8s/podlist-running.json"), kubectl_list(pod_of("podlist-running.json")), RUNNING),
    # Restart policy Never; its init container done (exit 0), its native sidecar still running.
    "native-sidecar": (
        "Pod", api_list("Pod", recorded_object("k8s/pod-native-sidecar.json")),
        kubectl_list(recorded_object("k8s/pod-native-sidecar.json")),
        k8s(
            "Pod", "sleep", "35079257-0ffb-4b09-b2c1-3c0d416f2523", {}, "2024-08-24 01:54:32.0", "17852",
            containers={"sleep": False, "init": True, "sidecar": False},
        ),
    ),
    "terminating": (
        "Pod", api_list("Pod", recorded_object("k8s/pod-terminating.json")),
        kubectl_list(recorded_object("k8s/pod-terminating.json")),
        k8s(
            "Pod", "static-web", "e96b4e07-633e-426d-9a7f-db39676cf0b4", {"role": "myrole"}, "2022-08-25 22:08:33.0",
            "86276", containers={"web": True}, deleting=True,
        ),
    ),
    "secret": (
        "Secret", metadata_list(recorded_object("k8s/secret.json")), kubectl_list(recorded_object("k8s/secret.json")),
        k8s(
            "Secret", "s1", "c3e3d3f3-cb32-11e9-990f-42010a800218", {"app": "fred"}, "2019-08-30 14:30:50.0",
            "49724026",
        ),
    ),
    "networkpolicy": (
        "NetworkPolicy", api_list("NetworkPolicy", recorded_object("k8s/networkpolicy.json")),
        kubectl_list(recorded_object("k8s/networkpolicy.json")),
        k8s(
            "NetworkPolicy", "fred", "e4aada4d-c8fd-11e9-990f-42010a800218", {}, "2019-08-27 19:07:20.0", "48999995",
            selects=(("app", "In", ("nginx",)),),
        ),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", RECORDED_OBJECTS)
def test_a_recorded_kubernetes_object_reads_alike_in_the_listing_and_the_export(tmp_path: Path, name: str) -> None:
    kind, page, export, expected = RECORDED_OBJECTS[name]
    assert k8s_listed(page, kind) == [expected]
    assert k8s_exported(tmp_path, export) == [expected]


def test_a_recorded_typed_podlist_is_an_export_too(tmp_path: Path) -> None:
    """``kubectl get pods -o json`` of one kind may write the API's typed list: read as the listing reads it."""
    assert k8s_exported(tmp_path, recorded("k8s/podlist-running.json")) == [RUNNING]


def test_a_recorded_secret_is_read_without_its_data() -> None:
    # A full Secret in the answer.
    (secret,) = cast(list[K8sObject], k8s_listed(kubectl_list(recorded_object("k8s/secret.json")), "Secret"))
    assert "ZHVtbXk" not in repr(secret) and not hasattr(secret, "data")


def test_a_recorded_list_of_another_kind_is_no_answer_to_a_pod_listing(tmp_path: Path) -> None:
    """A NamespaceList answering a Pod list would otherwise read as Pods; an export ignores kinds it does not judge."""
    namespaces = recorded("k8s/namespacelist.json")
    assert "a NamespaceList answered a list of Pods" in k8s_listed(namespaces, "Pod")
    assert k8s_exported(tmp_path, namespaces) == []


POD = recorded_object("k8s/pod-native-sidecar.json")
POD_META = b'"metadata": {"creationTimestamp"'  # the Pod's own metadata, not its list's
LABEL_TWICE = b'"metadata": {"labels": {"a": "1", "a": "2"}, "creationTimestamp"'
K8S_VARIANTS: dict[str, tuple[bytes, bool]] = {
    "as-recorded": (api_list("Pod", POD), True),
    "no-items": (b'{"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}', False),
    "null-items": (b'{"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": null}', False),
    "an-item-of-another-kind": (json.dumps({"kind": "PodList", "items": [{**POD, "kind": "Secret"}]}).encode(), False),
    # Go's encoder never writes a key twice; both readers keep the last value, as msgspec does.
    "label-twice": (api_list("Pod", POD).replace(POD_META, LABEL_TWICE), True),
    "no-uid": (api_list("Pod", {**POD, "metadata": {k: v for k, v in POD["metadata"].items() if k != "uid"}}), False),  # type: ignore[attr-defined]  # JSON data typed object: its shape is this code's own
}  # fmt: skip


@pytest.mark.parametrize("variant", K8S_VARIANTS)
def test_the_kubernetes_listing_and_the_export_accept_and_refuse_the_same_answers(tmp_path: Path, variant: str) -> None:
    body, readable = K8S_VARIANTS[variant]
    from_listing, from_export = k8s_listed(body, "Pod"), k8s_exported(tmp_path, body)
    if readable:
        assert isinstance(from_listing, list) and from_listing == from_export, (from_listing, from_export)
    else:
        assert isinstance(from_listing, str) and isinstance(from_export, str), (from_listing, from_export)
