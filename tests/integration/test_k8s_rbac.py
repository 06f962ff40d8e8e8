"""The reaper sweeps with exactly the RBAC of ``deploy/``: list and delete, no ``get``, a namespaced
Role where the sandbox namespaces are named. The emulator authorizes the ServiceAccount's token as the API server
would (403 for anything its role does not allow), so a call the manifests do not grant fails here too."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import cast

import pytest
import yaml
from kubernetes import config as kconfig
from pymongo import MongoClient

from include.emulators.k8s import Cluster, K8sEmulator
from reaper.config import parse_settings
from reaper.k8s.deleter import K8sDeleter
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject
from reaper.vocabulary import Result
from tests.helpers import ROOT, fast_backoff
from tests.helpers.k8s import MANAGED, put_leases, seed_run, sweep

TOKEN = "reaper-service-account-token"
SANDBOXES = "ci-sandboxes"  # the namespace deploy/rbac-swept-cluster.yaml's Role is in


def as_reaper(emulator, manifest: str):
    """An ApiClient bearing the ServiceAccount's token, the emulator enforcing ``deploy/<manifest>`` for it."""
    emulator.cluster.grant(TOKEN, list(yaml.safe_load_all((ROOT / "deploy" / manifest).read_text())))
    kubeconfig = emulator.kubeconfig()
    kubeconfig["users"][0]["user"]["token"] = TOKEN
    return kconfig.new_client_from_config_dict(kubeconfig)


def settings(db: str, namespaces: list[str]):
    return parse_settings(
        {
            "k8s": {
                "namespaces": namespaces,
                "mongo_run_store": {"database": db},
                "delete_rate_per_cluster": 1000.0,
            },
            "budget": {"min_stale": 100},
        },
        "test",
    )


@dataclass
class Fleet:
    """An orphan and a live run in the sandbox namespace, and an orphan elsewhere; their leases and run records."""

    cluster: Cluster
    emulator: K8sEmulator
    mongo: MongoClient
    db: str
    nats_url: str

    def sweep(self, manifest: str, namespaces: list[str]):
        """One enforcement sweep by the ServiceAccount of ``deploy/<manifest>``: (plan, outcomes)."""
        return sweep(as_reaper(self.emulator, manifest), settings(self.db, namespaces), self.nats_url, self.mongo, None)

    def runs_left(self) -> dict[str, int]:
        return dict(Counter(obj["metadata"]["labels"]["iterion.io/run-id"] for obj in self.cluster.objects.values()))


@pytest.fixture
def fleet(kube, nats_server, mongo) -> Fleet:
    cluster, _, emulator = kube
    client, db = mongo
    url = f"nats://127.0.0.1:{nats_server.port}"
    seed_run(cluster, "orphan", namespace=SANDBOXES)
    seed_run(cluster, "live", namespace=SANDBOXES)
    seed_run(cluster, "elsewhere", namespace="team-b")
    asyncio.run(put_leases(url, ["live"]))
    statuses = {"orphan": "failed", "live": "running", "elsewhere": "failed"}
    client[db]["runs"].insert_many([{"_id": run, "status": status} for run, status in statuses.items()])
    return Fleet(cluster, emulator, client, db, url)


def test_the_namespaced_role_is_enough_to_reap_the_named_namespaces(fleet: Fleet) -> None:
    _, outcomes = fleet.sweep("rbac-swept-cluster.yaml", [SANDBOXES])

    assert [(o.name, o.result) for o in outcomes] == [
        ("sandbox-orphan", "deleted"),
        ("sandbox-orphan-egress-ca", "deleted"),
        ("sandbox-orphan-files", "deleted"),
        ("sandbox-orphan", "deleted"),
    ]
    assert fleet.runs_left() == {"live": 4, "elsewhere": 4}  # the other namespace is never seen
    # Every re-read was a list by name: 4 before the Pod, 3 before its Secrets, and the Pod's terminating polls.
    counters = fleet.cluster.counters
    assert counters["get"] == 0 and counters["list_named"] >= 7
    assert fleet.cluster.secret_data_served is False


def test_the_cluster_role_reaps_every_namespace(fleet: Fleet) -> None:
    _, outcomes = fleet.sweep("rbac-swept-cluster-all-namespaces.yaml", [])

    assert {o.result for o in outcomes} == {"deleted"} and len(outcomes) == 8
    assert fleet.runs_left() == {"live": 4}
    assert fleet.cluster.counters["get"] == 0 and fleet.cluster.secret_data_served is False


def test_a_namespaced_role_without_named_namespaces_lists_nothing_and_deletes_nothing(fleet: Fleet) -> None:
    """Cluster-wide lists are forbidden to a Role: the cluster is incomplete, so everything is held."""
    api = as_reaper(fleet.emulator, "rbac-swept-cluster.yaml")
    listing = list_cluster(api, "c1", MANAGED, fast_backoff(), 10)
    assert listing.problems and all("HTTP 403" in p for p in listing.problems)
    _, outcomes = fleet.sweep("rbac-swept-cluster.yaml", [])
    assert outcomes == [] and fleet.runs_left() == {"orphan": 4, "live": 4, "elsewhere": 4}


def test_a_namespace_the_role_does_not_cover_holds_the_whole_cluster(fleet: Fleet) -> None:
    plan, outcomes = fleet.sweep("rbac-swept-cluster.yaml", [SANDBOXES, "team-b"])
    assert outcomes == [] and fleet.runs_left() == {"orphan": 4, "live": 4, "elsewhere": 4}
    assert {d.reason for d in plan.decisions if "orphan" in d.resource.name} == {"inventory_incomplete"}


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda body, other: {**body, "items": body["items"] + [other]}, id="two-objects"),
        pytest.param(lambda body, other: {**body, "items": [other]}, id="another-name"),
    ],
)
def test_a_server_that_ignores_the_field_selector_keeps_the_run(kube, answer) -> None:
    """The re-read before a delete must be this one object; any other answer is unreadable, so the run stays."""
    cluster, api, _ = kube
    seed_run(cluster, "orphan", namespace=SANDBOXES)
    other = {"kind": "PartialObjectMetadata", "metadata": {"name": "someone-else", "uid": "u-1"}}
    cluster.rewrites["list_named"] = lambda body: answer(body, other)
    config = settings("unused", [SANDBOXES])
    objects = cast(
        list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10, namespaces=[SANDBOXES]).resources
    )

    outcomes = K8sDeleter(lambda _: api, config, fast_backoff(0)).delete(objects)

    assert {o.result for o in outcomes} == {Result.CHANGED_SINCE_PLAN} and len(cluster.objects) == 4
    assert all("unreadable before the delete" in o.detail for o in outcomes)


def test_the_emulator_refuses_field_selectors_the_api_server_does_not_support(kube) -> None:
    from kubernetes.client.exceptions import ApiException

    from reaper.k8s.client import call

    _, api, _ = kube
    with pytest.raises(ApiException) as refused:
        call(api, "GET", f"/api/v1/namespaces/{SANDBOXES}/secrets", 10, [("fieldSelector", "spec.nodeName=n1")])
    assert refused.value.status == 400


def test_a_new_pod_in_the_secrets_own_namespace_keeps_them_whatever_k8s_namespaces_says(kube) -> None:
    """Review finding (hardening): the Pod check looked only in the namespaces of the deleter's config, never in
    the Secrets' own, the one namespace whose Pods can mount them (the DAG refuses a plan made under another
    config; this is the deleter's own interface)."""
    cluster, api, _ = kube
    seed_run(cluster, "r", namespace="ci")
    with cluster.lock:
        cluster.objects.pop(("pods", "ci", "sandbox-r"))  # its Pod went in an earlier sweep
        cluster._sorted.pop("pods", None)
    objects = cast(list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10, namespaces=["ci"]).resources)
    assert {o.kind for o in objects} == {"Secret", "NetworkPolicy"}
    (pod,) = [o for o in seed_run(type(cluster)(), "r") if o["kind"] == "Pod"]  # a retried step's new Pod
    pod["metadata"] = {**pod["metadata"], "uid": "new-pod"}
    cluster.create("pods", "ci", pod)

    outcomes = K8sDeleter(lambda _: api, settings("unused", ["other"]), fast_backoff()).delete(objects)

    assert {o.result for o in outcomes} == {Result.CHANGED_SINCE_PLAN} and len(cluster.objects) == 4


def test_the_emulator_puts_a_role_without_a_namespace_in_default_as_kubectl_does() -> None:
    """Otherwise a manifest that lost its namespace would grant everywhere here and nothing on a real cluster."""
    from include.emulators.http import ApiError
    from include.emulators.k8s.rbac import subject

    account = {"name": "reaper", "namespace": "reaper-system"}
    granted = subject(
        [
            {"kind": "ServiceAccount", "metadata": account},
            {
                "kind": "Role",
                "metadata": {"name": "r"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
            },
            {
                "kind": "RoleBinding",
                "metadata": {"name": "r"},
                "roleRef": {"kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", **account}],
            },
        ]
    )
    granted.authorize("list", "secrets", "default")
    for elsewhere in (None, SANDBOXES):
        with pytest.raises(ApiError) as refused:
            granted.authorize("list", "secrets", elsewhere)
        assert refused.value.code == 403


def test_a_new_pod_in_any_namespace_of_the_runs_secrets_keeps_them(kube) -> None:
    """Second review: the check looked in the first Secret's namespace only; a run whose Secrets span two
    namespaces (none of them in the deleter's config) lost the second's beside a new Pod of the run there."""
    cluster, api, _ = kube
    seed_run(cluster, "r", namespace="a")
    for stored in seed_run(cluster, "r", namespace="b"):
        stored["metadata"]["uid"] = "b-" + stored["metadata"]["uid"]  # uids are unique cluster-wide
    with cluster.lock:
        cluster.objects.pop(("pods", "a", "sandbox-r"))  # the run's Pods went in an earlier sweep
        cluster.objects.pop(("pods", "b", "sandbox-r"))
        cluster._sorted.pop("pods", None)
    objects = cast(
        list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10, namespaces=["a", "b"]).resources
    )
    objects.sort(key=lambda o: o.namespace)  # a's first: the check runs before them
    (pod,) = [o for o in seed_run(type(cluster)(), "r", namespace="b") if o["kind"] == "Pod"]
    pod["metadata"] = {**pod["metadata"], "uid": "new-pod"}
    cluster.create("pods", "b", pod)  # a retried step's Pod in b, which mounts b's Secrets

    outcomes = K8sDeleter(lambda _: api, settings("unused", ["other"]), fast_backoff()).delete(objects)

    assert {o.result for o in outcomes} == {Result.CHANGED_SINCE_PLAN} and len(cluster.objects) == 7
