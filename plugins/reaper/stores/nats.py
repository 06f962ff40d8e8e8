"""Leases as keys of a NATS JetStream KV bucket: one key listing per sweep, never one get per run.

A key whose latest operation is a put is a held lease (the bucket's TTL expires dead runners'
keys); a deleted or purged key is released. Only a listing that ran to its end (its last key
read) with no error on its connection until then is complete. Any connection, JetStream or timeout
error, and any error the client reports only to its callbacks (a slow consumer drops messages and
says so nowhere else; a connection lost mid-listing), makes every lease unknown: ``None``. An error
after the last key, while the listing unsubscribes, does not: every key was read. A key whose latest operation is
none of these is that run's lease unknown.

Credentials are ``nats.connect`` arguments, never part of a URL, and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict
from urllib.parse import unquote

import nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext

from reaper.config import NatsLeaseConfig
from reaper.durations import duration
from reaper.model import Keyed

log = logging.getLogger(__name__)


# How far ahead of this clock a key's write time may be (the NATS server's clock ahead): beyond, its age is no
# evidence, and the bucket proves nothing (the writers' clocks are uncertain everywhere: reaper.policy ``skew``).
FUTURE = 300.0


class Key(NamedTuple):
    """One key of the bucket as listed: whether its latest operation holds a lease (None: unknown), and when it
    was written (unix seconds, the stream's time)."""

    live: bool | None
    at: float


class ListingBroken(Exception):
    """The client reported an error or lost its connection while the listing ran."""


class ConnectKwargs(TypedDict):
    """The ``nats.connect`` arguments of :meth:`NatsOptions.connect_kwargs`."""

    servers: list[str]
    user: str | None
    password: str | None
    token: str | None


@dataclass(frozen=True)
class NatsOptions:
    """How to reach and authenticate to one connection's NATS servers; ``repr`` shows no secret."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_url(cls, url: str) -> NatsOptions:
        """Servers from a comma-separated URL list; a ``user:password@`` (or ``token@``) part moves out of it."""
        parts = [_split_userinfo(u.strip()) for u in url.split(",")]
        user, password = next(((u, p) for _, u, p in parts if u or p), (None, None))
        servers = tuple(server for server, _, _ in parts)
        if password is None:  # nats-py's reading of a URL: a user without a password is a token
            return cls(servers, token=user)
        return cls(servers, user=user, password=password)

    def connect_kwargs(self) -> ConnectKwargs:
        return {"servers": list(self.servers), "user": self.user, "password": self.password, "token": self.token}

    def redact(self, text: str) -> str:
        """``text`` with every secret of these options blanked out."""
        for secret in (self.password, self.token):
            if secret:
                text = text.replace(secret, "***")
        return text


def _split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its userinfo, and the percent-decoded user and password that were in it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostport = rest.rpartition("@")
    if not at:
        return url, None, None
    user, colon, password = userinfo.partition(":")
    return f"{scheme}{sep}{hostport}", unquote(user) or None, unquote(password) if colon else None


def nats_options(conn_id: str) -> NatsOptions:
    """The servers and credentials of the Airflow connection ``conn_id``.

    The host is a host name (with the port field) or a comma-separated list of ``nats://`` or
    ``tls://`` URLs. Credentials come from login and password, or a token from the extra ``token``
    (or a password without a login); credentials written into a host URL are moved out of it.
    """
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    host = conn.host or "127.0.0.1"
    url = host if "://" in host else f"nats://{host}:{conn.port or 4222}"
    from_url = NatsOptions.from_url(url)
    token = conn.extra_dejson.get("token") or (None if conn.login else conn.password)
    if conn.login or token:
        password = conn.password if conn.login else None
        return NatsOptions(from_url.servers, user=conn.login, password=password, token=token)
    return from_url


def read_timeout(config: NatsLeaseConfig) -> float:
    """The longest one read takes, its connection included: twice ``timeout`` (connecting and listing
    each get ``timeout``), then it is cut and every lease is unknown."""
    return 2 * config.timeout.total_seconds()


class NatsLeases:
    def __init__(self, server: NatsOptions | str, config: NatsLeaseConfig) -> None:
        self.options = server if isinstance(server, NatsOptions) else NatsOptions.from_url(server)
        self.config = config
        self.prefix, self.suffix = config.key_template.split("{run}")

    def read(self, keys: list[str] | None = None) -> Keyed[float | None] | None:
        """Every held lease: one listing answers for all runs, whichever ``keys`` the sweep asks about.

        The whole bucket, also for one key: a sweep whose listing names a single run must still see the other
        runs' leases (a run label every sandbox shares names one run, which only the others' leases expose:
        reaper.policy.k8s ``cross_checked``) and a bucket whose keys are not of the template."""
        return self._read(None)

    def read_one(self, keys: list[str]) -> Keyed[float | None] | None:
        """The re-read right before a run's delete: only that run's key (``keys``: that one), with the same rules."""
        return self._read(self.config.key_template.replace("{run}", keys[0]) if len(keys) == 1 else None)

    def _read(self, only: str | None) -> Keyed[float | None] | None:
        timeout = self.config.timeout.total_seconds()
        try:
            listed = asyncio.run(asyncio.wait_for(self._keys(timeout, only), read_timeout(self.config)))
        except Exception as exc:
            reason = self.options.redact(str(exc))
            log.warning("NATS leases unreadable, every lease unknown: %s: %s", type(exc).__name__, reason)
            return None
        problem = self.template_problem(listed, time.time()) if only is None else ""
        if problem:
            log.warning("%s", problem)
            return Keyed(complete=False, problem=problem)  # every lease unknown
        runs = {run: key.live for name, key in listed.items() if (run := self._run(name)) is not None}
        known: dict[str, float | None] = {run: None for run, live in runs.items() if live}
        return Keyed(known=known, failed=frozenset(run for run, live in runs.items() if live is None), complete=True)

    def template_problem(self, listed: dict[str, Key], now: float) -> str:
        """Why a whole bucket's keys prove nothing: there are none, none is a run's lease under the template, or the
        newest of those was written longer than ``max_silence`` before ``now`` (a bucket the runners left).

        The bucket is then not the one the runners write (a typo in ``bucket``, a bucket made by hand and never
        written), or the template not theirs, and its silence would read as every lease absent (docs/design.md
        §5: a source proves it is the right one before its silence counts; an empty Mongo lease collection is
        unknown alike). A bucket the runners use holds keys: a lease, or the delete marker a finished run's
        ``kv.delete`` leaves, until the bucket's ``max_age`` expires it. Only a fleet idle for that long empties it.
        """
        if not listed:
            return (
                f"k8s.nats_leases.bucket: bucket {self.config.bucket} holds no key (no lease, no delete marker): "
                "nothing shows the runners write it: every lease unknown"
            )
        written = [key.at for name, key in listed.items() if self._run(name) is not None]
        if not written:
            return (
                f"k8s.nats_leases.key_template: {len(listed)} keys in bucket {self.config.bucket}, none of the form "
                f"{self.config.key_template!r}: every lease unknown"
            )
        newest, silence = max(written), self.config.max_silence.total_seconds()
        if newest > now + FUTURE:
            return (
                f"k8s.nats_leases.max_silence: the newest lease key in bucket {self.config.bucket} was written "
                f"{duration(newest - now)} from now (the NATS server's clock ahead of this one's): its age "
                "proves nothing: every lease unknown"
            )
        if now - newest > silence:
            return (
                f"k8s.nats_leases.max_silence: the newest lease key in bucket {self.config.bucket} was written "
                f"{duration(now - newest)} ago, longer than {duration(silence)}: nothing shows the runners "
                "still write it: every lease unknown"
            )
        return ""

    def _run(self, key: str) -> str | None:
        """The run whose lease ``key`` is: the template exactly, around a non-empty run key."""
        if len(key) > len(self.prefix) + len(self.suffix) and key.startswith(self.prefix) and key.endswith(self.suffix):
            return key[len(self.prefix) : len(key) - len(self.suffix)]
        return None

    async def _keys(self, timeout: float, only: str | None) -> dict[str, Key]:
        """Every key of the bucket (or just ``only``), whether it is live and when it was written, or an exception
        as soon as the client reports an error."""
        errors: list[str] = []
        broken = asyncio.Event()
        done = asyncio.Event()  # the listing caught up, or the client reported an error

        async def on_error(exc: Exception) -> None:
            errors.append(type(exc).__name__)
            broken.set()
            done.set()

        async def on_lost() -> None:
            errors.append("connection lost")
            broken.set()
            done.set()

        client = await nats.connect(
            **self.options.connect_kwargs(),
            connect_timeout=timeout,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=on_error,
            disconnected_cb=on_lost,
            closed_cb=on_lost,
        )
        try:
            js = client.jetstream(timeout=timeout)
            listing = asyncio.ensure_future(_list_bucket(js, self.config.bucket, only, done))
            alarm = asyncio.ensure_future(broken.wait())
            await asyncio.wait({listing, alarm}, return_when=asyncio.FIRST_COMPLETED)
            alarm.cancel()
            if errors:
                listing.cancel()
                await asyncio.gather(listing, return_exceptions=True)
                raise ListingBroken(", ".join(dict.fromkeys(errors)))
            return listing.result()
        finally:
            await client.close()


async def _list_bucket(js: JetStreamContext, bucket: str, only: str | None, done: asyncio.Event) -> dict[str, Key]:
    """Each key of ``bucket`` (or the one key ``only``) and its latest operation, from one headers-only
    pass over its last messages.

    Done when a message says nothing more is pending, or at once when the consumer had nothing to
    deliver at all. Not nats-py's ``kv.keys()``: it takes the bucket for empty when its consumer info
    (nothing pending) overtakes the messages already on their way, and lists nothing. It also stops
    waiting once the client reported an error (the caller sets ``done`` too, and discards what was
    read: every lease unknown): a cancellation alone can be lost while the consumer info request is
    answered (seen about one read in ten under a slow-consumer flood: the task cancelled, yet still
    waiting for the last key until the read's timeout).
    """
    prefix = f"$KV.{bucket}."
    latest: dict[str, Key] = {}

    async def on_message(msg: Msg) -> None:
        # The metadata's timestamp is the message's in the stream: when its key was last written.
        latest[msg.subject.removeprefix(prefix)] = Key(_live(msg.headers), msg.metadata.timestamp.timestamp())
        if msg.metadata.num_pending == 0:
            done.set()

    sub = await js.subscribe(
        f"{prefix}{only}" if only else f"{prefix}>",
        stream=f"KV_{bucket}",
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        headers_only=True,
    )
    try:
        info = await sub.consumer_info()
        if info.num_pending != 0 or info.delivered is None or info.delivered.consumer_seq != 0:
            await done.wait()
        return dict(latest)
    finally:
        # On a connection the caller is closing (a client error), unsubscribing fails: nothing to undo.
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()


def _live(headers: dict[str, str] | None) -> bool | None:
    """A put is live, a delete or purge (or the server's expiry marker) is not; anything else is unknown."""
    operation = (headers or {}).get("KV-Operation")
    marker = (headers or {}).get("Nats-Marker-Reason")
    if operation is None and marker is None:
        return True
    if operation in ("DEL", "PURGE") or marker in ("MaxAge", "Purge", "Remove"):
        return False
    return None


async def nats_bucket_problem(options: NatsOptions, config: NatsLeaseConfig) -> str | None:
    """Why the leases' KV bucket proves nothing (no server, no such bucket, or what :meth:`NatsLeases.template_problem`
    says, which names its config key first), or ``None``: the preflight.

    Either makes every lease unknown, so nothing is reaped; this says so before the first sweep does.
    """
    timeout = config.timeout.total_seconds()
    try:
        client = await nats.connect(
            **options.connect_kwargs(), connect_timeout=timeout, allow_reconnect=False, max_reconnect_attempts=0
        )
    except Exception as exc:
        return f"no NATS server answers at {', '.join(options.servers)} ({type(exc).__name__})"
    try:
        info = await client.jetstream(timeout=timeout).stream_info(f"KV_{config.bucket}")
    except nats.js.errors.NotFoundError:
        return f"no JetStream KV bucket {config.bucket} at {', '.join(options.servers)}: every lease would be unknown"
    except Exception as exc:
        return f"the bucket {config.bucket} could not be read ({type(exc).__name__}: {options.redact(str(exc))})"
    finally:
        await client.close()
    leases = NatsLeases(options, config)
    if not info.state.messages:  # nothing there: nothing shows the runners write it
        return leases.template_problem({}, time.time())
    listed = await asyncio.wait_for(leases._keys(timeout, None), read_timeout(config))
    return leases.template_problem(listed, time.time()) or None
