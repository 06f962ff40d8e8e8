"""A Prometheus HTTP API stand-in serving canned ``/api/v1/query`` answers.

A real Prometheus never sends partial answers, NaN samples or duplicate series
on demand; Thanos, Mimir and federation do. This server lets a test put exactly
those bytes on the wire while the real ``PrometheusWriterHealth`` reads them
over HTTP.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from reaper.config import WriterHealthConfig

FAILED_METRIC = WriterHealthConfig().failed_passes_metric
LAST_METRIC = WriterHealthConfig().last_pass_metric


def vector(*series: object, **top: object) -> dict[str, object]:
    """A documented instant-vector answer holding ``series``; ``top`` adds or replaces top-level keys."""
    return {"status": "success", "data": {"resultType": "vector", "result": list(series)}, **top}


def series(manager: str, project: str, value: str, at: float) -> dict[str, object]:
    """One documented series: ``{"metric": {...}, "value": [at, "value"]}``."""
    return {"metric": {"manager": manager, "project": project}, "value": [at, value]}


class FakePrometheus:
    """Answers the failed-passes query with ``failed``, a query of the past (``offset``) with ``past``
    when set, and any other query of the last-pass metric with ``last``. A query of any other metric
    gets an empty vector, as a real Prometheus answers a metric name it has no series of (a typo).

    An answer is ``(HTTP status, body)``; a body that is not ``bytes`` is sent as
    JSON. ``queries`` records every query received, so a test can count them.
    """

    def __init__(self) -> None:
        self.last: tuple[int, object] = (200, vector())
        self.failed: tuple[int, object] = (200, vector())
        self.past: tuple[int, object] | None = None
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query).get("query", [""])[0]
                fake.queries.append(query)
                past = fake.past if fake.past and " offset " in query else None
                code, body = fake.failed if FAILED_METRIC in query else past or fake.last
                if FAILED_METRIC not in query and LAST_METRIC not in query:
                    code, body = 200, vector()
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code if url.path == "/api/v1/query" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), name="fake-prometheus", daemon=True
        )  # a short poll interval: close() waits for one
        self._thread.start()

    def answer(self, last: object, failed: object, codes: tuple[int, int] = (200, 200)) -> None:
        """Serve these bodies (with these HTTP statuses) from now on, and forget the queries seen."""
        self.last, self.failed = (codes[0], last), (codes[1], failed)
        self.queries.clear()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
