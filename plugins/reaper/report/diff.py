"""``reaper diff --format html``: one self-contained page of a config change's decision changes, for review.

The same shell, tables and reason sentences as the what-if report and the audit view
(:mod:`reaper.report.html`, :mod:`reaper.report.reasons`): each side's reason is read with that
config's thresholds, the liveness with those of the config that read it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from reaper.report.html import action, document, facts, table, text
from reaper.report.reasons import explain
from reaper.report.rows import when

if TYPE_CHECKING:
    from reaper.diff import Change, ConfigDiff
    from reaper.model import Decision
    from reaper.report.reasons import Limits

HEADERS = ("", "target", "scope", "kind", "location", "name", "old", "new", "liveness evidence")


def _side(decision: Decision | None, limits: Limits) -> str:
    if decision is None:
        return '<span class="muted">not decided (not selected, or the target is disabled): kept</span>'
    why = explain(decision.reason, decision.evidence, limits)
    return f"{action(decision.action.value)} {text(why)}<br><code class='muted'>{text(decision.reason)}</code>"


def _liveness(change: Change, limits: dict[str, Limits]) -> str:
    reading = change.liveness
    if reading is None:
        return '<span class="muted">not read: no rule reads a liveness for this kind</span>'
    why = explain(reading.reason, reading.evidence, limits[change.read_by])
    evidence = text(json.dumps(reading.evidence, sort_keys=True, default=str))
    return (
        f'<b>{text(reading.state.value)}</b> <span title="{evidence}">{text(why)}</span>'
        f'<br><span class="muted">as the {text(change.read_by)} config reads it</span>'
    )


def _cells(change: Change, limits: dict[str, Limits]) -> list[str]:
    r = change.resource
    return [
        '<span class="a-delete" title="deletes what may be alive">!</span>' if change.dangerous else "",
        text(change.target),
        text(r.scope),
        f'<span class="chip">{text(r.kind)}</span>',
        text(r.location),
        text(r.name),
        _side(change.old, limits["old"]),
        _side(change.new, limits["new"]),
        _liveness(change, limits),
    ]


def diff_page(result: ConfigDiff, paths: tuple[str, str], limits: dict[str, Limits]) -> str:
    """The verdict, the phases, then every change (the dangerous ones first)."""
    old, new = result.old, result.new
    dangerous = result.dangerous
    if not result.changes:
        verdict = "no decision changes"
    elif dangerous:
        verdict = (
            f"{len(dangerous)} of {len(result.changes)} changes delete a resource the old config kept while its "
            "liveness evidence is fresh or unknown: the new config fails review (exit 3)"
        )
    else:
        verdict = f"{len(result.changes)} changes; none deletes what may be alive"
    parts = [
        f"<h1>Config review: {text(paths[0])} → {text(paths[1])}</h1>",
        facts(
            [
                ("evaluated as of", text(when(result.now.timestamp()))),
                ("phases", text(", ".join(f"{t} {old.phases[t].value} → {new.phases[t].value}" for t in old.phases))),
                ("verdict", f'<span class="{"a-delete" if result.fails else "a-keep"}">{text(verdict)}</span>'),
                *(("not listed by the recorded input", text(what) + " (exit 3)") for what in result.unlisted),
                *(
                    (f"{name} config capped", text(f"{t}: {n} deletes over max_deletions_per_sweep"))
                    for name, side in (("old", old), ("new", new))
                    for t, n in side.capped.items()
                ),
            ]
        ),
        f"<h2>Decision changes ({len(result.changes)})</h2>",
    ]
    if result.changes:
        parts.append(table((text(h) for h in HEADERS), (_cells(c, limits) for c in result.changes), css="rows"))
    else:
        parts.append('<p class="muted">Both configs decide every resource of this input alike.</p>')
    return document(f"Reaper config review: {paths[1]}", "".join(parts))
