"""What the GCE and Kubernetes emulators share: fault injection, request counters, dispatch, the server;
and how the demo, the tests and the benchmarks start servers: free ports, readiness, the binaries,
one process wrapper (:class:`Daemon`) and SecantusDB's command line.

Each emulator supplies its routes, its handling and its error shape; this module
does the rest the same way for both, so a test injects faults and reads
counters identically whichever API it drives.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from subprocess import Popen
from typing import Any, ClassVar, Literal, overload
from urllib.parse import parse_qs, urlsplit

Route = tuple[str, re.Pattern[str], str]  # (method, path pattern, kind)
Hook = Callable[[tuple[str, ...]], object]  # called with the request's path arguments; what it returns is dropped


def free_port() -> int:
    """A free TCP port on loopback, for emulators and the servers tests and benchmarks start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on ``127.0.0.1:port``."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(ready: Callable[[], object], what: str, timeout: float = 30.0, process: Popen | None = None) -> None:
    """Poll ``ready()`` until it returns true; an exception from it means "not yet".

    Raises ``RuntimeError`` as soon as ``process`` (the server being waited for) exits, and
    ``TimeoutError`` after ``timeout`` seconds. Shared by the demo, the tests and the benchmarks.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not ready after {timeout:g} s")


@overload
def server_binary(name: str, required: Literal[True] = True) -> str: ...
@overload
def server_binary(name: str, required: bool) -> str | None: ...
def server_binary(name: str, required: bool = True) -> str | None:
    """Where the server ``name`` is installed: next to this interpreter (the venv's ``secantusd-py``,
    ``airflow``), on ``PATH``, or in ``/usr/sbin`` or ``/usr/bin`` (Debian's ``nats-server``, Prometheus).

    Not installed: ``RuntimeError``, or ``None`` when not ``required``.
    """
    candidates = (Path(sys.executable).parent / name, shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}")
    found = next((str(c) for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None and required:
        raise RuntimeError(f"{name} is not installed: run scripts/bootstrap.sh (make test and make demo do)")
    return found


class Daemon:
    """A server process of the demo's, a test's or a benchmark's own: started, waited for, stopped.

    Started at once; then, when given a ``port`` or a ``ready`` check, waited for until it accepts
    connections on that port (or ``ready()`` is true) for at most ``timeout`` seconds, and stopped
    if it never gets there. Its output goes to ``log``, or nowhere. ``detach`` starts it in a session
    of its own (the demo's services: they outlive the demo's command and are stopped by group).
    """

    def __init__(
        self,
        argv: list[str],
        port: int | None = None,
        what: str = "",
        *,
        ready: Callable[[], object] | None = None,
        timeout: float = 30.0,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        detach: bool = False,
    ) -> None:
        self.port, self.what, self.detach = port, what or argv[0], detach
        sink = log.open("wb") if log is not None else None
        try:
            self.process = Popen(
                argv,
                stdout=sink or subprocess.DEVNULL,
                stderr=subprocess.STDOUT if sink else subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=detach,
            )
        finally:
            if sink is not None:
                sink.close()
        if ready is not None or port is not None:
            self.wait(ready, timeout)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, ready: Callable[[], object] | None = None, timeout: float = 30.0, what: str | None = None) -> None:
        """Wait until ``ready()`` (by default: it accepts connections on its port); see :func:`wait_until`.

        A process that exits or is not ready in time is stopped, and the error raised.
        """
        if ready is None:
            if self.port is None:
                raise ValueError(f"{self.what}: nothing to wait for (no ready check and no port)")
            ready = partial(listening, self.port)
            what = what or f"{self.what} on port {self.port}"
        try:
            wait_until(ready, what or self.what, timeout, self.process)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (to its whole group when detached), then SIGKILL if it is still running ``timeout`` seconds later."""
        if self.process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=timeout)

    def _signal(self, signum: int) -> None:
        try:
            if self.detach:
                os.killpg(self.process.pid, signum)
            else:
                self.process.send_signal(signum)
        except ProcessLookupError:
            pass


SECANTUSDB = "secantusd-py"  # SecantusDB's server: MongoDB's wire protocol, installed with the requirements


def secantusdb_argv(port: int, storage: str | Path = ":memory:", options: tuple[str, ...] = ()) -> list[str]:
    """SecantusDB on ``127.0.0.1:port``, its data in ``storage`` (a directory, or in memory), logging errors only."""
    argv = [server_binary(SECANTUSDB), "--host", "127.0.0.1", "--port", str(port), "--storage-path", str(storage)]
    return [*argv, "--log-level", "ERROR", *options]


def start_secantusdb(
    port: int | None = None, *, storage: str | Path = ":memory:", options: tuple[str, ...] = (), **daemon: object
) -> Daemon:
    """SecantusDB (see :func:`secantusdb_argv`) as a :class:`Daemon`, on a free port unless given one.

    Returned once it accepts connections; ``daemon`` takes the other arguments of :class:`Daemon`.
    """
    port = port or free_port()
    what = " ".join(("SecantusDB", *options))
    return Daemon(secantusdb_argv(port, storage, options), port, what, **daemon)  # type: ignore[arg-type]  # **kwargs typed object: each goes to the parameter of its name


class ApiError(Exception):
    """An error the emulator answers with; each API renders it in its own shape.

    ``domain``, ``status`` and ``more`` are for the APIs whose error bodies carry them (Compute:
    ``errors[].domain``, ``"global"`` for its own errors; ``status``, the google.rpc.Code name, only where
    the API sends one; ``more``, other fields of the ``errors[]`` entry, such as ``location``).
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        domain: str = "global",
        status: str | None = None,
        more: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.domain, self.status, self.more = domain, status, more or {}
        self.headers = headers or {}


@dataclass
class Faults:
    """Injected faults, per request kind.

    ``latency`` delays every answer; ``slow`` maps a kind to seconds more for its answers (a slow
    ``get``, say). ``rates`` maps a kind to {"429"|"503"|"410"|"timeout": probability}; ``fail_next``
    maps a kind to the exact faults of its next requests, in order (for tests). ``retry_after`` is the
    ``Retry-After`` header of an injected 429 (None: none).
    """

    latency: float = 0.0
    slow: dict[str, float] = field(default_factory=dict)
    retry_after: str | None = None
    rates: dict[str, dict[str, float]] = field(default_factory=dict)
    fail_next: dict[str, list[str]] = field(default_factory=dict)
    timeout_delay: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def roll(self, kind: str) -> str | None:
        queued = self.fail_next.get(kind)
        if queued:
            return queued.pop(0)
        for fault, rate in self.rates.get(kind, {}).items():
            if rate and self._random.random() < rate:
                return fault
        return None


class State:
    """Counters, faults and mutation hooks every emulator state has; subclasses add the resources."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.faults = Faults()
        self.counters: Counter[str] = Counter()
        self.requests: list[tuple[str, str]] = []  # (method, path with query), for asserting on requests
        self.inflight: Counter[str] = Counter()  # requests being served now, per kind
        self.max_inflight: Counter[str] = Counter()  # the most ever served at once, per kind
        self._hooks: dict[tuple[str, str], list[list]] = {}  # (when, kind) -> [[hook, remaining calls]]
        self.rewrites: dict[str, Callable[[object], object]] = {}  # kind -> rewrite of the answer's body (or bytes)

    def on(self, when: str, kind: str, hook: Hook, times: int | None = 1) -> None:
        """Change the world at a point of the reaper's conversation with the API (the fault and race harness).

        ``when`` is ``"before"`` (the request of ``kind`` has arrived and is not handled yet) or
        ``"after"`` (it was handled and its answer has not gone out yet: the client cannot have
        seen it). ``hook`` gets the request's path arguments; it runs ``times`` times (None: always).
        A hook may raise :class:`ApiError` to answer the request with that error instead.
        """
        with self.lock:
            self._hooks.setdefault((when, kind), []).append([hook, times])

    def clear_hooks(self) -> None:
        """No more world changes: every hook is gone (for tests that reuse one emulator)."""
        with self.lock:
            self._hooks.clear()

    def fire(self, when: str, kind: str, args: tuple[str, ...]) -> None:
        with self.lock:
            due = []
            for entry in self._hooks.get((when, kind), []):
                if entry[1] is None or entry[1] > 0:
                    due.append(entry[0])
                    if entry[1] is not None:
                        entry[1] -= 1
        for hook in due:
            hook(args)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"counters": dict(self.counters), "max_inflight": dict(self.max_inflight)}


class Handler(BaseHTTPRequestHandler):
    """Routes a request, counts it, applies latency and faults, and answers JSON."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; with Nagle's algorithm the body waits for the
    # client's delayed ACK (~40 ms a response), which would swamp every latency we measure.
    disable_nagle_algorithm = True
    routes: ClassVar[list[Route]] = []
    state: State  # set on the subclass made by Server

    def log_message(self, format: str, *args: object) -> None:  # silence per-request logging
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # --- for subclasses --------------------------------------------------------------------

    def handle_api(self, kind: str, args: tuple[str, ...], query: dict[str, list[str]]) -> object:
        raise NotImplementedError

    def error_body(self, error: ApiError) -> object:
        raise NotImplementedError

    def admit(self, kind: str, args: tuple[str, ...]) -> None:
        """Let the request in, or raise :class:`ApiError` (a used-up rate quota); by default all get in."""

    def render(self, kind: str, body: object, query: dict[str, list[str]]) -> bytes:
        """The response bytes; emulators override it to shape responses (e.g. partial responses)."""
        return json.dumps(body).encode()

    def body(self) -> dict[str, Any]:
        """The request's JSON body (read by ``_dispatch`` before anything can fail)."""
        return json.loads(self._raw_body) if self._raw_body else {}

    # --- the shared part ---------------------------------------------------------------------

    def _send(self, code: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str, path: str) -> tuple[str, tuple[str, ...]]:
        for route_method, pattern, kind in self.routes:
            match = pattern.match(path)
            if match and route_method == method:
                return kind, match.groups()
        raise ApiError(404, "NotFound", f"No such path {method} {path}")

    def _dispatch(self, method: str) -> None:
        # Read the body first, whatever happens next: an unread body left on a keep-alive
        # connection would be taken for the start of the next request.
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        state = self.state
        try:
            if url.path == "/_emulator/stats" and method == "GET":
                self._send(200, json.dumps(state.stats()).encode())
                return
            kind, args = self._route(method, url.path)
            with state.lock:
                state.counters[kind] += 1
                state.requests.append((method, self.path))
                state.inflight[kind] += 1
                state.max_inflight[kind] = max(state.max_inflight[kind], state.inflight[kind])
            try:
                state.fire("before", kind, args)
                self.admit(kind, args)
                self._inject(kind)
                body = self.handle_api(kind, args, query)
                state.fire("after", kind, args)
                rewrite = state.rewrites.get(kind)
                answer = rewrite(body) if rewrite else body
                # Bytes from a rewrite go out as they are: what JSON objects cannot hold (a key twice).
                self._send(200, answer if isinstance(answer, bytes) else self.render(kind, answer, query))
            finally:
                with state.lock:
                    state.inflight[kind] -= 1
        except ApiError as exc:
            self._send(exc.code, json.dumps(self.error_body(exc)).encode(), exc.headers)

    def _inject(self, kind: str) -> None:
        faults = self.state.faults
        delay = faults.latency + faults.slow.get(kind, 0.0)
        if delay:
            time.sleep(delay)
        fault = faults.roll(kind)
        if fault == "timeout":
            time.sleep(faults.timeout_delay)
            raise ApiError(503, "ServiceUnavailable", "injected timeout")
        if fault:
            throttled = fault == "429"
            headers = {"Retry-After": faults.retry_after} if throttled and faults.retry_after else None
            raise ApiError(
                int(fault), "TooManyRequests" if throttled else "Injected", f"injected {fault}", headers=headers
            )


class Server:
    """A running emulator on loopback: ``endpoint`` is its base URL."""

    def __init__(self, handler: type[Handler], state: State, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        bound = type(f"Bound{handler.__name__}", (handler,), {"state": state})
        self.server = ThreadingHTTPServer((host, port), bound)
        self.server.daemon_threads = True
        self.endpoint = f"http://{host}:{self.server.server_port}"
        # serve_forever checks for a shutdown every poll_interval (0.5 s by default): every close waited that long.
        serve = partial(self.server.serve_forever, poll_interval=0.05)
        self.thread = threading.Thread(target=serve, name=handler.__name__, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self):
        return self.__enter__()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def serve_until_stopped(self, banner: str) -> None:
        """For ``python -m``: start, print ``banner`` (tools wait for it), serve until SIGTERM or Ctrl-C."""
        self.start()
        print(banner, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: self.close())
        try:
            self.thread.join()
        except KeyboardInterrupt:
            self.close()
