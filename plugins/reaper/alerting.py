"""The Prometheus that evaluates the reaper's alert rules (``metrics.prometheus_url``), as its HTTP API documents
itself (https://prometheus.io/docs/prometheus/latest/querying/api/): the reaper's alerting rules with their
state and alerts (``/api/v1/rules``), and instant queries (``/api/v1/query``).

A config can name a Prometheus that answers and still proves nothing: another server, a rules file that is not
mounted, a rule that cannot be evaluated, or a selector (``cause_alerts.*``) that matches no series, so that its
alert can never fire. Each of those is said here, never read as "nothing fires". The audit view's first
screen and the preflight read it. Credentials in the URL go as basic auth (``requests``) and are never shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reaper.config import Settings
from reaper.redact import error_for_log, url_for_log


class AlertingError(Exception):
    """The Prometheus did not answer as documented; the message names it without its credentials."""


def reapers(rule: Mapping[str, object], runbook_url: str) -> bool:
    """Whether an alerting rule (or an alert) is the reaper's: its runbook_url is the reaper's runbook."""
    notes = rule.get("annotations")
    return isinstance(notes, dict) and str(notes.get("runbook_url", "")).startswith(f"{runbook_url}#")


def _get(config: Settings, path: str, params: dict[str, str]) -> Any:  # JSON, read with KeyError, TypeError caught
    import requests

    url = config.metrics.prometheus_url.rstrip("/")
    try:
        answer = requests.get(f"{url}{path}", params=params, timeout=config.metrics.timeout.total_seconds())
        answer.raise_for_status()
        return answer.json()["data"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise AlertingError(f"Prometheus at {url_for_log(url)} did not answer {path} ({error_for_log(exc)})") from None


def rules(config: Settings) -> list[dict[str, object]]:
    """The reaper's alerting rules loaded there, each with its ``health`` and ``alerts``; raises
    :class:`AlertingError` when it does not answer, or has none of them (the rules file is not loaded)."""
    data = _get(config, "/api/v1/rules", {"type": "alert"})
    try:
        found = [r for g in data["groups"] for r in g["rules"] if reapers(r, config.metrics.runbook_url)]
    except (KeyError, TypeError) as exc:
        raise AlertingError(f"Prometheus at {shown(config)}: /api/v1/rules answered no rule groups ({exc})") from None
    if not found:
        raise AlertingError(
            f"Prometheus at {shown(config)} has none of the reaper's alert rules loaded (none links "
            f"{config.metrics.runbook_url}): no alert can fire there"
        )
    return found


def unhealthy(found: list[dict[str, object]]) -> list[str]:
    """The rules Prometheus cannot evaluate (``health`` not ``ok``): they list no alert, whatever happens."""
    return [f"{r.get('name')}: {r.get('lastError', '')}" for r in found if r.get("health", "ok") != "ok"]


def series(config: Settings, selector: str) -> int:
    """How many series ``selector`` (a metric name with its matchers) matches there now."""
    data = _get(config, "/api/v1/query", {"query": f"count({selector}) or vector(0)"})
    try:
        return int(float(data["result"][0]["value"][1]))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise AlertingError(f"Prometheus at {shown(config)}: count({selector}) gave no number ({exc})") from None


def shown(config: Settings) -> str:
    return url_for_log(config.metrics.prometheus_url.rstrip("/"))
