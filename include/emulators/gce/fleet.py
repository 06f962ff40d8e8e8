"""The emulated Compute state: instances per project and zone, zone operations, rate quotas, faults and counters.

Thread-safe (one lock): the HTTP handler threads, the test code and the manager
simulator all touch it. Instances are stored in the API's own JSON shape, so
what the SDK receives is what the real API would send.

Operations (the answer of every delete, insert and setLabels) take time, as the API documents them
(compute.v1.json): "You can use an operation resource to manage asynchronous API requests", its status
``PENDING`` ("waiting to be processed"), ``RUNNING``, then ``DONE``; and ``zoneOperations.wait`` "Waits for
the specified Operation resource to return as DONE or for the request to approach the 2 minute deadline
... This method waits for no more than the 2 minutes and then returns the current state of the operation,
which might be DONE or still in progress" (best effort: it may return sooner). An operation is DONE once its
duration has passed (``faults.instance_operation_seconds`` by instance name, else
``faults.operation_seconds`` by type: ``delete``, ``insert``, ``setLabels``; 0 by default), whether anyone
polls or not: a delete takes effect then (the instance is gone), settled by a timer thread and at every
request. The call's own answer is the operation as created, ``PENDING``; ``get`` answers it as it stands;
``wait`` blocks until DONE or ``faults.operation_wait_cap`` seconds (120, the documented deadline). An insert
or a setLabels takes effect when accepted; either is refused with the API's 400 ``invalid`` when a label is one
no instance may carry (:func:`refuse_invalid`).

Rate quotas (``quotas``, :mod:`include.emulators.gce.quota`) are off until given limits:
``fleet.quotas.documented()`` for the documented ones, ``fleet.quotas.limits["read_requests"] = 5`` and
``fleet.quotas.window = 1.0`` for a test; :meth:`Fleet.quota_usage` is what each caller spent and was refused.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from include.emulators.gce.quota import RateQuotas, Usage
from include.emulators.http import ApiError, Faults, State
from include.emulators.shapes import COMPUTE, gcloud_instance
from reaper.gce import labels as gce_labels

WAIT_CAP = 120.0  # zoneOperations.wait: "waits for no more than the 2 minutes" (compute.v1.json)


@dataclass
class GceFaults(Faults):
    """The shared faults plus the Compute-specific ones."""

    unreachable: set[tuple[str, str]] = field(default_factory=set)  # (project, zone)
    failing_pages: set[tuple[str, int]] = field(default_factory=set)  # (project, page index) -> 503
    deny_set_labels: set[str] = field(default_factory=set)  # projects whose setLabels answer 403
    # Projects whose projects.get answers 403: a caller without ``compute.projects.get`` (the reaper's
    # role may grant the instance permissions only).
    deny_project_get: set[str] = field(default_factory=set)
    instance_quota: dict[str, int] = field(default_factory=dict)  # project -> instances it may hold; then insert: 403
    failing_operations: set[str] = field(default_factory=set)  # instance names whose delete op ends in error
    # (project, zone): the aggregated list leaves the zone's instances out and says so only with a
    # top-level PARTIAL_SUCCESS warning, as the API does when some results may be missing.
    partial_zones: set[tuple[str, str]] = field(default_factory=set)
    operation_seconds: dict[str, float] = field(default_factory=dict)  # operationType -> seconds until DONE
    instance_operation_seconds: dict[str, float] = field(default_factory=dict)  # instance name -> seconds
    operation_wait_cap: float = WAIT_CAP  # the longest zoneOperations.wait blocks


@dataclass
class Operation:
    """A zone operation: its resource as the API answers it (``op``), what it is about, and when it is DONE."""

    op: dict[str, Any]
    project: str
    zone: str
    instance: str  # the target's name
    done_at: float  # time.monotonic()


# InstanceGroupManagerActionsSummary: each managed instance counts under exactly one.
_ACTIONS = (
    "abandoning",
    "creating",
    "creatingWithoutRetries",
    "deleting",
    "none",
    "recreating",
    "refreshing",
    "restarting",
    "resuming",
    "starting",
    "stopping",
    "suspending",
    "verifying",
)


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def refuse_invalid(labels: dict[str, Any], field: str) -> None:
    """The API's 400 for a label no instance may carry (reaper.gce.labels), in the words recorded from it on insert
    (``resource.labels``: googleapis/google-cloud-node-core#314, oap-project/cloudtik#14) and setLabels (``labels``:
    cloudfoundry-incubator/kubo-deployment#159)."""
    for key, value in labels.items():
        if not gce_labels.key_ok(str(key)):
            why = (
                f"Label key '{key}' violates format constraints. The key must start with a lowercase character, can "
                "only contain lowercase letters, numeric characters, underscores and dashes. The key can be at most "
                "63 characters long. International characters are allowed."
            )
        elif not isinstance(value, str) or not gce_labels.value_ok(value):
            why = (
                f"Label value '{value}' violates format constraints. The value can only contain lowercase letters, "
                "numeric characters, underscores and dashes. The value can be at most 63 characters long. "
                "International characters are allowed."
            )
        else:
            continue
        raise ApiError(400, "invalid", f"Invalid value for field '{field}': ''. {why}")


class Fleet(State):
    """Projects -> zones -> instance name -> instance resource (API JSON)."""

    def __init__(self) -> None:
        super().__init__()
        self.projects: dict[str, dict[str, dict[str, dict[str, Any]]]] = defaultdict(dict)
        self.operations: dict[str, Operation] = {}
        self.faults: GceFaults = GceFaults()
        self.mutations: list[tuple[float, str, str]] = []  # (time, project, kind)
        self.deleted_ids: list[str] = []  # the instance ids delete calls were accepted for, in order
        # Managed instance groups: project -> scope ("zones/Z", "regions/R") -> name -> (resource, members).
        self.groups: dict[str, dict[str, dict[str, tuple[dict[str, Any], list[tuple[str, str]]]]]] = {}
        # Project id -> project number; a project not named here has a number derived from its id.
        self.numbers: dict[str, str] = {}
        self.quotas = RateQuotas()
        self._op_ids = itertools.count(1)
        self._due: list[tuple[float, str]] = []  # (monotonic time it is DONE, operation name), a heap
        self._tick = threading.Condition(self.lock)  # wakes the settler thread and blocked waits
        self._settler: threading.Thread | None = None

    # --- seeding ---------------------------------------------------------------------------

    def add(self, instance: dict[str, Any]) -> None:
        """Add one instance resource; project and zone come from its URLs."""
        zone_url = str(instance["zone"])
        project = zone_url.split("/projects/")[1].split("/")[0]
        zone = zone_url.rstrip("/").split("/")[-1]
        instance.setdefault("labels", {})
        instance["labelFingerprint"] = fingerprint(instance["labels"])
        with self.lock:
            self.projects[project].setdefault(zone, {})[str(instance["name"])] = instance

    def add_zone(self, project: str, zone: str) -> None:
        with self.lock:
            self.projects[project].setdefault(zone, {})

    def load_gcloud_json(self, path: str | Path) -> int:
        """Seed from a ``gcloud compute instances list --format=json`` export."""
        instances = json.loads(Path(path).read_text())
        for instance in instances:
            self.add(instance)
        return len(instances)

    def generate(
        self,
        projects: int,
        zones: int,
        per_project: int,
        now: float,
        orphaned: float = 0.02,
        heartbeat_label: str = "runner_manager_heartbeat",
        stale_age: float = 6 * 3600,
        seed: int = 7,
    ) -> list[tuple[str, str, str]]:
        """A synthetic fleet; returns the (project, zone, name) of the orphaned (stale) instances."""
        rnd = random.Random(seed)
        stale = []
        ids = itertools.count(5_000_000_000_000_000_000)
        for p in range(projects):
            project = f"ci-project-{p:03d}"
            zone_names = [f"us-east1-{chr(ord('b') + z)}" for z in range(zones)]
            for zone in zone_names:
                self.add_zone(project, zone)
            for i in range(per_project):
                zone = zone_names[i % zones]
                name = f"runner-{p:03d}-{i:06d}"
                orphan = rnd.random() < orphaned
                beat = now - (stale_age + rnd.randint(0, 3600) if orphan else rnd.randint(0, 600))
                labels = {"ci_ephemeral": "true", heartbeat_label: str(int(beat))}
                self.add(gcloud_instance(project, zone, name, next(ids), "RUNNING", labels, now - 86400))
                if orphan:
                    stale.append((project, zone, name))
        return stale

    def add_group(
        self,
        project: str,
        scope: str,
        name: str,
        group_id: int,
        members: list[dict[str, Any]],
        target_size: int | None = None,
    ) -> dict[str, Any]:
        """A managed instance group in ``scope`` (``zones/Z`` or ``regions/R``) holding ``members``.

        Each member is added as an instance carrying the ``created-by`` metadata a group stamps on
        the instances it creates (the group's URL). The group's ``currentActions`` count its members
        still present when it is listed (all ``none``: running, nothing scheduled).
        """
        url = f"{COMPUTE}/projects/{project}/{scope}/instanceGroupManagers/{name}"
        resource: dict[str, Any] = {
            "kind": "compute#instanceGroupManager",
            "id": str(group_id),
            "name": name,
            "baseInstanceName": name,
            "creationTimestamp": _timestamp(),
            scope.split("/")[0].removesuffix("s"): f"{COMPUTE}/projects/{project}/{scope}",
            "instanceTemplate": f"{COMPUTE}/projects/{project}/global/instanceTemplates/{name}",
            "instanceGroup": f"{COMPUTE}/projects/{project}/{scope}/instanceGroups/{name}",
            "selfLink": url,
            "status": {"isStable": True},
            "targetSize": len(members) if target_size is None else target_size,
        }
        placed = []
        for member in members:
            items = [{"key": "created-by", "value": url}]
            member["metadata"] = {**member.get("metadata", {}), "items": items}
            self.add(member)
            placed.append((str(member["zone"]).rstrip("/").split("/")[-1], str(member["name"])))
        with self.lock:
            self.projects.setdefault(project, {})  # an empty group's project exists too
            self.groups.setdefault(project, {}).setdefault(scope, {})[name] = (resource, placed)
        return resource

    def group(self, project: str, scope: str, name: str) -> dict[str, Any]:
        """A group resource as listed now (lock held): its members still present are its instances."""
        resource, members = self.groups[project][scope][name]
        present = sum(1 for zone, member in members if member in self.projects[project].get(zone, {}))
        actions = dict.fromkeys(_ACTIONS, 0)
        actions["none"] = present
        return json.loads(json.dumps({**resource, "currentActions": actions}))

    # --- projects: an id and a number each ------------------------------------------------------

    def number(self, project: str) -> str:
        """The project's number: set in ``numbers``, else 12 digits derived from its id (the same every run)."""
        derived = 10**11 + int(hashlib.sha1(project.encode()).hexdigest(), 16) % (9 * 10**11)
        return self.numbers.get(project) or str(derived)

    def project_id(self, name: str) -> str:
        """The project a request's ``projects/{project}`` segment names: its id, or the id whose number it is.

        The Compute API takes either in every path ("Project ID for this request", whose pattern in
        compute.v1.json admits ``[0-9]{1,19}``; Google's AIP-2510: APIs accept project ids and numbers)
        and names the project by its id in the URLs it answers (``selfLink``, ``zone``: the ids this
        emulator stores). A name that is neither stays as it was sent: its 404 quotes it unchanged.
        """
        if not (name.isascii() and name.isdigit()):
            return name
        with self.lock:
            return next((p for p in self.projects if self.number(p) == name), name)

    def project(self, project: str) -> dict[str, Any]:
        """``projects.get``: the Project resource as compute.v1.json's schema defines it (``quotas`` left empty).

        ``name`` is the project id. ``id`` is no project number ("This is *not* the project ID, and is
        just a unique ID used by Compute Engine"; answers recorded from real projects hold another
        number there): the number appears in ``defaultServiceAccount``, the Compute Engine default
        service account ``PROJECT_NUMBER-compute@developer.gserviceaccount.com``.
        """
        self.zones(project)  # 404 for an unknown project
        if project in self.faults.deny_project_get:
            raise ApiError(403, "forbidden", f"Required 'compute.projects.get' permission for 'projects/{project}'")
        number = self.number(project)
        return {
            "kind": "compute#project",
            "id": str(int(hashlib.sha1(f"compute/{project}".encode()).hexdigest()[:15], 16)),
            "creationTimestamp": "2024-01-01T00:00:00.000-08:00",
            "name": project,
            "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": fingerprint({})},
            "quotas": [],
            "selfLink": f"{COMPUTE}/projects/{project}",
            "defaultServiceAccount": f"{number}-compute@developer.gserviceaccount.com",
            "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
            "defaultNetworkTier": "PREMIUM",
            "vmDnsSetting": "ZONAL_ONLY",
        }

    # --- reads and mutations used by the HTTP layer ------------------------------------------

    def zones(self, project: str) -> dict[str, dict[str, dict[str, Any]]]:
        if project not in self.projects:
            raise ApiError(404, "notFound", f"The resource 'projects/{project}' was not found")
        return self.projects[project]

    def instance(self, project: str, zone: str, name: str) -> dict[str, Any]:
        """An instance by name, or by its numeric id: the API takes either in the ``instance`` path
        segment (pattern ``[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19}``; names start with a letter)."""
        instances = self.zones(project).get(zone, {})
        if name.isdigit():
            found = next((i for i in instances.values() if i["id"] == name), None)
        else:
            found = instances.get(name)
        if found is None:
            raise ApiError(
                404, "notFound", f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found"
            )
        return found

    def set_labels(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if project in self.faults.deny_set_labels:
                raise ApiError(403, "forbidden", f"Required 'compute.instances.setLabels' permission for '{name}'")
            instance = self.instance(project, zone, name)
            name = str(instance["name"])
            # labelFingerprint: "Provide the latest fingerprint value when making a request to add or change
            # labels" (InstancesSetLabelsRequest, compute.v1.json); a stale one is refused with this 412, as
            # recorded from the real API (skypilot-org/skypilot#4571, googleapis/google-cloud-go#7802).
            if body.get("labelFingerprint") != instance["labelFingerprint"]:
                message = "Labels fingerprint either invalid or resource labels have changed"
                raise ApiError(412, "conditionNotMet", message, more={"location": "If-Match", "locationType": "header"})
            labels = dict(body.get("labels") or {})
            refuse_invalid(labels, "labels")
            instance["labels"] = labels
            instance["labelFingerprint"] = fingerprint(labels)
            self.mutations.append((time.monotonic(), project, "setLabels"))
            return self._operation(project, zone, instance, "setLabels")

    def insert(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a RUNNING instance from the request's ``name`` and ``labels``, refused as the API refuses it
        when the name is taken (409) or the project's instance quota is used up (403 quotaExceeded)."""
        name = str(body.get("name") or "")
        with self.lock:
            held = sum(len(zone_instances) for zone_instances in self.projects.get(project, {}).values())
            limit = self.faults.instance_quota.get(project)
            if limit is not None and held >= limit:
                region = zone.rsplit("-", 1)[0]
                raise ApiError(
                    403, "quotaExceeded", f"Quota 'INSTANCES' exceeded. Limit: {limit}.0 in region {region}."
                )
            if name in self.projects[project].get(zone, {}):
                where = f"projects/{project}/zones/{zone}/instances/{name}"
                raise ApiError(409, "alreadyExists", f"The resource '{where}' already exists")
            instance_id = int(hashlib.sha1(f"{project}/{zone}/{name}/{time.time()}".encode()).hexdigest()[:15], 16)
            labels = {str(k): str(v) for k, v in dict(body.get("labels") or {}).items()}
            refuse_invalid(labels, "resource.labels")
            instance = gcloud_instance(project, zone, name, instance_id + 1, "RUNNING", labels, time.time())
            self.add(instance)
            self.mutations.append((time.monotonic(), project, "insert"))
            return self._operation(project, zone, instance, "insert")

    def delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        with self.lock:
            instance = self.instance(project, zone, name)
            if instance.get("deletionProtection"):
                raise ApiError(
                    400,
                    "resourceInUseByAnotherResource",
                    "Invalid resource usage: 'Resource cannot be deleted if it's protected against deletion.'",
                )
            instance["status"] = "STOPPING"
            self.mutations.append((time.monotonic(), project, "delete"))
            self.deleted_ids.append(str(instance["id"]))
            return self._operation(project, zone, instance, "delete")

    # --- operations ------------------------------------------------------------------------

    def _operation(self, project: str, zone: str, instance: dict[str, Any], kind: str) -> dict[str, Any]:
        """Start the operation of a mutation (lock held); the answer is the operation as created, PENDING."""
        op_name = f"operation-{next(self._op_ids)}-{kind}"
        zone_url = f"{COMPUTE}/projects/{project}/zones/{zone}"
        name = str(instance["name"])
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(abs(hash(op_name)) % 10**18),
            "name": op_name,
            "operationType": kind,
            "status": "PENDING",
            "progress": 0,
            "targetLink": f"{zone_url}/instances/{name}",
            "targetId": str(instance["id"]),
            "zone": zone_url,
            "selfLink": f"{zone_url}/operations/{op_name}",
            "insertTime": _timestamp(),
        }
        answer = dict(op)
        op.update(status="RUNNING", startTime=op["insertTime"])
        seconds = self.faults.instance_operation_seconds.get(name, self.faults.operation_seconds.get(kind, 0.0))
        operation = self.operations[op_name] = Operation(op, project, zone, name, time.monotonic() + seconds)
        heapq.heappush(self._due, (operation.done_at, op_name))
        self.settle()
        if self._due and self._settler is None:
            self._settler = threading.Thread(target=self._settle_until_idle, name="gce-operations", daemon=True)
            self._settler.start()
        self._tick.notify_all()
        return answer

    def settle(self) -> None:
        """Finish every operation whose time has come: called at every request, and by the settler thread."""
        with self.lock:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                self._finish(self.operations[heapq.heappop(self._due)[1]])

    def _settle_until_idle(self) -> None:
        """The settler thread: operations finish at their time whether anyone polls or not; it ends when none is due."""
        with self._tick:
            while self._due:
                self.settle()
                if self._due:
                    self._tick.wait(self._due[0][0] - time.monotonic())
            self._settler = None

    def poll_operation(self, project: str, zone: str, op_name: str, wait: bool) -> dict[str, Any]:
        """``zoneOperations.get``: the operation as it stands. ``wait``: the same once it is DONE or
        ``faults.operation_wait_cap`` seconds have passed, whichever comes first (the documented 2 minutes)."""
        give_up = time.monotonic() + self.faults.operation_wait_cap
        with self._tick:
            operation = self.operations.get(op_name)
            if operation is None or operation.project != project or operation.zone != zone:
                raise ApiError(
                    404,
                    "notFound",
                    f"The resource 'projects/{project}/zones/{zone}/operations/{op_name}' was not found",
                )
            self.settle()
            while wait and operation.op["status"] != "DONE":
                left = min(operation.done_at, give_up) - time.monotonic()
                if left <= 0:
                    break
                self._tick.wait(left)
                self.settle()
            return json.loads(json.dumps(operation.op))  # rendered after the lock is released

    def _finish(self, operation: Operation) -> None:
        """The operation is DONE (lock held): a delete takes effect, or fails as ``failing_operations`` says."""
        op, name = operation.op, operation.instance
        op.update(status="DONE", progress=100, endTime=_timestamp())
        instances = self.projects[operation.project].get(operation.zone, {})
        current = instances.get(name)
        # The instance the operation is about, not one recreated under its name since.
        target = current if current is not None and current["id"] == op["targetId"] else None
        if name in self.faults.failing_operations:
            op["error"] = {"errors": [{"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": f"{name} is in use"}]}
            if target is not None:
                target["status"] = "RUNNING"
            return
        if op["operationType"] == "delete" and target is not None:
            instances.pop(name)

    # --- for tests and benchmarks ------------------------------------------------------------

    def names(self, project: str | None = None) -> set[str]:
        with self.lock:
            self.settle()
            projects = [project] if project else list(self.projects)
            return {n for p in projects for zone in self.projects.get(p, {}).values() for n in zone}

    def quota_usage(self) -> list[Usage]:
        """What each caller spent of each project's rate quotas, and was refused, per window."""
        return self.quotas.usage()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {**super().stats(), "mutations": len(self.mutations), "quota_usage": self.quotas.stats()}


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())
