"""Heartbeat-writer health from the Prometheus HTTP API (``/api/v1/query``).

Two instant queries per sweep, not one per manager: the last pass timestamp
and the failed passes over a window, both per (manager, project).

The answers are read as evidence for deleting, so only their documented form
counts (docs/design.md §1 and §4, "Surprising evidence"):

- The whole source is unknown (``None``, which holds every heartbeat delete)
  on any HTTP error or timeout, a body that is not strict JSON, ``status`` other
  than ``success``, ``resultType`` other than ``vector``, any ``warnings`` (a
  Thanos or Mimir partial answer: the missing series may be a live writer's,
  which would read as a dead manager), or a series without a non-empty manager
  or project label (it may be the only report of some project's writer).
- One (manager, project) pair is unknown (a record with ``last_pass`` NaN,
  which the policy turns into ``writer_health_unknown`` for its project) when
  its sample is not a ``[unix_time, "value"]`` pair with a finite decimal
  value, when it has two series in one answer, when its failed-pass count
  is negative, or when it has no failed-pass series.

An answer with no series for a project is no news of its managers' death: the
policy holds that project's heartbeat deletes (``writer_health_unknown``), as a
wrong metric name or Prometheus URL answers exactly that (docs/design.md §4).
"""

from __future__ import annotations

import json
import logging
import math
import re
from datetime import timedelta

import requests

from reaper.config import WriterHealthConfig
from reaper.model import WriterRecord
from reaper.redact import error_for_log, url_for_log

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (manager, project)
UNKNOWN = math.nan  # the last_pass of a pair whose health is unknown
# Go's ParseFloat decimal syntax, ASCII only. Python's float() also takes blanks, underscores,
# non-ASCII digits and "infinity", none of which Prometheus writes.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class UnreadableAnswer(ValueError):
    """An answer that proves nothing as a whole: the source is unknown."""


class PrometheusWriterHealth:
    def __init__(self, config: WriterHealthConfig, session: requests.Session | None = None) -> None:
        self.config = config
        self.session = session or requests.Session()

    def read(self) -> list[WriterRecord] | None:
        """Every reporting (manager, project), or ``None`` when the answers cannot be trusted whole."""
        cfg = self.config
        by = f"{cfg.manager_label}, {cfg.project_label}"
        window = f"{int(cfg.failing_window.total_seconds())}s"
        try:
            last = self._query(f"max by ({by}) ({cfg.last_pass_metric})")
            failed = self._query(f"sum by ({by}) (increase({cfg.failed_passes_metric}[{window}]))")
        except (requests.RequestException, ValueError) as exc:
            where = url_for_log(cfg.prometheus_url)
            log.warning(
                "writer health from %s unreadable, holding heartbeat deletes in every project: %s", where, _why(exc)
            )
            return None
        if not last and not failed:
            log.warning(
                "writer health from %s answered no series at all: a wrong metric name or URL? "
                "Heartbeat deletes are held",
                url_for_log(cfg.prometheus_url),
            )
        return _join(last, failed)

    def reporting(self, window: timedelta) -> frozenset[Pair] | None:
        """The (manager, project) pairs with any last-pass sample within ``window`` (the quarantine).

        Read from the same source, metric and labels as :meth:`read`, with the same strictness; any
        sample counts, even one whose value is unusable (the manager was there). ``None``: unknown,
        when the answers cannot be trusted whole or the source holds no last-pass sample from the
        window before this one: a Prometheus younger than the window (or with a shorter retention)
        cannot tell a manager gone for that long from one it never scraped; and when no manager at
        all reported within the window, which a scrape outage that long looks like too.
        """
        cfg = self.config
        span = f"{int(window.total_seconds())}s"
        recent = f"last_over_time({cfg.last_pass_metric}[{span}])"
        older = f"count(last_over_time({cfg.last_pass_metric}[{span}] offset {span}))"
        try:
            seen = self._query(f"max by ({cfg.manager_label}, {cfg.project_label}) ({recent})")
            history = _vector(self._get(older), older)
        except (requests.RequestException, ValueError) as exc:
            where = url_for_log(cfg.prometheus_url)
            log.warning("writer-health reports from %s unreadable, no group is residual: %s", where, _why(exc))
            return None
        if not history:
            log.warning("writer health holds no report older than %s: no group is residual yet", span)
            return None
        if not seen:  # a scrape or Prometheus outage that long reads the same as every manager gone at once
            log.warning("no writer reported within %s, though some did before: no group is residual", span)
            return None
        return frozenset(seen)

    def _get(self, promql: str) -> object:
        """One instant query's decoded answer (strict JSON); an HTTP error is an unreadable answer."""
        cfg = self.config
        response = self.session.get(
            f"{cfg.prometheus_url.rstrip('/')}/api/v1/query",
            params={"query": promql},
            timeout=cfg.timeout.total_seconds(),
        )
        if not response.ok:  # the URL stays out of the log line: it may carry credentials
            raise UnreadableAnswer(f"HTTP {response.status_code} answering {promql!r}")
        return _strict_json(response.content)

    def _query(self, promql: str) -> dict[Pair, float]:
        """One instant query: each pair's finite value, or NaN where its series is unusable."""
        values: dict[Pair, float] = {}
        for series in _vector(self._get(promql), promql):
            pair = self._attribute(series, promql)
            if pair in values:
                log.warning("writer health of %s in %s unknown: two series answer %r", *pair, promql)
                values[pair] = UNKNOWN
                continue
            values[pair] = _sample_value(series.get("value"))
            if math.isnan(values[pair]):
                log.warning("writer health of %s in %s unknown: sample %.200r is no finite value", *pair, series)
        return values

    def _attribute(self, series: dict[str, object], promql: str) -> Pair:
        """The series' (manager, project); an empty label is an absent one in Prometheus."""
        cfg = self.config
        metric = series.get("metric")
        manager, project = (
            (metric.get(cfg.manager_label), metric.get(cfg.project_label)) if isinstance(metric, dict) else (None, None)
        )
        if not (isinstance(manager, str) and manager and isinstance(project, str) and project):
            raise UnreadableAnswer(
                f"a series of {promql!r} lacks the {cfg.manager_label} or {cfg.project_label} label: {series!r:.200}"
            )
        return manager, project


def _why(exc: Exception) -> str:
    """Why an answer was unreadable, for a log line: a request error quotes the URL, which may carry
    credentials; an answer's fault is ours to word."""
    return str(exc) if isinstance(exc, UnreadableAnswer) else error_for_log(exc)


def _strict_json(content: bytes) -> object:
    """Standard JSON only: no NaN/Infinity literals, no key given twice (which one would be believed?)."""

    def reject_constant(name: str) -> object:
        raise UnreadableAnswer(f"{name} is not JSON")

    def unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
        if len({key for key, _ in pairs}) != len(pairs):
            raise UnreadableAnswer(f"a JSON object repeats a key: {[key for key, _ in pairs]}")
        return dict(pairs)

    return json.loads(content, parse_constant=reject_constant, object_pairs_hook=unique_keys)


def _vector(body: object, promql: str) -> list[dict[str, object]]:
    """The series of a complete, successful instant-vector answer; anything else is unreadable."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise UnreadableAnswer(f"unexpected answer to {promql!r}: {error or repr(body)[:200]}")
    # Thanos and Mimir answer partial results (a store or querier unreachable) with top-level warnings.
    if body.get("warnings", []) != []:
        raise UnreadableAnswer(f"partial answer to {promql!r}, warnings: {body['warnings']!r:.500}")
    data = body.get("data")
    result = data.get("result") if isinstance(data, dict) and data.get("resultType") == "vector" else None
    if not (isinstance(result, list) and all(isinstance(series, dict) for series in result)):
        raise UnreadableAnswer(f"unexpected answer to {promql!r}: data {data!r:.200}")
    return result


def _sample_value(sample: object) -> float:
    """The value of a documented ``[unix_time, "decimal"]`` sample if it is finite, else NaN."""
    if not (isinstance(sample, list) and len(sample) == 2):
        return UNKNOWN
    at, text = sample
    # bool is an int to Python; a huge JSON float is inf (a huge JSON int stays finite).
    if isinstance(at, bool) or not isinstance(at, int | float) or (isinstance(at, float) and not math.isfinite(at)):
        return UNKNOWN
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        return UNKNOWN
    value = float(text)
    return value if math.isfinite(value) else UNKNOWN


def _join(last: dict[Pair, float], failed: dict[Pair, float]) -> list[WriterRecord]:
    """One record per reporting pair, sorted by project then manager.

    A pair unknown in either answer is unknown. A manager that fails every pass
    may never have completed one: it reports, so it is not dead (last pass 0,
    failing). A pair with only a zero failed-pass count is a manager that died
    within the failing window (the counter's window outlives the last-pass
    series): no record, like any dead manager. A manager with a last pass but
    no failed-pass series is unknown: managers export the counter from their
    start, so its absence is a wrong metric name or label, under which a
    failing writer would read as healthy (docs/design.md §4).
    """
    for manager, project in sorted(last.keys() - failed.keys()):
        log.warning("writer health of %s in %s unknown: a last pass but no failed-pass series", manager, project)
    records = []
    for manager, project in sorted(last.keys() | failed.keys(), key=lambda pair: (pair[1], pair[0])):
        failures = failed.get((manager, project), 0.0)
        last_pass = last.get((manager, project), 0.0)
        # NaN, a negative increase, or a last pass without its failed-pass series (a manager whose counter is
        # named or labelled otherwise: a failing writer would read as healthy).
        if math.isnan(last_pass) or not failures >= 0 or (manager, project) not in failed:
            records.append(WriterRecord(manager, project, UNKNOWN, False))
        elif (manager, project) in last or failures > 0:
            records.append(WriterRecord(manager, project, last_pass, failures > 0))
    return records
