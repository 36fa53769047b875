"""AWS's rule for a node's name, which becomes its ``Name`` tag: a tag value of at most 256
characters of letters, digits, spaces and ``_ . : / = + - @``, not starting with ``aws:``
(reserved)."""
from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from providers.base import LaunchSpec

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


CLIENT_TOKEN_LIMIT = 64  # EC2's ClientToken: at most 64 ASCII characters


def client_token(spec: LaunchSpec) -> str:
    """EC2's idempotency token for ``spec``: the broker's token when it fits, else its hash."""
    token = spec.client_token or f"lease-{spec.lease_id}"
    if len(token) <= CLIENT_TOKEN_LIMIT and token.isascii() and token.isprintable():
        return token
    import hashlib  # OpenSSL's start-up, ~3 ms, off the path of every command that never launches

    return "h-" + hashlib.sha256(token.encode()).hexdigest()[: CLIENT_TOKEN_LIMIT - 2]


def _price(micros: int) -> str:
    """Micro-dollars as EC2's price string (``"12.5"``)."""
    return format(Decimal(micros).scaleb(-6).normalize(), "f")
