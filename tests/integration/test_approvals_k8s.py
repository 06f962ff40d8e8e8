"""An approval against the Kubernetes emulator: a relabel between the approval and the run keeps the whole run."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import cast

from reaper.approvals import Approval, ApprovedItem
from reaper.config import parse_settings
from reaper.k8s.deleter import K8sDeleter
from reaper.k8s.inventory import list_cluster
from reaper.model import Evidence, K8sObject, Keyed, Phase
from reaper.policy import evaluate
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_run

CONFIG = parse_settings({"k8s": {"clusters": ["c1"], "delete_rate_per_cluster": 1000.0}}, "test")
RUN_LABEL = "iterion.io/run-id"
GONE = Evidence(leases=Keyed(complete=True), runs=Keyed(complete=True), swept=frozenset({("k8s", "c1")}))


def listed(api) -> list[K8sObject]:
    return cast(list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10).resources)


def approval_of(objects: list[K8sObject]) -> Approval:
    now = time.time()
    items = [
        ApprovedItem(o.cluster, o.uid, o.resource_version, o.name, o.kind, o.labels[RUN_LABEL], "sandbox_orphan")
        for o in objects
    ]
    return Approval("apr-k", "k8s", "reaper_k8s_enforcement", "scheduled__1", "alice", "INC-2", now, now + 3600, items)


def relabel(cluster, resource: str, name: str) -> None:
    """What the API server does on a label update: the labels change, and so does the resourceVersion."""
    with cluster.lock:
        meta = cluster.objects[(resource, "ci", name)]["metadata"]
        meta["labels"] = {**meta["labels"], "touched": "yes"}
        meta["resourceVersion"] = cluster._version()


def test_a_relabel_between_the_approval_and_the_run_keeps_the_whole_run(kube) -> None:
    cluster, api, _ = kube
    for run in ("r1", "r2", "r3"):  # three orphaned runs of three: the budget holds them all
        seed_run(cluster, run)
    reviewed = listed(api)
    approval = approval_of(reviewed)
    relabel(cluster, "secrets", "sandbox-r1-files")
    plan = evaluate(listed(api), GONE, CONFIG, Phase.ENFORCEMENT, datetime.now(UTC), approval=approval)
    reasons = {(d.resource.labels[RUN_LABEL], d.resource.name): d.reason for d in plan.decisions}
    assert reasons[("r1", "sandbox-r1-files")] == "approval_changed"
    assert {r for (run, _), r in reasons.items() if run == "r1" and _ != "sandbox-r1-files"} == {"approval_run_partial"}
    assert {d.resource.labels[RUN_LABEL] for d in plan.deletes()} == {"r2", "r3"}
    # Deleted with the planned (approved) resourceVersions as preconditions.
    outcomes = K8sDeleter(lambda _: api, CONFIG, fast_backoff()).delete(
        [cast(K8sObject, d.resource) for d in plan.deletes()]
    )
    assert {o.result for o in outcomes} == {"deleted"}
    assert {n for n in cluster.names() if "r1" in n} == {"sandbox-r1", "sandbox-r1-egress-ca", "sandbox-r1-files"}


def test_the_precondition_is_the_approved_resource_version(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    approved = listed(api)  # planned as approved; the Pod relabelled before its delete is sent
    relabel(cluster, "pods", "sandbox-r1")
    outcomes = K8sDeleter(lambda _: api, CONFIG, fast_backoff()).delete(approved)
    assert {o.result for o in outcomes} == {"changed_since_plan"}
    assert cluster.deletes == [] and len(cluster.objects) == 4
