"""HTTP server speaking the Kubernetes API subset the reaper uses: Pods, Secrets, NetworkPolicies.

``/api/v1/{pods,secrets}`` and ``/apis/networking.k8s.io/v1/networkpolicies``, all
namespaces or one: list (``labelSelector`` with equality- and set-based terms,
``fieldSelector`` on ``metadata.name`` and ``metadata.namespace``, ``limit``/``continue``,
``PartialObjectMetadataList`` when the ``Accept`` header asks for it), get, create, delete
(``preconditions``: 409 on mismatch; ``propagationPolicy``). Errors are ``Status`` objects, as the
API returns them. A namespace's list selected by one name is its own request kind, ``list_named``
(how the reaper reads an object again without ``get``), so hooks and counters can tell it apart;
tokens granted RBAC (``Cluster.grant``) get 403 for anything their roles do not allow.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from include.emulators.http import ApiError, Handler, Route, Server
from include.emulators.k8s.cluster import RESOURCES, Cluster

_PREFIX = r"^/(?:api/v1|apis/networking\.k8s\.io/v1)"
_ROUTES: list[Route] = [
    ("GET", re.compile(_PREFIX + r"/(pods|secrets|networkpolicies)$"), "list"),
    ("GET", re.compile(_PREFIX + r"/namespaces/([^/]+)/(pods|secrets|networkpolicies)$"), "list_namespaced"),
    ("POST", re.compile(_PREFIX + r"/namespaces/([^/]+)/(pods|secrets|networkpolicies)$"), "create"),
    ("GET", re.compile(_PREFIX + r"/namespaces/([^/]+)/(pods|secrets|networkpolicies)/([^/]+)$"), "get"),
    ("DELETE", re.compile(_PREFIX + r"/namespaces/([^/]+)/(pods|secrets|networkpolicies)/([^/]+)$"), "delete"),
]
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
}
_METADATA_ONLY = "as=PartialObjectMetadata"  # ...List for lists
_FIELDS = ("metadata.name", "metadata.namespace")  # the field selectors every resource supports
_VERBS = {"list": "list", "list_namespaced": "list", "list_named": "list", "get": "get", "create": "create"}


def _equals(key: str, value: str, want: bool) -> Callable[[Mapping[str, object]], bool]:
    """``key`` holds ``value`` (``want`` False: it does not)."""
    return lambda fields: (fields.get(key) == value) == want


def _within(key: str, values: set[str], want: bool) -> Callable[[Mapping[str, object]], bool]:
    """``key`` holds one of ``values`` (``want`` False: it does not, or is absent)."""
    return lambda fields: (fields.get(key) in values) == want


def _present(key: str, want: bool) -> Callable[[Mapping[str, object]], bool]:
    return lambda fields: (key in fields) == want


def parse_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """A label selector (``a=b,c!=d,e in (x,y),f notin (z),g,!h``) as a predicate over labels."""
    terms = [t.strip() for t in re.split(r",(?![^()]*\))", text) if t.strip()]
    tests: list[Callable[[Mapping[str, object]], bool]] = []
    for term in terms:
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            values = {v.strip() for v in m.group(3).split(",")}
            tests.append(_within(m.group(1), values, m.group(2) == "in"))
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", term):
            key, op, value = m.groups()
            tests.append(_equals(key, value, op != "!="))
        elif m := re.fullmatch(r"(!?)([\w./-]+)", term):
            tests.append(_present(m.group(2), m.group(1) != "!"))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return lambda labels: all(test(labels) for test in tests)


def parse_field_selector(text: str) -> tuple[Callable[[dict[str, Any]], bool], str | None]:
    """A field selector as a predicate over an object's metadata, and the one name it requires, if any.

    Only ``metadata.name`` and ``metadata.namespace`` with ``=``, ``==`` or ``!=``, as the API
    server supports for every resource; any other field is a 400, as there.
    """
    tests: list[Callable[[Mapping[str, object]], bool]] = []
    name = None
    for term in (t.strip() for t in text.split(",") if t.strip()):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m or m.group(1) not in _FIELDS:
            raise ApiError(400, "BadRequest", f'"{term}" is not a known field selector: only {", ".join(_FIELDS)}')
        field, op, value = m.group(1).split(".")[1], m.group(2), m.group(3)
        tests.append(_equals(field, value, op != "!="))
        if op != "!=" and field == "name":
            name = value
    return (lambda meta: all(test(meta) for test in tests)), name


def _continue_token(after: tuple[str, str], version: str) -> str:
    """Like the API server's: the key to resume after, and the list's resource version."""
    return base64.urlsafe_b64encode(json.dumps({"after": after, "rv": version}).encode()).decode()


def _metadata_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


class K8sHandler(Handler):
    routes = _ROUTES
    state: Cluster

    def error_body(self, error: ApiError) -> object:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": error.message,
            "reason": _REASONS.get(error.code, error.reason),
            "code": error.code,
        }

    def _route(self, method: str, path: str) -> tuple[str, tuple[str, ...]]:
        kind, args = super()._route(method, path)
        if kind == "list_namespaced":
            query = parse_qs(urlsplit(self.path).query)
            _, name = parse_field_selector(query.get("fieldSelector", [""])[0])
            if name is not None:
                return "list_named", (*args, name)
        return kind, args

    def handle_api(self, kind: str, args: tuple[str, ...], query: dict[str, list[str]]) -> object:
        cluster = self.state
        self._authorize(kind, args)
        if kind == "list":
            return self._list(args[0], None, query)
        if kind in ("list_namespaced", "list_named"):
            return self._list(args[1], args[0], query)
        namespace, resource = args[0], args[1]
        if kind == "create":
            return cluster.create(resource, namespace, self.body())
        if kind == "get":
            return self._serve_objects(resource, [cluster.get(resource, namespace, args[2])])[0]
        return self._serve_objects(resource, [cluster.delete(resource, namespace, args[2], self.body())])[0]

    def _authorize(self, kind: str, args: tuple[str, ...]) -> None:
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        granted = self.state.subjects.get(token)
        if granted is not None:
            namespace, resource = (None, args[0]) if kind == "list" else (args[0], args[1])
            granted.authorize(_VERBS.get(kind, kind), resource, namespace)

    def _serve_objects(self, resource: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if _METADATA_ONLY in (self.headers.get("Accept") or ""):
            return [_metadata_only(o) for o in objects]
        if resource == "secrets" and any("data" in o or "stringData" in o for o in objects):
            with self.state.lock:
                self.state.secret_data_served = True
        return objects

    def _list(self, resource: str, namespace: str | None, query: dict[str, list[str]]) -> object:
        cluster = self.state
        labels = parse_selector(query.get("labelSelector", [""])[0])
        fields, name = parse_field_selector(query.get("fieldSelector", [""])[0])

        def matches(obj: dict[str, Any]) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and fields(obj["metadata"])

        limit = int(query.get("limit", ["0"])[0] or 0)
        token = query.get("continue", [""])[0]
        after = None
        if token:
            with cluster.lock:
                if cluster.faults.expire_continue_tokens > 0:
                    cluster.faults.expire_continue_tokens -= 1
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. "
                        "You can start a new list without the continue parameter.",
                    )
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token.encode()))["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid") from None
        if namespace is not None and name is not None:  # at most one object: looked up, as an index would
            with cluster.lock:
                found = cluster.objects.get((resource, namespace, name))
            page, resume = ([found] if found is not None and matches(found) else []), None
        else:
            page, resume = cluster.select(resource, namespace, matches, after, limit)
        with cluster.lock:
            if token and resume and cluster.faults.repeat_continue_tokens > 0:
                cluster.faults.repeat_continue_tokens -= 1
                resume = after  # a server that hands back the token it was given: the list never ends
        version = str(next(cluster._versions))
        kind, api_version = RESOURCES[resource]
        metadata_only = _METADATA_ONLY in (self.headers.get("Accept") or "")
        body: dict[str, Any] = {
            "kind": "PartialObjectMetadataList" if metadata_only else f"{kind}List",
            "apiVersion": "meta.k8s.io/v1" if metadata_only else api_version,
            "metadata": {"resourceVersion": version},
            # A metadata-only list that matches nothing is "items": null, as the API server answers it (its
            # PartialObjectMetadataList is built by appending to a nil slice: kubernetes-client/python#2142).
            "items": self._serve_objects(resource, page) or (None if metadata_only else []),
        }
        if resume:
            body["metadata"]["continue"] = token if resume == after else _continue_token(resume, version)
        return body


class K8sEmulator(Server):
    """A running Kubernetes API emulator; ``kubeconfig()`` points a client at it."""

    def __init__(self, cluster: Cluster | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(K8sHandler, cluster or Cluster(), host, port)
        self.cluster: Cluster = self.state  # type: ignore[assignment]  # this server's state is always its own emulator's

    def kubeconfig(self, name: str = "emulator") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.endpoint}}],
            "users": [{"name": name, "user": {"token": "emulator"}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }
