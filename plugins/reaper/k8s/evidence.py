"""Gathering the Kubernetes evidence of one sweep: leases, run states and step results, in batches.

The run keys come from the listed objects' run labels; step attempts from step
pods' labels. Sources that are not configured stay ``None`` (unknown), so the
policy keeps or reports, never deletes, what they would have vouched for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from reaper.config import Settings
from reaper.model import Evidence, K8sObject, Keyed

LeaseReader = Callable[[list[str]], Keyed[float | None] | None]
RunReader = Callable[[list[str]], Keyed[str]]
StepReader = Callable[[list[tuple[str, str, str]]], Keyed[tuple[str, bool]]]


def gather(
    objects: Iterable[K8sObject],
    config: Settings,
    leases: LeaseReader | None,
    runs: RunReader | None,
    steps: StepReader | None,
    incomplete: frozenset[tuple[str, str]] = frozenset(),
) -> Evidence:
    cfg = config.k8s
    keys: set[str] = set()
    attempts: set[tuple[str, str, str]] = set()
    for obj in objects:
        run = obj.labels.get(cfg.run_label)
        if not run:
            continue
        keys.add(run)
        step, attempt = obj.labels.get(cfg.step_label), obj.labels.get(cfg.attempt_label)
        if obj.kind == "Pod" and step and attempt:
            attempts.add((run, step, attempt))
    wanted = sorted(keys)
    return Evidence(
        leases=leases(wanted) if leases else None,
        runs=runs(wanted) if runs else None,
        steps=steps(sorted(attempts)) if steps and cfg.step_store != "none" else None,
        incomplete=incomplete,
    )
