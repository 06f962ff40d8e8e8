"""The runners' side of an emulated cluster: run records in MongoDB and run leases, for the sandboxes of
``python -m include.emulators.k8s --generate RUNS``.

``python -m include.emulators.runs --generate RUNS --mongo-url URL [--nats-url URL]`` writes, for the
emulator's runs ``run-000000``, ``run-000001``, ... in turn (run ``r`` is of kind ``r % 5``):

- 0, 1: **live**: run record ``running``, lease held (kept);
- 2: **finished**: run record ``succeeded``, no lease (an orphan: reported, deleted by enforcement);
- 3: **vanished**: no run record, no lease (an orphan too);
- 4: **crashed**: run record ``running``, no lease (the runner died mid-run: reported, never deleted).

So two runs in five are orphans, under the budget's default ``max_stale_fraction`` (0.5).
Run records go to ``iterion.runs`` (``k8s.mongo_run_store`` defaults, replaced whole). Leases go
to the NATS JetStream KV bucket ``run_leases`` (``k8s.nats_leases`` defaults), which is created
when absent (without a TTL: the leases stay held until deleted), or, without ``--nats-url``, to
``iterion.run_leases`` in MongoDB (``k8s.lease_source: mongo``, ``expires_at`` null: no expiry). Both stores are waited
for (``--wait``, seconds) before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from pymongo import MongoClient

RUN_KEY = "run-{:06d}"  # the run keys of include/emulators/k8s's --generate (it formats them with this)
KINDS = ("live", "live", "finished", "vanished", "crashed")
STATUS = {"live": "running", "finished": "succeeded", "vanished": None, "crashed": "running"}


@dataclass(frozen=True)
class Runs:
    """What the runner side says of each run: its record's status (``None``: no record) and its lease."""

    status: dict[str, str | None]
    leased: list[str]

    def records(self) -> list[dict[str, Any]]:
        return [{"_id": run, "status": status} for run, status in self.status.items() if status]


def generated_runs(count: int) -> Runs:
    """Runs ``0 .. count-1`` of the K8s emulator's ``--generate``, each of kind ``KINDS[r % 5]``."""
    kinds = {RUN_KEY.format(r): KINDS[r % len(KINDS)] for r in range(count)}
    return Runs({run: STATUS[kind] for run, kind in kinds.items()}, [run for run, k in kinds.items() if k == "live"])


def _replace(client: MongoClient, database: str, collection: str, documents: list[dict[str, Any]]) -> None:
    """The collection's documents, all of them replaced by ``documents``."""
    store = client[database][collection]
    store.delete_many({})
    if documents:
        store.insert_many(documents)


def write_runs(client: MongoClient, runs: Runs, database: str = "iterion", collection: str = "runs") -> None:
    """Replace the run store's records with ``runs``'."""
    _replace(client, database, collection, runs.records())


def write_mongo_leases(
    client: MongoClient, runs: Runs, database: str = "iterion", collection: str = "run_leases"
) -> None:
    """Replace the Mongo lease collection's documents with one held lease per leased run: ``expires_at`` null,
    held until the document is removed (a lease document carries the field; the reaper proves the
    collection by it, docs/design.md §5)."""
    _replace(client, database, collection, [{"_id": run, "expires_at": None} for run in runs.leased])


async def put_nats_leases(url: str, runs: Runs, bucket: str = "run_leases", timeout: float = 10) -> None:
    """Put one key per leased run in ``bucket``, creating the bucket when absent (an existing one is kept
    as it is: the runners own it)."""
    import nats
    from nats.js.api import KeyValueConfig
    from nats.js.errors import BucketNotFoundError

    client = await nats.connect(url, connect_timeout=timeout, allow_reconnect=False)
    try:
        js = client.jetstream(timeout=timeout)
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await js.create_key_value(KeyValueConfig(bucket=bucket))
        for run in runs.leased:
            await kv.put(run, b"runner")
    finally:
        await client.close()


def _retry(action, what: str, wait: float):
    """``action()`` until it succeeds or ``wait`` seconds have passed: the servers may still be starting."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return action()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"runs: {what} unreachable after {wait:g} s: {exc}") from None
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", type=int, required=True, metavar="RUNS", help="as given to the K8s emulator")
    parser.add_argument("--mongo-url", required=True, help="e.g. mongodb://127.0.0.1:27017/")
    parser.add_argument("--nats-url", help="e.g. nats://127.0.0.1:4222 (else leases in MongoDB)")
    parser.add_argument("--bucket", default="run_leases", help="the NATS KV bucket (k8s.nats_leases.bucket)")
    parser.add_argument("--wait", type=float, default=30, help="seconds to wait for MongoDB and NATS")
    args = parser.parse_args()

    runs = generated_runs(args.generate)
    client: MongoClient[dict[str, Any]] = MongoClient(args.mongo_url, serverSelectionTimeoutMS=2000)
    _retry(lambda: write_runs(client, runs), "MongoDB", args.wait)
    if args.nats_url:
        _retry(lambda: asyncio.run(put_nats_leases(args.nats_url, runs, args.bucket)), "NATS", args.wait)
        where = f"NATS KV bucket {args.bucket}"
    else:
        write_mongo_leases(client, runs)
        where = "MongoDB iterion.run_leases"
    client.close()
    print(f"{len(runs.records())} run records in MongoDB iterion.runs, {len(runs.leased)} leases in {where}")


if __name__ == "__main__":
    main()
