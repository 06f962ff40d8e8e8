"""Deleting orphaned runs' objects, a run at a time: Pod, then Secrets, then NetworkPolicy.

Before a run's first delete, after its rate-limit token, its objects are read again (same uid and
resourceVersion; each through a list of its namespace selected by name, so that the reaper needs
``list`` and ``delete`` only, no ``get``) and so is its evidence (``revalidate``: the lease still absent, the run still
terminal or gone); a run that changed in any of these is skipped whole. Every delete carries
``preconditions.uid`` and ``preconditions.resourceVersion``, so an object recreated, relabelled or
opted out after the plan answers 409 and is skipped, and ``propagationPolicy: Background``; answers
are asked for as metadata only (a Secret's delete would otherwise echo its data). A Pod's delete is
graceful: while the Pod is still terminating (grace period, finalizers) its containers may run, so it
is recorded ``terminating`` and the run's Secrets and NetworkPolicy wait for a later sweep that finds it
gone. 404 means already gone (``deleted`` when this sweep's own delete call went out first); 409 (a
failed precondition) means changed under us; any other refusal is ``failed``. A run stops at its first
object that is not gone: a Pod that could not be deleted keeps the Secrets it may mount. 429 and 5xx
are retried with backoff, bounded, each retry guarded.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reaper.config import Settings
from reaper.fence import UNCONFIRMED, Halted, SendGuard
from reaper.k8s.client import METADATA_ONLY as METADATA_LIST
from reaper.k8s.client import PATHS, call, collection_paths, transient
from reaper.model import K8sObject, Outcome
from reaper.ratelimit import BucketsPerScope
from reaper.retry import Backoff

DELETED, ALREADY_GONE, CHANGED, FAILED, TERMINATING = (
    "deleted",
    "already_gone",
    "changed_since_plan",
    "failed",
    "terminating",
)
GONE = (DELETED, ALREADY_GONE)
ORDER = {"Pod": 0, "Secret": 1, "NetworkPolicy": 2}
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_POLL = (0.1, 1.0)  # seconds between reads of a terminating Pod: first, doubling up to the last

# Why a run's evidence no longer supports deleting it, or None (the lease and the run store read again).
Revalidate = Callable[[str, str], str | None]


class _Meta(msgspec.Struct):
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""
    deletionTimestamp: str | None = None


class _Answer(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _List(msgspec.Struct):
    items: list[_Answer] = []


_ANSWER = msgspec.json.Decoder(_Answer)
_LIST = msgspec.json.Decoder(_List)


def run_key(obj: K8sObject, run_label: str) -> tuple[str, str]:
    """The (cluster, run) an object belongs to: the unit deletes are grouped, ordered and stopped by."""
    return obj.cluster, obj.labels.get(run_label, "")


class K8sDeleter:
    def __init__(
        self,
        api_for: Callable[[str], k8s.ApiClient],
        config: Settings,
        backoff: Backoff | None = None,
        revalidate: Revalidate | None = None,
    ) -> None:
        cfg = config.k8s
        self.api_for = api_for
        self.run_label = cfg.run_label
        self.namespaces = cfg.namespaces
        self.concurrency = cfg.delete_concurrency
        self.timeout = cfg.request_timeout.total_seconds()
        self.pod_gone_timeout = cfg.pod_gone_timeout.total_seconds()
        self.backoff = backoff or Backoff(cfg.max_retries)
        self.buckets = BucketsPerScope(cfg.delete_rate_per_cluster)
        self.revalidate = revalidate

    def delete(self, planned: Sequence[K8sObject], guard: SendGuard | None = None) -> list[Outcome]:
        """Delete the planned objects run by run; one outcome per object, in the order given."""
        guard = guard or SendGuard()
        runs: dict[tuple[str, str], list[K8sObject]] = defaultdict(list)
        for obj in planned:
            runs[run_key(obj, self.run_label)].append(obj)
        groups = [sorted(members, key=lambda o: ORDER.get(o.kind, 9)) for members in runs.values()]
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="k8s-delete") as pool:
            results = pool.map(lambda group: self._delete_run(group, guard), groups)
            done = {(o.resource.scope, o.uid): o for outcomes in results for o in outcomes}
        return [done[(obj.cluster, obj.uid)] for obj in planned]

    def _delete_run(self, members: list[K8sObject], guard: SendGuard) -> list[Outcome]:
        """One run: its first token, then everything read again, then its objects in order, stopping early.

        Before its first Secret or NetworkPolicy goes (after its Pods are gone, or when no Pod was
        planned: the Pod went in an earlier sweep or try), the run is read again: whether any Pod of
        the run exists (a retried step reusing the run's Secrets, a Pod that lost the managed label),
        its remaining objects, and its evidence. The wait for a Pod to go can take its whole shutdown.
        """
        stopped = guard.check(lease=False)  # the lease is read before each send, after the token
        if not stopped:
            self.buckets.acquire(members[0].cluster)  # before the re-reads: no wait between them and the delete
            changed = self._changed(members) or self._evidence_changed(members[0])
            if changed:
                return [self._record(obj, guard, CHANGED, changed) for obj in members]
        outcomes: list[Outcome] = []
        for i, obj in enumerate(members):
            if stopped:
                outcomes.append(self._record(obj, guard, guard.unsent(obj), stopped))
                continue
            if obj.kind != "Pod" and (i == 0 or members[i - 1].kind == "Pod"):
                rest = members[i:]
                changed = self._pods_of_run(rest) or self._changed(rest) or self._evidence_changed(obj)
                if changed:
                    return outcomes + [self._record(o, guard, CHANGED, changed) for o in rest]
            outcome = self._delete_one(obj, guard, take_token=i > 0)
            outcomes.append(self._record(obj, guard, outcome.result, outcome.detail))
            if outcome.result not in GONE:
                stopped = f"after {obj.kind} {obj.namespace}/{obj.name}: {outcome.result}; the next sweep decides again"
        return outcomes

    def _evidence_changed(self, obj: K8sObject) -> str | None:
        return self.revalidate(obj.cluster, obj.labels.get(self.run_label, "")) if self.revalidate else None

    def _pods_of_run(self, rest: list[K8sObject]) -> str | None:
        """Whether any Pod of the run exists, managed or not: its remaining Secrets and NetworkPolicies
        (``rest``) then stay.

        Cluster-wide, or in every namespace of ``k8s.namespaces`` and every one ``rest`` lives in (a Pod
        can only mount Secrets of its own namespace, which the plan's config may not have named).
        """
        obj = rest[0]
        api = self.api_for(obj.cluster)
        query: list[tuple[str, object]] = [("labelSelector", f"{self.run_label}={obj.labels.get(self.run_label, '')}")]
        namespaces = sorted({*self.namespaces, *(o.namespace for o in rest)}) if self.namespaces else []
        try:
            for path in collection_paths("Pod", namespaces):
                raw = self.backoff.call(
                    lambda p=path: call(api, "GET", p, self.timeout, query, accept=METADATA_LIST), transient
                )
                pods = _LIST.decode(raw).items
                if pods:
                    return f"a Pod of the run exists ({pods[0].metadata.uid}): its Secrets and NetworkPolicy stay"
        except Exception as exc:
            return f"the run's Pods unreadable before its Secrets: {type(exc).__name__}"
        return None

    def _changed(self, members: list[K8sObject]) -> str | None:
        """Whether any object of the run changed since the plan (recreated, relabelled or opted out).

        The preconditions catch a change to the object being deleted; this catches one to the
        run's other objects before its Pod goes: the decision is the run's, not the object's.
        """
        api = self.api_for(members[0].cluster)  # a run lives in one cluster
        for obj in members:
            try:
                meta = self.backoff.call(lambda o=obj: self._read(api, o), transient)
            except ApiException as exc:
                return f"{obj.kind} {obj.namespace}/{obj.name} unreadable before the delete: HTTP {exc.status}"
            except Exception as exc:
                return f"{obj.kind} {obj.namespace}/{obj.name} unreadable before the delete: {type(exc).__name__}"
            if meta is None:
                continue  # gone already: nothing to protect
            if meta.uid != obj.uid:
                return f"{obj.kind} {obj.namespace}/{obj.name} was recreated since the plan"
            if obj.resource_version and meta.resourceVersion != obj.resource_version:
                return f"{obj.kind} {obj.namespace}/{obj.name} changed since the plan (resourceVersion)"
        return None

    def _read(self, api: k8s.ApiClient, obj: K8sObject) -> _Meta | None:
        """The object's metadata as it is now, or None when it is gone.

        A list of its namespace selected by name, not a ``get``: the reaper's Role then needs no
        ``get`` on Secrets (only ``list`` and ``delete``). More than one answer, or one of another name
        (a server that ignored the selector), is not this object: it raises, and the caller reads that
        as unreadable (keep).
        """
        prefix, resource = PATHS[obj.kind]
        path = f"{prefix}/namespaces/{obj.namespace}/{resource}"
        query: list[tuple[str, object]] = [("fieldSelector", f"metadata.name={obj.name}")]
        items = _LIST.decode(call(api, "GET", path, self.timeout, query, accept=METADATA_LIST)).items
        if len(items) > 1 or any(item.metadata.name != obj.name for item in items):
            raise ValueError("the answer is not this one object: the field selector was not applied")
        return items[0].metadata if items else None

    def _record(self, obj: K8sObject, guard: SendGuard, result: str, detail: str) -> Outcome:
        guard.record(obj, result, detail)
        return Outcome(obj, result, detail)

    def _path(self, obj: K8sObject) -> str:
        prefix, resource = PATHS[obj.kind]
        return f"{prefix}/namespaces/{obj.namespace}/{resource}/{obj.name}"

    def _delete_one(self, obj: K8sObject, guard: SendGuard, take_token: bool) -> Outcome:
        api = self.api_for(obj.cluster)
        if take_token:
            self.buckets.acquire(obj.cluster)
        why = guard.before_send(obj)
        if why:
            return Outcome(obj, guard.unsent(obj), why)
        preconditions = {"uid": obj.uid}
        if obj.resource_version:
            preconditions["resourceVersion"] = obj.resource_version
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": preconditions,
            "propagationPolicy": "Background",
        }
        attempts = 0

        def send() -> bytes:
            nonlocal attempts
            if attempts:
                guard.retry(obj)
            attempts += 1
            return call(api, "DELETE", self._path(obj), self.timeout, body=body, accept=METADATA)

        try:
            answer = self.backoff.call(send, transient)
        except ApiException as exc:
            if exc.status == 404:
                if attempts > 1 or obj.uid in guard.sent_before:
                    return Outcome(obj, DELETED, "404 after this sweep's delete call")
                return Outcome(obj, ALREADY_GONE, "404 on delete")
            if exc.status == 409:  # what the API server answers a failed precondition
                if obj.kind == "Pod" and self._terminating(api, obj):
                    return Outcome(obj, TERMINATING, "409, and the Pod is already terminating")
                return Outcome(obj, CHANGED, "409: a precondition failed (recreated, relabelled or opted out)")
            return Outcome(obj, FAILED, f"HTTP {exc.status} {exc.reason}")
        except Halted as exc:
            return Outcome(obj, UNCONFIRMED, f"the delete call's answer was lost and no retry was sent: {exc}")
        except Exception as exc:
            return Outcome(obj, FAILED, f"{type(exc).__name__}: {exc}")
        guard.sent(obj)
        if obj.kind == "Pod" and self._still_terminating(api, obj, answer, guard):
            return Outcome(obj, TERMINATING, "the Pod is terminating; its Secrets and NetworkPolicy wait")
        return Outcome(obj, DELETED)

    def _terminating(self, api: k8s.ApiClient, obj: K8sObject) -> bool:
        """Whether the planned Pod (same uid) still exists with a deletionTimestamp; in doubt (a failed
        read), it is: the run's Secrets and NetworkPolicy then wait for a later sweep."""
        try:
            meta = self._read(api, obj)
        except Exception:
            return True
        return meta is not None and meta.uid == obj.uid and meta.deletionTimestamp is not None

    def _still_terminating(self, api: k8s.ApiClient, obj: K8sObject, answer: bytes, guard: SendGuard) -> bool:
        """After a graceful delete: wait (bounded) for the Pod to go; True while it is still there.

        Any doubt (an undecodable answer, a failed read) counts as still terminating: the run's
        Secrets and NetworkPolicy then wait for the next sweep, which is the safe side.
        """
        try:
            if _ANSWER.decode(answer).metadata.deletionTimestamp is None:
                return False  # deleted at once: the answer is the object as it was removed
            give_up = time.monotonic() + self.pod_gone_timeout
            pause = _POLL[0]
            while True:
                if not self._terminating(api, obj):
                    return False
                if time.monotonic() >= give_up or guard.check(lease=False):
                    return True
                time.sleep(pause)
                pause = min(pause * 2, _POLL[1])
        except Exception:
            return True
