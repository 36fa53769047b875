"""Leader election on PostgreSQL: one leader among replicas; leadership moves when it leaves."""
from __future__ import annotations

from broker.leader import Leadership
from broker.store import Store
from tests.stores import pg_url_or_skip


def test_one_leader_and_failover(tmp_path):
    gen = pg_url_or_skip()
    url = next(gen)
    a, b = Store(url), Store(url)  # two replicas; the second also races schema creation safely
    try:
        la, lb = Leadership(a), Leadership(b)
        assert la.is_leader() is True
        assert lb.is_leader() is False
        assert la.is_leader() is True  # stays leader while connected
        la.release()
        assert lb.is_leader() is True
        assert la.is_leader() is False
    finally:
        a.close()
        b.close()
        next(gen, None)


def test_sqlite_owner_always_leads(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'b.db'}")
    assert Leadership(s).is_leader()
    s.close()
