"""HTTP server speaking the subset of the Compute Engine v1 REST API that the reaper and the manager use.

Paths (under ``/compute/v1``): ``projects/P`` (get), ``projects/P/aggregated/instances`` (``maxResults``,
``pageToken``, ``filter`` of label equalities joined by AND, per-zone warnings),
``projects/P/zones/Z/instances`` (list, insert), ``.../instances/NAME`` (get, delete),
``.../instances/NAME/setLabels`` (with ``labelFingerprint``: 412 when stale),
``projects/P/zones/Z/operations/OP`` (get) and ``.../OP/wait``,
``projects/P/aggregated/instanceGroupManagers`` (``maxResults``, ``pageToken``). Plus
``/_emulator/stats`` (GET: counters, and ``quota_usage`` per window, project, group and caller) and
``/_emulator/faults`` (POST JSON: see :meth:`GceHandler._set_faults`) for tools. Partial responses
(``X-Goog-FieldMask`` header or ``fields`` parameter) are honored, as by the real API. Every
``projects/P`` segment takes the project's id or its number (:meth:`Fleet.project_id`).

Where the real API documents what the reaper relies on (``compute.v1.json``, the discovery document
in google-api-python-client's cache, unless said otherwise):

- paging: ``maxResults`` "Acceptable values are 0 to 500 ... (Default: 500)", and "If the number of
  available results is larger than maxResults, Compute Engine returns a nextPageToken" (every list method);
- partial responses: the ``fields`` system parameter, "Selector specifying which fields to include in a
  partial response" (its header form is ``X-Goog-FieldMask``: "System parameters",
  https://cloud.google.com/apis/docs/system-parameters);
- warnings: ``InstanceAggregatedList.items`` "An object that contains a list of instances scoped by zone",
  each ``InstancesScopedList.warning`` "[Output Only] Informational warning which replaces the list of
  instances when the list is empty", with the codes of its ``code`` enum (``NO_RESULTS_ON_PAGE``,
  ``UNREACHABLE``; ``PARTIAL_SUCCESS`` "Success is reported, but some results may be missing due to errors")
  and a ``scope`` data entry; ``unreachables``, "[Output Only] Unreachable resources." (the emulator lists
  none itself: tests rewrite pages to add them);
- filters: ``filter``'s description (label equalities, ``labels.KEY = VALUE``, parenthesised terms ANDed);
- the ``instance`` path segment takes a name or the numeric id (its pattern, ``[1-9][0-9]{0,19}`` for ids);
- ``setLabels``: ``InstancesSetLabelsRequest.labelFingerprint`` "Fingerprint of the previous set of labels
  for this resource, used to prevent conflicts. Provide the latest fingerprint value when making a
  request to add or change labels": a stale one is refused with 412 ``conditionNotMet``;
- operations and ``zoneOperations.wait``: :mod:`include.emulators.gce.fleet`;
- rate quotas, and their 403: :mod:`include.emulators.gce.quota`;
- error bodies: Google's JSON error format (API design guide, "Errors", https://cloud.google.com/apis/design/errors),
  with the v1 ``errors[]`` list of ``domain``/``reason``/``message`` that the Compute API still sends.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from include.emulators.gce import fieldmask
from include.emulators.gce.fleet import Fleet
from include.emulators.gce.quota import caller
from include.emulators.http import ApiError, Handler, Server

MAX_RESULTS = 500  # maxResults: "Acceptable values are 0 to 500" (compute.v1.json, every list method)
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)$"), "project_get"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instances$"), "aggregated_list"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/aggregated/instanceGroupManagers$"), "group_list"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances$"), "list"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances$"), "insert"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$"), "get"),
    ("DELETE", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)$"), "delete"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/setLabels$"), "set_labels"),
    ("GET", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)$"), "operation_get"),
    ("POST", re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)/wait$"), "operation_wait"),
    ("POST", re.compile(r"^/_emulator/faults$"), "emulator_faults"),
]
_TERM = re.compile(r'^\(?\s*labels\.([A-Za-z0-9_.\-/]+)\s*=\s*(?:"([^"]*)"|([^\s")]+))\s*\)?$')


def parse_filter(text: str) -> dict[str, str]:
    """``labels.a = "x" AND labels.b = y`` -> {a: x, b: y}; anything else is a 400, as the API would say.

    The subset of ``filter``'s documented syntax (compute.v1.json) that the reaper sends: label equalities,
    parenthesised or joined by ``AND`` ("By default, each expression is an AND expression").
    """
    if not text.strip():
        return {}
    wanted = {}
    for term in re.split(r"\s+AND\s+|\)\s+\(", text.strip()):
        match = _TERM.match(term.strip())
        if not match:
            raise ApiError(
                400, "invalid", f"Invalid value for field 'filter': '{text}'. Invalid list filter expression."
            )
        wanted[match.group(1)] = match.group(2) if match.group(2) is not None else match.group(3)
    return wanted


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _offset(token: str) -> int:
    try:
        return int(base64.urlsafe_b64decode(token.encode()).decode().split(":")[1])
    except (ValueError, IndexError):
        raise ApiError(400, "invalid", "Invalid value for field 'pageToken'") from None


def _page_args(query: dict[str, list[str]]) -> tuple[dict[str, str], int, int]:
    wanted = parse_filter(query.get("filter", [""])[0])
    size = min(int(query.get("maxResults", [str(MAX_RESULTS)])[0]), MAX_RESULTS)
    offset = _offset(query["pageToken"][0]) if query.get("pageToken", [""])[0] else 0
    return wanted, size, offset


def _matches(instance: dict[str, Any], wanted: dict[str, str]) -> bool:
    labels = instance.get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())


class GceHandler(Handler):
    routes = _ROUTES
    state: Fleet

    def _route(self, method: str, path: str) -> tuple[str, tuple[str, ...]]:
        """The route, its project segment read as the project's id: hooks, faults and handlers see the id."""
        kind, args = super()._route(method, path)
        if path.startswith("/compute/v1/projects/"):
            args = (self.state.project_id(args[0]), *args[1:])
        return kind, args

    def error_body(self, error: ApiError) -> object:
        body: dict[str, Any] = {
            "code": error.code,
            "message": error.message,
            "errors": [{"message": error.message, "domain": error.domain, "reason": error.reason, **error.more}],
        }
        if error.status:
            body["status"] = error.status
        return {"error": body}

    def admit(self, kind: str, args: tuple[str, ...]) -> None:
        """The project's rate quota for the request's group (every API path starts with its project)."""
        if args:
            self.state.quotas.admit(kind, args[0], caller(self.headers), self.state.number(args[0]))

    def render(self, kind: str, body: object, query: dict[str, list[str]]) -> bytes:
        """Partial responses: the ``X-Goog-FieldMask`` header or ``fields`` parameter, as the real API."""
        mask = self._mask(query)
        if mask:
            try:
                body = fieldmask.apply(body, fieldmask.parse(mask))
            except ValueError as exc:
                raise ApiError(400, "invalidParameter", str(exc)) from None
        return super().render(kind, body, query)

    def _mask(self, query: dict[str, list[str]]) -> str:
        return self.headers.get("X-Goog-FieldMask") or query.get("fields", [""])[0]

    def _served_instances(self, query: dict[str, list[str]]) -> fieldmask.Tree:
        """What of each listed instance the request's mask selects ({}: all of it, as for no or a bad mask)."""
        mask = self._mask(query)
        try:
            tree = fieldmask.parse(mask) if mask else {}
        except ValueError:
            return {}  # render answers 400
        return tree.get("items", {}).get("*", {}).get("instances", {}) if tree else {}

    def handle_api(self, kind: str, args: tuple[str, ...], query: dict[str, list[str]]) -> object:
        fleet = self.state
        fleet.settle()  # the operations due by now are DONE before anything is read
        if kind == "project_get":
            with fleet.lock:
                return fleet.project(args[0])
        if kind == "aggregated_list":
            return self._aggregated(args[0], query)
        if kind == "group_list":
            return self._groups(args[0], query)
        if kind == "emulator_faults":
            return self._set_faults(self.body())
        project, zone, *rest = args  # every other route is zonal (_ROUTES); `rest`: the instance or operation
        if kind == "list":
            return self._list(project, zone, query)
        if kind == "insert":
            return fleet.insert(project, zone, self.body())
        (name,) = rest
        if kind == "get":
            with fleet.lock:
                return fleet.instance(project, zone, name)
        if kind == "delete":
            return fleet.delete(project, zone, name)
        if kind == "set_labels":
            return fleet.set_labels(project, zone, name, self.body())
        return fleet.poll_operation(project, zone, name, wait=kind == "operation_wait")

    def _aggregated(self, project: str, query: dict[str, list[str]]) -> object:
        fleet = self.state
        wanted, size, offset = _page_args(query)
        served_fields = self._served_instances(query)
        if (project, offset // size) in fleet.faults.failing_pages:
            raise ApiError(503, "backendError", f"injected failure of page {offset // size}")
        with fleet.lock:
            zones = fleet.zones(project)
            unreachable = {z for p, z in fleet.faults.unreachable if p == project}
            partial = {z for p, z in fleet.faults.partial_zones if p == project}
            rows = sorted(
                (zone, name, inst)
                for zone, instances in zones.items()
                if zone not in unreachable | partial
                for name, inst in instances.items()
                if _matches(inst, wanted)
            )
            page = rows[offset : offset + size]
            items: dict[str, Any] = {}
            for zone in sorted(zones):
                on_page = [inst for z, _, inst in page if z == zone]
                if zone in unreachable:
                    items[f"zones/{zone}"] = _warning("UNREACHABLE", f"Zone {zone} is unreachable", zone)
                elif on_page:
                    # Copied under the lock (the answer is rendered after it), and only what the mask
                    # serves: copying 500 whole instances took 25 ms a page, the emulator's CPU, not the API's.
                    served = fieldmask.apply(on_page, served_fields)
                    items[f"zones/{zone}"] = {"instances": json.loads(json.dumps(served))}
                else:
                    items[f"zones/{zone}"] = _warning("NO_RESULTS_ON_PAGE", "There are no results for scope", zone)
        body: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": items,
            "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/aggregated/instances",
        }
        if partial:  # "Success is reported, but some results may be missing due to errors" (PARTIAL_SUCCESS)
            body.update(_warning("PARTIAL_SUCCESS", "Some results may be missing from the response.", "-"))
        if offset + size < len(rows):
            body["nextPageToken"] = _token(offset + size)
        return body

    def _groups(self, project: str, query: dict[str, list[str]]) -> object:
        """``instanceGroupManagers.aggregatedList``: zonal and regional groups, paged like the instances
        (no filter: the reaper selects groups by name itself)."""
        fleet = self.state
        _, size, offset = _page_args({k: v for k, v in query.items() if k != "filter"})
        with fleet.lock:
            fleet.zones(project)  # 404 for an unknown project
            scopes = fleet.groups.get(project, {})
            rows = sorted((scope, name) for scope, groups in scopes.items() for name in groups)
            page = rows[offset : offset + size]
            items: dict[str, Any] = {}
            for scope in sorted(scopes):
                on_page = [fleet.group(project, scope, name) for s, name in page if s == scope]
                if on_page:
                    items[scope] = {"instanceGroupManagers": on_page}
                else:
                    items[scope] = _warning("NO_RESULTS_ON_PAGE", "There are no results for scope", scope)
        body: dict[str, Any] = {
            "kind": "compute#instanceGroupManagerAggregatedList",
            "id": f"projects/{project}/aggregated/instanceGroupManagers",
            "items": items,
        }
        if offset + size < len(rows):
            body["nextPageToken"] = _token(offset + size)
        return body

    def _list(self, project: str, zone: str, query: dict[str, list[str]]) -> object:
        fleet = self.state
        wanted, size, offset = _page_args(query)
        with fleet.lock:
            if (project, zone) in fleet.faults.unreachable:
                raise ApiError(503, "backendError", f"Zone {zone} is unreachable")
            rows = sorted((n, i) for n, i in fleet.zones(project).get(zone, {}).items() if _matches(i, wanted))
            body: dict[str, Any] = {
                "kind": "compute#instanceList",
                "items": json.loads(json.dumps([i for _, i in rows[offset : offset + size]])),
            }
        if offset + size < len(rows):
            body["nextPageToken"] = _token(offset + size)
        return body

    def _set_faults(self, body: dict[str, Any]) -> object:
        """``latency`` (s), ``slow`` {kind: s}, ``rates`` {kind: {fault: p}}, ``unreachable`` [[project, zone]],
        ``deny_set_labels`` [project], ``operation_seconds`` {operationType: s}, ``instance_operation_seconds``
        {name: s}, ``operation_wait_cap`` (s), ``quotas`` (see :meth:`RateQuotas.configure`)."""
        fleet = self.state
        with fleet.lock:
            faults = fleet.faults
            faults.latency = float(body.get("latency", faults.latency))
            faults.slow.update(body.get("slow", {}))
            faults.rates.update(body.get("rates", {}))
            faults.unreachable |= {tuple(pz) for pz in body.get("unreachable", [])}
            faults.deny_set_labels |= set(body.get("deny_set_labels", []))
            faults.deny_project_get |= set(body.get("deny_project_get", []))
            faults.operation_seconds.update(body.get("operation_seconds", {}))
            faults.instance_operation_seconds.update(body.get("instance_operation_seconds", {}))
            faults.operation_wait_cap = float(body.get("operation_wait_cap", faults.operation_wait_cap))
        try:
            fleet.quotas.configure(body.get("quotas", {}))
        except (TypeError, ValueError) as exc:
            raise ApiError(400, "invalid", str(exc)) from None
        return {"ok": True}


def _warning(code: str, message: str, zone: str) -> dict[str, Any]:
    """A scope's (or the page's) ``warning``: "[Output Only] Informational warning which replaces the list of
    instances when the list is empty", its ``code`` from the schema's enum and a ``scope`` data entry."""
    scope = zone if "/" in zone else f"zones/{zone}"  # a zone name, or a scope (zones/Z, regions/R)
    return {"warning": {"code": code, "message": message, "data": [{"key": "scope", "value": scope}]}}


class Emulator(Server):
    """A running GCE emulator: ``endpoint`` is what ``client_options.api_endpoint`` takes."""

    def __init__(self, fleet: Fleet | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(GceHandler, fleet or Fleet(), host, port)
        self.fleet: Fleet = self.state  # type: ignore[assignment]  # this server's state is always its own emulator's
