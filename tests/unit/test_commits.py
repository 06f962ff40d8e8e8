"""Group commit: concurrent records share writes, each is acknowledged before it counts, a failure stops all."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.commits import GroupCommit


class Store:
    """A ledger's write and lease read, counted, in the order they happened."""

    def __init__(self, fail_writes: int = 0) -> None:
        self.calls: list[tuple[str, object]] = []
        self.docs: dict[Any, dict[str, object]] = {}  # by each record's "id"
        self.fail_writes = fail_writes
        self.lease: str | None = None
        self.lock = threading.Lock()

    def write(self, records: list[dict[str, object]]) -> int:
        with self.lock:
            self.calls.append(("write", [r["id"] for r in records]))
            if self.fail_writes:
                self.fail_writes -= 1
                raise ConnectionError("the ledger is gone")
            for r in records:
                self.docs[r["id"]] = {**self.docs.get(r["id"], {}), **r}
        return len(records)

    def read(self) -> str | None:
        with self.lock:
            self.calls.append(("lease", None))
            return self.lease

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


def commits(
    store: Store,
    failures: list[BaseException] | None = None,
    interval: float = 0.02,
    most: int = 64,
    lease: Callable[[], str | None] | None = None,
    timeout: float = 5.0,
) -> GroupCommit:
    """A group commit over ``store`` (its lease read unless ``lease`` is given), its failures told to ``failures``."""
    return GroupCommit(
        store.write,
        lease or store.read,
        key=lambda r: r["id"],
        failed=lambda exc, records: (failures if failures is not None else []).append(exc),
        interval=interval,
        most=most,
        timeout=timeout,
    )


def test_records_of_concurrent_deletes_share_one_write_and_lease_checks_one_read() -> None:
    store = Store()
    barrier = threading.Barrier(8)
    with commits(store, interval=0.05) as group:

        def one(i: int) -> str | None:
            barrier.wait()
            group.submit([{"id": i}]).wait()
            return group.lease_problem()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(store.docs) == list(range(8))
    assert store.kinds().count("write") <= 2 and store.kinds().count("lease") <= 2  # 16 commands one at a time


def test_an_acknowledgement_comes_only_after_the_write_and_a_lease_answer_only_from_a_later_read() -> None:
    store = Store()
    with commits(store) as group:
        ack = group.submit([{"id": 1}])
        assert ack.wait() is None and store.calls == [("write", [1])]
        store.lease = "the sweep lease is held by another"
        # Asked after the lease changed: the answer is a read made after the question, never an earlier one.
        assert group.lease_problem() == "the sweep lease is held by another"
        assert store.kinds() == ["write", "lease"]


def test_most_records_waiting_go_at_once_without_the_interval() -> None:
    store = Store()
    with commits(store, interval=30.0, most=3) as group:
        started = time.monotonic()
        acks = [group.submit([{"id": i}]) for i in range(3)]
        for ack in acks:
            ack.wait()
        assert time.monotonic() - started < 5.0


def test_a_failed_write_fails_every_record_of_its_cycle_tells_at_once_and_answers_no_lease_check() -> None:
    store = Store(fail_writes=1)
    failures: list[BaseException] = []
    with commits(store, failures, interval=0.05) as group:
        acks = [group.submit([{"id": i}]) for i in range(3)]
        problem = group.lease_problem()
        for ack in acks:
            with pytest.raises(ConnectionError):
                ack.wait()
        assert problem == "ledger: a write failed (ConnectionError)"  # nothing is sent on it
        assert len(failures) == 1 and "lease" not in store.kinds()
        assert group.submit([{"id": 9}]).wait() is None  # the next cycle writes again: outcomes of what is left
    assert list(store.docs) == [9]


def test_a_lease_that_cannot_be_read_is_a_reason_not_to_send_and_an_outage() -> None:
    store = Store()
    failures: list[BaseException] = []

    def unreadable() -> str | None:
        raise TimeoutError("no answer")

    with commits(store, failures, interval=0.0, most=1, lease=unreadable) as group:
        assert group.lease_problem() == "ledger: the sweep lease could not be read (TimeoutError)"
    assert len(failures) == 1


def test_close_writes_what_is_waiting() -> None:
    store = Store()
    group = commits(store, interval=30.0)
    ack = group.submit([{"id": 1}])
    group.close()
    assert ack.wait() is None and store.docs == {1: {"id": 1}}
    with pytest.raises(RuntimeError):
        group.submit([{"id": 2}])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["intent", "sent", "outcome"])), max_size=30))
def test_records_of_one_key_merged_in_a_cycle_leave_what_writing_them_one_by_one_leaves(
    records: list[tuple[int, str]],
) -> None:
    """Upserts by key, each setting its fields: a group commit must never reorder two records of one key."""
    one_by_one: dict[int, dict[str, object]] = {}
    for n, (key, field) in enumerate(records):
        one_by_one[key] = {**one_by_one.get(key, {}), "id": key, field: n, "last": n}
    store = Store()
    with commits(store, interval=60.0, most=len(records) or 1) as group:
        acks = [group.submit([{"id": key, field: n, "last": n}]) for n, (key, field) in enumerate(records)]
        for ack in acks:
            ack.wait()
    assert store.docs == one_by_one


def test_a_lease_check_unanswered_in_time_is_a_reason_not_to_send_and_an_outage() -> None:
    # Review finding: the wait's TimeoutError escaped the guard, and the other threads went on sending.
    failures: list[BaseException] = []
    release = threading.Event()

    def slow() -> str | None:
        release.wait(5.0)
        return None

    group = commits(Store(), failures, interval=0.0, most=1, lease=slow, timeout=0.2)
    try:
        assert group.lease_problem() == "ledger: no answer about the sweep lease within 0.2s"
        assert [type(f) for f in failures] == [TimeoutError]
    finally:
        release.set()
        group.close()


def test_the_wait_bound_covers_the_cycle_in_progress_and_its_own() -> None:
    from reaper.commits import wait_bound

    assert wait_bound(10.0, 0.01) == pytest.approx(40.01)  # two cycles, each a write and a lease read
    assert wait_bound(10.0, 0.01, reads=2) == pytest.approx(60.01)  # and the approval read under an approval
