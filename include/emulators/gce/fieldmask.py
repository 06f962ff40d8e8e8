"""Partial responses: the ``fields`` system parameter / ``X-Goog-FieldMask`` header of Google APIs.

Grammar: ``a,b/c,items/*/instances(name,id)``: comma-separated paths of ``/``-separated
names, ``*`` for every key of a map, and ``(...)`` for sub-selections.
"""

from __future__ import annotations

Tree = dict[str, "Tree"]


def parse(mask: str) -> Tree:
    tree: Tree = {}
    position = _fields(mask.replace(" ", ""), 0, tree)
    if position != len(mask.replace(" ", "")):
        raise ValueError(f"invalid field mask {mask!r}")
    return tree


def _fields(text: str, i: int, tree: Tree) -> int:
    while True:
        node = tree
        while True:
            start = i
            while i < len(text) and text[i] not in "/(),":
                i += 1
            if start == i:
                raise ValueError(f"invalid field mask {text!r} at {i}")
            node = node.setdefault(text[start:i], {})
            if i < len(text) and text[i] == "/":
                i += 1
                continue
            break
        if i < len(text) and text[i] == "(":
            i = _fields(text, i + 1, node)
            if i >= len(text) or text[i] != ")":
                raise ValueError(f"unbalanced parentheses in field mask {text!r}")
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        return i


def apply(value: object, tree: Tree) -> object:
    """Keep only the selected fields; an empty subtree keeps the whole value."""
    if not tree:
        return value
    if isinstance(value, list):
        return [apply(v, tree) for v in value]
    if not isinstance(value, dict):
        return value
    if "*" in tree:
        return {k: apply(v, tree["*"]) for k, v in value.items()}
    return {k: apply(value[k], sub) for k, sub in tree.items() if k in value}
