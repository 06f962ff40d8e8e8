"""The send guard's stop: SIGTERM halts every send at once, and Airflow's own handler still runs."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

from reaper.fence import SendGuard, halt_on_sigterm


def test_sigterm_halts_the_guard_and_chains_to_the_previous_handler() -> None:
    seen: list[int] = []

    def airflows(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, airflows)
    try:
        guard = SendGuard()
        with halt_on_sigterm(guard):
            assert guard.check() is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.check() == guard.halted == "SIGTERM: the task is being stopped"
        assert seen == [signal.SIGTERM]  # Airflow's handler (on_kill) ran too
        assert signal.getsignal(signal.SIGTERM) is airflows  # the previous handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_deadline_and_the_lease_stop_sends_but_waits_only_on_the_deadline() -> None:
    now = [100.0]
    lease: list[str | None] = [None]
    guard = SendGuard(deadline=110.0, lease=lambda: lease[0], clock=lambda: now[0])
    assert guard.check() is None
    lease[0] = "the sweep lease was released"
    assert guard.check() == "the sweep lease was released" and guard.check(lease=False) is None
    now[0] = 110.0
    assert guard.check(lease=False) == "deadline reached: left for the next sweep"


def test_stop_at_refuses_a_wait_that_ends_past_the_deadline_or_after_a_halt() -> None:
    guard = SendGuard(deadline=110.0, clock=lambda: 100.0)
    assert guard.stop_at(109.9) is None
    assert guard.stop_at(110.0) == "deadline reached: left for the next sweep"
    guard.halt("SIGTERM: the task is being stopped")
    assert guard.stop_at(101.0) == "SIGTERM: the task is being stopped"
    assert SendGuard().stop_at(1e12) is None  # no deadline: the adapters' own tests


def test_no_send_after_an_intent_whose_write_outlasted_the_deadline() -> None:
    now = [100.0]
    written: list[str] = []

    def slow_intent(resource: object) -> None:
        written.append("intent")
        now[0] = 111.0  # the ledger took until past the deadline to acknowledge

    vm = SimpleNamespace(uid="1", scope="p1")
    guard = SendGuard(deadline=110.0, intent=slow_intent, clock=lambda: now[0])
    assert guard.before_send(vm) is None  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
    assert guard.ready(vm) == "deadline reached: left for the next sweep"  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
    assert written == ["intent"]  # recorded, and then not sent: the caller records it unsent
    now[0] = 100.0
    on_time = SendGuard(deadline=110.0, intent=lambda r: None, clock=lambda: now[0])
    assert on_time.before_send(vm) is None and on_time.ready(vm) is None  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource


def test_a_queued_intent_is_waited_for_by_its_own_resource_even_where_a_uid_repeats_across_clusters() -> None:
    # Review finding: acks keyed by uid alone let one cluster's object take another's; a send then went
    # out before its own intent was durable.
    from reaper.commits import Pending

    acks: dict[str, Pending[None]] = {}

    def intent(resource: SimpleNamespace) -> Pending[None]:
        acks[resource.scope] = Pending(5.0)
        return acks[resource.scope]

    guard = SendGuard(intent=intent)
    a, b = SimpleNamespace(scope="cluster-a", uid="same"), SimpleNamespace(scope="cluster-b", uid="same")
    assert guard.before_send(a) is None and guard.before_send(b) is None  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
    acks["cluster-a"].settle(error=ConnectionError("not written"))
    acks["cluster-b"].settle()
    assert guard.ready(b) is None  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
    assert guard.ready(a) == "ledger: intent not recorded (ConnectionError)"  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource


def test_an_earlier_tries_sent_mark_counts_for_its_own_cluster_only_where_a_uid_repeats() -> None:
    # Review finding: sent_before held uids alone, so a sent mark of cluster c0's object made c1's object of the
    # same uid read as sent (a 404 then said deleted, a refused send unconfirmed).
    guard = SendGuard(sent_before={("c0", "u1")})
    mine, other = SimpleNamespace(scope="c0", uid="u1"), SimpleNamespace(scope="c1", uid="u1")
    assert guard.sent_earlier(mine) and not guard.sent_earlier(other)  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
    assert (guard.unsent(mine), guard.unsent(other)) == ("unconfirmed", "not_attempted")  # type: ignore[arg-type]  # a SimpleNamespace stands in for a resource
