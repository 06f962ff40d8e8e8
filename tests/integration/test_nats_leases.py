"""NATS KV leases against a real nats-server: only a complete, successful listing proves a lease absent.

A listing cut or stalled part-way, one that lost messages, a missing bucket or a closed connection
makes every lease unknown (``None``); a key that only resembles the template is no run's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from datetime import timedelta
from functools import partialmethod

import nats
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from reaper.config import NatsLeaseConfig
from reaper.model import LeaseState
from reaper.policy.k8s import lease_state
from reaper.stores.nats import NatsLeases

MANY = 2000  # enough that the listing spans many reads of the client's socket


def url(port: int) -> str:
    return f"nats://127.0.0.1:{port}"


async def _apply(port: int, ops: list[tuple[str, str]], bucket: str = "run_leases") -> None:
    """Run ``(put|delete|purge, key)`` operations on a fresh bucket."""
    client = await nats.connect(url(port))
    kv = await client.jetstream().create_key_value(bucket=bucket)
    for op, key in ops:
        await (kv.put(key, b"runner-7") if op == "put" else getattr(kv, op)(key))
    await client.close()


async def _fill(port: int, count: int) -> None:
    """``count`` leases in one burst: plain publishes to the bucket's subjects, then wait until all are stored."""
    client = await nats.connect(url(port))
    js = client.jetstream()
    await js.create_key_value(bucket="run_leases")
    for i in range(count):
        await client.publish(f"$KV.run_leases.run-{i:05d}", b"runner-7")
    await client.flush()
    deadline = time.monotonic() + 30
    while (await js.stream_info("KV_run_leases")).state.messages < count:
        assert time.monotonic() < deadline, "the bucket never held every lease"
        await asyncio.sleep(0.05)
    await client.close()


class CuttingProxy:
    """A TCP proxy that forwards ``limit`` bytes to the client, then cuts the connection or stalls it."""

    def __init__(self, upstream: int, limit: int, stall: bool) -> None:
        self.upstream, self.limit, self.stall = upstream, limit, stall
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.limit), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: limit - sent])
                    if self.stall:
                        self.closed.wait()
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        _hang_up(src, dst)

    def close(self) -> None:
        self.closed.set()
        _hang_up(*self.sockets)


def _hang_up(*sockets: socket.socket) -> None:
    """Close at once: ``shutdown`` sends FIN even while another thread still blocks in ``recv``."""
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def test_keys_that_only_resemble_the_template_are_no_runs_lease(nats_server) -> None:
    resembling = ["Lease-r2-v1", "lease-r2-V1", "lease-r2", "r2-v1", "xlease-r2-v1", "lease-r2-v1x", "lease-R3-v1"]
    released = [("put", "lease-r4-v1"), ("delete", "lease-r4-v1"), ("put", "lease-r5-v1"), ("purge", "lease-r5-v1")]
    ops = [("put", "lease-r1-v1"), ("put", "lease-v1")] + [("put", key) for key in resembling] + released
    asyncio.run(_apply(nats_server.port, ops))
    answer = NatsLeases(url(nats_server.port), NatsLeaseConfig(key_template="lease-{run}-v1")).read()
    assert answer is not None and answer.complete
    assert set(answer.known) == {"r1", "R3"}  # "lease-v1" overlaps prefix and suffix: no run at all
    states = {run: lease_state(run, answer, time.time(), 30) for run in ["r1", "r2", "r3", "r4", "r5"]}
    assert states == {
        "r1": LeaseState.HELD,
        "r2": LeaseState.ABSENT,
        "r3": LeaseState.ABSENT,  # "lease-R3-v1" is another run's lease
        "r4": LeaseState.ABSENT,  # deleted
        "r5": LeaseState.ABSENT,  # purged
    }


def test_a_key_template_that_matches_no_key_of_the_bucket_makes_every_lease_unknown(nats_server) -> None:
    """The runners write lease-<run>-v1; the config says lease.{run} (a typo): no key is any run's, and a silence
    read through the wrong template would prove every held lease absent. The preflight names it too."""
    from reaper.stores.nats import NatsOptions, nats_bucket_problem

    asyncio.run(_apply(nats_server.port, [("put", "lease-r1-v1"), ("put", "lease-r2-v1")]))
    config = NatsLeaseConfig(key_template="lease.{run}")
    answer = NatsLeases(url(nats_server.port), config).read(["r1", "r2"])
    assert answer is not None and not answer.complete and "key_template" in answer.problem
    assert {run: lease_state(run, answer, time.time(), 30) for run in ("r1", "r2")} == dict.fromkeys(
        ("r1", "r2"), LeaseState.UNKNOWN
    )
    problem = asyncio.run(nats_bucket_problem(NatsOptions.from_url(url(nats_server.port)), config))
    assert problem == (
        "k8s.nats_leases.key_template: 2 keys in bucket run_leases, none of the form 'lease.{run}': every lease unknown"
    )
    right = NatsLeaseConfig(key_template="lease-{run}-v1")
    assert asyncio.run(nats_bucket_problem(NatsOptions.from_url(url(nats_server.port)), right)) is None


def test_a_bucket_whose_leases_were_released_is_a_complete_listing_of_no_lease(nats_server) -> None:
    asyncio.run(_apply(nats_server.port, [("put", "r1"), ("delete", "r1")]))  # the delete marker stays
    answer = NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=2))).read()
    assert answer is not None and answer.complete and answer.known == {} and not answer.failed


def test_a_bucket_that_holds_no_key_proves_nothing(nats_server) -> None:
    """The second review: the runners write `leases`, the config names `run_leases`, which exists but holds no key
    (made by hand, or every message aged out): read as a complete listing, every live run was `absent`."""
    from reaper.stores.nats import NatsOptions, nats_bucket_problem

    asyncio.run(_apply(nats_server.port, []))
    config = NatsLeaseConfig(timeout=timedelta(seconds=2))
    answer = NatsLeases(url(nats_server.port), config).read()
    assert answer is not None and not answer.complete and "holds no key" in answer.problem
    assert lease_state("r1", answer, time.time(), 30) is LeaseState.UNKNOWN
    problem = asyncio.run(nats_bucket_problem(NatsOptions.from_url(url(nats_server.port)), config))
    assert problem and problem.startswith("k8s.nats_leases.bucket: bucket run_leases holds no key")


async def _publish_odd(port: int) -> None:
    client = await nats.connect(url(port))
    js = client.jetstream()
    await js.publish("$KV.run_leases.r2", b"", headers={"KV-Operation": "ROLLBACK"})
    await js.publish("$KV.run_leases.r3", b"", headers={"Nats-Marker-Reason": "SomethingNew"})
    await client.close()


def test_a_key_whose_latest_operation_is_unexpected_is_unknown(nats_server) -> None:
    asyncio.run(_apply(nats_server.port, [("put", "r1"), ("put", "r2"), ("put", "r3")]))
    asyncio.run(_publish_odd(nats_server.port))
    answer = NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=2))).read()
    states = {run: lease_state(run, answer, time.time(), 30) for run in ["r1", "r2", "r3", "r4"]}
    assert states == {
        "r1": LeaseState.HELD,
        "r2": LeaseState.UNKNOWN,
        "r3": LeaseState.UNKNOWN,
        "r4": LeaseState.ABSENT,
    }


def test_a_listing_cut_off_part_way_is_unknown_at_once(nats_server) -> None:
    """The lost connection is noticed when it happens, not when the listing's timeout runs out."""
    asyncio.run(_fill(nats_server.port, MANY))
    assert len(NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=2))).read().known) == MANY
    proxy = CuttingProxy(nats_server.port, limit=64 * 1024, stall=False)
    started = time.monotonic()
    try:
        assert NatsLeases(url(proxy.port), NatsLeaseConfig(timeout=timedelta(seconds=10))).read() is None
    finally:
        proxy.close()
    assert time.monotonic() - started < 5


def test_a_listing_stalled_part_way_is_unknown(nats_server) -> None:
    asyncio.run(_fill(nats_server.port, MANY))
    proxy = CuttingProxy(nats_server.port, limit=64 * 1024, stall=True)
    try:
        assert NatsLeases(url(proxy.port), NatsLeaseConfig(timeout=timedelta(seconds=1))).read() is None
    finally:
        proxy.close()


def test_a_listing_that_dropped_messages_is_unknown_at_once(nats_server, monkeypatch) -> None:
    """A slow consumer drops messages and says so only to the error callback: the listing is partial.

    The error ends the read when it happens: waiting for the listing would mean waiting out its timeout.
    """
    asyncio.run(_fill(nats_server.port, MANY))
    monkeypatch.setattr(JetStreamContext, "subscribe", partialmethod(JetStreamContext.subscribe, pending_msgs_limit=4))
    started = time.monotonic()
    assert NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=10))).read() is None
    assert time.monotonic() - started < 5


def test_a_consumer_info_that_overtakes_the_keys_does_not_empty_the_listing(nats_server, monkeypatch) -> None:
    """The server answers the listing's consumer info and pushes its messages independently.

    When the answer (nothing pending) is read before the messages already on their way, nats-py's
    ``kv.keys()`` concludes that the bucket is empty and lists nothing: every lease would read absent.
    The client here holds each KV message back a moment, as a slow network path would.
    """
    asyncio.run(_apply(nats_server.port, [("put", "r1"), ("put", "r2"), ("put", "r3"), ("delete", "r3")]))
    process = Client._process_msg
    held_back: list[asyncio.Future[None]] = []

    async def late(self, sid, subject, reply, data, headers) -> None:
        if not subject.startswith(b"$KV."):
            return await process(self, sid, subject, reply, data, headers)
        frame = (sid, bytes(subject), bytes(reply), bytes(data), bytes(headers) if headers else headers)
        before = held_back[-1] if held_back else asyncio.sleep(0.2)

        async def deliver() -> None:  # in order, after the frames the read loop goes on to
            await before
            await process(self, *frame)

        held_back.append(asyncio.ensure_future(deliver()))

    monkeypatch.setattr(Client, "_process_msg", late)
    answer = NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=2))).read()
    assert answer is not None and set(answer.known) == {"r1", "r2"}


def test_one_run_is_read_alone_with_the_same_rules(nats_server) -> None:
    # The re-read right before a run's delete: only its key, held, released or never written.
    ops = [("put", "r-held"), ("put", "r-released"), ("put", "other"), ("delete", "r-released")]
    asyncio.run(_apply(nats_server.port, ops))
    leases = NatsLeases(url(nats_server.port), NatsLeaseConfig(timeout=timedelta(seconds=2)))
    now = time.time()
    assert lease_state("r-held", leases.read_one(["r-held"]), now, 30) is LeaseState.HELD
    assert lease_state("r-released", leases.read_one(["r-released"]), now, 30) is LeaseState.ABSENT
    assert lease_state("r-never", leases.read_one(["r-never"]), now, 30) is LeaseState.ABSENT
    assert set(leases.read_one(["r-held"]).known) == {"r-held"}  # not the whole bucket
    # The sweep's read of one run still lists the bucket: the others' leases are evidence too.
    assert set(leases.read(["r-held"]).known) == {"r-held", "other"}
    nats_server.stop()
    assert leases.read_one(["r-held"]) is None


def test_a_bucket_the_runners_left_long_ago_proves_nothing(nats_server, monkeypatch) -> None:
    """The fourth review: a bucket created without max_age keeps its delete markers for ever, so a bucket the
    runners wrote once (then moved to another) still had keys under the template, and read as every lease absent.
    Its newest key under the template older than max_silence: every lease unknown, in reads and the preflight."""
    from reaper.stores.nats import NatsOptions, nats_bucket_problem

    asyncio.run(_apply(nats_server.port, [("put", "r1"), ("delete", "r1"), ("put", "r2"), ("delete", "r2")]))
    config = NatsLeaseConfig(timeout=timedelta(seconds=2), max_silence=timedelta(hours=24))
    leases = NatsLeases(url(nats_server.port), config)
    fresh = leases.read()
    assert fresh is not None and fresh.complete and fresh.known == {}  # released today: no lease, and proof of it
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 25 * 3600)  # a day and an hour later, nothing written
    stale = leases.read()
    assert stale is not None and not stale.complete and "max_silence" in stale.problem
    assert lease_state("r1", stale, real() + 25 * 3600, 30) is LeaseState.UNKNOWN
    problem = asyncio.run(nats_bucket_problem(NatsOptions.from_url(url(nats_server.port)), config))
    assert problem and problem.startswith("k8s.nats_leases.max_silence:") and "longer than 1 d" in problem, problem
    # The sixth review: a key stamped ahead of this clock (the server's clock ahead) read as fresh whatever its age.
    monkeypatch.setattr(time, "time", lambda: real() - 40 * 86400)
    ahead = leases.read()
    assert ahead is not None and not ahead.complete and "from now" in ahead.problem
