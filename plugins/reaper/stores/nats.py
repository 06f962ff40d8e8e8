"""Leases as keys of a NATS JetStream KV bucket: one key listing per sweep, never one get per run.

A key present is a held lease (the bucket's TTL expires dead runners' keys). Any
connection, JetStream or timeout error makes every lease unknown: ``None``.
"""

from __future__ import annotations

import asyncio
import logging

import nats
from nats.js.errors import NoKeysError

from reaper.config import NatsLeaseConfig
from reaper.model import Keyed

log = logging.getLogger(__name__)


def nats_url(conn_id: str) -> str:
    """The server URL of the Airflow connection ``conn_id`` (host and port, or a nats:// URL as host)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.host and "://" in conn.host:
        return conn.host
    return f"nats://{conn.host or '127.0.0.1'}:{conn.port or 4222}"


class NatsLeases:
    def __init__(self, url: str, config: NatsLeaseConfig) -> None:
        self.url, self.config = url, config
        self.prefix, self.suffix = config.key_template.split("{run}")

    def read(self, keys: object = None) -> Keyed[float | None] | None:
        """Every held lease (``keys`` is ignored: one listing answers for all runs)."""
        timeout = self.config.timeout.total_seconds()
        try:
            keys = asyncio.run(asyncio.wait_for(self._keys(timeout), timeout * 2))
        except Exception as exc:
            log.warning("NATS leases unreadable, every lease unknown: %s: %s", type(exc).__name__, exc)
            return None
        runs = {
            key[len(self.prefix) : len(key) - len(self.suffix)]: None
            for key in keys
            if key.startswith(self.prefix) and key.endswith(self.suffix)
        }
        return Keyed(known=runs, complete=True)

    async def _keys(self, timeout: float) -> list[str]:
        client = await nats.connect(self.url, connect_timeout=timeout, allow_reconnect=False, max_reconnect_attempts=0)
        try:
            kv = await client.jetstream(timeout=timeout).key_value(self.config.bucket)
            try:
                return await kv.keys()
            except NoKeysError:
                return []
        finally:
            await client.close()
