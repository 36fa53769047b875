"""Leader election through the store itself, so several replicas can serve quotes while exactly
one runs the reconciler and the autoscaler.

PostgreSQL: leadership is a *lease* — one row (``broker_leader``) naming the holder, a term, and
an expiry on the database's clock. The leader renews it every ``renew_s``; any replica takes it
over once it has expired, and a takeover bumps the term. A leader that is killed, frozen
(SIGSTOP, a long GC or VM pause) or cut off from the database stops renewing, and another replica
leads within ``ttl_s + renew_s``. A frozen leader that wakes up finds, before its next step, that
its own deadline (counted on its monotonic clock, which runs on while it is stopped) has passed,
and the term in the row is no longer its own: :meth:`Leadership.fence`, called before every
side-effecting step of the reconciler and the autoscaler, raises :class:`NotLeader`.

The cloud APIs know nothing of terms, so a step that passed the fence a moment before its
replica froze can still make its one call late; every such call is idempotent or reconciled
(client tokens, tagged instances), which is what makes that window harmless.

SQLite is a single-host embedded store: the one process that owns it leads, in term 1.

A host serving with several processes (``broker serve --processes N``) lets one of them contend;
the others are built with ``contend=False`` and never lead, on either store, so nothing the
leader does runs twice on one host.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Callable

import structlog
from sqlalchemy import BigInteger, Column, Float, MetaData, String, Table, text

from broker.errors import Unavailable

log = structlog.get_logger("broker.leader")

#: The leader's table (created and changed by the store's migrations, broker/migrate.py).
METADATA = MetaData()
LEADER_TABLE = Table(
    "broker_leader", METADATA,
    Column("name", String, primary_key=True),
    Column("holder", String, nullable=False),
    Column("term", BigInteger, nullable=False),
    Column("expires_at", Float, nullable=False),  # seconds since the epoch, on the database's clock
)

NAME = "broker"
DB_NOW = "extract(epoch from clock_timestamp())"

# Take the lease when it is free or expired; renew it when it is ours. The term moves only when
# the holder changes, so the holder's term stays valid across renewals.
ACQUIRE = text(f"""
INSERT INTO broker_leader AS l (name, holder, term, expires_at)
VALUES (:name, :me, 1, {DB_NOW} + :ttl)
ON CONFLICT (name) DO UPDATE SET
    holder = :me,
    term = CASE WHEN l.holder = :me THEN l.term ELSE l.term + 1 END,
    expires_at = {DB_NOW} + :ttl
WHERE l.holder = :me OR l.expires_at <= {DB_NOW}
RETURNING term
""")
CURRENT = text(f"SELECT term FROM broker_leader WHERE name = :name AND holder = :me AND expires_at > {DB_NOW}")
RESIGN = text("UPDATE broker_leader SET expires_at = 0 WHERE name = :name AND holder = :me AND term = :term")


class NotLeader(Unavailable):
    """This replica does not (or no longer) hold leadership: the step is left to the leader."""


class Leadership:
    """This replica's view of leadership: ``is_leader()`` for a pass, ``fence()`` for a step.

    ``start()`` runs the heartbeat thread (acquire or renew every ``renew_s``); ``beat()`` is one
    heartbeat, for callers that drive it themselves. ``on_change(leading)`` is told each change.
    """

    def __init__(self, store, *, ttl_s: float = 10.0, renew_s: float = 2.0, replica: str = "",
                 on_change: Callable[[bool], None] | None = None, contend: bool = True) -> None:
        self.store = store
        self.contend = contend
        self.ttl_s, self.renew_s = ttl_s, renew_s
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.on_change = on_change
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.term = 0 if store.is_postgres else 1
        # Monotonic deadline of our lease. It runs on while the process is stopped, so a replica
        # that wakes from a freeze knows at once that it may have been replaced.
        self._valid_until = 0.0 if store.is_postgres or not contend else float("inf")
        self._was_leading = not store.is_postgres and contend
        if on_change is not None:
            on_change(self._was_leading)

    # -- the view --------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def fence(self) -> int:
        """The current term, or :class:`NotLeader`. Call before every side-effecting step: it checks
        the local deadline and then the row itself (a lost or taken-over lease fails here)."""
        if not self.is_leader():
            raise NotLeader("this replica is not the leader (its leadership lease has lapsed).")
        if not self.store.is_postgres:
            return self.term
        term = self.term
        try:
            with self.store.engine.connect() as conn:
                now_term = conn.execute(CURRENT, {"name": NAME, "me": self.replica}).scalar()
        except Exception as e:
            raise NotLeader(f"leadership cannot be confirmed: {str(e).splitlines()[0]}") from None
        if now_term != term:
            self._lost(f"term {term} is over (now {now_term or 'another holder'})")
            raise NotLeader(f"this replica's leadership term {term} is over.")
        return term

    # -- the heartbeat ---------------------------------------------------------------------------
    def beat(self) -> bool:
        """Acquire or renew once; returns whether this replica leads now."""
        if not self.contend:
            return False
        if not self.store.is_postgres:
            return True
        with self._lock:
            started = time.monotonic()
            try:
                with self.store.engine.begin() as conn:
                    term = conn.execute(ACQUIRE, {"name": NAME, "me": self.replica, "ttl": self.ttl_s}).scalar()
            except Exception as e:  # the database is unreachable: our lease runs out on its own
                log.warning("leadership_renew_failed", error=str(e).splitlines()[0])
                term = None
                if time.monotonic() < self._valid_until:
                    return True
            if term is None:
                self._lost("another replica holds the lease")
                return False
            # The row expires ttl after the database ran the statement, which is after `started`;
            # keep a margin so this replica stops acting before anyone else may start.
            self._valid_until = started + self.ttl_s - self.renew_s
            if term != self.term or not self._was_leading:
                self.term = int(term)
                self._was_leading = True
                log.info("leadership_acquired", term=self.term, replica=self.replica)
                if self.on_change is not None:
                    self.on_change(True)
            return True

    def _lost(self, why: str) -> None:
        self._valid_until = 0.0
        if self._was_leading:
            self._was_leading = False
            log.warning("leadership_lost", term=self.term, replica=self.replica, why=why)
            if self.on_change is not None:
                self.on_change(False)

    def start(self) -> "Leadership":
        if self.store.is_postgres and self.contend and self._thread is None:
            self.beat()
            self._thread = threading.Thread(target=self._run, name="leader", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive anything; the next beat decides again
                log.exception("leadership_beat_failed")

    def release(self) -> None:
        """Stop renewing and hand leadership over at once (a graceful stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.renew_s + 5)
            self._thread = None
        if not self.store.is_postgres or not self.contend:
            return
        with self._lock:
            if self._was_leading:
                try:
                    with self.store.engine.begin() as conn:
                        conn.execute(RESIGN, {"name": NAME, "me": self.replica, "term": self.term})
                except Exception as e:
                    log.warning("leadership_resign_failed", error=str(e).splitlines()[0])
            self._lost("released")
