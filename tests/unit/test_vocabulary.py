"""The reaper's words (reaper.vocabulary): every reason has its sentence, and the policy and the deleters name their
reasons and results only through the enums, so none can be written that the report cannot explain."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest

from reaper.config import Settings
from reaper.report.reasons import Limits, explain, explain_hold
from reaper.rules import RULES
from reaper.vocabulary import GONE, Reason, RecordAction, Result

PLUGINS = Path(__file__).resolve().parents[2] / "plugins" / "reaper"
POLICY = sorted((PLUGINS / "policy").glob("*.py"))
# Where delete results are made: the deleters, the fence, and the batch that records what it did not send.
DELETING = [
    PLUGINS / "gce" / "deleter.py",
    PLUGINS / "k8s" / "deleter.py",
    PLUGINS / "fence.py",
    PLUGINS / "sweep" / "deletes.py",
]


def _words_in(path: Path) -> set[str]:
    """The string constants of a module that are values, not names: docstrings, dict keys and subscripts (the
    evidence's, the census's and the verdict's field names), ``__slots__`` and ``__all__`` aside."""
    tree = ast.parse(path.read_text())
    names: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            names |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            names.add(id(node.slice))
        elif isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") in ("__slots__", "__all__") for t in node.targets
        ):
            names |= {id(n) for n in ast.walk(node.value)}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                names.add(id(first.value))
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in names
    }


@pytest.mark.parametrize("limits", [None, Limits.of(Settings())], ids=["no config", "config"])
@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_every_reason_has_a_sentence(reason: Reason, limits: Limits | None) -> None:
    # Even with no evidence at all (a record of another shape): a sentence, never the bare code or its raw facts.
    words = explain(reason, {}, limits)
    assert words and words != reason and not words.startswith(f"{reason} (")
    assert explain(reason.value, {}, limits) == words  # the ledger's string reads the same as the member


def test_every_hold_a_scope_can_carry_has_a_sentence_of_the_scope() -> None:
    # The holds of the rules' table, the protected scope and the sweep-wide cap: what a verdict or a notice names.
    holds = {h for rule in RULES for h in rule.held_by} | {Reason.PROTECTED_SCOPE, Reason.MAX_DELETIONS_EXCEEDED}
    for hold in holds:
        assert hold.hold_sentence is not None and explain_hold(hold, {}) != hold, hold
    assert explain_hold("brand_new_hold", {}) == "brand_new_hold"


def test_a_string_that_is_both_a_reason_and_a_result_has_a_member_in_each() -> None:
    assert Reason.TERMINATING == cast(str, Result.STILL_TERMINATING) == "terminating"
    assert {r.value for r in Reason} & {r.value for r in Result} == {"terminating"}
    assert {"deleted", "already_gone"} == GONE and all(isinstance(r, Result) for r in GONE)
    assert [(a.value, a.kind) for a in RecordAction] == [("delete_intent", "intent"), ("outcome", "outcome")]


@pytest.mark.parametrize("path", POLICY, ids=lambda p: p.name)
def test_the_policy_names_its_reasons_only_through_the_enum(path: Path) -> None:
    # A reason written as a string would escape the enum: a typo, or a code without a sentence. (The rules'
    # names, which their findings share, are the table's: reaper.rules.)
    written = _words_in(path) & {r.value for r in Reason}
    assert not written, f"{path.name}: name these through reaper.vocabulary.Reason: {sorted(written)}"


@pytest.mark.parametrize("path", DELETING, ids=lambda p: p.parent.name + "/" + p.name)
def test_the_deleters_name_their_results_only_through_the_enum(path: Path) -> None:
    written = _words_in(path) & {r.value for r in Result}
    assert not written, f"{path.name}: name these through reaper.vocabulary.Result: {sorted(written)}"


def test_only_the_policy_makes_decisions() -> None:
    # The scans above read the policy's modules: a sweep module making its own decisions would escape them.
    for path in (PLUGINS / "sweep").glob("*.py"):
        calls = {
            n.func.id
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert "Decision" not in calls, path
