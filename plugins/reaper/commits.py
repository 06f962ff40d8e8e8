"""Group commit: the ledger records of concurrent deletes written together, each still acknowledged before it counts.

A delete writes three records (its intent, its sent mark, its outcome) and reads the sweep lease before its
send (docs/design.md §6, §7). One command each would be four ledger round trips per delete, made one at a
time by every delete thread, to a store that slows as it grows. Here the records that the delete threads
have waiting go out as one acknowledged bulk write every ``interval`` (at once when ``most`` are waiting),
and the lease checks asked for meanwhile are answered by one lease read made after that write: a cycle of
at most two round trips, whatever the number of deletes in it.

What each delete depends on stays as strict as one write at a time (:class:`reaper.fence.SendGuard` waits):
its send waits for its intent's acknowledgement and for a lease read that began after it asked; its outcome
counts when it is acknowledged; a failed write fails every record of its cycle and stops all sends at once
(``failed``). The lease lives in another collection than the records, and a bulk write names one
collection: so the lease check shares the cycle, not the command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

from reaper.records import Document, LedgerRecord, document

T = TypeVar("T")
Record = Document  # a record as the ledger writes it (reaper.records.document)


class Pending(Generic[T]):
    """What one cycle will answer: the acknowledgement of a record, or the lease read's result."""

    def __init__(self, timeout: float) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._timeout = timeout

    def settle(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def wait(self) -> T | None:
        """The answer; raises the cycle's error, or :class:`TimeoutError` when no cycle answered in time."""
        if not self._done.wait(self._timeout):
            raise TimeoutError(f"no ledger acknowledgement within {self._timeout:.0f}s")
        if self._error is not None:
            raise self._error
        return self._value


def wait_bound(ledger_timeout: float, interval: float, reads: int = 1) -> float:
    """How long a record or a lease check may wait with every ledger call within ``ledger_timeout``: the cycle in
    progress when it came, then the interval and its own cycle, each cycle a write and the lease's ``reads``
    (the sweep lease; under an approval, the approval too)."""
    return 2 * (1 + reads) * ledger_timeout + interval


class GroupCommit:
    """One writer thread that commits the records handed to it in groups, and reads the lease for those who ask.

    - ``write(records)``: one acknowledged bulk write (upserts by the record's key); raises if not acknowledged.
    - ``lease()``: why the sweep lease does not cover this task now, or None.
    - ``key(record)``: the record's identity (its fence): two records of one key in a cycle are merged in
      the order they came, as two upserts one after the other would leave the document.
    - ``failed(error, records)``: called at once when a cycle's write (its records) or lease read (none) fails,
      before anyone waiting hears of it.
    - ``interval``: seconds the first waiting record waits for others; ``most``: as many waiting send at once.
    - ``timeout``: how long a caller waits for its answer: at least the cycle in progress and its own, each a
      write and a lease read bounded by the ledger's timeout (:func:`wait_bound`).
    """

    def __init__(
        self,
        write: Callable[[list[Record]], object],
        lease: Callable[[], str | None],
        key: Callable[[Record], Hashable],
        failed: Callable[[BaseException, list[Record]], None],
        *,
        interval: float,
        most: int,
        timeout: float,
    ) -> None:
        self._write, self._lease, self._key, self._failed = write, lease, key, failed
        self.interval, self.most, self.timeout = interval, most, timeout
        self._cond = threading.Condition()
        self._records: list[tuple[Record, Pending[None]]] = []
        self._asks: list[Pending[str]] = []
        self._since = 0.0  # when the oldest waiting record or ask came
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ledger-commit", daemon=True)
        self._thread.start()

    def __enter__(self) -> GroupCommit:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(self, records: Iterable[LedgerRecord | Mapping[str, object]]) -> Pending[None]:
        """Queue records for the next cycle, encoded now (a cycle merges them as documents); their
        acknowledgement, which the caller waits for before what depends on them."""
        ack: Pending[None] = Pending(self.timeout)
        docs = [document(r) for r in records]  # outside the lock: the writer thread waits on it
        with self._cond:
            if self._closed:
                raise RuntimeError("the group commit is closed")
            self._arrive()
            self._records.extend((d, ack) for d in docs)
            self._cond.notify()
        return ack

    def lease_problem(self) -> str | None:
        """Why the sweep lease does not cover this task, from a read made after this call and after the
        records queued before it are written. A failed read or write is a reason too (and ``failed`` is told)."""
        ask: Pending[str] = Pending(self.timeout)
        with self._cond:
            if self._closed:
                raise RuntimeError("the group commit is closed")
            self._arrive()
            self._asks.append(ask)
            self._cond.notify()
        try:
            return ask.wait()
        except TimeoutError as exc:  # a ledger too slow to answer is an outage: every send stops
            self._failed(exc, [])
            return f"ledger: no answer about the sweep lease within {self.timeout:g}s"

    def close(self) -> None:
        """Write what is waiting, then stop the writer thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _arrive(self) -> None:
        if not self._records and not self._asks:
            self._since = time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._records and not self._asks and not self._closed:
                    self._cond.wait()
                if not self._records and not self._asks:
                    return  # closed, nothing left
                while not self._closed and len(self._records) < self.most:
                    left = self._since + self.interval - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                records, self._records = self._records, []
                asks, self._asks = self._asks, []
            self._cycle(records, asks)

    def _cycle(self, records: list[tuple[Record, Pending[None]]], asks: list[Pending[str]]) -> None:
        """One bulk write of the records, then one lease read for the asks; each answered, every error told."""
        try:
            if records:
                merged: dict[Hashable, Record] = {}
                for record, _ in records:
                    key = self._key(record)
                    merged[key] = {**merged.get(key, {}), **record}
                self._write(list(merged.values()))
        except BaseException as exc:  # every waiter must hear of it, whatever it is
            self._failed(exc, [record for record, _ in records])
            told = exc if isinstance(exc, Exception) else RuntimeError(f"the ledger write stopped: {exc!r}")
            for _, ack in records:
                ack.settle(error=told)
            for ask in asks:  # a lease check behind a failed write: nothing may be sent on it
                ask.settle(f"ledger: a write failed ({type(exc).__name__})")
            return
        for _, ack in records:
            ack.settle()
        if asks:
            try:
                problem = self._lease()
            except BaseException as exc:
                self._failed(exc, [])  # a ledger that cannot be read is an outage: every send stops
                problem = f"ledger: the sweep lease could not be read ({type(exc).__name__})"
            for ask in asks:
                ask.settle(problem)
