"""The DAG's listings, run end to end (real client libraries, HTTP, the field mask and the metadata-only Accept
header) against the emulators answering with recorded answers of the real APIs (``tests/data/recorded``), read the
same records as ``reaper evaluate`` reads from an export of the same resources."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from reaper.decoders import InputError, load_gce, load_k8s
from reaper.gce.inventory import list_project
from reaper.k8s.inventory import list_cluster
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED
from tests.helpers.recorded import (
    api_list,
    gcloud_export,
    instances_of,
    kubectl_list,
    metadata_list,
    recorded,
    recorded_object,
)

PROJECT = "cloud-custodian"  # the project the recorded answers name
PAGES = (
    "gce/aggregated-keyless-metadata.json",
    "gce/aggregated-four-instances.json",
    "gce/aggregated-restarted.json",
    "gce/aggregated-no-results-warnings.json",
)


def serve_pages(fleet, names: tuple[str, ...]) -> None:
    """The emulator answers the aggregated list with these recorded pages, chained by page tokens of ours (in the
    emulator's own form, which it checks when they come back)."""
    pages = [json.loads(recorded(name)) for name in names]
    for index, page in enumerate(pages[:-1]):
        page["nextPageToken"] = base64.urlsafe_b64encode(f"offset:{index + 1}".encode()).decode()
    served = iter(pages)
    fleet.add_zone(PROJECT, "us-central1-a")
    fleet.rewrites["aggregated_list"] = lambda _body: next(served)


def test_the_gce_listing_of_recorded_pages_is_complete_and_reads_as_their_export(gce, tmp_path: Path) -> None:
    fleet, clients = gce
    serve_pages(fleet, PAGES)
    listing = list_project(clients, PROJECT, {"ci_ephemeral": "true"}, fast_backoff(0), 10)
    assert listing.complete, listing.problems
    assert listing.pages == len(PAGES)
    export = tmp_path / "gcloud.json"
    export.write_bytes(gcloud_export([inst for name in PAGES for inst in instances_of(recorded(name))]))
    assert listing.resources == load_gce(export)
    assert len(listing.resources) == 7 and {r.project for r in listing.resources} == {PROJECT}


def test_a_recorded_instance_filed_under_no_project_is_refused_by_the_listing_and_the_export(gce, tmp_path) -> None:
    fleet, clients = gce
    serve_pages(fleet, ("gce/aggregated-restarted.json", "gce/aggregated-scrubbed-urls.json"))
    listing = list_project(clients, PROJECT, {"ci_ephemeral": "true"}, fast_backoff(0), 10)
    assert not listing.complete and any("no project" in p for p in listing.problems), listing.problems
    export = tmp_path / "gcloud.json"
    export.write_bytes(gcloud_export(instances_of(recorded("gce/aggregated-scrubbed-urls.json"))))
    try:
        load_gce(export)
    except InputError as exc:
        assert "no project" in str(exc)
    else:
        raise AssertionError("the export of an instance under no project was read")


PODS = ("k8s/pod-native-sidecar.json", "k8s/pod-terminating.json")


def test_the_k8s_listing_of_recorded_objects_reads_as_their_kubectl_export(kube, tmp_path: Path) -> None:
    cluster, api, _ = kube
    running = json.loads(recorded("k8s/podlist-running.json"))["items"]
    pods = [*running, *(recorded_object(name) for name in PODS)]
    secret, policy = recorded_object("k8s/secret.json"), recorded_object("k8s/networkpolicy.json")
    answers = {
        "PodList": api_list("Pod", *pods),
        "PartialObjectMetadataList": metadata_list(secret),  # the listing asks for Secrets' metadata only
        "NetworkPolicyList": api_list("NetworkPolicy", policy),
    }
    cluster.rewrites["list"] = lambda body: json.loads(answers[body["kind"]])
    listing = list_cluster(api, "c1", MANAGED, fast_backoff(0), 10)
    assert listing.complete, listing.problems
    export = tmp_path / "kubectl.json"
    export.write_bytes(kubectl_list(*({"kind": "Pod", **pod} for pod in pods), secret, policy))
    assert sorted(listing.resources, key=lambda o: (o.kind, o.name)) == sorted(
        load_k8s(export, "c1"), key=lambda o: (o.kind, o.name)
    )
    assert [o.kind for o in listing.resources].count("Pod") == 3


def test_a_recorded_list_of_another_kind_makes_the_k8s_listing_incomplete(kube) -> None:
    cluster, api, _ = kube
    namespaces = json.loads(recorded("k8s/namespacelist.json"))
    cluster.rewrites["list"] = lambda body: namespaces if body["kind"] == "PodList" else body
    listing = list_cluster(api, "c1", MANAGED, fast_backoff(0), 10)
    assert not listing.complete
    assert any("NamespaceList answered a list of Pods" in p for p in listing.problems), listing.problems
