"""Timestamps as text: the one RFC 3339 (UTC, seconds, ``Z``) form of every time in the JSON,
the CLI and the messages. A leaf module (standard library only), so anything may import it."""
from __future__ import annotations

import datetime as dt


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def as_of(text: str) -> str:
    """A catalog or price date as RFC 3339 in UTC, like every other timestamp in the JSON
    ("2025-06-01" -> "2025-06-01T00:00:00Z"); empty stays empty, anything unreadable as it is."""
    t = (text or "").strip()
    if not t:
        return ""
    try:
        d = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return t
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    return d.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
