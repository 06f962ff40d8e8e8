"""The normalizers shared by exports and the adapters: what a Pod's container states and an object's
deletion state mean (docs/design.md §5, row 6 and the terminating rule), and GCE deletion protection."""

from __future__ import annotations

import msgspec
import pytest

from reaper.decoders import KubeItem, RawInstance, gce_instance, k8s_object

SIDECAR = "results-egress"
RUNNING = {"running": {"startedAt": "2026-11-29T11:00:00Z"}}
WAITING = {"waiting": {"reason": "CrashLoopBackOff"}}
EXIT_0 = {"terminated": {"exitCode": 0, "reason": "Completed"}}
EXIT_1 = {"terminated": {"exitCode": 1, "reason": "Error"}}


def pod(
    sidecar_state: dict | None,
    phase: str = "Running",
    restart_policy: str = "Never",
    native: bool = False,
    **meta: object,
) -> dict:
    """A step pod whose egress sidecar is in ``sidecar_state`` (None: no status reported yet)."""
    sidecar_status = [] if sidecar_state is None else [{"name": SIDECAR, "state": sidecar_state}]
    spec: dict = {"containers": [{"name": "step"}], "restartPolicy": restart_policy}
    status: dict = {"phase": phase, "containerStatuses": [{"name": "step", "state": EXIT_0}]}
    if native:  # an init container with restartPolicy Always
        spec["initContainers"] = [{"name": SIDECAR, "restartPolicy": "Always"}]
        status["initContainerStatuses"] = sidecar_status
    else:
        spec["containers"].append({"name": SIDECAR})
        status["containerStatuses"] += sidecar_status
    metadata = {"name": "p", "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-11-29T10:00:00Z", **meta}
    return {"kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def normalize(raw: dict):
    return k8s_object(msgspec.convert(raw, KubeItem), "c1")


@pytest.mark.parametrize(
    ("raw", "finished"),
    [
        (pod(RUNNING, phase="Succeeded"), False),  # a container status beats the phase
        (pod(RUNNING, phase="Failed"), False),  # DeadlineExceeded with the sidecar still uploading
        (pod(WAITING), False),
        (pod(None, phase="Succeeded"), False),  # no status reported: counts as running
        (pod(EXIT_1, native=True), False),  # a native sidecar is restarted whatever the pod's policy
        (pod(EXIT_1, restart_policy="OnFailure"), False),
        (pod(EXIT_1, restart_policy="Always"), False),
        (pod({"terminated": {"reason": "Unknown"}}, restart_policy="OnFailure"), False),  # no exit code
        (pod(EXIT_1, restart_policy="Never"), True),  # failed for good: nothing will upload
        (pod(EXIT_0, restart_policy="OnFailure"), True),
        (pod(EXIT_0, native=True), True),
        # A Pod in a terminal phase restarts nothing: the kubelet stopped its native sidecar when its containers ended.
        (pod({"terminated": {"exitCode": 143, "reason": "Error"}}, phase="Succeeded", native=True), True),
        (pod(EXIT_1, phase="Failed", restart_policy="Always"), True),
    ],
    ids=[
        "succeeded-pod-sidecar-running",
        "failed-pod-sidecar-running",
        "waiting",
        "no-status",
        "native-sidecar-exit-1",
        "exit-1-onfailure",
        "exit-1-always",
        "no-exit-code-onfailure",
        "exit-1-never",
        "exit-0-onfailure",
        "native-sidecar-exit-0",
        "succeeded-pod-native-sidecar-stopped",
        "failed-pod-exit-1-always",
    ],
)
def test_sidecar_finished_for_good_only_when_terminated_and_never_restarted(raw: dict, finished: bool) -> None:
    assert normalize(raw).containers[SIDECAR] is finished


def test_deletion_timestamp_marks_an_object_terminating() -> None:
    assert normalize(pod(EXIT_0, deletionTimestamp="2026-11-29T11:00:00Z")).deleting is True
    assert normalize(pod(EXIT_0)).deleting is False


def test_deletion_protection_is_read_from_the_instance() -> None:
    raw = {
        "name": "vm",
        "id": "7",
        "status": "RUNNING",
        "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/z",
        "creationTimestamp": "2026-11-29T10:00:00Z",
        "deletionProtection": True,
    }
    assert gce_instance(msgspec.convert(raw, RawInstance)).deletion_protection is True
    assert gce_instance(msgspec.convert({**raw, "deletionProtection": False}, RawInstance)).deletion_protection is False


# Volume plugins of the Pod API that name a Secret in `secretRef`.
_SECRET_REF_VOLUMES = ("cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos")


def test_a_pods_secrets_are_every_one_it_mounts_or_reads() -> None:
    raw = pod(EXIT_0)
    raw["spec"]["volumes"] = [
        {"name": "a", "secret": {"secretName": "mounted"}},
        {"name": "b", "projected": {"sources": [{"secret": {"name": "projected"}}, {"configMap": {"name": "cm"}}]}},
        {"name": "c", "emptyDir": {}},
        {"name": "d", "csi": {"driver": "secrets-store.csi.k8s.io", "nodePublishSecretRef": {"name": "csi"}}},
        {"name": "e", "azureFile": {"secretName": "azure", "shareName": "s"}},
        *({"name": k, k: {"secretRef": {"name": k}}} for k in _SECRET_REF_VOLUMES),
    ]
    raw["spec"]["containers"][0]["env"] = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "env", "key": "t"}}}]
    raw["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "env-from"}}, {"configMapRef": {"name": "cm"}}]
    raw["spec"]["ephemeralContainers"] = [{"name": "debug", "envFrom": [{"secretRef": {"name": "debugger"}}]}]
    raw["spec"]["imagePullSecrets"] = [{"name": "pull"}]
    expected = {"env", "env-from", "mounted", "projected", "pull", "csi", "azure", "debugger", *_SECRET_REF_VOLUMES}
    assert normalize(raw).uses == tuple(sorted(expected))


def test_a_networkpolicy_selector_becomes_requirements() -> None:
    meta = {"name": "np", "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-11-29T10:00:00Z"}
    spec = {"podSelector": {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}}
    item = {"kind": "NetworkPolicy", "metadata": meta, "spec": spec}
    assert normalize(item).selects == (("a", "In", ("1",)), ("b", "Exists", ()))
    assert normalize({**item, "spec": {"podSelector": {}}}).selects == ()  # selects every Pod


@pytest.mark.parametrize("missing", ["uid", "resourceVersion"])
def test_an_object_without_uid_or_resource_version_is_unreadable(missing: str) -> None:
    """Every delete is made on the object's uid and resourceVersion as preconditions: one listed without either
    (the API server gives every object both) is surprising, and its page unreadable (the listing incomplete)."""
    raw = pod(None)
    del raw["metadata"][missing]
    with pytest.raises(ValueError, match=r"uid|resourceVersion"):  # msgspec's ValidationError is a ValueError
        normalize(raw)


def test_a_pod_without_its_spec_is_unreadable() -> None:
    """A metadata-only answer for Pods (PartialObjectMetadataList) has no container to read as running: row 6 would
    see no upload at all, so such a Pod is unreadable (its listing incomplete), never a Pod with nothing running."""
    meta = {"name": "p", "uid": "u", "resourceVersion": "1", "creationTimestamp": "2026-11-29T10:00:00Z"}
    item = msgspec.convert({"metadata": meta}, KubeItem)
    with pytest.raises(ValueError, match="expected its spec"):
        k8s_object(item, "c1", "Pod")
    assert k8s_object(item, "c1", "Secret").containers == {}  # Secrets are listed metadata-only on purpose


def test_a_listing_page_answered_items_null_is_empty_and_one_without_items_is_undecodable() -> None:
    # The API server's empty metadata-only list is "items": null (kubernetes-client/python#2142).
    from reaper.k8s.inventory import read_page

    empty = b'{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{},"items":null}'
    assert read_page(empty, "c1", "Secret") == ([], "")
    with pytest.raises(msgspec.ValidationError, match="items"):
        read_page(b'{"kind":"PartialObjectMetadataList","metadata":{}}', "c1", "Secret")


@pytest.mark.parametrize(
    "raw",
    [
        b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}',  # only a metadata-only list is null
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","items":null}',
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","items":[]}',
    ],
    ids=["typed-null", "status-null", "status-empty"],
)
def test_a_page_of_another_shape_than_a_list_or_null_outside_a_metadata_list_is_undecodable(raw: bytes) -> None:
    from reaper.k8s.inventory import read_page

    with pytest.raises(ValueError):
        read_page(raw, "c1", "Pod")
