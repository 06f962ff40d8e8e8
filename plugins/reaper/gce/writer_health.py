"""Heartbeat-writer health from the Prometheus HTTP API (``/api/v1/query``).

Two instant queries per sweep, not one per manager: the last pass timestamp
and the failed passes over a window, both per (manager, project). Any error,
timeout or malformed answer means the source is unreadable: ``None``, which
holds every heartbeat delete (DESIGN.md section 4).
"""

from __future__ import annotations

import logging

import requests

from reaper.config import WriterHealthConfig
from reaper.model import WriterRecord

log = logging.getLogger(__name__)


class PrometheusWriterHealth:
    def __init__(self, config: WriterHealthConfig, session: requests.Session | None = None) -> None:
        self.config = config
        self.session = session or requests.Session()

    def _query(self, promql: str) -> list[tuple[str, str, float]]:
        cfg = self.config
        response = self.session.get(
            f"{cfg.prometheus_url.rstrip('/')}/api/v1/query",
            params={"query": promql},
            timeout=cfg.timeout.total_seconds(),
        )
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success" or body["data"]["resultType"] != "vector":
            raise ValueError(f"unexpected answer to {promql!r}: {body.get('error') or body['data']['resultType']}")
        return [
            (s["metric"][cfg.manager_label], s["metric"][cfg.project_label], float(s["value"][1]))
            for s in body["data"]["result"]
        ]

    def read(self) -> list[WriterRecord] | None:
        cfg = self.config
        by = f"{cfg.manager_label}, {cfg.project_label}"
        window = f"{int(cfg.failing_window.total_seconds())}s"
        try:
            last = self._query(f"max by ({by}) ({cfg.last_pass_metric})")
            failed = self._query(f"sum by ({by}) (increase({cfg.failed_passes_metric}[{window}]))")
        except (requests.RequestException, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("writer health unreadable, holding heartbeat deletes: %s", exc)
            return None
        failing = {(m, p) for m, p, value in failed if value > 0}
        records = {(m, p): WriterRecord(m, p, value, (m, p) in failing) for m, p, value in last}
        # A manager that fails every pass may never have completed one: it reports, so it is not dead.
        for m, p in failing - records.keys():
            records[(m, p)] = WriterRecord(m, p, 0.0, True)
        return sorted(records.values(), key=lambda r: (r.project, r.manager))
