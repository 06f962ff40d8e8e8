"""Deleting orphaned runs' objects, a run at a time: Pod, then Secrets, then NetworkPolicy.

Every delete carries ``preconditions.uid`` (an object recreated under the same
name for a new run is never deleted) and ``propagationPolicy: Background``. 404
means already gone; 409 means the object changed under us: skip it and the rest
of its run. A run whose Pod could not be deleted keeps its Secrets and
NetworkPolicy (the Pod may still mount them); the next sweep finishes a
partially deleted run. 429 and 5xx are retried with backoff, bounded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reaper.config import Settings
from reaper.k8s.client import PATHS, call, transient
from reaper.model import K8sObject
from reaper.ratelimit import BucketsPerScope
from reaper.retry import Backoff

DELETED, ALREADY_GONE, CHANGED, FAILED, NOT_ATTEMPTED = (
    "deleted",
    "already_gone",
    "changed_since_plan",
    "failed",
    "not_attempted",
)
ORDER = {"Pod": 0, "Secret": 1, "NetworkPolicy": 2}


@dataclass(frozen=True)
class Outcome:
    cluster: str
    kind: str
    namespace: str
    name: str
    uid: str
    result: str
    detail: str = ""


class K8sDeleter:
    def __init__(
        self, api_for: Callable[[str], k8s.ApiClient], config: Settings, backoff: Backoff | None = None
    ) -> None:
        cfg = config.k8s
        self.api_for = api_for
        self.run_label = cfg.run_label
        self.concurrency = cfg.delete_concurrency
        self.timeout = cfg.request_timeout.total_seconds()
        self.backoff = backoff or Backoff(cfg.max_retries)
        self.buckets = BucketsPerScope(cfg.delete_rate_per_cluster)

    def delete(self, planned: Sequence[K8sObject]) -> list[Outcome]:
        """Delete the planned objects run by run; one outcome per object, in the order given."""
        runs: dict[tuple[str, str], list[K8sObject]] = defaultdict(list)
        for obj in planned:
            runs[(obj.cluster, obj.labels.get(self.run_label, ""))].append(obj)
        groups = [sorted(members, key=lambda o: ORDER.get(o.kind, 9)) for members in runs.values()]
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="k8s-delete") as pool:
            done = {(o.cluster, o.uid): o for outcomes in pool.map(self._delete_run, groups) for o in outcomes}
        return [done[(obj.cluster, obj.uid)] for obj in planned]

    def _delete_run(self, members: list[K8sObject]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        stopped = ""
        for obj in members:
            if stopped:
                outcomes.append(self._outcome(obj, NOT_ATTEMPTED, f"after {stopped}; the next sweep retries"))
                continue
            outcome = self._delete_one(obj)
            outcomes.append(outcome)
            if outcome.result in (CHANGED, FAILED):
                stopped = f"{obj.kind} {obj.namespace}/{obj.name}: {outcome.result}"
        return outcomes

    def _outcome(self, obj: K8sObject, result: str, detail: str = "") -> Outcome:
        return Outcome(obj.cluster, obj.kind, obj.namespace, obj.name, obj.uid, result, detail)

    def _delete_one(self, obj: K8sObject) -> Outcome:
        prefix, resource = PATHS[obj.kind]
        path = f"{prefix}/namespaces/{obj.namespace}/{resource}/{obj.name}"
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": obj.uid},
            "propagationPolicy": "Background",
        }
        api = self.api_for(obj.cluster)
        self.buckets.acquire(obj.cluster)
        try:
            self.backoff.call(lambda: call(api, "DELETE", path, self.timeout, body=body), transient)
        except ApiException as exc:
            if exc.status == 404:
                return self._outcome(obj, ALREADY_GONE, "404 on delete")
            if exc.status == 409:
                return self._outcome(obj, CHANGED, "409: uid precondition failed (recreated or changed)")
            return self._outcome(obj, FAILED, f"HTTP {exc.status} {exc.reason}")
        except Exception as exc:
            return self._outcome(obj, FAILED, f"{type(exc).__name__}: {exc}")
        return self._outcome(obj, DELETED)
