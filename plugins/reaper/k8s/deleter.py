"""Deleting orphaned runs' objects, a run at a time: Pod, then Secrets, then NetworkPolicy.

For each run, in this order (docs/design.md §6):

1. stop or deadline reached: the whole run is ``not_attempted``;
2. the cluster's rate-limit token, first: no wait sits between the re-reads and the delete;
3. every object of the run read again (same uid and resourceVersion) and its evidence (``revalidate``: the
   lease still absent, the run still terminal or gone); a run that changed in any of these is skipped whole;
4. its objects in order; before its first Secret or NetworkPolicy, whether any Pod of the run exists, and its
   remaining objects and its evidence read again;
5. per object: its token (after the first), then the guard (stop, deadline, sweep lease) and the durable intent;
6. the delete, with ``preconditions.uid`` and ``preconditions.resourceVersion`` (an object recreated,
   relabelled or opted out after the plan answers 409 and is skipped) and ``propagationPolicy: Background``;
7. the call marked sent. A Pod's delete is graceful: while the Pod is still terminating (grace period,
   finalizers) its containers may run, so it is recorded ``terminating`` and the run's Secrets and
   NetworkPolicy wait for a later sweep that finds it gone;
8. the run stops at its first object that is not gone: a Pod that could not be deleted keeps the Secrets it
   may mount.

The requests are :class:`reaper.k8s.api.ClusterApi`'s: reads are lists (``list`` and ``delete`` are all the
reaper's Role needs), answers metadata only. 404 means already gone (``deleted`` when this sweep's own
delete call went out first); 409 (a failed precondition) means changed under us; any other refusal is
``failed``.

Every call between the plan and the send, and every wait after it, stops when the run must stop
(docs/design.md §6): a re-read is started only while the guard allows it, and retried (429 after
its ``Retry-After``, 5xx after a backoff, bounded by ``k8s.max_retries``) only while the retry can
begin before the deadline. A run stopped there is left for the next sweep (``not_attempted``, or
``unconfirmed`` for a retried send), never ``failed`` or ``changed_since_plan``: nothing was read
as changed. Each request is bounded by ``k8s.request_timeout``, so a task ends at most one request
after its deadline, which is the margin the deadline leaves (``Settings.send_margin``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reaper.config import Settings
from reaper.fence import Halted, SendGuard
from reaper.k8s.api import ClusterApi, Conflict, Gone, ObjectMeta
from reaper.k8s.client import answer, retryable
from reaper.k8s.evidence import reread_timeout
from reaper.model import K8sObject, Outcome
from reaper.ratelimit import BucketsPerScope
from reaper.retry import Backoff, GaveUp
from reaper.vocabulary import GONE, Result

ORDER = {"Pod": 0, "Secret": 1, "NetworkPolicy": 2}
_POLL = (0.1, 1.0)  # seconds between reads of a terminating Pod: first, doubling up to the last

# Why a run's evidence no longer supports deleting it, or None (the lease and the run store read again).
Revalidate = Callable[[str, str], str | None]
T = TypeVar("T")


class Stopped(Exception):
    """The run must stop (deadline, SIGTERM) before a call it needs could start or be retried: what
    it has not sent is left for the next sweep (``guard.unsent``)."""


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
        self.revalidate_timeout = reread_timeout(config)

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
            try:
                # The token before the re-reads: no wait between them and the delete (none past the deadline).
                self.buckets.acquire(members[0].cluster, guard.stop_at)
                changed = self._changed(members, guard) or self._evidence_changed(members[0], guard)
            except (Stopped, GaveUp) as exc:
                stopped, changed = str(exc), None
            if changed:
                return [self._record(obj, guard, Result.CHANGED_SINCE_PLAN, changed) for obj in members]
        outcomes: list[Outcome] = []
        for i, obj in enumerate(members):
            if not stopped and obj.kind != "Pod" and (i == 0 or members[i - 1].kind == "Pod"):
                rest = members[i:]
                try:
                    changed = self._pods_of_run(rest, guard) or self._changed(rest, guard)
                    changed = changed or self._evidence_changed(obj, guard)
                except Stopped as exc:
                    stopped, changed = str(exc), None
                if changed:
                    return outcomes + [self._record(o, guard, Result.CHANGED_SINCE_PLAN, changed) for o in rest]
            if stopped:
                outcomes.append(self._record(obj, guard, guard.unsent(obj), stopped))
                continue
            outcome = self._delete_one(obj, guard, take_token=i > 0)
            outcomes.append(self._record(obj, guard, outcome.result, outcome.detail))
            if outcome.result not in GONE:
                stopped = f"after {obj.kind} {obj.namespace}/{obj.name}: {outcome.result}; the next sweep decides again"
        return outcomes

    def _start(self, guard: SendGuard, seconds: float) -> None:
        """Raise :class:`Stopped` unless a call that takes at most ``seconds``, started now, ends by
        the deadline plus one request timeout (what the send margin leaves for it)."""
        why = guard.stop_at(guard.clock() + seconds - self.timeout)
        if why:
            raise Stopped(why)

    def _guarded(self, guard: SendGuard, fn: Callable[[], T]) -> T:
        """One request between the plan and the send: started, and retried, only before the deadline."""
        self._start(guard, self.timeout)
        try:
            return self.backoff.call(fn, retryable, stop=guard.stop_at)
        except GaveUp as exc:
            raise Stopped(f"{exc.why} (no retry after {answer(exc.last)})") from exc

    def _evidence_changed(self, obj: K8sObject, guard: SendGuard) -> str | None:
        """The run's lease and state read again, only when the readers' own timeouts let it end in time
        (they retry nothing: ``reaper/k8s/evidence.py`` ``reread_timeout``)."""
        if not self.revalidate:
            return None
        self._start(guard, self.revalidate_timeout)
        return self.revalidate(obj.cluster, obj.labels.get(self.run_label, ""))

    def _pods_of_run(self, rest: list[K8sObject], guard: SendGuard) -> str | None:
        """Whether any Pod of the run exists, managed or not: its remaining Secrets and NetworkPolicies
        (``rest``) then stay.

        Cluster-wide, or in every namespace of ``k8s.namespaces`` and every one ``rest`` lives in (a Pod
        can only mount Secrets of its own namespace, which the plan's config may not have named).
        """
        api = self._api(rest[0].cluster)
        run = {self.run_label: rest[0].labels.get(self.run_label, "")}
        namespaces = sorted({*self.namespaces, *(o.namespace for o in rest)}) if self.namespaces else [None]
        try:
            for namespace in namespaces:
                pods = self._guarded(guard, partial(api.pods, run, namespace))
                if pods:
                    return f"a Pod of the run exists ({pods[0].uid}): its Secrets and NetworkPolicy stay"
        except Stopped:
            raise
        except Exception as exc:
            return f"the run's Pods unreadable before its Secrets: {answer(exc)}"
        return None

    def _changed(self, members: list[K8sObject], guard: SendGuard) -> str | None:
        """Whether any object of the run changed since the plan (recreated, relabelled or opted out).

        The preconditions catch a change to the object being deleted; this catches one to the
        run's other objects before its Pod goes: the decision is the run's, not the object's.
        """
        api = self._api(members[0].cluster)  # a run lives in one cluster
        # A listing without one is incomplete (reaper/decoders.py k8s_object): only a plan made otherwise lacks it.
        if unpinned := [o for o in members if not o.resource_version]:
            o = unpinned[0]
            return f"{o.kind} {o.namespace}/{o.name} planned without a resourceVersion: its state cannot be checked"
        for obj in members:
            try:
                meta = self._guarded(guard, partial(api.read, obj))
            except Stopped:
                raise
            except Exception as exc:
                return f"{obj.kind} {obj.namespace}/{obj.name} unreadable before the delete: {answer(exc)}"
            if meta is None:
                continue  # gone already: nothing to protect
            if meta.uid != obj.uid:
                return f"{obj.kind} {obj.namespace}/{obj.name} was recreated since the plan"
            if meta.resourceVersion != obj.resource_version:
                return f"{obj.kind} {obj.namespace}/{obj.name} changed since the plan (resourceVersion)"
        return None

    def _api(self, cluster: str) -> ClusterApi:
        return ClusterApi(self.api_for(cluster), self.timeout)

    def _record(self, obj: K8sObject, guard: SendGuard, result: str, detail: str) -> Outcome:
        guard.record(obj, result, detail)
        return Outcome(obj, result, detail)

    def _delete_one(self, obj: K8sObject, guard: SendGuard, take_token: bool) -> Outcome:
        """Token (after the run's first object), guard and intent, then the delete with its preconditions."""
        api = self._api(obj.cluster)
        if take_token:
            try:
                self.buckets.acquire(obj.cluster, guard.stop_at)
            except GaveUp as exc:
                return Outcome(obj, guard.unsent(obj), str(exc))
        why = guard.before_send(obj) or guard.ready(obj)  # the intent durable, then the lease: one commit cycle
        if why:
            return Outcome(obj, guard.unsent(obj), why)
        attempts = 0

        def send() -> ObjectMeta | None:
            nonlocal attempts
            if attempts:
                guard.retry(obj)
            attempts += 1
            return api.delete(obj)

        try:
            removed = self.backoff.call(send, retryable, stop=guard.stop_at)
        except Gone:
            if attempts > 1 or guard.sent_earlier(obj):
                return Outcome(obj, Result.DELETED, "404 after this sweep's delete call")
            return Outcome(obj, Result.ALREADY_GONE, "404 on delete")
        except Conflict:
            if obj.kind == "Pod" and self._terminating(api, obj, guard):
                return Outcome(obj, Result.STILL_TERMINATING, "409, and the Pod is already terminating")
            return Outcome(
                obj, Result.CHANGED_SINCE_PLAN, "409: a precondition failed (recreated, relabelled or opted out)"
            )
        except ApiException as exc:
            return Outcome(obj, Result.FAILED, answer(exc))
        except Halted as exc:
            return Outcome(obj, Result.UNCONFIRMED, f"the delete call's answer was lost and no retry was sent: {exc}")
        except GaveUp as exc:
            guard.sent(obj)  # as a retry would have marked it: a later try's 404 is this call's doing
            why = f"{exc.why} (no retry after {answer(exc.last)})"
            return Outcome(obj, Result.UNCONFIRMED, f"the delete call was not confirmed and may not be retried: {why}")
        except Exception as exc:
            return Outcome(obj, Result.FAILED, f"{type(exc).__name__}: {exc}")
        guard.sent(obj)
        if obj.kind == "Pod" and self._still_terminating(api, obj, removed, guard):
            return Outcome(obj, Result.STILL_TERMINATING, "the Pod is terminating; its Secrets and NetworkPolicy wait")
        return Outcome(obj, Result.DELETED)

    def _terminating(self, api: ClusterApi, obj: K8sObject, guard: SendGuard) -> bool:
        """Whether the planned Pod (same uid) still exists with a deletionTimestamp; in doubt (a failed
        read, or none started because the run must stop), it is: the run's Secrets and NetworkPolicy
        then wait for a later sweep."""
        if guard.stop_at(guard.clock()):
            return True
        try:
            meta = api.read(obj)
        except Exception:
            return True
        return meta is not None and meta.uid == obj.uid and meta.deletionTimestamp is not None

    def _still_terminating(self, api: ClusterApi, obj: K8sObject, removed: ObjectMeta | None, guard: SendGuard) -> bool:
        """After a graceful delete: wait (bounded) for the Pod to go; True while it is still there.

        Any doubt (an undecodable answer, a failed read) counts as still terminating: the run's
        Secrets and NetworkPolicy then wait for the next sweep, which is the safe side.
        """
        if removed is None:
            return True
        if removed.deletionTimestamp is None:
            return False  # deleted at once: the answer is the object as it was removed
        try:
            give_up = time.monotonic() + self.pod_gone_timeout
            pause = _POLL[0]
            while True:
                if not self._terminating(api, obj, guard):
                    return False
                if time.monotonic() >= give_up or guard.stop_at(guard.clock() + pause):
                    return True
                time.sleep(pause)
                pause = min(pause * 2, _POLL[1])
        except Exception:
            return True
