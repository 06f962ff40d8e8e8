"""What must hold at the instant a delete is sent, and where its intent and outcome go (docs/design.md §6 and §7).

Both deleters ask a :class:`SendGuard` before every send: the sweep has not been
told to stop (SIGTERM), its deadline has not passed, and it still holds the
target's sweep lease under the token its plan was made with. The guard then
makes the intent durable (if that fails, nothing is sent) and takes each outcome
as it is observed, so a task killed mid-batch loses nothing it saw. The default
guard permits everything and records nothing: what the adapters' own tests use.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from types import FrameType
from typing import Protocol

from reaper.model import Resource
from reaper.vocabulary import Result


class Halted(Exception):
    """Raised inside a send when the guard no longer permits it; never retried."""


class Ack(Protocol):
    """A record queued for a group commit (:class:`reaper.commits.Pending`): ``wait`` raises if not durable."""

    def wait(self) -> object: ...


# A sink of intents, sent marks and outcomes: writes at once (returns None) or queues and returns its Ack.
Sink = Callable[..., "Ack | None"]


class SendGuard:
    """The conditions of one delete task's sends, and the sink of its intents and outcomes.

    - ``deadline``: unix seconds after which nothing is sent (the run's timeout and the lease's
      expiry, less a margin that covers one request and one ledger write).
    - ``lease``: returns why the sweep lease no longer covers this task, or None.
    - ``intent(resource)``: makes the intent durable; raising means the delete must not be sent.
    - ``sent(resource)``: records that the delete call went out and was accepted.
    - ``outcome(resource, result, detail)``: records one outcome as it is observed.
    - ``sent_before``: (scope, uid) of the resources whose delete call an earlier try of this execution
      made (it recorded ``sent``): a 404 for one of those is this sweep's own delete, so ``deleted``. Keyed
      by scope too: two clusters' objects may share a uid.

    The three sinks either write before they return, or queue the record for a group commit
    (:mod:`reaper.commits`) and return its :class:`Ack`. Then the guard waits for each where what
    follows depends on it: an intent before its send (:meth:`before_send`, :meth:`ready`), a sent
    mark before a retry of its send, every record before the batch's counts (:meth:`settle`). A
    failed record halts the task as a failed write does.
    """

    def __init__(
        self,
        deadline: float | None = None,
        lease: Callable[[], str | None] | None = None,
        intent: Sink | None = None,
        outcome: Sink | None = None,
        sent: Sink | None = None,
        sent_before: Collection[tuple[str, str]] = frozenset(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.deadline, self._lease, self._intent, self._outcome, self._sent = deadline, lease, intent, outcome, sent
        self.sent_before = frozenset(sent_before)
        self.clock = clock
        self._stop = threading.Event()
        self._why = ""
        self._lock = threading.Lock()
        # Records queued and not yet waited for: intents and sent marks by (scope, uid) (a uid alone may repeat
        # across clusters), outcomes in order.
        self._intents: dict[tuple[str, str], Ack] = {}
        self._sent_marks: dict[tuple[str, str], list[Ack]] = {}
        self._outcomes: list[Ack] = []

    def halt(self, why: str) -> None:
        """Stop sending at once (SIGTERM, a failed ledger write); the first reason is kept."""
        with self._lock:
            if not self._stop.is_set():
                self._why = why
                self._stop.set()

    @property
    def halted(self) -> str:
        return self._why if self._stop.is_set() else ""

    def check(self, lease: bool = True) -> str | None:
        """Why nothing may be sent now, or None; ``lease=False`` for waits, which send nothing."""
        if self._stop.is_set():
            return self._why
        if self.deadline is not None and self.clock() >= self.deadline:
            return "deadline reached: left for the next sweep"
        return self._lease() if lease and self._lease else None

    def stop_at(self, at: float) -> str | None:
        """Why nothing may be done at unix time ``at`` (a retry's or a wait's end), or None.

        What :class:`reaper.retry.Backoff` asks before it sleeps: every call between the plan and the
        send, and every wait after it, stops when the run must stop (docs/design.md §6).
        """
        if self._stop.is_set():
            return self._why
        if self.deadline is not None and at >= self.deadline:
            return "deadline reached: left for the next sweep"
        return None

    def pause(self, seconds: float) -> None:
        """Sleep, cut short by :meth:`halt` (a SIGTERM): a task told to stop does not sit out a quota's minute."""
        self._stop.wait(seconds)

    def unsent(self, resource: Resource) -> Result:
        """The result of a resource this try stops before its send: ``not_attempted``, unless an earlier
        try's delete call for it went out (its answer lost): then it may have been applied, ``unconfirmed``."""
        return Result.UNCONFIRMED if self.sent_earlier(resource) else Result.NOT_ATTEMPTED

    def sent_earlier(self, resource: Resource) -> bool:
        """Whether an earlier try of this execution made this resource's delete call."""
        return _key(resource) in self.sent_before

    def before_send(self, resource: Resource) -> str | None:
        """Stop and deadline, then queue the delete's intent; None: go on, and call :meth:`ready` right before the
        send. A failed submit halts the task.

        The intent is only queued: its write overlaps what comes before the send (GCE's re-read), and
        :meth:`ready` asks for the lease read that the same commit cycle (or a later one) makes after writing
        it, so intent and lease cost one cycle. An intent the lease then refuses is this execution's record of
        a send that never went out (``not_attempted``).
        """
        why = self.check(lease=False)
        if why:
            return why
        if self._intent:
            try:
                ack = self._intent(resource)
            except Exception as exc:
                self.halt(f"ledger: intent not recorded ({type(exc).__name__})")
                return self._why
            if ack is not None:
                with self._lock:
                    self._intents[_key(resource)] = ack
        return None

    def ready(self, resource: Resource) -> str | None:
        """Right before the send: its intent durable, the lease read now, the deadline not passed; or why not.

        The lease read is asked for first: a group commit answers it in the cycle that writes the intent
        queued before it (or a later one). The write or the wait may have taken until past the deadline
        (or a SIGTERM came): nothing is sent then.
        """
        why = self.check()
        with self._lock:
            ack = self._intents.pop(_key(resource), None)
        if ack is not None and not self._settled(ack, "intent"):
            return self._why
        return why or self.check(lease=False)

    def retry(self, resource: Resource) -> None:
        """Before a retry of a send whose answer was lost: the first try may have been applied (it is
        recorded as sent), and the retry is a new send (raise :class:`Halted` unless it may go out now)."""
        self.sent(resource)
        with self._lock:
            marks = self._sent_marks.pop(_key(resource), [])
        for ack in marks:
            self._settled(ack, "delete call")
        why = self.check()
        if why:
            raise Halted(why)

    def sent(self, resource: Resource) -> None:
        """The delete call was accepted: a later 404 for this resource is this sweep's own doing."""
        if self._sent:
            try:
                ack = self._sent(resource)
            except Exception as exc:
                self.halt(f"ledger: delete call not recorded ({type(exc).__name__})")
                return
            if ack is not None:
                with self._lock:
                    self._sent_marks.setdefault(_key(resource), []).append(ack)

    def record(self, resource: Resource, result: str, detail: str) -> None:
        """Record one outcome; a failed write halts the task (its intents stay for the retry).

        Queued, it is not waited for here: a group commit writes it in its resource's sent mark's cycle
        or a later one, and :meth:`settle` waits for both before the batch counts it.
        """
        if self._outcome:
            try:
                ack = self._outcome(resource, result, detail)
            except Exception as exc:
                self.halt(f"ledger: outcome not recorded ({type(exc).__name__})")
                return
            if ack is not None:
                with self._lock:
                    self._outcomes.append(ack)

    def settle(self) -> None:
        """Wait for every record still queued (the batch's outcomes): the batch counts only what is durable."""
        with self._lock:
            waiting = [
                *(("intent", a) for a in self._intents.values()),
                *(("delete call", a) for marks in self._sent_marks.values() for a in marks),
                *(("outcome", a) for a in self._outcomes),
            ]
            self._intents, self._sent_marks, self._outcomes = {}, {}, []
        for what, ack in waiting:
            self._settled(ack, what)

    def _settled(self, ack: Ack, what: str) -> bool:
        """Whether a queued record is durable; if not, the task halts."""
        try:
            ack.wait()
        except Exception as exc:
            self.halt(f"ledger: {what} not recorded ({type(exc).__name__})")
            return False
        return True


def _key(resource: Resource) -> tuple[str, str]:
    return resource.scope, resource.uid


@contextlib.contextmanager
def halt_on_sigterm(guard: SendGuard) -> Iterator[None]:
    """While deleting, SIGTERM stops every send at once; the previous handler still runs.

    Airflow's task runner only calls the operator's ``on_kill`` on SIGTERM and lets the task run
    on until SIGKILL: without this, worker threads would keep deleting after the run timed out.
    Signal handlers can only be set from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        guard.halt("SIGTERM: the task is being stopped")
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
