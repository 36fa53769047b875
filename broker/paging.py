"""Pages of lease listings (ListLeases): a bounded page size and an opaque token to go on.

A listing returns at most ``limit`` leases (0 = :data:`DEFAULT_PAGE`; more than :data:`MAX_PAGE`
is INVALID_ARGUMENT naming ``limit``, see :data:`broker.limits.FIELDS`), newest first, and a
``next_page_token`` while older ones match: the next call with that token returns the leases
after the last one returned, so a client reads any history in bounded pages. The token is the
last lease's creation time and id (URL-safe base64 of JSON); it selects a position, never a lease
or a tenant, so a caller sees through it only what its own listing shows.
"""
from __future__ import annotations

import base64
import binascii
import json
import math

from broker.errors import InvalidArgument

#: Leases in a page when the request asks for none in particular (limit 0).
DEFAULT_PAGE = 100
#: The most leases one page holds.
MAX_PAGE = 1000


def page_size(limit: int) -> int:
    """The leases a page of ``limit`` holds (the edge's bounds checked it already)."""
    if limit < 0:
        raise InvalidArgument(f"limit must be zero or more, got {limit}.", field="limit")
    if limit > MAX_PAGE:
        raise InvalidArgument(f"limit must be at most {MAX_PAGE:,}, got {limit}.", field="limit")
    return limit or DEFAULT_PAGE


def encode(created_at: float, lease_id: str) -> str:
    """The token of the page after the one that ended with this lease."""
    return base64.urlsafe_b64encode(json.dumps([created_at, lease_id]).encode()).decode().rstrip("=")


def decode(token: str) -> tuple[float, str] | None:
    """``(created_at, lease_id)`` of the last lease before the page ``token`` asks for; None for
    "" (the first page). A token this module did not make is INVALID_ARGUMENT naming page_token."""
    if not token:
        return None
    try:
        at, lease_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at) \
                and isinstance(lease_id, str):
            return float(at), lease_id
    except (ValueError, TypeError, binascii.Error):
        pass
    raise InvalidArgument("page_token is not a token a lease listing returned; pass the "
                          "next_page_token of the previous page, or none for the first page.", field="page_token")
