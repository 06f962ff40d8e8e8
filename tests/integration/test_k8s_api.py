"""The deleter's API object through the real ``kubernetes`` client against the emulator: each request as it goes
out, and each answer as the deleter is told it (docs/design.md §6)."""

from __future__ import annotations

from typing import cast

import pytest
from kubernetes.client.exceptions import ApiException

from reaper.k8s.api import ClusterApi, Conflict, Gone
from reaper.k8s.client import retryable
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_run

RUN_LABEL = "iterion.io/run-id"


def listed(api) -> dict[str, K8sObject]:
    """The seeded run's objects as the inventory lists them, by kind (the second Secret under "Secret/files")."""
    objects = cast(list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10).resources)
    return {o.kind + ("/files" if o.name.endswith("-files") else ""): o for o in objects}


def recording(cluster) -> list[dict[str, object]]:
    """The DeleteOptions of every delete the emulator receives."""
    bodies: list[dict[str, object]] = []
    original = cluster.delete

    def delete(resource, namespace, name, options):
        bodies.append(options)
        return original(resource, namespace, name, options)

    cluster.delete = delete
    return bodies


def test_a_delete_carries_both_preconditions_background_propagation_and_asks_for_metadata_only(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    objects = listed(api)
    bodies = recording(cluster)
    secret = ClusterApi(api, 10).delete(objects["Secret"])
    assert bodies == [
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": "r1-ca", "resourceVersion": objects["Secret"].resource_version},
            "propagationPolicy": "Background",
        }
    ]
    assert secret is not None and secret.uid == "r1-ca" and secret.deletionTimestamp is None
    assert cluster.secret_data_served is False  # the answer was the Secret's metadata, never its data
    assert ("DELETE", "/api/v1/namespaces/ci/secrets/sandbox-r1-egress-ca") in cluster.requests


def test_a_pods_graceful_delete_answers_the_pod_as_it_is_now_terminating(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    cluster.faults.pod_shutdown = 10.0
    pod = ClusterApi(api, 10).delete(listed(api)["Pod"])
    assert pod is not None and pod.uid == "r1-pod" and pod.deletionTimestamp is not None


def test_an_undecodable_delete_answer_is_none_so_that_nobody_takes_the_pod_for_gone(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    cluster.rewrites["delete"] = lambda _: b"not json"
    assert ClusterApi(api, 10).delete(listed(api)["Pod"]) is None
    assert cluster.counters["delete"] == 1


def test_a_404_on_delete_is_gone_and_final(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    secret = listed(api)["Secret"]
    with cluster.lock:
        cluster._remove(("secrets", "ci", secret.name))
    with pytest.raises(Gone) as gone:
        ClusterApi(api, 10).delete(secret)
    assert isinstance(gone.value.__cause__, ApiException) and gone.value.__cause__.status == 404
    assert retryable(gone.value) is False


@pytest.mark.parametrize("change", ["recreated", "relabelled"])
def test_a_failed_precondition_is_a_409_conflict_and_final(kube, change: str) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    pod = listed(api)["Pod"]
    with cluster.lock:  # a new uid under the same name, or a label write (a new resourceVersion)
        meta = cluster.objects[("pods", "ci", pod.name)]["metadata"]
        if change == "recreated":
            meta["uid"] = "new-uid"
        else:
            meta["labels"] = {**meta["labels"], "touched": "yes"}
            meta["resourceVersion"] = cluster._version()
    with pytest.raises(Conflict) as conflict:
        ClusterApi(api, 10).delete(pod)
    assert isinstance(conflict.value.__cause__, ApiException) and conflict.value.__cause__.status == 409
    assert retryable(conflict.value) is False
    assert cluster.deletes == [] and len(cluster.objects) == 4


@pytest.mark.parametrize(("fault", "retried"), [("412", False), ("403", False), ("429", True), ("503", True)])
def test_any_other_refusal_is_raised_as_it_came_for_the_retry_to_classify(kube, fault: str, retried: bool) -> None:
    # A 412 is no failed precondition of the Kubernetes API (that is a 409): it is the deleter's ``failed``.
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    pod = listed(api)["Pod"]
    cluster.faults.fail_next["delete"] = [fault]
    with pytest.raises(ApiException) as refused:
        ClusterApi(api, 10).delete(pod)
    assert not isinstance(refused.value, (Gone, Conflict)) and refused.value.status == int(fault)
    assert bool(retryable(refused.value)) is retried


def test_read_is_a_list_selected_by_name_metadata_only(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    objects = listed(api)
    before = dict(cluster.counters)
    meta = ClusterApi(api, 10).read(objects["Secret/files"])
    assert meta is not None and (meta.name, meta.uid) == ("sandbox-r1-files", "r1-files")
    assert meta.resourceVersion == objects["Secret/files"].resource_version and meta.deletionTimestamp is None
    assert cluster.counters["list_named"] == before.get("list_named", 0) + 1 and cluster.counters["get"] == 0
    selector = "fieldSelector=metadata.name%3Dsandbox-r1-files"
    assert cluster.requests[-1] == ("GET", f"/api/v1/namespaces/ci/secrets?{selector}")
    assert cluster.secret_data_served is False


def test_read_of_an_object_gone_is_none(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    policy = listed(api)["NetworkPolicy"]
    with cluster.lock:
        cluster._remove(("networkpolicies", "ci", policy.name))
    assert ClusterApi(api, 10).read(policy) is None


def test_read_of_an_answer_that_is_not_this_one_object_raises(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    pod = listed(api)["Pod"]
    other = {"kind": "PartialObjectMetadata", "metadata": {"name": "someone-else", "uid": "u-1"}}
    cluster.rewrites["list_named"] = lambda body: {**body, "items": [other]}  # a server that ignored the selector
    with pytest.raises(ValueError, match="not this one object"):
        ClusterApi(api, 10).read(pod)


def test_pods_lists_a_runs_pods_cluster_wide_or_in_one_namespace(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    seed_run(cluster, "r2")
    pods = ClusterApi(api, 10).pods
    assert [p.uid for p in pods({RUN_LABEL: "r1"}, None)] == ["r1-pod"]
    assert [p.uid for p in pods({RUN_LABEL: "r1"}, "ci")] == ["r1-pod"]
    assert pods({RUN_LABEL: "r1"}, "elsewhere") == []
    selector = "labelSelector=iterion.io%2Frun-id%3Dr1"
    assert cluster.requests[-3:] == [
        ("GET", f"/api/v1/pods?{selector}"),
        ("GET", f"/api/v1/namespaces/ci/pods?{selector}"),
        ("GET", f"/api/v1/namespaces/elsewhere/pods?{selector}"),
    ]


def test_an_empty_metadata_only_list_answered_null_is_none_there_and_one_without_items_is_no_answer(kube) -> None:
    # The API server answers a metadata-only list that matches nothing with "items": null (kubernetes-client/
    # python#2142): read as an error, a run's Secrets were never deleted once its Pod was gone (the Pod check
    # before them failed). An answer without "items" is no list: never "no Pod there".
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    secret = listed(api)["Secret"]
    answers: list[object] = []

    def seen(body: object) -> object:
        answers.append(body)
        return body

    cluster.rewrites["list"] = cluster.rewrites["list_namespaced"] = seen
    assert ClusterApi(api, 10).pods({RUN_LABEL: "r2"}, None) == []
    assert ClusterApi(api, 10).pods({RUN_LABEL: "r2"}, "ci") == []
    assert [cast(dict, a)["items"] for a in answers] == [None, None]  # as the API server answers it
    cluster.rewrites["list"] = cluster.rewrites["list_namespaced"] = lambda body: {**cast(dict, body), "items": []}
    assert ClusterApi(api, 10).pods({RUN_LABEL: "r2"}, None) == []
    for rewrite in ("list", "list_namespaced"):
        cluster.rewrites[rewrite] = lambda body: {k: v for k, v in cast(dict, body).items() if k != "items"}
    with pytest.raises(Exception, match="items"):
        ClusterApi(api, 10).pods({RUN_LABEL: "r1"}, None)
    cluster.rewrites.clear()
    assert [p.name for p in ClusterApi(api, 10).pods({RUN_LABEL: "r1"}, None)] == ["sandbox-r1"]
    assert ClusterApi(api, 10).read(secret) is not None


@pytest.mark.parametrize(
    "answer",
    [
        # Review finding (helper-52): a first page of none that says more follows read as "no Pod of the run".
        {"metadata": {"continue": "eyJhZnRlciI6W119", "remainingItemCount": 1}, "items": None},
        {"metadata": {"continue": "eyJhZnRlciI6W119"}, "items": []},
        {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": None},  # not the list asked for
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "items": None},
    ],
    ids=["null-page-continues", "empty-page-continues", "typed-list", "status"],
)
def test_a_run_whose_pod_check_is_answered_by_no_whole_metadata_list_keeps_its_secrets(kube, answer) -> None:
    from reaper.config import parse_settings
    from reaper.k8s.deleter import K8sDeleter

    cluster, api, _ = kube
    seed_run(cluster, "r1")
    rest = [o for o in listed(api).values() if o.kind != "Pod"]  # the Pod's delete went earlier, or so it seems

    def hide_the_pod(body: object) -> object:
        pods = [i for i in cast(dict, body).get("items") or [] if i["metadata"].get("name") == "sandbox-r1"]
        return {**cast(dict, body), **answer} if pods else body

    cluster.rewrites["list"] = cluster.rewrites["list_namespaced"] = hide_the_pod
    config = parse_settings({"k8s": {"delete_rate_per_cluster": 1000.0}}, "test")
    outcomes = K8sDeleter(lambda _: api, config, fast_backoff()).delete(rest)
    assert ("pods", "ci", "sandbox-r1") in cluster.objects and cluster.counters["delete"] == 0
    assert {o.result for o in outcomes} <= {"changed_since_plan", "not_attempted", "failed"}, outcomes
