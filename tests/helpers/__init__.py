"""Helpers the tests share, as plain functions, classes and constants; the fixtures are in ``tests/conftest.py``.

``tests.helpers.gce`` and ``tests.helpers.k8s`` seed the emulators; ``tests.builders`` builds
normalized resources for the policy tests. Each name means one thing across the tests.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pymongo import monitoring

from include.local_postgres import server_url
from reaper.retry import Backoff

ROOT = Path(__file__).resolve().parents[2]  # the repository
# The local PostgreSQL's maintenance database: tests create (and drop) databases of their own there.
POSTGRES_DSN = f"{server_url()}/postgres"


def fast_backoff(retries: int = 4) -> Backoff:
    return Backoff(retries, base=0.01, cap=0.05)


class FindCounter(monitoring.CommandListener):
    """Counts the round trips a MongoDB read costs: every ``find`` and ``getMore`` sent (``commands``), and
    every command but the client's own ``endSessions`` (``every``)."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.every: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("find", "getMore", "aggregate"):
            self.commands.append(event.command_name)
        if event.command_name != "endSessions":
            self.every.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def one_outcome_per_intent(ledger, run_id: str) -> Counter[str]:
    """Asserts that every delete intent of the run has exactly one outcome; the outcomes counted by result."""
    intents = Counter(r["uid"] for r in ledger.ledger.find({"run_id": run_id, "action": "delete_intent"}))
    outcomes = list(ledger.ledger.find({"run_id": run_id, "action": "outcome"}))
    per_uid = Counter(r["uid"] for r in outcomes)
    assert all(per_uid[uid] == 1 for uid in intents), "an intent without exactly one outcome"
    return Counter(r["result"] for r in outcomes)
