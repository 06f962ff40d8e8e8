"""The per-target sweep lease (docs/design.md §6): one sweep of a target at a time, fenced by a token.

It lives in the ledger's database (``ledger.locks_collection``), on the ledger's client and its write and read
concerns, so that taking it, checking it before each send and writing the intent all read one majority-committed
state; only its operations are here. A delete path reaches it as :attr:`reaper.ledger.Ledger.sweep_lease`.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from reaper.stores.mongo import Document


class SweepLease:
    """The sweep lease of every target, one document per target in ``locks`` (its ``_id`` the target)."""

    def __init__(self, locks: Collection[Document]) -> None:
        self.locks = locks

    def acquire(self, target: str, holder: str, ttl: timedelta) -> dict[str, object] | None:
        """Take the target's sweep lease for ``holder``; None if another holds it.

        The lease is fenced: it carries a token, new at every acquisition, that a plan is stamped
        with and every send checks (:meth:`lease_problem`). Even the same holder taking it again
        gets a new token: only ``resolve_scopes`` acquires, before anything has used the token, and
        a cleared ``resolve_scopes`` is a new execution whose old plans must not run.
        """
        now = time.time()
        try:
            lease = self.locks.find_one_and_update(
                {"_id": target, "$or": [{"holder": holder}, {"expires_at": {"$lt": now}}]},
                [
                    {
                        "$set": {
                            "token": uuid.uuid4().hex,
                            "holder": holder,
                            "expires_at": now + ttl.total_seconds(),
                        }
                    }
                ],
                upsert=True,
                return_document=ReturnDocument.AFTER,
            )
        except DuplicateKeyError:
            return None  # held by another, unexpired: the upsert collided with it
        assert lease is not None  # an upsert answering with the document after it always has one
        return {"holder": lease["holder"], "token": lease["token"], "expires_at": float(lease["expires_at"])}

    def holder(self, target: str) -> str | None:
        """Who holds the target's sweep lease now (expired or not), or None."""
        lease = self.locks.find_one({"_id": target})
        return str(lease.get("holder")) if lease else None

    def lease_problem(self, target: str, holder: str, token: str) -> str | None:
        """Why the target's sweep lease does not cover ``holder`` with ``token`` right now, or None."""
        lease = self.locks.find_one({"_id": target})
        if lease is None:
            return "the sweep lease was released"
        if lease.get("holder") != holder or lease.get("token") != token:
            return f"the sweep lease is held by {lease.get('holder')} under another token"
        if float(lease.get("expires_at", 0)) <= time.time():
            return "the sweep lease has expired"
        return None

    def release(self, target: str, holder: str) -> None:
        self.locks.delete_one({"_id": target, "holder": holder})
