"""The reaper's words (reaper.vocabulary): every reason has its sentence."""

from __future__ import annotations

import pytest

from reaper.config import Settings
from reaper.report.reasons import Limits, explain, explain_hold
from reaper.vocabulary import GONE, Reason, RecordAction, Result


@pytest.mark.parametrize("limits", [None, Limits.of(Settings())], ids=["no config", "config"])
@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_every_reason_has_a_sentence(reason: Reason, limits: Limits | None) -> None:
    # Even with no evidence at all (a record of another shape): a sentence, never the bare code or its raw facts.
    words = explain(reason, {}, limits)
    assert words and words != reason and not words.startswith(f"{reason} (")
    assert explain(reason.value, {}, limits) == words  # the ledger's string reads the same as the member


def test_every_hold_a_scope_can_carry_has_a_sentence_of_the_scope() -> None:
    # What a verdict or a notice names: the scopes' holds, the protected scope and the sweep-wide cap.
    holds = {
        Reason.INVENTORY_INCOMPLETE,
        Reason.WRITER_HEALTH_UNKNOWN,
        Reason.WRITER_UNHEALTHY,
        Reason.BUDGET_EXCEEDED,
        Reason.PROTECTED_SCOPE,
        Reason.MAX_DELETIONS_EXCEEDED,
    }
    for hold in holds:
        assert hold.hold_sentence is not None and explain_hold(hold, {}) != hold, hold
    assert explain_hold("brand_new_hold", {}) == "brand_new_hold"


def test_a_string_that_is_both_a_reason_and_a_result_has_a_member_in_each() -> None:
    assert Reason.TERMINATING == Result.STILL_TERMINATING == "terminating"
    assert {r.value for r in Reason} & {r.value for r in Result} == {"terminating"}
    assert {"deleted", "already_gone"} == GONE and all(isinstance(r, Result) for r in GONE)
    assert [(a.value, a.kind) for a in RecordAction] == [("delete_intent", "intent"), ("outcome", "outcome")]
