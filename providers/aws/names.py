"""AWS's rule for a node's name, which becomes its ``Name`` tag: a tag value of at most 256
characters of letters, digits, spaces and ``_ . : / = + - @``, not starting with ``aws:``
(reserved)."""
from __future__ import annotations

_PUNCT = set(" _.:/=+-@")


def node_name_problem(name: str) -> str:
    """Why EC2 would refuse ``name`` as a ``Name`` tag value ("" when it takes it)."""
    if not name:
        return "is empty"
    if len(name) > 256:
        return f"is {len(name)} characters long; an AWS tag value holds at most 256"
    if name.lower().startswith("aws:"):
        return "starts with aws:, which AWS reserves"
    bad = next((c for c in name if not (c.isalnum() or c in _PUNCT)), "")
    if bad:
        return f"contains {bad!r}: an AWS tag value takes letters, digits, spaces and _ . : / = + - @"
    return ""
