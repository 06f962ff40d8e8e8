"""``bench/plan_digest.py`` over each plan's field values in order instead of its encoding
(``python bench/plan_values.py``): a refactor that renames a field of ``Plan`` changes every encoded plan, not
one decision, and this tells the two apart.

It runs ``plan_digest``'s own drawing and hashing code with the encoder swapped for one that encodes a dataclass
as the list of its field values: the same inputs as ``plan_digest`` draws, so its hashes compare between
checkouts whose ``bench/plan_digest.py`` is the same (copy both files into the older one, as for plan_digest).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT)]

import msgspec  # noqa: E402

import bench.plan_digest as plan_digest  # noqa: E402

_encoder = msgspec.msgpack.Encoder()


def _by_value(value: object) -> bytes:
    """A dataclass (the plan) as its field values in order; anything else as msgspec encodes it."""
    fields = list(vars(value).values()) if hasattr(value, "__dataclass_fields__") else value
    return _encoder.encode(fields)


vars(plan_digest)["msgspec"] = types.SimpleNamespace(  # the module's msgspec, its encoder swapped
    msgpack=types.SimpleNamespace(encode=_by_value), structs=msgspec.structs
)

if __name__ == "__main__":
    plan_digest.main()
