"""The effective mode of each rule in a rollout phase, and which holds stop a delete (docs/design.md §3).

Both read the table of :mod:`reaper.rules`: a rule's preset in each phase and the holds that stop it.
"""

from __future__ import annotations

from reaper.config import Settings
from reaper.model import Mode, Phase
from reaper.rules import RULES
from reaper.vocabulary import Reason


def effective_modes(config: Settings, phase: Phase) -> dict[str, Mode]:
    """The lower of the phase preset and ``rules.<rule>``: config can only restrict."""
    return {rule.name: min(rule.presets[phase], getattr(config.rules, rule.name)) for rule in RULES}


def blocking(target: str, holds: tuple[str, ...], modes: dict[str, Mode]) -> tuple[str, ...]:
    """The holds that stop a delete in this phase: those holding a rule whose mode is ``delete``.

    A hold on a rule that only reports (or is off) changes nothing the phase would do: it is
    information, never a page. Nor does any hold of a protected scope: nothing is ever deleted
    there, so a budget or writer hold stops no delete the protection had not stopped already. The
    verdict still lists them (the audit view shows them); only the page goes.
    """
    if Reason.PROTECTED_SCOPE in holds:
        return ()
    deleting = [rule for rule in RULES if rule.target == target and modes[rule.name] is Mode.DELETE]
    return tuple(h for h in holds if any(h in rule.held_by for rule in deleting))
