"""The notices of one sweep (docs/notifications.md), as ``record`` sends them after the deletes and the summary.

The I/O between :mod:`reaper.notify` (what to tell) and :mod:`reaper.notifiers` (the sending): the outcomes'
decisions and the digest's deletes from the ledger, each channel's state read before and written after.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING

import msgspec

from reaper import notify
from reaper.config import SEND_MARGIN_SLACK, NotifyChannel
from reaper.notifiers import send_all
from reaper.records import Notices, Sent
from reaper.report.reasons import Limits
from reaper.sweep.deadline import run_ends
from reaper.vocabulary import Result

if TYPE_CHECKING:
    from reaper.ledger import Ledger
    from reaper.sweep.steps import Execution, Summary

log = logging.getLogger(__name__)
NOTHING = Notices(notices=[])  # what a sweep with nothing due records


def send(
    sweep: Execution, summary: Summary, recorded: Iterable[Mapping[str, object]], started: datetime | None
) -> Notices:
    """Tell each channel of the sweep's target what it is due; what was sent and what failed, for the summary.

    ``recorded``: this execution's outcome records. The sends wait at most ``notifications.timeout``, and never
    into the margin the task needs before the run's timeout to write the channels' state and the summary.
    """
    config, target = sweep.config.notifications, sweep.target.name
    channels = [c for c in config.channels if target in c.targets]
    ledger = sweep.ledger()
    limits = Limits.of(sweep.config)
    every = config.digest_every.total_seconds()
    events = {e for c in channels for e in c.events}
    wanted = {Result.FAILED} if notify.Event.FAILED in events else set()
    if notify.Event.DELETED in events and not every:
        wanted.add(Result.DELETED)
    outcomes = [o for o in recorded if o.get("result") in wanted]
    ids = sweep.ids
    run = f"{ids.dag_id} run {ids.run_id}, execution {ids.execution}, phase {sweep.phase.value}"
    execution = f"{ids.holder}/{summary.plan.token}"  # one execution's own deletes are told once
    pairs = zip(outcomes, ledger.deciding(outcomes), strict=True)
    facts = notify.facts(summary, target, run, execution, pairs, limits)
    now = time.time()
    windows: dict[tuple[float, float], notify.Digest] = {}
    states: dict[str, tuple[notify.ChannelState, notify.ChannelState]] = {}
    planned: list[tuple[str, NotifyChannel, notify.Notice]] = []
    for channel in channels:
        key = f"{target}/{channel.key}"
        state = msgspec.convert(ledger.notice_state(key) or {}, notify.ChannelState)
        deleted = None
        if notify.Event.DELETED in channel.events:
            window = notify.digest_window(now, every, state)
            if not every:
                deleted = notify.digest((r.scope for r in facts.deleted), facts.deleted[: config.max_listed], None)
            elif window is not None:
                if window not in windows:
                    windows[window] = window_digest(ledger, target, window, limits, config.max_listed)
                deleted = windows[window]
        quiet, notices = notify.plan(channel, facts, state, now, config, deleted)
        states[key] = (state, quiet)
        planned += [(key, channel, n) for n in notices]
    budget = min(config.timeout.total_seconds(), time_left(sweep, started))
    if not planned or budget >= 1:
        sent = send_all([(c, n) for _, c, n in planned], budget)
    else:
        why = "not sent: no time left before the run's timeout"
        sent = [Sent(c.key, n.event, False, why) for _, c, n in planned]
        log.warning("%d notices %s", len(sent), why)
    for key, (before, after) in states.items():
        for (of, _, notice), result in zip(planned, sent, strict=True):
            if of == key and result.ok:
                after = notify.told(after, notice)
        if after != before:
            ledger.save_notice_state(key, msgspec.to_builtins(after))
    return Notices(sent=sum(s.ok for s in sent), failed=sum(not s.ok for s in sent), notices=sent)


def window_digest(
    ledger: Ledger, target: str, window: tuple[float, float], limits: Limits, listed: int
) -> notify.Digest:
    """The digest of what ``target``'s sweeps deleted in ``window``: all counted, the first ``listed`` named."""
    outcomes = ledger.deleted_between(target, *window)
    shown = outcomes[:listed]
    rows = [notify.row(o, d, limits) for o, d in zip(shown, ledger.deciding(shown), strict=True)]
    return notify.digest((str(o.get("scope")) for o in outcomes), rows, window)


def time_left(sweep: Execution, started: datetime | None) -> float:
    """Seconds the sends may take before the run's timeout, less what the task still writes after them (the
    channels' state and the summary, each a ledger write) and a few seconds to end; unbounded without ``started``."""
    if started is None:
        return float("inf")
    config = sweep.config
    ends = run_ends(config, sweep.target.name, started)
    return ends - time.time() - (2 * config.ledger.timeout + SEND_MARGIN_SLACK).total_seconds()
