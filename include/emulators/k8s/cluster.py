"""The emulated cluster state: Pods, Secrets and NetworkPolicies as the API stores them.

Every object gets a ``uid``, a ``resourceVersion`` and a ``creationTimestamp``.
Deleting an object deletes its dependents (``ownerReferences``) in the
background unless the propagation policy is ``Orphan``, as the garbage collector
does. Deleting a Pod is graceful, as on a real API server: the answer is the Pod
with ``metadata.deletionTimestamp`` set, and the object stays (terminating) until
the kubelet has stopped its containers (``K8sFaults.pod_shutdown`` seconds, at most
its grace period) and no finalizer is left. The cluster remembers whether a
Secret's ``data`` was ever served, so tests can prove the reaper never asked for it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from include.emulators.http import ApiError, Faults, State
from include.emulators.k8s.rbac import Subject, subject

# resource -> (kind, apiVersion)
RESOURCES = {
    "pods": ("Pod", "v1"),
    "secrets": ("Secret", "v1"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1"),
}
RESOURCE_OF_KIND = {kind: resource for resource, (kind, _) in RESOURCES.items()}


@dataclass
class K8sFaults(Faults):
    """The shared faults plus: answer 410 Gone to this many requests that carry a continue token;
    answer this many list pages with the continue token of the request again (a looping server);
    how long a deleted Pod's containers take to stop (capped by its grace period).

    An injected 429 carries ``Retry-After: 1``, as the API server sends it when API Priority and
    Fairness (or the max-in-flight limit) rejects a request (Kubernetes docs, "API Priority and
    Fairness"; kube-apiserver ``staging/src/k8s.io/apiserver/pkg/server/filters/maxinflight.go``
    ``tooManyRequests``, which both filters call).
    """

    retry_after: str | None = "1"
    expire_continue_tokens: int = 0
    repeat_continue_tokens: int = 0
    cascade_delay: float = 0.0
    pod_shutdown: float = 0.2


class Cluster(State):
    def __init__(self) -> None:
        super().__init__()
        self.faults: K8sFaults = K8sFaults()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, namespace, name)
        self.secret_data_served = False
        self.deletes: list[tuple[float, str, str, str]] = []  # (time, resource, namespace, name)
        self._versions = itertools.count(1000)
        # Indexes, so a list page and a delete cost what they would on a real API server, not a scan:
        self._sorted: dict[str, list[tuple[str, str, str]]] = {}  # resource -> keys in list order (lazy)
        self._dependents: dict[str, set[tuple[str, str, str]]] = {}  # owner uid -> dependent keys
        self._stopped: set[tuple[str, str, str]] = set()  # terminating Pods whose containers have stopped
        self.subjects: dict[str, Subject] = {}  # bearer token -> what it may do (RBAC); other tokens: anything

    def _version(self) -> str:
        return str(next(self._versions))

    # --- API operations ----------------------------------------------------------------------

    def create(self, resource: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        kind, api_version = RESOURCES[resource]
        meta = dict(obj.get("metadata") or {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        with self.lock:
            key = (resource, namespace, str(name))
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists')
            meta.update(namespace=namespace, uid=meta.get("uid") or str(uuid.uuid4()), resourceVersion=self._version())
            meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            stored = {**obj, "kind": kind, "apiVersion": api_version, "metadata": meta}
            self.objects[key] = stored
            self._sorted.pop(resource, None)
            for ref in meta.get("ownerReferences") or []:
                self._dependents.setdefault(str(ref.get("uid")), set()).add(key)
            return stored

    def adopt(self, key: tuple[str, str, str], owner_uid: str) -> None:
        """Add an owner reference to a stored object (tests build cascades with it)."""
        with self.lock:
            meta = self.objects[key]["metadata"]
            meta.setdefault("ownerReferences", []).append({"uid": owner_uid})
            self._dependents.setdefault(owner_uid, set()).add(key)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            found = self.objects.get((resource, namespace, name))
            if found is None:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            return found

    def delete(self, resource: str, namespace: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """Delete as the API server does; the answer is the object as deleted (or now terminating)."""
        with self.lock:
            obj = self.get(resource, namespace, name)
            meta: dict[str, Any] = obj["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {resource} {name!r}: Precondition failed: "
                    f"UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise ApiError(409, "Conflict", f"Precondition failed: resourceVersion of {resource} {name!r}")
            self.deletes.append((time.monotonic(), resource, namespace, name))
            if resource == "pods" or meta.get("finalizers"):
                return self._begin_graceful_delete((resource, namespace, name), obj)
            self._remove((resource, namespace, name))
        if options.get("propagationPolicy") != "Orphan":
            self._cascade(self._dependents.pop(str(meta["uid"]), set()))
        return obj

    def _begin_graceful_delete(self, key: tuple[str, str, str], obj: dict[str, Any]) -> dict[str, Any]:
        """Mark the object terminating; the kubelet (a timer here) and the finalizers remove it later."""
        meta: dict[str, Any] = obj["metadata"]
        if "deletionTimestamp" not in meta:
            grace = float((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            meta["deletionTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = int(grace)
            meta["resourceVersion"] = self._version()
            if key[0] == "pods":
                stop_after = min(grace, self.faults.pod_shutdown)
                timer = threading.Timer(stop_after, self._containers_stopped, [key, str(meta["uid"])])
                timer.daemon = True
                timer.start()
            else:
                self._containers_stopped(key, str(meta["uid"]))
        return obj

    def _containers_stopped(self, key: tuple[str, str, str], uid: str) -> None:
        """The kubelet has stopped the Pod: it goes once no finalizer holds it."""
        with self.lock:
            obj = self.objects.get(key)
            if obj is None or obj["metadata"]["uid"] != uid:
                return  # gone already, or recreated under the same name: another object
            meta: dict[str, Any] = obj["metadata"]
            self._stopped.add(key)
            if meta.get("finalizers"):
                return
            self._remove(key)
            dependents = self._dependents.pop(str(meta["uid"]), set())
        self._cascade(dependents)

    def remove_finalizers(self, key: tuple[str, str, str]) -> None:
        """What the controller owning a finalizer does when it is done (tests call it)."""
        with self.lock:
            meta: dict[str, Any] = self.objects[key]["metadata"]
            meta["finalizers"] = []
            meta["resourceVersion"] = self._version()
            done = "deletionTimestamp" in meta and (key[0] != "pods" or key in self._stopped)
        if done:
            self._containers_stopped(key, str(meta["uid"]))

    def _remove(self, key: tuple[str, str, str]) -> None:
        del self.objects[key]
        self._stopped.discard(key)
        self._sorted.pop(key[0], None)

    def _cascade(self, dependents: set[tuple[str, str, str]]) -> None:
        """The garbage collector: dependents of a deleted owner go too, in the background."""
        if not dependents:
            return

        def collect() -> None:
            for resource, namespace, name in sorted(dependents):
                with contextlib.suppress(ApiError):  # already gone
                    self.delete(resource, namespace, name, {"propagationPolicy": "Background"})

        timer = threading.Timer(self.faults.cascade_delay, collect)
        timer.daemon = True
        timer.start()

    def select(
        self,
        resource: str,
        namespace: str | None,
        matches: Callable[[dict[str, Any]], bool],
        after: tuple[str, str] | None,
        limit: int,
    ) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
        """One page in list order (namespace, name) after ``after``: (objects, key to continue after or None)."""
        with self.lock:
            keys = self._sorted.get(resource)
            if keys is None:
                keys = self._sorted[resource] = sorted(k for k in self.objects if k[0] == resource)
            start = bisect_right(keys, (resource, *after)) if after else 0
            page: list[dict[str, Any]] = []
            for key in itertools.islice(keys, start, None):
                if namespace is not None and key[1] != namespace:
                    continue
                obj = self.objects[key]
                if not matches(obj):
                    continue
                if limit and len(page) == limit:
                    last = page[-1]["metadata"]
                    return page, (last["namespace"], last["name"])
                page.append(obj)
            return page, None

    # --- for tests ---------------------------------------------------------------------------

    def grant(self, token: str, documents: list[dict]) -> None:
        """Requests bearing ``token`` may do what these RBAC manifests grant their ServiceAccount, nothing more."""
        with self.lock:
            self.subjects[token] = subject(documents)

    def reset(self) -> None:
        """An empty cluster again, for tests that reuse one server across many examples."""
        with self.lock:
            self.objects.clear()
            self._sorted.clear()
            self._dependents.clear()
            self._stopped.clear()
            self.deletes.clear()
            self.subjects.clear()
        self.clear_hooks()

    def names(self, resource: str | None = None) -> set[str]:
        with self.lock:
            return {name for (res, _, name) in self.objects if resource is None or res == resource}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {**super().stats(), "deletes": len(self.deletes), "secret_data_served": self.secret_data_served}
