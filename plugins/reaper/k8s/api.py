"""One cluster's API as the deleter calls it: an object read again, a run's Pods listed, a delete with preconditions.

Each method is one request (:func:`reaper.k8s.client.call`: one try, bounded by ``k8s.request_timeout``)
answered in the deleter's terms: metadata decoded, a delete's 404 raised as :class:`Gone` and its 409 as
:class:`Conflict`, any other failure raised as it came, for :func:`reaper.k8s.client.retryable` to classify.
Retries, and the guard's checks around every call, are the deleter's (docs/design.md §6).

Reads are lists, selected by name or by label, never a ``get``: the reaper's Role then needs ``list`` and
``delete`` only. Every answer is asked for as metadata only: a Secret's would otherwise carry its data.
"""

from __future__ import annotations

import msgspec
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from reaper.decoders import METADATA_LIST, ListMeta
from reaper.k8s.client import METADATA_ONLY, answer, call, collection_path, selector_string
from reaper.model import K8sObject

METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"  # one object's: a delete's answer


class Gone(Exception):
    """A delete answered 404: the object is not there."""


class Conflict(Exception):
    """A delete answered 409: its preconditions did not hold (Kubernetes API reference, "DeleteOptions":
    preconditions "must be fulfilled before a deletion is carried out. If not possible, a 409 Conflict status
    will be returned")."""


class ObjectMeta(msgspec.Struct):
    """What the deleter compares of an object: which one it is, which version, whether it is terminating."""

    name: str = ""
    uid: str = ""
    resourceVersion: str = ""
    deletionTimestamp: str | None = None


class _Answer(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class _List(msgspec.Struct):
    """A metadata-only list. ``items`` is required (an answer without it is no list: never read as "none there",
    which before a Secret's delete would say the run's Pod is gone); ``null`` is the API server's empty one
    (reaper.decoders.KubeList). Its kind and its metadata are read too (:meth:`ClusterApi._list`)."""

    items: list[_Answer] | None
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


_ANSWER = msgspec.json.Decoder(_Answer)
_LIST = msgspec.json.Decoder(_List)


class ClusterApi:
    """One cluster's ``ApiClient`` and the timeout each of its requests is bounded by."""

    def __init__(self, api: k8s.ApiClient, timeout: float) -> None:
        self.api, self.timeout = api, timeout

    def read(self, obj: K8sObject) -> ObjectMeta | None:
        """The object's metadata as it is now, or None when it is gone.

        More than one answer, or one of another name (a server that ignored the field selector), is not this
        object: ``ValueError``, which the deleter reads as unreadable (keep).
        """
        items = self._list(collection_path(obj.kind, obj.namespace), [("fieldSelector", f"metadata.name={obj.name}")])
        if len(items) > 1 or any(item.name != obj.name for item in items):
            raise ValueError("the answer is not this one object: the field selector was not applied")
        return items[0] if items else None

    def pods(self, labels: dict[str, str], namespace: str | None) -> list[ObjectMeta]:
        """The Pods carrying ``labels``, managed or not: cluster-wide (``namespace`` None), or in one namespace."""
        return self._list(collection_path("Pod", namespace), [("labelSelector", selector_string(labels))])

    def delete(self, obj: K8sObject) -> ObjectMeta | None:
        """Delete the object only while it is the planned one: its uid and resourceVersion (the deleter refuses a
        plan without one) are the preconditions; its dependents go in the background.

        The answer is the object as deleted, or as it is now terminating (a graceful delete); None when it
        cannot be decoded, so that the caller cannot take it for gone.
        """
        preconditions = {"uid": obj.uid, "resourceVersion": obj.resource_version}
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": preconditions,
            "propagationPolicy": "Background",
        }
        path = f"{collection_path(obj.kind, obj.namespace)}/{obj.name}"
        try:
            reply = call(self.api, "DELETE", path, self.timeout, body=body, accept=METADATA)
        except ApiException as exc:
            if exc.status == 404:
                raise Gone(answer(exc)) from exc
            if exc.status == 409:
                raise Conflict(answer(exc)) from exc
            raise
        # Whatever the answer is, the delete was accepted: an answer that does not decode (not JSON, no body,
        # invalid UTF-8, nesting past the decoder's depth) is None, never an error that would unmark the send.
        try:
            return _ANSWER.decode(reply).metadata
        except Exception:
            return None

    def _list(self, path: str, query: list[tuple[str, object]]) -> list[ObjectMeta]:
        """One list request, metadata only, asked without ``limit``: its items' metadata.

        Another kind of answer, or a page that says more follows (a continue token, items remaining: a proxy
        that pages by itself), is no answer (``ValueError``, unreadable: keep), never "none there" or "these".
        Review finding (helper-52): a first page of none with a continue token read as "no Pod of the run".
        """
        raw = call(self.api, "GET", path, self.timeout, query, accept=METADATA_ONLY)
        listing = _LIST.decode(raw)
        if listing.kind != METADATA_LIST:
            raise ValueError(f"a {listing.kind or 'list without a kind'} answered a metadata-only list")
        if listing.metadata.next or listing.metadata.remainingItemCount:
            raise ValueError("a page of a list (a continue token, items remaining) answered an unpaged list")
        return [item.metadata for item in listing.items or []]
