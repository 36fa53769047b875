"""The store: quotes, leases and their every transition, decisions, blocks, snapshots.

SQLite (WAL) is the embedded default; PostgreSQL is the production store (``--db
postgresql+psycopg://...``). Lease writes use optimistic versioning: every update names the
version it read, so two replicas can never both act on one lease.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from sqlalchemy import BigInteger, Index, Integer, String, Text, UniqueConstraint, delete, func, insert, text, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, select
from broker.engine import MAX_OVERFLOW, WARM_CONNECTIONS, engine_for
from broker.errors import Unavailable

if TYPE_CHECKING:
    from broker.quote import StoredQuote

from broker import records, spend
from broker.lease import TRANSITIONS, EventKind, Lease, LeaseState, check_transition, encode


#: Money (micro-dollars) and counters are 64-bit on every store: a 32-bit column of micro-dollars
#: overflows at $2,147.48, which one large lease accrues in hours.
INT64 = BigInteger().with_variant(Integer, "sqlite")  # SQLite's INTEGER is 64-bit (and the rowid)


def int64(default: int = 0) -> Any:
    return Field(default=default, sa_type=INT64)


class StaleLease(RuntimeError):
    """Another writer changed the lease since it was read; re-read and decide again."""


class QuoteRecord(SQLModel, table=True):
    __tablename__ = "quotes"
    quote_id: str = Field(primary_key=True)
    created_at: float
    valid_until: float = Field(index=True)
    body: str  # the StoredQuote as JSON (its demand and launchable offers)


class LeaseRecord(SQLModel, table=True):
    __tablename__ = "leases"
    # Listings are newest first (creation time, then id) and paged (ListLeases' limit and page
    # token): the first two indexes let the store read only the rows it returns, however many
    # ended leases it keeps; the second also serves every lookup by tenant. The last two read
    # live leases by state, and ended ones from a time on (a tenant's month for its budget,
    # /metrics' recent ones), without reading the ended leases before it.
    __table_args__ = (UniqueConstraint("tenant", "idempotency_key", name="uq_lease_idempotency"),
                      Index("ix_leases_created_at_lease_id", "created_at", "lease_id"),
                      Index("ix_leases_tenant_created_at_lease_id", "tenant", "created_at", "lease_id"),
                      Index("ix_leases_tenant_state_ended_at", "tenant", "state", "ended_at"),
                      Index("ix_leases_state_ended_at", "state", "ended_at"))
    lease_id: str = Field(primary_key=True)
    tenant: str = Field(default="default")
    idempotency_key: str = Field(index=True)
    state: str
    state_reason: str = ""
    version: int = int64(1)
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    nodes: int = Field(sa_type=INT64)
    hourly_micros: int = Field(sa_type=INT64)  # per node
    reservation: str = ""
    client_token: str  # the cloud-side idempotency token of the current launch attempt
    attempt: int = int64()
    quote_id: str = ""
    offer_rank: int = int64()
    bootstrap: str = ""
    job: str = "{}"  # JSON: job_id, owner, queue, checkpoint_uri, dataset_uri, env
    instances: str = "[]"  # JSON list of instance dicts
    demand: str = "{}"  # JSON demand for replacements and failover ("{}" = explicit launch)
    attempts: str = "[]"  # JSON list of failed attempts (provider, code, scope, message)
    created_at: float
    updated_at: float
    state_since: float
    started_at: float = 0.0  # first time running
    ended_at: float = 0.0
    accrued_micros: int = int64()  # spend accrued up to accrued_at
    accrued_at: float = 0.0
    max_lifetime_s: int = int64()
    idle_since: float = 0.0
    replaces: str = ""  # lease id this one replaces after an interruption
    job_state: str = ""  # the attached job's: "" none, running, succeeded, failed, cancelled
    starts_at: float = 0.0  # a bought Capacity Block's start: the lease waits for it (0 = none)


class LeaseCredentialRecord(SQLModel, table=True):
    """A lease's callback credential (broker.jobs): only its SHA-256 digest. Minted for each boot
    script rendered, valid for that lease's job reports only, revoked when the lease ends."""
    __tablename__ = "lease_credentials"
    digest: str = Field(primary_key=True)  # hex SHA-256 of the credential
    lease_id: str = Field(index=True)
    created_at: float
    revoked_at: float | None = None


class LeaseEventRecord(SQLModel, table=True):
    __tablename__ = "lease_events"
    id: int | None = Field(default=None, primary_key=True, sa_type=INT64)
    lease_id: str = Field(index=True)
    at: float = Field(index=True)  # /metrics counts the events of the last hour, the rest once
    kind: str  # an EventKind value (broker.lease)
    from_state: str = ""
    to_state: str = ""
    message: str = ""
    data: str = "{}"


class DecisionRecord(SQLModel, table=True):
    __tablename__ = "decisions"
    decision_id: str = Field(primary_key=True)
    at: float = Field(index=True)
    action: str
    reason: str
    job_ids: str = "[]"
    lease_id: str = ""
    data: str = "{}"


class BlockRecord(SQLModel, table=True):
    __tablename__ = "blocks"
    scope_key: str = Field(primary_key=True)
    until: float
    reason: str


class SnapshotRecord(SQLModel, table=True):
    __tablename__ = "snapshots"
    source: str = Field(primary_key=True)
    taken_at: float
    body: str


class MarketSnapshotRecord(SQLModel, table=True):
    """A provider's live market (broker/market_store.py reads and writes it in plain SQL)."""
    __tablename__ = "market_snapshots"
    provider: str = Field(primary_key=True, sa_type=String(16))
    fetched_at: float
    attempted_at: float
    last_error: str = Field(sa_type=Text)
    body: str = Field(sa_type=Text)


class Store:
    """All persistence. Thread-safe; every method is one transaction."""

    def __init__(self, url: str, connect_timeout_s: float = 10.0, pool_size: int | None = None,
                 max_overflow: int = MAX_OVERFLOW) -> None:
        self.url = url
        self.engine = engine_for(url, connect_timeout_s=connect_timeout_s, pool_size=pool_size,
                                 max_overflow=max_overflow)
        self._create_schema()
        self._changed = threading.Condition()
        self._recent: OrderedDict[str, tuple] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._pending: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self._blocks: tuple[float, list[BlockRecord]] | None = None

    def _create_schema(self) -> None:
        """Bring the database to the newest schema revision (broker/migrate.py): creates an empty
        one, upgrades an older one (under the schema lock on PostgreSQL), refuses a newer one."""
        from broker import migrate

        done = migrate.upgrade(self.engine)
        if done.changed:
            _log().info(
                "schema_upgraded", database=migrate.where(self.url), before=done.before, after=done.after,
                made_before_migrations=done.adopted)

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def connections_past_server(self, processes: int) -> str:
        """On PostgreSQL, a sentence when ``processes`` pools of this size (``[store] pool_size``
        plus ``max_overflow`` each) could open more connections than the server takes
        (``max_connections`` less ``superuser_reserved_connections``), else "" (and on SQLite).
        Replicas on other hosts come on top, so this is the least a deployment needs."""
        pool = self.engine.pool
        if self.engine.dialect.name != "postgresql" or not hasattr(pool, "size"):
            return ""
        most = processes * (pool.size() + max(0, pool._max_overflow))
        with self.engine.connect() as conn:
            limit = int(conn.exec_driver_sql("SHOW max_connections").scalar() or 0)
            reserved = int(conn.exec_driver_sql("SHOW superuser_reserved_connections").scalar() or 0)
        if most <= limit - reserved:
            return ""
        return (f"{processes} serving process(es) x ([store] pool_size {pool.size()} + max_overflow "
                f"{pool._max_overflow}) = {most} connections at most, but the PostgreSQL server takes "
                f"{limit - reserved} (max_connections {limit} less {reserved} reserved): under load, "
                f"calls past that fail; lower [store] pool_size or raise max_connections.")

    def open_connections(self, at_most: int = WARM_CONNECTIONS) -> int:
        """Open the pool's connections now (at start-up), not as the first calls arrive and each
        waits for its own (a PostgreSQL connection is a new server process); returns how many.
        At most ``at_most``: a pool sized for every worker grows to its size under load and keeps
        them, while replicas and tests that start together stay within the server's connections."""
        size = min(at_most, getattr(self.engine.pool, "size", lambda: 1)())
        conns = []
        try:
            for _ in range(size):
                conns.append(self.engine.connect())
                conns[-1].exec_driver_sql("SELECT 1")
        finally:
            for c in conns:
                c.close()
        return len(conns)

    def close(self) -> None:
        if self._writer is not None:
            self._pending.put(None)
            self._writer.join(10)
            self._writer = None
        self.engine.dispose()

    # -- change notification (WatchLeases in this process; other replicas poll) ---------------
    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_for_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    # -- quotes ----------------------------------------------------------------------------------
    # A quote is on disk before its id is returned, so every replica can launch it. The writes
    # are group commits: a writer thread inserts whatever quotes are waiting in one transaction
    # and wakes their callers, so concurrent Quote RPCs share a commit instead of queueing on it.
    def save_quote(self, quote: "StoredQuote") -> None:
        """Write ``quote``; returns once it is committed (Unavailable if it could not be)."""
        from concurrent.futures import Future

        done: Future = Future()
        with self._recent_lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_quotes, name="quote-writer", daemon=True)
                self._writer.start()
        self._pending.put((quote, done))
        done.result()
        with self._recent_lock:  # this replica answers its own recent quotes from memory
            self._recent[quote.quote_id] = quote
            while len(self._recent) > 8192:
                self._recent.popitem(last=False)

    def _write_quotes(self) -> None:
        while True:
            first = self._pending.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < 512:
                try:
                    nxt = self._pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._pending.put(None)
                    break
                batch.append(nxt)
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(QuoteRecord.__table__), [
                        {"quote_id": q.quote_id, "created_at": q.created_at, "valid_until": q.valid_until,
                         "body": q.to_json().decode()} for q, _ in batch])
            except Exception as e:  # the writer outlives a failed batch; its callers hear of it
                _log().warning("quote_write_failed", quotes=len(batch), error=type(e).__name__)
                for _, done in batch:
                    done.set_exception(Unavailable("the quote could not be stored (the database is "
                                                   "unavailable); ask again shortly."))
            else:
                for _, done in batch:
                    done.set_result(None)

    def get_quote(self, quote_id: str) -> "StoredQuote | None":
        from broker.quote import StoredQuote

        with self._recent_lock:
            hit = self._recent.get(quote_id)
        if hit is not None:
            return hit
        with Session(self.engine) as s:
            r = s.get(QuoteRecord, quote_id)
        if r is None:
            return None
        try:
            return StoredQuote.from_json(r.body)
        except ValueError:  # stored by a release with another layout: the client re-quotes
            return None

    def prune_quotes(self, before: float) -> int:
        """Delete quotes that expired before ``before``; returns how many."""
        with self.engine.begin() as conn:
            return conn.execute(delete(QuoteRecord.__table__).where(QuoteRecord.__table__.c.valid_until < before)).rowcount

    # -- leases ----------------------------------------------------------------------------------
    # Leases are read as plain rows (no ORM state: a reconciler pass reads thousands) and handed
    # out as :class:`broker.lease.Lease` snapshots with their JSON columns decoded once.
    _leases = LeaseRecord.__table__
    _lease_columns = tuple(LeaseRecord.__table__.columns.keys())

    def _read_leases(self, conn, q) -> list[Lease]:
        cols = self._lease_columns
        return [Lease.from_row(cols, r) for r in conn.execute(q)]

    TENANT_LOCK = 0x62726F62  # "brob": namespace of the per-tenant admission locks

    def _lock_tenant(self, conn, tenant: str) -> None:
        """Serialise this transaction with every other one that checks ``tenant``'s budget: a
        PostgreSQL advisory lock on the tenant, SQLite's write lock."""
        if self.is_postgres:
            conn.execute(text("SELECT pg_advisory_xact_lock(:ns, hashtext(:tenant))"),
                         {"ns": self.TENANT_LOCK, "tenant": tenant})
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def create_lease(self, lease: Lease, message: str = "lease requested", *,
                     admit: Callable[[spend.Counted], None] | None = None,
                     counted_since: float = 0.0) -> tuple[Lease, bool]:
        """Insert ``lease`` unless the tenant already used its idempotency key.

        ``admit`` (a budget check) is called with what counts against the tenant's caps from
        ``counted_since`` (:func:`broker.spend.counted`) and raises to refuse. The check and the
        insert are one atomic step: the transaction first takes the tenant's lock (a transaction
        advisory lock on PostgreSQL, the database write lock — ``BEGIN IMMEDIATE`` — on SQLite),
        so two launches at once cannot both fit under a cap that holds only one.

        Returns (lease, created): on a repeated key, the existing lease and False.
        """
        t = self._leases
        try:
            with self.engine.begin() as conn:
                self._lock_tenant(conn, lease.tenant)
                existing = self._by_key(conn, lease.tenant, lease.idempotency_key)
                if existing is not None:
                    return existing, False
                if admit is not None:
                    admit(spend.counted(conn, t, lease.tenant, counted_since))
                conn.execute(insert(t).values(**lease.to_row()))
                conn.execute(insert(LeaseEventRecord.__table__).values(
                    lease_id=lease.lease_id, at=lease.created_at, kind=EventKind.STATE_CHANGED.value, from_state="",
                    to_state=LeaseState(lease.state).value, message=message, data="{}"))
                # read back in the writing transaction: the row as stored, whatever another writer
                # does to it once this one commits
                created = self._read_leases(conn, select(t).where(t.c.lease_id == lease.lease_id))[0]
        except IntegrityError:
            with self.engine.connect() as conn:
                existing = self._by_key(conn, lease.tenant, lease.idempotency_key)
            if existing is None:
                raise
            return existing, False
        self._notify()
        return created, True

    def _by_key(self, conn, tenant: str, key: str) -> Lease | None:
        t = self._leases
        found = self._read_leases(conn, select(t).where(t.c.tenant == tenant, t.c.idempotency_key == key))
        return found[0] if found else None

    def lease_by_key(self, tenant: str, key: str) -> Lease | None:
        """The tenant's lease with this idempotency key (one indexed lookup)."""
        with self.engine.connect() as conn:
            return self._by_key(conn, tenant, key)

    def get_lease(self, lease_id: str) -> Lease | None:
        t = self._leases
        with self.engine.connect() as conn:
            found = self._read_leases(conn, select(t).where(t.c.lease_id == lease_id))
        return found[0] if found else None

    def _lease_query(self, q, states: Sequence[str], tenant: str):
        t = self._leases
        if states:
            q = q.where(t.c.state.in_([LeaseState(s).value for s in states]))
        if tenant:
            q = q.where(t.c.tenant == tenant)
        return q

    def list_leases(self, states: Sequence[str] = (), tenant: str = "", limit: int = 0,
                    before: tuple[float, str] | None = None) -> list[Lease]:
        """Leases newest first (by creation time, then id), at most ``limit`` (0 = all).

        ``before``: only leases after this ``(created_at, lease_id)`` in that order, the last one
        of a previous page. Either way the database walks ``ix_leases_created_at_lease_id`` (or
        the tenant's) and stops at the limit, whatever history the store keeps.
        """
        t = self._leases
        q = self._lease_query(select(t), states, tenant).order_by(t.c.created_at.desc(), t.c.lease_id.desc())
        if before is not None:
            at, lease_id = before
            q = q.where(t.c.created_at <= at, (t.c.created_at < at) | (t.c.lease_id < lease_id))
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return self._read_leases(conn, q)

    def lease_rows(self, columns: Sequence[str], states: Sequence[str] = (), tenant: str = "") -> list[Any]:
        """Only ``columns`` of the matching leases, as plain rows (attribute access, values as
        stored: ``state`` a string, JSON columns text), in no particular order. For passes over
        every live lease (the reconciler, notices), which read the full :class:`Lease` only of
        the few they act on: at 100,000 leases this is a fraction of the time and memory."""
        t = self._leases
        q = self._lease_query(select(*(t.c[c] for c in columns)), states, tenant)
        with self.engine.connect() as conn:
            return conn.execute(q).all()

    def counted(self, tenant: str, since: float) -> spend.Counted:
        """What counts against ``tenant``'s budget caps from ``since`` (:func:`broker.spend.counted`)."""
        with self.engine.connect() as conn:
            return spend.counted(conn, self._leases, tenant, since)

    def update_lease(self, lease: Lease, *, now: float, state: LeaseState | None = None,
                     message: str = "", event_kind: EventKind | None = None, event_data: dict | None = None,
                     events: Sequence[tuple[EventKind, str, dict]] = (), **fields: Any) -> Lease:
        """Write ``fields`` (and a state change) iff the lease is still at ``lease.version``.

        This is the one place a lease's state is written: a change :data:`broker.lease.TRANSITIONS`
        does not allow raises :class:`broker.lease.InvalidTransition` before anything is written.
        JSON fields (job, instances, demand, attempts) are given as Python values.
        A state change, or ``event_kind``, also appends a lease event in the same transaction, as
        do ``events`` (``(kind, message, data)`` each), so a change and what it announces (an
        interruption and the requeue of its job) are written together or not at all.
        Raises :class:`StaleLease` when another writer got there first.
        """
        with self.engine.begin() as conn:
            fresh = self._update(conn, lease, now=now, state=state, message=message, event_kind=event_kind,
                                 event_data=event_data, events=events, fields=fields)
        self._notify()
        return fresh

    def charge_lease(self, lease: Lease, *, now: float, admit: Callable[[spend.Counted], None] | None,
                     counted_since: float = 0.0, state: LeaseState | None = None, message: str = "",
                     event_kind: EventKind | None = None, event_data: dict | None = None,
                     **fields: Any) -> Lease:
        """:meth:`update_lease` with a spend the tenant's budget must cover: ``admit`` is called with
        what counts against the tenant's caps (as :meth:`create_lease` does) under its lock, in the
        transaction that writes ``fields`` — two purchases at once cannot both fit under a cap that
        holds only one. ``admit`` raises to refuse (nothing is written then)."""
        t = self._leases
        with self.engine.begin() as conn:
            self._lock_tenant(conn, lease.tenant)
            if admit is not None:
                admit(spend.counted(conn, t, lease.tenant, counted_since))
            fresh = self._update(conn, lease, now=now, state=state, message=message, event_kind=event_kind,
                                 event_data=event_data, events=(), fields=fields)
        self._notify()
        return fresh

    def _update(self, conn, lease: Lease, *, now: float, state: LeaseState | None, message: str,
                event_kind: EventKind | None, event_data: dict | None,
                events: Sequence[tuple[EventKind, str, dict]], fields: dict[str, Any]) -> Lease:
        frm = LeaseState(lease.state)
        to = frm if state is None else check_transition(frm, state)
        values = encode(fields)
        values["version"] = lease.version + 1
        values["updated_at"] = now
        if to is not frm:
            values.update(state=to.value, state_since=now, state_reason=message)
        t, ev = self._leases, LeaseEventRecord.__table__
        rows = []
        if to is not frm:
            rows.append((EventKind.STATE_CHANGED, message, event_data))
        if event_kind:
            rows.append((event_kind, message, event_data))
        rows.extend(events)
        res = conn.execute(update(t).where(t.c.lease_id == lease.lease_id, t.c.version == lease.version)
                           .values(**values))
        if res.rowcount != 1:
            raise StaleLease(f"lease {lease.lease_id} changed since version {lease.version}")
        if to is not frm and not TRANSITIONS[to]:  # ended: its nodes' credentials go with it
            cred = LeaseCredentialRecord.__table__
            conn.execute(update(cred).where(cred.c.lease_id == lease.lease_id, cred.c.revoked_at.is_(None))
                         .values(revoked_at=now))
        if rows:
            conn.execute(insert(ev), [
                {"lease_id": lease.lease_id, "at": now, "kind": str(kind), "from_state": frm.value,
                 "to_state": to.value, "message": msg, "data": json.dumps(data or {}, default=records.to_builtins)}
                for kind, msg, data in rows])
        (fresh,) = self._read_leases(conn, select(t).where(t.c.lease_id == lease.lease_id))
        return fresh

    def add_event(self, lease_id: str, kind: EventKind, message: str, now: float, data: dict | None = None) -> None:
        with Session(self.engine) as s:
            s.add(LeaseEventRecord(lease_id=lease_id, at=now, kind=str(kind), message=message,
                                   data=json.dumps(data or {}, default=records.to_builtins)))
            s.commit()
        self._notify()

    def events_after(self, after_id: int, lease_id: str = "", limit: int = 500) -> list[LeaseEventRecord]:
        q = select(LeaseEventRecord).where(LeaseEventRecord.id > after_id)
        if lease_id:
            q = q.where(LeaseEventRecord.lease_id == lease_id)
        with Session(self.engine) as s:
            return list(s.exec(q.order_by(LeaseEventRecord.id).limit(limit)).all())

    def last_event_id(self) -> int:
        with Session(self.engine) as s:
            return int(s.exec(select(func.max(LeaseEventRecord.id))).one() or 0)

    def events_of(self, lease_id: str) -> list[LeaseEventRecord]:
        return self.events_after(0, lease_id, limit=10_000)

    # -- decisions -------------------------------------------------------------------------------
    def record_decision(self, decision_id: str, at: float, action: str, reason: str,
                        job_ids: Iterable[str] = (), lease_id: str = "", data: dict | None = None) -> None:
        with Session(self.engine) as s:
            s.add(DecisionRecord(decision_id=decision_id, at=at, action=str(action), reason=reason,
                                 job_ids=json.dumps(list(job_ids)), lease_id=lease_id,
                                 data=json.dumps(data or {}, default=records.to_builtins)))
            s.add(LeaseEventRecord(lease_id=lease_id, at=at, kind=EventKind.DECISION.value, message=reason,
                                   data=json.dumps({"decision_id": decision_id, "action": str(action),
                                                    "job_ids": list(job_ids)})))
            s.commit()
        self._notify()

    def list_decisions(self, limit: int = 100, since: float = 0.0) -> list[DecisionRecord]:
        with Session(self.engine) as s:
            q = select(DecisionRecord).where(DecisionRecord.at >= since).order_by(DecisionRecord.at.desc()).limit(limit)
            return list(s.exec(q).all())

    # -- blocks (failover and interruptions) -----------------------------------------------------
    def block(self, scope_key: str, until: float, reason: str) -> None:
        self._blocks = None
        with Session(self.engine) as s:
            r = s.get(BlockRecord, scope_key)
            if r is None:
                s.add(BlockRecord(scope_key=scope_key, until=until, reason=reason))
            elif r.until < until:
                r.until, r.reason = until, reason
                s.add(r)
            s.commit()

    BLOCKS_TTL_S = 1.0  # blocks written by other replicas are seen within this long

    def active_blocks(self, now: float) -> dict[str, str]:
        cached = self._blocks
        if cached is None or time.monotonic() - cached[0] > self.BLOCKS_TTL_S:
            with Session(self.engine) as s:
                rows = list(s.exec(select(BlockRecord)).all())
            cached = self._blocks = (time.monotonic(), rows)
        return {r.scope_key: r.reason for r in cached[1] if r.until > now}

    # -- snapshots -------------------------------------------------------------------------------
    def save_snapshot(self, source: str, taken_at: float, body: dict | str) -> None:
        """Keep ``source``'s newest snapshot: one upsert, so concurrent reports of one source never
        collide, and a report that arrives after a newer one does not replace it. ``body`` is the
        document, or its JSON text already encoded (:func:`broker.watchers.snapshot_json.encode`)."""
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        text = body if isinstance(body, str) else json.dumps(body)
        row = insert(SnapshotRecord).values(source=source, taken_at=taken_at, body=text)
        row = row.on_conflict_do_update(
            index_elements=[SnapshotRecord.source],
            set_={"taken_at": row.excluded.taken_at, "body": row.excluded.body},
            where=SnapshotRecord.taken_at <= row.excluded.taken_at)
        with Session(self.engine) as s:
            s.exec(row)
            s.commit()

    def snapshots_since(self, taken_after: float) -> list[tuple[str, float, dict]]:
        """(source, taken_at, body) of every source's latest snapshot taken after ``taken_after``."""
        with Session(self.engine) as s:
            rows = s.exec(select(SnapshotRecord).where(SnapshotRecord.taken_at > taken_after)
                          .order_by(SnapshotRecord.taken_at)).all()
            return [(r.source, r.taken_at, json.loads(r.body)) for r in rows]

    def latest_snapshot(self, source: str = "") -> dict | None:
        with Session(self.engine) as s:
            q = select(SnapshotRecord)
            if source:
                q = q.where(SnapshotRecord.source == source)
            r = s.exec(q.order_by(SnapshotRecord.taken_at.desc())).first()
            return None if r is None else json.loads(r.body)


def _log() -> Any:
    """The store's logger. In a process that set up no logging (a command line's), its records
    go to stderr, never into stdout, which may be the command's JSON."""
    import sys

    import structlog

    if not structlog.is_configured():
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    return structlog.get_logger("broker.store")
