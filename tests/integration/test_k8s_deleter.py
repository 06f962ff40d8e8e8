"""Grouped deletion through the real ``kubernetes`` client against the emulator."""

from __future__ import annotations

import time

import msgspec
import pytest

from include.emulators.k8s import RESOURCE_OF_KIND
from include.emulators.shapes import kube_run
from reaper.config import parse_settings
from reaper.fence import SendGuard
from reaper.k8s.deleter import K8sDeleter
from reaper.k8s.inventory import list_cluster
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_run

CONFIG = parse_settings({"k8s": {"delete_rate_per_cluster": 1000.0}}, "test")


def planned(api, run: str | None = None):
    objects = list_cluster(api, "c1", MANAGED, fast_backoff(), 10).resources
    return [o for o in objects if run is None or o.labels.get("iterion.io/run-id") == run]


def delete(api, objects):
    return K8sDeleter(lambda _: api, CONFIG, fast_backoff()).delete(objects)


def test_a_run_is_deleted_pod_first_then_secrets_then_networkpolicy(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "dead")
    seed_run(cluster, "live")
    outcomes = delete(api, planned(api, "dead"))
    assert [o.result for o in outcomes] == ["deleted"] * 4
    assert [resource for _, resource, _, _ in cluster.deletes] == ["pods", "secrets", "secrets", "networkpolicies"]
    assert cluster.names() == {"sandbox-live", "sandbox-live-egress-ca", "sandbox-live-files"}
    bodies = [p for m, p in cluster.requests if m == "DELETE"]
    assert len(bodies) == 4


def test_recreated_object_is_not_deleted_and_the_rest_of_its_run_waits(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api, "r1")
    with cluster.lock:  # the pod is recreated under the same name for a new run
        cluster.objects[("pods", "ci", "sandbox-r1")]["metadata"]["uid"] = "new-uid"
    out = {o.kind + "/" + o.name: o for o in delete(api, plan)}
    # Read again before the run's first delete: the whole run is skipped, nothing is sent.
    assert {o.result for o in out.values()} == {"changed_since_plan"}
    assert "recreated" in out["Pod/sandbox-r1"].detail
    assert len(cluster.objects) == 4 and cluster.deletes == []


def test_a_run_planned_without_a_resource_version_is_not_deleted(kube) -> None:
    """A plan that did not come from a listing (which refuses an object without one) pins no object's state: the
    re-read could not see a relabel or opt-out, and the delete would carry only the uid as its precondition."""
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = [msgspec.structs.replace(o, resource_version="") if o.kind == "Secret" else o for o in planned(api, "r1")]
    out = delete(api, plan)
    assert {o.result for o in out} == {"changed_since_plan"}
    assert all("without a resourceVersion" in o.detail for o in out)
    assert len(cluster.objects) == 4 and cluster.deletes == []


def test_404_is_already_gone_and_transient_errors_are_retried(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api, "r1")
    with cluster.lock:
        del cluster.objects[("secrets", "ci", "sandbox-r1-files")]
    cluster.faults.fail_next["delete"] = ["429", "503"]
    results = {(o.kind, o.name): o.result for o in delete(api, plan)}
    assert results == {
        ("Pod", "sandbox-r1"): "deleted",
        ("Secret", "sandbox-r1-egress-ca"): "deleted",
        ("Secret", "sandbox-r1-files"): "already_gone",
        ("NetworkPolicy", "sandbox-r1"): "deleted",
    }
    assert cluster.names() == set()
    assert cluster.counters["delete"] == 4 + 2


def test_a_partially_deleted_run_is_finished_by_the_next_sweep(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api, "r1")
    # The Pod and first Secret go; the second Secret keeps failing; the NetworkPolicy waits.
    original = cluster.delete

    def flaky(resource, namespace, name, options):
        if name == "sandbox-r1-files":
            from include.emulators.http import ApiError

            raise ApiError(503, "ServiceUnavailable", "etcd leader changed")
        return original(resource, namespace, name, options)

    cluster.delete = flaky
    first = {(o.kind, o.name): o.result for o in delete(api, plan)}
    assert first[("Pod", "sandbox-r1")] == "deleted" and first[("Secret", "sandbox-r1-files")] == "failed"
    assert first[("NetworkPolicy", "sandbox-r1")] == "not_attempted"
    cluster.delete = original
    second = {o.name: o.result for o in delete(api, planned(api, "r1"))}
    assert set(second.values()) == {"deleted"} and cluster.names() == set()


def test_owner_reference_cascade_leaves_the_reaper_nothing(kube) -> None:
    cluster, api, _ = kube
    runner = cluster.create("pods", "ci", {"metadata": {"name": "runner-0"}, "spec": {"containers": []}})
    for obj in seed_run(cluster, "r1"):
        meta = obj["metadata"]
        cluster.adopt((RESOURCE_OF_KIND[obj["kind"]], meta["namespace"], meta["name"]), runner["metadata"]["uid"])
    assert len(planned(api)) == 4
    cluster.delete("pods", "ci", "runner-0", {"propagationPolicy": "Background"})
    deadline = time.time() + 5
    while cluster.names() and time.time() < deadline:
        time.sleep(0.05)
    assert cluster.names() == set()
    assert planned(api) == []


def test_deletes_are_rate_limited_per_cluster(kube) -> None:
    cluster, api, _ = kube
    for r in range(3):
        seed_run(cluster, f"r{r}")
    config = parse_settings({"k8s": {"delete_rate_per_cluster": 10.0}}, "test")
    started = time.monotonic()
    K8sDeleter(lambda _: api, config, fast_backoff()).delete(planned(api))
    assert time.monotonic() - started >= 11 / 10  # 12 deletes at 10/s
    times = sorted(t for t, *_ in cluster.deletes)
    assert max(sum(1 for u in times if t <= u <= t + 1.0) for t in times) <= 10 + 1


def test_a_409_then_a_failed_read_of_the_pod_is_terminating_and_every_intent_has_its_outcome(kube) -> None:
    # Review finding: after a 409 the Pod is read to see whether it is terminating; a failed read escaped
    # the deleter and left the Pod's durable intent without an outcome. In doubt, it is terminating.
    from include.emulators.http import ApiError
    from reaper.fence import SendGuard

    cluster, api, _ = kube
    seed_run(cluster, "dead")
    intents, outcomes = [], {}
    guard = SendGuard(intent=lambda r: intents.append(r.uid), outcome=lambda r, res, _d: outcomes.update({r.uid: res}))

    def refuse(_: tuple[str, ...]) -> None:
        cluster.faults.fail_next["list_named"] = ["503"]  # the read that follows fails
        raise ApiError(409, "Conflict", "Precondition failed: UID in precondition")

    cluster.on("before", "delete", refuse)
    K8sDeleter(lambda _: api, CONFIG, fast_backoff()).delete(planned(api), guard)
    assert intents == ["dead-pod"] and outcomes["dead-pod"] == "terminating"
    assert set(outcomes.values()) == {"terminating", "not_attempted"} and len(outcomes) == 4
    assert len(cluster.objects) == 4


# Answers a decoder cannot read: not JSON, a name of invalid UTF-8 (msgspec: UnicodeDecodeError), nesting past its
# depth (RecursionError). A delete so answered was still accepted.
UNDECODABLE = [b"not json", b'{"metadata":{"name":"\xff"}}', b'{"a":' * 2000 + b"1" + b"}" * 2000]


@pytest.mark.parametrize("reply", UNDECODABLE, ids=["not json", "invalid utf-8", "deep"])
def test_an_undecodable_answer_to_a_pods_delete_is_terminating_without_a_poll(kube, reply: bytes) -> None:
    # The answer cannot show the Pod gone: in doubt it is terminating, and its Secrets and NetworkPolicy wait.
    cluster, api, _ = kube
    seed_run(cluster, "dead")
    cluster.rewrites["delete"] = lambda _: reply
    outcomes = {o.kind + "/" + o.name: o.result for o in delete(api, planned(api))}
    assert outcomes == {
        "Pod/sandbox-dead": "terminating",
        "Secret/sandbox-dead-egress-ca": "not_attempted",
        "Secret/sandbox-dead-files": "not_attempted",
        "NetworkPolicy/sandbox-dead": "not_attempted",
    }
    assert cluster.counters["delete"] == 1 and cluster.counters["list_named"] == 4  # the run's re-reads, no poll


@pytest.mark.parametrize("reply", UNDECODABLE, ids=["not json", "invalid utf-8", "deep"])
def test_an_undecodable_answer_to_a_secrets_delete_is_a_delete_marked_sent(kube, reply: bytes) -> None:
    cluster, api, _ = kube
    for obj in kube_run("dead", "ci", time.time() - 3600, MANAGED):  # a run whose Pod is gone: its Secrets are left
        if obj["kind"] != "Pod":
            cluster.create(RESOURCE_OF_KIND[obj["kind"]], "ci", obj)
    objects = planned(api, "dead")
    cluster.rewrites["delete"] = lambda _: reply
    sent: list[str] = []
    guard = SendGuard(intent=lambda r: None, outcome=lambda r, res, _d: None)
    guard.sent = lambda resource: sent.append(resource.name)  # type: ignore[method-assign]  # a probe of the mark
    outcomes = {
        o.kind + "/" + o.name: o.result
        for o in K8sDeleter(lambda _: api, CONFIG, fast_backoff()).delete(objects, guard)
    }
    assert outcomes == {
        "Secret/sandbox-dead-egress-ca": "deleted",
        "Secret/sandbox-dead-files": "deleted",
        "NetworkPolicy/sandbox-dead": "deleted",
    }
    assert sent == ["sandbox-dead-egress-ca", "sandbox-dead-files", "sandbox-dead"] and cluster.names() == set()
