"""What a sweep tells the owners of what it reaps (docs/notifications.md), as pure functions.

Three events. ``held``: a scope whose deletes a hold stopped, told when the hold starts or changes and again
after ``notifications.remind_after`` while it lasts, and its end told too. ``failed``: deletes that failed,
told per scope the same way. ``deleted``: a digest of what was deleted, per window of ``digest_every``
(aligned to UTC) or per sweep. Each notice is computed from the sweep's summary, its ledger records and what
the channel was told before (:class:`ChannelState`), so a hold that lasts a day is one notice, not one per
sweep. Sending is :mod:`reaper.notifiers`; :mod:`reaper.sweep.notices` does the I/O between.

A notice names scopes, locations, kinds, names, run keys and the reasons in words; never other label values,
evidence it was not written for, Secret contents or credentials (API error text goes through
:func:`reaper.redact.text_for_log`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

import msgspec

from reaper.config import NotificationsConfig, NotifyChannel
from reaper.redact import text_for_log
from reaper.report.reasons import Limits, explain, explain_hold
from reaper.report.rows import when
from reaper.vocabulary import Reason, Result

if TYPE_CHECKING:
    from reaper.sweep.steps import Summary

EVERY_SCOPE = "(every scope)"  # the sweep-wide hold: the plan exceeded max_deletions_per_sweep
DETAIL_CHARS = 300  # of an API's error text, per failed delete


class Event(StrEnum):
    HELD = "held"
    FAILED = "failed"
    DELETED = "deleted"


class Held(msgspec.Struct, frozen=True):
    """A scope whose deletes this sweep held: the holds that stopped them, each in words, and how many it held."""

    scope: str
    holds: tuple[str, ...]
    why: tuple[str, ...]
    deletes: int


class Row(msgspec.Struct, frozen=True):
    """One resource a notice names: its scope, what it is, why it was to be deleted, what became of it."""

    scope: str
    what: str
    why: str
    detail: str = ""
    at: str = ""


class Facts(msgspec.Struct, frozen=True):
    """What one sweep gives its notices: which run it was (``run`` for people, ``key``: its execution and lease),
    the scopes it swept, what it held, failed and deleted (its own deletes: the digest of ``digest_every`` 0)."""

    target: str
    run: str
    key: str
    swept: frozenset[str]
    held: tuple[Held, ...] = ()
    failed: tuple[Row, ...] = ()
    deleted: tuple[Row, ...] = ()


class Digest(msgspec.Struct, frozen=True):
    """The deleted resources of one digest: the first ``max_listed`` by name, all counted by scope.

    ``since``/``until``: the window it covers (unix seconds); None: one sweep's own deletes.
    """

    rows: tuple[Row, ...]
    total: int
    by_scope: dict[str, int]
    since: float | None = None
    until: float | None = None


class Told(msgspec.Struct, frozen=True):
    """A scope a channel was told of: with which holds (none for failing deletes), and when."""

    scope: str
    holds: tuple[str, ...] = ()
    at: float = 0.0


class ChannelState(msgspec.Struct, frozen=True):
    """What one channel was told of one target: scopes told held and failing, where its last digest window ended
    (None: it had none yet), and the last sweep whose own deletes it was told (``Facts.key``). Kept in the ledger
    (``ledger.notices_collection``), one document per channel and target, so a retried ``record`` task does not
    tell again what its first try told."""

    held: tuple[Told, ...] = ()
    failing: tuple[Told, ...] = ()
    digested_until: float | None = None
    digested_sweep: str = ""


class Notice(msgspec.Struct, frozen=True):
    """One message to one channel, and what the channel's state becomes once it is sent (None: that part stays)."""

    event: Event
    subject: str
    text: str
    held: tuple[Told, ...] | None = None
    failing: tuple[Told, ...] | None = None
    digested_until: float | None = None
    digested_sweep: str | None = None


def told(state: ChannelState, notice: Notice) -> ChannelState:
    """The channel's state after ``notice`` was sent."""
    changes = {f: getattr(notice, f) for f in ChannelState.__struct_fields__ if getattr(notice, f) is not None}
    return msgspec.structs.replace(state, **changes)


# --- what a sweep gives -------------------------------------------------------------------------


def facts(
    summary: Summary,
    target: str,
    run: str,
    key: str,
    outcomes: Iterable[tuple[Mapping[str, object], Mapping[str, object] | None]],
    limits: Limits | None,
) -> Facts:
    """A sweep's facts from its summary and its outcome records, each with the delete decision behind it
    (:meth:`reaper.ledger.Ledger.deciding`)."""
    failed: list[Row] = []
    deleted: list[Row] = []
    for outcome, decision in outcomes:
        if outcome.get("result") in (Result.FAILED, Result.DELETED):  # the outcomes notices tell of
            (failed if outcome["result"] == Result.FAILED else deleted).append(row(outcome, decision, limits))
    swept = frozenset(v.scope for v in summary.scopes) | {EVERY_SCOPE}
    held = held_scopes(summary, limits)
    return Facts(target, run, key, swept, held, tuple(sorted(failed, key=_order)), tuple(sorted(deleted, key=_order)))


def held_scopes(summary: Summary, limits: Limits | None) -> tuple[Held, ...]:
    """The scopes whose deletes a hold stopped in this sweep's phase (a verdict's ``blocking`` holds, as the audit
    view and the alerts read them), and the sweep-wide hold of a plan over ``max_deletions_per_sweep``."""
    reported: Counter[tuple[str, str]] = Counter()
    for d in summary.decisions:
        if d.action == "report":
            reported[d.scope, d.reason] += d.count
    held = []
    for verdict in summary.scopes:
        blocking = tuple(verdict.blocking)
        if not blocking:
            continue
        scope, facts = verdict.scope, verdict.facts()
        why = tuple(f"{h}: {explain_hold(h, facts, limits)}{_problems(summary, scope, h)}" for h in blocking)
        held.append(Held(scope, blocking, why, sum(reported[scope, h] for h in blocking)))
    if summary.capped:
        planned = sum(summary.capped.values())
        capped: dict[str, object] = {"planned": planned, "cap": summary.max_deletions}
        hold = Reason.MAX_DELETIONS_EXCEEDED
        held.append(Held(EVERY_SCOPE, (hold,), (f"{hold}: {explain_hold(hold, capped, limits)}",), planned))
    return tuple(held)


def _problems(summary: Summary, scope: str, hold: str) -> str:
    """Why a listing was incomplete, as its scope's listing said (an API's words: redacted)."""
    problems = summary.incomplete.get(scope) if hold == Reason.INVENTORY_INCOMPLETE else None
    return f" ({text_for_log('; '.join(problems))[:DETAIL_CHARS]})" if problems else ""


def row(outcome: Mapping[str, object], decision: Mapping[str, object] | None, limits: Limits | None) -> Row:
    """A resource as a notice names it, from its outcome and (when the ledger has it) its decision."""
    detail = (
        text_for_log(str(outcome.get("detail") or ""))[:DETAIL_CHARS] if outcome.get("result") == Result.FAILED else ""
    )
    if decision is None:
        what, why = str(outcome.get("name")), "its decision is not in the ledger"
    else:
        what = f"{decision.get('resource_kind')} {decision.get('location')}/{decision.get('name')}"
        why = explain(str(decision.get("reason")), decision.get("evidence"), limits, raw=False)  # type: ignore[arg-type]  # an object
    return Row(str(outcome.get("scope")), what, why, detail, when(outcome.get("at")))


def _order(r: Row) -> tuple[str, str]:
    return r.scope, r.what


def digest(scopes: Iterable[str], rows: Sequence[Row], window: tuple[float, float] | None) -> Digest:
    """A digest of the deleted resources in ``scopes`` (one entry each), naming ``rows`` (those of them listed)."""
    by_scope = Counter(scopes)
    since, until = window if window else (None, None)
    return Digest(tuple(rows), sum(by_scope.values()), dict(sorted(by_scope.items())), since, until)


def digest_window(now: float, every: float, state: ChannelState) -> tuple[float, float] | None:
    """The window a channel's digest is due for, or None: from where its last one ended (its first: one period
    back) to the start of the current period. Periods are aligned to the Unix epoch, so 24h is UTC days."""
    if every <= 0:
        return None
    end = math.floor(now / every) * every
    start = state.digested_until if state.digested_until is not None else end - every
    return (start, end) if start < end else None


# --- what a channel is told ---------------------------------------------------------------------


def plan(
    channel: NotifyChannel,
    sweep: Facts,
    state: ChannelState,
    now: float,
    config: NotificationsConfig,
    deleted: Digest | None = None,
) -> tuple[ChannelState, list[Notice]]:
    """The notices ``channel`` gets of this sweep, and its state should none of them be sent.

    ``deleted``: the digest due (:func:`digest_window`, or the sweep's own for ``digest_every`` 0), if any.
    Quietly, a scope swept without failures is no longer failing, and an empty digest window counts as told.
    """
    remind = config.remind_after.total_seconds()
    notices: list[Notice] = []
    if Event.HELD in channel.events:
        notices += _held(sweep, state, now, remind)
    failing_now = {r.scope for r in sweep.failed}
    failing = tuple(t for t in state.failing if t.scope not in sweep.swept or t.scope in failing_now)
    if Event.FAILED in channel.events:
        notices += _failed(sweep, failing, now, remind, config.max_listed)
    quiet = msgspec.structs.replace(state, failing=failing)
    own = deleted is not None and deleted.until is None
    if Event.DELETED in channel.events and deleted is not None and not (own and state.digested_sweep == sweep.key):
        if deleted.total:
            notices.append(_digest(sweep, deleted))
        elif deleted.until is not None:
            quiet = msgspec.structs.replace(quiet, digested_until=deleted.until)
    return quiet, notices


def _held(sweep: Facts, state: ChannelState, now: float, remind: float) -> list[Notice]:
    before = {t.scope: t for t in state.held}
    held = {h.scope: h for h in sweep.held}
    tell = [h for h in sweep.held if _due(before.get(h.scope), h.holds, now, remind)]
    lifted = sorted(s for s in before if s in sweep.swept and s not in held)
    if not (tell or lifted):
        return []
    told_now = {h.scope for h in tell}
    after = tuple(t for s, t in before.items() if s not in told_now and s not in lifted) + tuple(
        Told(h.scope, h.holds, now) for h in tell
    )
    if tell:
        subject = f"deletes held in {_few(h.scope for h in tell)}"
        head = (
            f"The reaper's {sweep.target} sweep held deletes in {_count(len(tell), 'scope')}: nothing a hold "
            "stops is deleted there until it clears."
        )
    else:
        subject = f"holds lifted in {_few(lifted)}"
        head = f"The reaper's {sweep.target} sweep no longer holds deletes in {_count(len(lifted), 'scope')}."
    lines = [head, f"Sweep: {sweep.run}."]
    for h in tell:
        lines += ["", f"{h.scope}: {_count(h.deletes, 'delete')} held this sweep", *(f"  {why}" for why in h.why)]
    if lifted:
        lines += ["", "No longer held: " + ", ".join(f"{s} (was {', '.join(before[s].holds)})" for s in lifted)]
    lines += ["", "The run's page in the reaper audit view lists every held resource and why."]
    return [Notice(Event.HELD, _subject(sweep, subject), "\n".join(lines), held=after)]


def _due(before: Told | None, holds: tuple[str, ...], now: float, remind: float) -> bool:
    """Whether a scope is told (again): never told, told with other holds, or told ``remind`` ago."""
    return before is None or before.holds != holds or now - before.at >= remind


def _failed(sweep: Facts, failing: tuple[Told, ...], now: float, remind: float, listed: int) -> list[Notice]:
    before = {t.scope: t for t in failing}
    scopes = sorted({r.scope for r in sweep.failed})
    tell = [s for s in scopes if _due(before.get(s), (), now, remind)]
    if not tell:
        return []
    rows = [r for r in sweep.failed if r.scope in tell]
    after = tuple(t for t in failing if t.scope not in tell) + tuple(Told(s, (), now) for s in tell)
    lines = [
        f"{_count(len(rows), 'delete')} of the reaper's {sweep.target} sweep failed in {_few(tell)}. The next sweep "
        "decides again, and deletes what it still finds reapable.",
        f"Sweep: {sweep.run}.",
        "",
    ]
    for r in rows[:listed]:
        lines += [f"- {r.scope} {r.what}: {r.why}", f"  failed: {r.detail or 'no detail recorded'}"]
    lines += _more(len(rows) - listed, Counter(r.scope for r in rows))
    subject = f"{_count(len(rows), 'delete')} failed in {_few(tell)}"
    return [Notice(Event.FAILED, _subject(sweep, subject), "\n".join(lines), failing=after)]


def _digest(sweep: Facts, deleted: Digest) -> Notice:
    n = _count(deleted.total, "resource")
    if deleted.since is None or deleted.until is None:
        span, lines = "", [f"The reaper's {sweep.target} sweep deleted {n}.", f"Sweep: {sweep.run}."]
    else:
        span = f" {when(deleted.since)} to {when(deleted.until)}"
        lines = [f"The reaper's {sweep.target} sweeps deleted {n} from{span}."]
    lines.append("By scope: " + ", ".join(f"{s} {c}" for s, c in deleted.by_scope.items()) + ".")
    lines.append("")
    lines += [f"- {r.scope} {r.what}: {r.why}" + (f" (deleted {r.at})" if r.at else "") for r in deleted.rows]
    lines += _more(deleted.total - len(deleted.rows), None)
    subject = _subject(sweep, f"{n} deleted{span}")
    if deleted.until is None:
        return Notice(Event.DELETED, subject, "\n".join(lines), digested_sweep=sweep.key)
    return Notice(Event.DELETED, subject, "\n".join(lines), digested_until=deleted.until)


def _more(left: int, by_scope: Counter[str] | None) -> list[str]:
    if left <= 0:
        return []
    where = f" ({', '.join(f'{s}: {c}' for s, c in sorted(by_scope.items()))} in all)" if by_scope else ""
    return [f"and {left} more{where}: the reaper audit view lists them."]


def _subject(sweep: Facts, what: str) -> str:
    return f"[reaper] {sweep.target}: {what}"


def _few(names: Iterable[str], shown: int = 3) -> str:
    """``a, b, c and 4 more``: a subject line stays short."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
