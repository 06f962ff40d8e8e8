"""Every reason code the policy can give, as a sentence filled from the decision's evidence.

The policy's decisions carry a code (``lease_absent_run_active``) and the facts it decided on
(``{"lease": "absent", "store": "active", "status": "running"}``); people read a sentence: the one its
:class:`reaper.vocabulary.Reason` member carries. The thresholds (quarantine, grace, minimum age) are not
in the evidence: they come from a config, and without one the sentence leaves them out rather than
guess. A code that is no member (a record of an older or newer reaper) is shown as the code itself
with its raw evidence: never hidden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from reaper.vocabulary import Facts, Reason

if TYPE_CHECKING:
    from reaper.config import Settings


class Limits(NamedTuple):
    """The thresholds a sentence quotes, in seconds (from the config the decision was judged under)."""

    quarantine: float
    terminated_grace: float
    unlabeled_max_age: float
    min_age: float
    writer_stale_after: float
    min_stale: int
    max_stale_fraction: float

    @classmethod
    def of(cls, config: Settings) -> Limits:
        gce, k8s = config.gce, config.k8s
        return cls(
            gce.quarantine.total_seconds(),
            gce.terminated_grace.total_seconds(),
            gce.unlabeled_max_age.total_seconds(),
            k8s.min_age.total_seconds(),
            gce.writer_stale_after.total_seconds(),
            config.budget.min_stale,
            config.budget.max_stale_fraction,
        )


def _member(code: str | None) -> Reason | None:
    """The reason a stored code names, or None for a code that is no reason."""
    if code is None:
        return None
    try:
        return Reason(code)  # type: ignore[call-arg]  # a lookup by value (EnumMeta.__call__), not __new__
    except ValueError:
        return None


def explain(reason: str | None, evidence: Facts | None, limits: Limits | None = None, raw: bool = True) -> str:
    """The reason in words; an unknown code, or evidence a sentence cannot read, as the code and its facts.

    ``raw`` False: the code alone in that case, without the facts (a notice that leaves Airflow quotes no
    evidence it was not written for: docs/notifications.md).
    """
    ev = evidence or {}
    member = _member(reason)
    if member is not None:
        try:
            return member.sentence(ev, limits)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # evidence of an older or newer shape: the raw facts below say it all
    facts = ", ".join(f"{k}={v}" for k, v in ev.items() if v not in (None, [], {})) if raw else ""
    return f"{reason or 'no reason'}" + (f" ({facts})" if facts else "")


def explain_hold(hold: str, verdict: Facts, limits: Limits | None = None) -> str:
    """A scope's hold in words, from the scope's verdict; a code that holds no scope (a new one) as its code."""
    member = _member(hold)
    if member is not None and member.hold_sentence is not None:
        try:
            return member.hold_sentence(verdict, limits)
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a verdict of another shape: the code says what it is
    return hold
