"""When a sweep's deletes must stop, and how many of them fit before then (docs/design.md §6, "a plan belongs to
one execution of one sweep").

Deadline = ``min(run start + run timeout, lease expiry) - send_margin`` (:meth:`reaper.config.Settings.send_margin`:
after the last send, one request and one ledger write remain), and an approval's expiry when that comes first. The
steps that wait on an API (resolving, listing) stop by it too, and a plan is cut to what its scopes' token buckets
can send before it. Pure arithmetic: the clock is read by the caller.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from datetime import datetime

from reaper.config import Settings
from reaper.model import R
from reaper.sweep.deletes import units_of


def run_ends(config: Settings, target: str, started: datetime) -> float:
    """Unix seconds at which the run that ``started`` then reaches its timeout (``dagrun_timeout``)."""
    return (started + config.run_timeout(target)).timestamp()


def send_deadline(
    config: Settings, target: str, lease_expires: float, started: datetime | None, approval_expires: float | None = None
) -> float:
    """Unix seconds after which this execution sends no delete: the run's timeout (from ``started``) or the
    lease's expiry, whichever comes first, less ``send_margin`` (the last request and its outcome's write); an
    approval's expiry (``approval_expires``) when it comes first, as nothing is deleted under it after that."""
    ends = [lease_expires]
    if started is not None:
        ends.append(run_ends(config, target, started))
    deadline = min(ends) - config.send_margin(target).total_seconds()
    return deadline if approval_expires is None else min(deadline, approval_expires)


def resolving_deadline(deadline: float, now: float) -> float:
    """When resolving the scopes stops waiting for a used-up quota: a quarter of the time the run may send for,
    at most, so that the sweep after it keeps room."""
    return now + (deadline - now) / 4


def fit_before_deadline(
    resources: Iterable[R], unit: Callable[[R], Hashable], rate: float, seconds: float
) -> tuple[list[R], list[R]]:
    """The deletes that can be sent in ``seconds`` at ``rate`` per scope, whole units in plan order; the rest.

    A bound, not an estimate: every send takes a token of its scope's bucket (one banked, then
    ``rate`` a second), so no more than ``1 + rate * seconds`` of a scope go out however fast the
    rest is (each delete task banks its own first token: a few of what is left might have fit,
    never the other way round). Planning more would only queue batches past the run's deadline,
    each a task that starts, finds the deadline passed and records its resources as left: at
    incident scale, enough of them to outlast the margin and have the run killed by its own
    timeout mid-batch.
    """
    most = 1 + rate * seconds if seconds > 0 else 0  # past the deadline the guard sends nothing
    taken: Counter[str] = Counter()
    full: set[str] = set()  # units stay in plan order: none of a full scope's later ones jumps the queue
    fits: list[R] = []
    left: list[R] = []
    for members in units_of(resources, unit).values():
        scope = members[0].scope
        if scope not in full and taken[scope] + len(members) <= most:
            taken[scope] += len(members)
            fits += members
        else:
            full.add(scope)
            left += members
    return fits, left
