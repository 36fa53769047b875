"""Bearer tokens issued into the store: created, listed and revoked with ``broker tokens``,
honoured by every replica next to the config file's ``[auth] tokens``.

A token is ``brk_`` and 43 URL-safe characters (256 random bits from :mod:`secrets`); it is shown
once, when it is created, and the store keeps only its SHA-256 digest with its role, tenants,
expiry, revocation and a note. A token gives a principal through the same roles and the one
authorization table as the config file's (:func:`broker.auth.principal_for`):

- ``tenant``: one tenant (``tenants`` holds it);
- ``scheduler``: the queues/tenants it reports for and watches (``tenants``, comma-separated);
- ``operator``: everything, for any tenant (``tenants`` is ``*``).

The server looks a presented token up by its digest (:class:`IssuedTokens`, the ``issued`` hook
of :class:`broker.auth.Auth`). An index lookup by digest tells a caller nothing about any other
token: without a preimage of SHA-256, how far two digests agree says nothing about a token;
the row found is still compared in constant time. Each replica keeps what it looked up for
``[auth] store_cache_s`` (2 s): a revocation in the store is honoured by every replica within
that, and an expiry at its instant (the expiry travels with the cached answer).
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from sqlalchemy import update
from sqlmodel import Field, Session, SQLModel, select

PREFIX = "brk_"
ROLES = ("tenant", "scheduler", "operator")
ANY = "*"
MAX_NOTE = 200
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,6})([smhdw])\Z")
MAX_LIFETIME_S = 10 * 366 * 86400


class TokenRecord(SQLModel, table=True):
    """One issued token: never the token itself, only its SHA-256 digest."""

    __tablename__ = "tokens"
    id: str = Field(primary_key=True)
    role: str  # tenant | scheduler | operator
    tenants: str  # the tenant; a scheduler's queues, comma-separated; "*" for an operator
    digest: str = Field(unique=True, index=True)  # hex SHA-256 of the token
    created_at: float
    expires_at: Optional[float] = None  # None: never
    revoked_at: Optional[float] = None
    note: str = ""

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


def new_token() -> str:
    """A fresh token: the recognisable prefix and 256 random bits."""
    return PREFIX + secrets.token_urlsafe(32)


def digest_hex(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_duration(text: str) -> Optional[float]:
    """``90d``, ``12h``, ``30m``, ``45s``, ``2w`` → seconds; ``never`` → None (ValueError with
    a sentence otherwise)."""
    t = text.strip().lower()
    if t == "never":
        return None
    m = _DURATION.match(t)
    seconds = int(m[1]) * _UNITS[m[2]] if m else 0
    if not m or seconds <= 0:
        raise ValueError(f"must be a duration like 90d, 12h, 30m or 2w (or never), got {text[:32]!r}")
    if seconds > MAX_LIFETIME_S:
        raise ValueError(f"must be at most ten years, got {text[:32]!r}")
    return float(seconds)


def check_grant(role: str, tenants: Iterable[str]) -> tuple[str, str]:
    """(role, stored tenants) for a new token, or ValueError with a sentence: the role is one of
    :data:`ROLES`, and the tenants make a principal of it (the same rules as the config file's)."""
    from broker.auth import principal_for

    if role not in ROLES:
        raise ValueError(f"unknown role {role[:32]!r} (tenant, scheduler or operator)")
    names = [t.strip() for part in tenants for t in part.split(",") if t.strip()]
    if role == "operator":
        if names:
            raise ValueError("an operator token acts for every tenant: give it no tenant")
        return role, ANY
    p = principal_for(role, names)
    return role, ",".join(sorted(p.tenants))


def check_note(note: str) -> None:
    if len(note) > MAX_NOTE or any(ord(c) < 32 or ord(c) == 127 for c in note):
        raise ValueError(f"a note is one line of at most {MAX_NOTE} characters")


class TokenStore:
    """Issued tokens in the store's database: create, list, revoke, look up."""

    def __init__(self, engine, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock

    def create(self, role: str, tenants: Iterable[str], expires_in_s: Optional[float] = None,
               note: str = "") -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself (the only time it exists outside the
        caller's hands). ValueError with a sentence for a bad role, tenant or note."""
        role, stored = check_grant(role, tenants)
        check_note(note)
        now = self.clock()
        token = new_token()
        rec = TokenRecord(id=f"tok-{secrets.token_hex(5)}", role=role, tenants=stored, digest=digest_hex(token),
                          created_at=now, expires_at=None if expires_in_s is None else now + expires_in_s,
                          note=note)
        with Session(self.engine) as s:
            s.add(rec)
            s.commit()
            s.refresh(rec)
            s.expunge(rec)
        return rec, token

    def list(self, include_inactive: bool = False) -> list[TokenRecord]:
        """Tokens, newest first (active ones only unless ``include_inactive``)."""
        now = self.clock()
        with Session(self.engine) as s:
            rows = list(s.exec(select(TokenRecord).order_by(TokenRecord.created_at.desc(),  # type: ignore[attr-defined]
                                                            TokenRecord.id)))
        return [r for r in rows if include_inactive or r.status(now) == "active"]

    def get(self, token_id: str) -> TokenRecord | None:
        with Session(self.engine) as s:
            return s.get(TokenRecord, token_id)

    def revoke(self, token_id: str) -> tuple[TokenRecord, bool]:
        """Revoke ``token_id``: (its record, whether this call revoked it; False when it already
        was). LookupError when there is no such token."""
        now = self.clock()
        with Session(self.engine) as s:
            done = s.exec(update(TokenRecord).where(TokenRecord.id == token_id,  # type: ignore[arg-type]
                                                    TokenRecord.revoked_at.is_(None))  # type: ignore[union-attr]
                          .values(revoked_at=now)).rowcount
            s.commit()
            rec = s.get(TokenRecord, token_id)
        if rec is None:
            raise LookupError(token_id)
        return rec, bool(done)

    def by_digest(self, digest: bytes) -> TokenRecord | None:
        """The token whose SHA-256 is ``digest`` (revoked and expired ones included)."""
        want = digest.hex()
        t = TokenRecord.__table__
        with self.engine.connect() as conn:  # one indexed read, no ORM session (every cache miss)
            row = conn.execute(select(t).where(t.c.digest == want)).first()
        if row is None or not hmac.compare_digest(row.digest, want):
            return None
        return TokenRecord(**row._mapping)


@dataclass(frozen=True)
class _Answer:
    principal: object  # broker.auth.Principal, or None: no usable token
    expires_at: Optional[float]
    fetched: float  # monotonic


class IssuedTokens:
    """The ``issued`` hook of :class:`broker.auth.Auth`: digest → principal, from the store,
    remembered for ``ttl_s`` (0: every call asks the store). A revoked, expired or unknown token
    gives None (UNAUTHENTICATED); a store that cannot answer is UNAVAILABLE, never a pass."""

    MAX_ENTRIES = 10_000

    def __init__(self, tokens: TokenStore, ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.tokens, self.ttl_s, self.clock, self.monotonic = tokens, ttl_s, clock, monotonic
        self._cache: OrderedDict[bytes, _Answer] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0  # store reads, for the figures in benchmarks/tokens.py

    def __call__(self, digest: bytes):
        now = self.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is None or now - hit.fetched >= self.ttl_s:
            hit = self._fetch(digest, now)
        if hit.principal is None or (hit.expires_at is not None and hit.expires_at <= self.clock()):
            return None
        return hit.principal

    def _fetch(self, digest: bytes, now: float) -> _Answer:
        from sqlalchemy.exc import SQLAlchemyError

        from broker.auth import principal_for
        from broker.errors import Unavailable

        self.lookups += 1
        try:
            rec = self.tokens.by_digest(digest)
        except SQLAlchemyError:
            raise Unavailable("the token store is unavailable; retry shortly.") from None
        principal = None
        if rec is not None and rec.revoked_at is None:
            try:
                principal = principal_for(rec.role, rec.tenants.split(","))
            except ValueError:  # a row edited by hand into something no role allows
                principal = None
        answer = _Answer(principal, rec.expires_at if rec is not None else None, now)
        if self.ttl_s > 0:
            with self._lock:
                self._cache[digest] = answer
                self._cache.move_to_end(digest)
                while len(self._cache) > self.MAX_ENTRIES:
                    self._cache.popitem(last=False)
        return answer


def _iso(ts: Optional[float]) -> Optional[str]:
    import datetime as dt

    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def token_view(rec: TokenRecord, now: float) -> dict:
    """A token as ``broker tokens list -o json`` shows it: never the token, and of its digest
    only the first 12 hex digits (enough to tell tokens apart, nothing to authenticate with)."""
    return {"id": rec.id, "role": rec.role, "tenants": rec.tenants.split(","), "status": rec.status(now),
            "created_at": _iso(rec.created_at), "expires_at": _iso(rec.expires_at),
            "revoked_at": _iso(rec.revoked_at), "sha256_prefix": rec.digest[:12], "note": rec.note}
