"""Google Cloud's label syntax, which the Compute API enforces on every instance's labels.

Keys of 1 to 63 characters starting with a lowercase letter, values of at most 63; both only lowercase letters,
digits, underscores and dashes, international characters allowed (Compute Engine docs, "Organize resources using
labels": requirements for labels; the API's own pattern, quoted in its refusals: key
``[\\p{Ll}\\p{Lo}][\\p{Ll}\\p{Lo}\\p{N}_-]{0,62}``). The config refuses selectors and label names no instance can
carry (:mod:`reaper.config`), and the emulator refuses such labels as the API does.
"""

from __future__ import annotations

import unicodedata

MOST = 63  # characters of a key or of a value


def _letter(char: str) -> bool:
    """A lowercase or uncased (international) letter: Unicode classes Ll and Lo."""
    return unicodedata.category(char) in ("Ll", "Lo")


def _rest(char: str) -> bool:
    return _letter(char) or char in "_-" or unicodedata.category(char).startswith("N")


def key_ok(key: str) -> bool:
    return 0 < len(key) <= MOST and _letter(key[0]) and all(map(_rest, key))


def value_ok(value: str) -> bool:
    return len(value) <= MOST and all(map(_rest, value))
