"""Realistic API-shaped fleet objects, for the sample exports, the tests and the benchmarks.

Shapes follow what the Compute v1 API (and so ``gcloud ... --format=json``) and
the Kubernetes API (and so ``kubectl get -o json``) return, including the
fields the reaper ignores, so parsing cost and memory are measured honestly.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

COMPUTE = "https://www.googleapis.com/compute/v1"


def rfc3339(ts: float, offset_hours: int = 0) -> str:
    """A Compute-style timestamp (milliseconds and an offset, e.g. ``-07:00``)."""
    tz = UTC if offset_hours == 0 else timezone(timedelta(hours=offset_hours))
    text = datetime.fromtimestamp(ts, tz).isoformat(timespec="milliseconds")
    return text


def _fingerprint(*parts: object) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:12]


def gcloud_instance(
    project: str,
    zone: str,
    name: str,
    instance_id: int,
    status: str,
    labels: dict[str, str] | None,
    created: float,
    last_stop: float | None = None,
    offset_hours: int = -7,
) -> dict[str, Any]:
    """One instance resource as the Compute API returns it (``labels`` None: no labels field at all)."""
    zone_url = f"{COMPUTE}/projects/{project}/zones/{zone}"
    inst: dict[str, Any] = {
        "canIpForward": False,
        "cpuPlatform": "Intel Cascade Lake",
        "creationTimestamp": rfc3339(created, offset_hours),
        "deletionProtection": False,
        "disks": [
            {
                "architecture": "X86_64",
                "autoDelete": True,
                "boot": True,
                "deviceName": "persistent-disk-0",
                "diskSizeGb": "25",
                "guestOsFeatures": [{"type": "VIRTIO_SCSI_MULTIQUEUE"}, {"type": "GVNIC"}],
                "index": 0,
                "interface": "SCSI",
                "kind": "compute#attachedDisk",
                "licenses": [f"{COMPUTE}/projects/cos-cloud/global/licenses/cos"],
                "mode": "READ_WRITE",
                "source": f"{zone_url}/disks/{name}",
                "type": "PERSISTENT",
            }
        ],
        "fingerprint": _fingerprint(name, "fp"),
        "id": str(instance_id),
        "kind": "compute#instance",
        "labelFingerprint": _fingerprint(name, labels),
        "lastStartTimestamp": rfc3339(created + 20, offset_hours),
        "machineType": f"{zone_url}/machineTypes/n2d-standard-2",
        "metadata": {"fingerprint": _fingerprint(name, "md"), "kind": "compute#metadata"},
        "name": name,
        "networkInterfaces": [
            {
                "fingerprint": _fingerprint(name, "nic"),
                "kind": "compute#networkInterface",
                "name": "nic0",
                "network": f"{COMPUTE}/projects/{project}/global/networks/ci",
                "networkIP": f"10.{instance_id % 250}.{(instance_id // 250) % 250}.{instance_id % 200 + 2}",
                "stackType": "IPV4_ONLY",
                "subnetwork": f"{COMPUTE}/projects/{project}/regions/{zone[:-2]}/subnetworks/ci-{zone[:-2]}",
            }
        ],
        "satisfiesPzi": True,
        "scheduling": {
            "automaticRestart": False,
            "onHostMaintenance": "TERMINATE",
            "preemptible": True,
            "provisioningModel": "SPOT",
        },
        "selfLink": f"{zone_url}/instances/{name}",
        "serviceAccounts": [
            {
                "email": f"ci-runner@{project}.iam.gserviceaccount.com",
                "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            }
        ],
        "shieldedInstanceConfig": {"enableIntegrityMonitoring": True, "enableSecureBoot": False, "enableVtpm": True},
        "startRestricted": False,
        "status": status,
        "tags": {"fingerprint": _fingerprint(name, "tags"), "items": ["ci-runner"]},
        "zone": zone_url,
    }
    if labels is not None:
        inst["labels"] = labels
    if last_stop is not None:
        inst["lastStopTimestamp"] = rfc3339(last_stop, offset_hours)
    return inst


def _meta(name: str, namespace: str, uid: str, labels: dict[str, str], created: float) -> dict[str, Any]:
    return {
        "creationTimestamp": datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "labels": labels,
        "name": name,
        "namespace": namespace,
        "resourceVersion": str(int(created) % 10_000_000),
        "uid": uid,
    }


def kube_pod(
    name: str,
    namespace: str,
    uid: str,
    labels: dict[str, str],
    created: float,
    phase: str = "Running",
    sidecar: str | None = None,
    sidecar_terminated: bool = True,
    deadline: int | None = 5400,
) -> dict[str, Any]:
    """A sandbox Pod; ``sidecar`` adds a results-egress container in the given state."""
    containers = [{"name": "sandbox", "image": "registry.example/sandbox:1.4", "command": ["sleep", "infinity"]}]
    statuses = [_status("sandbox", "registry.example/sandbox:1.4", uid, phase != "Running")]
    if sidecar:
        containers.append({"name": sidecar, "image": "registry.example/egress:0.3"})
        statuses.append(_status(sidecar, "registry.example/egress:0.3", uid, sidecar_terminated))
    spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Never", "serviceAccountName": "sandbox"}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, namespace, uid, labels, created),
        "spec": spec,
        "status": {"phase": phase, "containerStatuses": statuses, "qosClass": "Burstable"},
    }


def _status(name: str, image: str, uid: str, terminated: bool) -> dict[str, Any]:
    """A containerStatus with every field the API always sets (typed clients refuse it otherwise)."""
    return {
        "name": name,
        "image": image,
        "imageID": f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
        "containerID": f"containerd://{hashlib.sha256(f'{uid}/{name}'.encode()).hexdigest()}",
        "ready": not terminated,
        "restartCount": 0,
        "started": not terminated,
        "state": _state(terminated),
    }


def _state(terminated: bool) -> dict[str, Any]:
    if terminated:
        return {"terminated": {"exitCode": 0, "reason": "Completed"}}
    return {"running": {"startedAt": "2026-11-29T11:00:00Z"}}


def kube_secret(name: str, namespace: str, uid: str, labels: dict[str, str], created: float) -> dict[str, Any]:
    """A Secret with ``data`` as kubectl prints it; the reaper must never read or print it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(name, namespace, uid, labels, created),
        "type": "Opaque",
        "data": {"credentials.json": "c3VwZXItc2VjcmV0LXRva2VuLWRvLW5vdC1sZWFr"},
    }


def kube_netpol(name: str, namespace: str, uid: str, labels: dict[str, str], created: float) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(name, namespace, uid, labels, created),
        "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Egress"], "egress": []},
    }


def kube_run(
    run: str,
    namespace: str,
    created: float,
    managed_labels: dict[str, str],
    run_label: str = "iterion.io/run-id",
    **pod_options: object,
) -> list[dict[str, Any]]:
    """A run's sandbox footprint: the Pod, its two Secrets and its NetworkPolicy."""
    labels = {**managed_labels, run_label: run}
    return [
        kube_pod(f"sandbox-{run}", namespace, f"{run}-pod", labels, created, **pod_options),  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name
        kube_secret(f"sandbox-{run}-egress-ca", namespace, f"{run}-ca", labels, created),
        kube_secret(f"sandbox-{run}-files", namespace, f"{run}-files", labels, created),
        kube_netpol(f"sandbox-{run}", namespace, f"{run}-np", labels, created),
    ]
