"""Compute Engine rate quotas: per project and quota group, counted per synchronized window, answered with 403.

What the real API documents (Compute Engine docs, "Rate quotas and system limits",
https://cloud.google.com/compute/api-quota):

- rate quotas apply per project, each to a group of API methods, and each group is counted separately;
- they are enforced per minute, on synchronized intervals: "if a project reaches a quota limit at
  10:00:15, the quota refills at the start of the next synchronized interval, such as 10:01:00". The
  windows here are aligned on the epoch, ``window`` seconds long (60 by default; tests use shorter ones);
- a project over a rate quota receives "a 403 error with the reason ``rateLimitExceeded``", and should
  wait for the next interval;
- the default limits are 1,500 requests per minute per project in each of these groups.

The answer's body is the one the Compute API sends (recorded in hail-is/hail#10613 and
hashicorp/terraform-provider-google#8360, scylladb/scylla-cluster-tests#7940 for the per-minute
wording): ``error.code`` 403, ``message`` "Quota exceeded for quota metric '...' and limit '... per
minute' of service 'compute.googleapis.com' for consumer 'project_number:...'.", one ``errors[]`` entry
with ``domain: "usageLimits"`` and ``reason: "rateLimitExceeded"``, and ``status: "PERMISSION_DENIED"``.
No recording of a Compute answer shows an ErrorInfo ``details`` entry, so none is sent.

Whether a refused request spends quota is not documented; here it spends nothing (Google's advice, wait
for the next interval and retry, assumes the refill is all it takes), and the accounting keeps refusals
apart, so that a test sees them either way.

Not modelled: the per-region limits of zonal methods some projects see ("... per minute per region"),
and the filtered-list cost quota (resources scanned by filtered lists per minute).

Every request is also accounted per (window, project, group, caller), refused ones apart, for tests and
benchmarks: the caller is the product name that starts the request's ``x-goog-api-client`` header
(where the SDK puts its client info: ``reaper/0.1.0 gl-python/...`` is ``reaper``), or its
``User-Agent`` without one.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from include.emulators.http import ApiError

LIST, READ, MUTATION, OPERATION_READ = "list_requests", "read_requests", "mutation_requests", "operation_read_requests"
# Route kind -> the quota group its requests count in (a new route is one line here).
GROUPS: dict[str, str] = {
    "aggregated_list": LIST,  # instances.aggregatedList: a *.list method
    "list": LIST,  # instances.list
    "group_list": LIST,  # instanceGroupManagers.aggregatedList
    "get": READ,  # instances.get: a *.get method
    "project_get": READ,  # projects.get
    "delete": MUTATION,
    "insert": MUTATION,
    "set_labels": MUTATION,
    "operation_get": OPERATION_READ,  # zoneOperations.get
    "operation_wait": OPERATION_READ,  # zoneOperations.wait
}
# How the 403 names each group's metric and limit (mutations count in the "Queries" group, compute's default).
_NAMES = {
    LIST: "List requests",
    READ: "Read requests",
    MUTATION: "Queries",
    OPERATION_READ: "Operation read requests",
}
DOCUMENTED_LIMIT = 1500  # requests per minute per project, in each group
MINUTE = 60.0


class Headers(Protocol):
    """A request's headers: ``http.server``'s message, whose lookup ignores case, as HTTP's does."""

    def get(self, name: str) -> str | None: ...


def caller(headers: Headers) -> str:
    """Who sent a request: the first product's name in ``x-goog-api-client``, else in ``User-Agent``."""
    for header in ("x-goog-api-client", "User-Agent"):
        tokens = (headers.get(header) or "").split()
        if tokens:
            return tokens[0].split("/")[0]
    return "unknown"


def exceeded(number: str, group: str) -> ApiError:
    """The answer to a request over its group's quota, as the Compute API words it (the consumer by number)."""
    name = _NAMES[group]
    message = (
        f"Quota exceeded for quota metric '{name}' and limit '{name} per minute' of service "
        f"'compute.googleapis.com' for consumer 'project_number:{number}'."
    )
    return ApiError(403, "rateLimitExceeded", message, domain="usageLimits", status="PERMISSION_DENIED")


@dataclass(frozen=True)
class Usage:
    """The requests of one caller in one quota group of one project, in the window starting at ``window``."""

    window: float  # epoch seconds
    project: str
    group: str
    caller: str
    admitted: int
    refused: int  # answered 403 rateLimitExceeded


class RateQuotas:
    """The rate quotas of every project, and what each caller spent of them.

    Off until given limits (``documented()`` sets the documented ones): a test or benchmark that is not
    about quotas must not depend on how many requests a machine manages in a minute. ``limits`` is the
    limit per group for every project (a group absent is unlimited), ``projects`` a project's own limits
    over those, ``window`` the interval's length in seconds. Thread-safe.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.limits: dict[str, int] = {}
        self.projects: dict[str, dict[str, int]] = {}
        self.window = MINUTE
        self.clock = clock
        self._lock = threading.Lock()
        self._spent: Counter[tuple[float, str, str]] = Counter()  # (window, project, group) -> admitted
        self._usage: dict[tuple[float, str, str, str], list[int]] = {}  # (window, project, group, caller)

    def documented(self) -> RateQuotas:
        """The documented defaults: 1,500 requests per minute per project in each group."""
        with self._lock:
            self.limits = dict.fromkeys(_NAMES, DOCUMENTED_LIMIT)
            self.window = MINUTE
        return self

    def configure(self, settings: Mapping[str, Any]) -> None:
        """From JSON (``/_emulator/faults``' ``quotas``, the command line): ``documented`` (true: the documented
        limits first), ``limits`` {group: n}, ``projects`` {project: {group: n}}, ``window`` (seconds)."""
        if settings.get("documented"):
            self.documented()
        with self._lock:
            for group, limit in dict(settings.get("limits") or {}).items():
                self.limits[_group(group)] = int(limit)
            for project, limits in dict(settings.get("projects") or {}).items():
                own = self.projects.setdefault(str(project), {})
                own.update({_group(group): int(limit) for group, limit in dict(limits).items()})
            if "window" in settings:
                self.window = float(settings["window"])

    def limit(self, project: str, group: str) -> int | None:
        return self.projects.get(project, {}).get(group, self.limits.get(group))

    def window_start(self, at: float | None = None) -> float:
        """The start of the synchronized window holding ``at`` (now by default): windows are aligned on the epoch."""
        at = self.clock() if at is None else at
        return math.floor(at / self.window) * self.window

    def admit(self, kind: str, project: str, who: str, number: str = "") -> None:
        """Count one request of route ``kind`` in ``project`` (its id; ``number``: its project number, which the
        403 names); raise the API's 403 when its group's quota is used up."""
        group = GROUPS.get(kind)
        if group is None:  # not an API method (the emulator's own endpoints)
            return
        with self._lock:
            start = self.window_start()
            usage = self._usage.setdefault((start, project, group, who), [0, 0])
            limit = self.limit(project, group)
            if limit is not None and self._spent[start, project, group] >= limit:
                usage[1] += 1
                raise exceeded(number or project, group)
            self._spent[start, project, group] += 1
            usage[0] += 1

    def usage(self) -> list[Usage]:
        """Every (window, project, group, caller) seen, oldest window first."""
        with self._lock:
            return [Usage(*key, *counts) for key, counts in sorted(self._usage.items())]

    def stats(self) -> list[dict[str, Any]]:
        return [asdict(u) for u in self.usage()]


def _group(name: object) -> str:
    if name not in _NAMES:
        raise ValueError(f"unknown quota group {name!r}: expected one of {', '.join(_NAMES)}")
    return str(name)
