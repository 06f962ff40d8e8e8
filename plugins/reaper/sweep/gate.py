"""The phase gate (docs/design.md §8): which sweeps delete, and so push metrics and tell the owners.

Only the target's active phase deletes on its own. A manual run of another phase (but telemetry, which deletes
nothing) is a dry run unless its trigger confirms the phase (``confirm_phase``, with ``override_reason``). The
sweeps whose deletes count, the active phase's and the confirmed ones, never a dry run, are the ones the alerts
and the owners hear of: the metrics' series are read as the target's, so a what-if must not feed them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from airflow.sdk.exceptions import AirflowFailException

from reaper.model import Phase
from reaper.records import PhaseGate
from reaper.sweep.params import param_text

if TYPE_CHECKING:
    from reaper.sweep.steps import Execution, Summary


def gated(phase: Phase, active: Phase) -> bool:
    """Whether a run of ``phase`` deletes only when its trigger confirms the phase (:func:`phase_gate`): every
    phase but the target's active one and telemetry (which deletes nothing)."""
    return phase not in (active, Phase.TELEMETRY)


def check_confirmation(params: dict[str, object], phase: Phase) -> None:
    """``resolve_scopes``'s check of ``confirm_phase``: empty, or this DAG's phase with ``override_reason``."""
    confirm = param_text(params, "confirm_phase")
    if confirm and confirm != phase.value:
        raise AirflowFailException(
            f"params.confirm_phase: {confirm!r} is not this DAG's phase; expected {phase.value!r} "
            "for a run that deletes as that phase does, or empty for a dry run"
        )
    if confirm and not param_text(params, "override_reason"):
        raise AirflowFailException("params.override_reason: expected a non-empty reason with confirm_phase")


def phase_gate(sweep: Execution, params: dict[str, object], triggered_by: str, rerun: bool) -> PhaseGate | None:
    """The ledger's record of the phase gate (docs/design.md §8), or None for the active phase (and telemetry,
    which deletes nothing).

    Only the active phase deletes on its own. A manual run of any other phase is a what-if, a dry run, unless
    its trigger names that phase in ``confirm_phase`` and gives ``override_reason`` (:func:`check_confirmation`
    refused a confirmation without a reason or of another phase): then it deletes as its phase does and
    pushes its metrics, so what it deletes reaches the alerts. A later phase deletes what the active one
    keeps; an earlier one is no subset either: under the active phase's global cap it deletes nothing, the
    earlier phase's smaller plan fits. Like an override, a confirmation was given for the evidence its
    trigger saw: a cleared or re-run run is a dry run.
    """
    active = sweep.target.active_phase
    if not gated(sweep.phase, active):
        return None
    gate = partial(PhaseGate, phase=sweep.phase.value, active=active.value, user=triggered_by)
    if param_text(params, "confirm_phase") != sweep.phase.value:
        why = (
            f"{sweep.phase.value} is not the active phase ({active.value}): a dry run, unless the trigger sets "
            f"confirm_phase to {sweep.phase.value} with an override_reason"
        )
        return gate(confirmed=False, why=why)
    reason = param_text(params, "override_reason")
    if rerun:
        why = "the run was cleared or re-run: a phase confirmation applies to its first execution only"
        return gate(reason=reason, confirmed=False, why=why)
    return gate(reason=reason, confirmed=True, why=f"{sweep.phase.value} confirmed by {triggered_by}")


def pushes_metrics(sweep: Execution, summary: Summary | None) -> bool:
    """Whether this sweep's metrics reach the Pushgateway: a sweep that :func:`acts`.

    The alerts read these series: a what-if run of another phase, or a dry run, must not feed them.
    """
    return bool(sweep.config.metrics.pushgateway_url) and acts(sweep, summary)


def acts(sweep: Execution, summary: Summary | None) -> bool:
    """Whether this sweep is one whose deletes count: the active phase's, or a confirmed run of another phase
    (:func:`phase_gate`: what it deletes must reach the alerts); never a dry run. Only such a sweep pushes its
    metrics and tells the owners (:mod:`reaper.sweep.notices`)."""
    if summary is not None and summary.dry_run:
        return False
    gate = summary.phase_gate if summary is not None else None  # no summary: the sweep failed before its plan
    return sweep.phase is sweep.target.active_phase or (gate is not None and gate.confirmed)
