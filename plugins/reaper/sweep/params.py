"""A manual trigger's params as the sweep's steps read them (docs/design.md §8: every optional one may be null)."""

from __future__ import annotations

from collections.abc import Mapping


def param_text(params: Mapping[str, object], name: str) -> str:
    """A text Param as the run gave it, trimmed; "" when empty (the form's cleared field sends null)."""
    return str(params.get(name) or "").strip()
