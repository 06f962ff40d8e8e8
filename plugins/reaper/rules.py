"""The rules, one row each: the target it decides, its mode in each rollout phase, and the scope holds that stop
its deletes (docs/design.md §3, with the holds of §4 and §5).

Everything that asks about a rule reads this table: the policy's effective modes and which holds page
(:mod:`reaper.policy.modes`), the GCE rules' holds (:mod:`reaper.policy.gce`), and the config's ``rules``
section (:class:`reaper.config.RulesConfig`: a mode above every preset of the rule is refused). A rule's
finding is the :class:`reaper.vocabulary.Reason` of its name, whose sentence the report shows. It lives
beside, not in, :mod:`reaper.policy`, because the config reads it and the policy imports the config.
"""

from __future__ import annotations

from typing import NamedTuple

from reaper.model import Mode, Phase
from reaper.vocabulary import Reason

OFF, REPORT, DELETE = Mode.OFF, Mode.REPORT, Mode.DELETE


class Rule(NamedTuple):
    """One rule: ``name`` is its key under ``rules`` in the config and the reason its finding carries."""

    name: str
    target: str  # "gce" or "k8s"
    presets: dict[Phase, Mode]  # its mode in each phase, before the config restricts it
    held_by: tuple[Reason, ...]  # the scope holds that turn its deletes into reports

    @property
    def finding(self) -> Reason:
        return Reason(self.name)  # type: ignore[call-arg]  # a lookup by value (EnumMeta.__call__), not __new__

    @property
    def ceiling(self) -> Mode:
        """The highest mode any phase gives it: its default in the config, and the most the config may set."""
        return max(self.presets.values())


def _by_phase(telemetry: Mode, terminated_cleanup: Mode, report_only: Mode, enforcement: Mode) -> dict[Phase, Mode]:
    """A rule's presets, in rollout order (the columns of the table below)."""
    return dict(zip(Phase, (telemetry, terminated_cleanup, report_only, enforcement), strict=True))


_LISTING, _BUDGET = Reason.INVENTORY_INCOMPLETE, Reason.BUDGET_EXCEEDED
_WRITERS = (Reason.WRITER_HEALTH_UNKNOWN, Reason.WRITER_UNHEALTHY)
_LABEL_UNSEEN, _STEP_LABELS_UNSEEN = Reason.HEARTBEAT_LABEL_UNSEEN, Reason.STEP_LABELS_UNSEEN

# A listing not proven complete holds every rule that deletes; writer health and the budget hold only the rules
# whose evidence they question: the heartbeat's and the runs' leases; a heartbeat label that no VM of a project
# stamps now holds the rule that reads its absence, and step labels no Pod of a cluster carries hold its deletes
# (the runs whose results they would prove durable are reported by row 7 already). residual_group
# (docs/design.md §10) only ever reports, so no hold has a delete of it to stop.
TERMINATED = Rule("terminated", "gce", _by_phase(OFF, DELETE, DELETE, DELETE), (_LISTING,))
HEARTBEAT_STALE = Rule("heartbeat_stale", "gce", _by_phase(OFF, OFF, REPORT, DELETE), (_LISTING, *_WRITERS, _BUDGET))
UNLABELED_AGE = Rule("unlabeled_age", "gce", _by_phase(OFF, OFF, REPORT, DELETE), (_LISTING, _LABEL_UNSEEN))
SANDBOX_ORPHAN = Rule(
    "sandbox_orphan", "k8s", _by_phase(OFF, OFF, REPORT, DELETE), (_LISTING, _STEP_LABELS_UNSEEN, _BUDGET)
)
RESIDUAL_GROUP = Rule("residual_group", "gce", _by_phase(OFF, OFF, REPORT, REPORT), ())

RULES = (TERMINATED, HEARTBEAT_STALE, UNLABELED_AGE, SANDBOX_ORPHAN, RESIDUAL_GROUP)
RULE = {rule.name: rule for rule in RULES}
