"""Duration strings of the config: short forms (``90s``, ``15m``, ``3h``, ``2d``) and ISO 8601 (``P3D``, ``PT72H``);
and durations in words for people (``5 h 12 min``).

Kept separate from the config model so the CLI and the tests can parse durations
with exactly the rules the config uses, and so the reasons' sentences (:mod:`reaper.vocabulary`) can
quote durations without importing the report.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

EXPECTED = "a duration such as 90s, 15m, 3h, 2d or ISO 8601 (P3D, PT72H)"
# The longest duration anywhere: MongoDB's TTL (``ledger.retention``) takes at most 2**31 - 1
# seconds, and a cap this far below ``timedelta.max`` keeps sums such as
# ``max_job_timeout + slack`` from overflowing.
MAX = timedelta(days=24855)

# re.ASCII: a bare "\d" also matches non-ASCII digits such as "\u0663".
_SHORT = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$", re.ASCII)
_SHORT_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# ISO 8601 durations without years and months: those have no fixed length in seconds.
_ISO = re.compile(
    r"^P(?!$)(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$",
    re.ASCII,
)


def parse_duration(value: object) -> timedelta:
    """Parse a config duration; raise ``ValueError`` naming the accepted forms otherwise.

    Bare numbers are refused on purpose: ``slack: 3600`` could mean seconds or
    minutes, and a wrong guess in a safety margin is how a live VM gets reaped.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        seconds = _seconds(value.strip())
    else:
        raise ValueError(f"expected {EXPECTED}, got {type(value).__name__} {value!r}")
    if seconds < 0:
        raise ValueError(f"expected a non-negative duration, got {value!r}")
    # Compared as seconds: timedelta() itself raises OverflowError long before a float overflows.
    if seconds > MAX.total_seconds():
        raise ValueError(f"expected a duration of at most {MAX.days}d (about 68 years), got {value!r}")
    return timedelta(seconds=seconds)


def _seconds(text: str) -> float:
    if text.startswith("-"):
        raise ValueError(f"expected a non-negative duration, got {text!r}")
    short = _SHORT.match(text)
    if short:
        return float(short.group(1)) * _SHORT_UNITS[short.group(2)]
    iso = _ISO.match(text.upper())
    if iso:
        parts = {k: float(v) for k, v in iso.groupdict().items() if v is not None}
        return sum(parts.get(unit, 0.0) * _SHORT_UNITS[unit] for unit in _SHORT_UNITS)
    raise ValueError(f"expected {EXPECTED}, got {text!r}")


def short(span: timedelta) -> str:
    """``span`` for a message, in whole units largest first (``7d 9m``, ``1h``, ``90s`` as ``1m 30s``, ``0.5s``)."""
    seconds = span.total_seconds()
    parts = []
    for unit in ("d", "h", "m"):
        size = _SHORT_UNITS[unit]
        if seconds >= size:
            whole, seconds = divmod(seconds, size)
            parts.append(f"{whole:.0f}{unit}")
    if seconds or not parts:
        parts.append(f"{seconds:g}s")
    return " ".join(parts)


def duration(seconds: object) -> str:
    """``5 h 12 min``, ``3 d 4 h``, ``45 s``: the largest unit and the next one when not zero, for people."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "unknown"
    left = int(abs(seconds))
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    first = next((i for i, (_, size) in enumerate(units) if left >= size), len(units) - 1)
    (big, big_size), rest = units[first], units[first + 1 : first + 2]
    parts = [f"{left // big_size} {big}"] + [
        f"{left % big_size // size} {unit}" for unit, size in rest if left % big_size // size
    ]
    return ("-" if seconds < 0 else "") + " ".join(parts)
