"""The store's pool holds a connection for every thread that can use it at once (``[store]
pool_size`` 0: ``[server] workers`` plus the background threads), so once it has grown to the load,
steady load opens and closes no connection (SQLite and PostgreSQL). A pool of 10 with 20 overflow under 32
workers opened an overflow connection for each call past the tenth and closed it on return: on
PostgreSQL a new server process about every two seconds of a soak."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import event

from broker.engine import BACKGROUND_THREADS, pool_size_for
from tests.grpc_server import running_server
from tests.stores import db_url  # noqa: F401  (fixture)

WORKERS = 16


def test_the_pool_covers_the_workers_and_background_threads_by_default():
    assert pool_size_for(WORKERS) == WORKERS + BACKGROUND_THREADS
    assert pool_size_for(WORKERS, configured=5) == 5


def test_every_worker_at_once_opens_no_connection_once_the_pool_has_grown(tmp_path, db_url):  # noqa: F811
    with running_server(tmp_path, config={"store.url": db_url, "server.workers": WORKERS}) as (_addr, svc):
        engine = svc.store.engine
        svc.store.open_connections()  # what start-up does
        opened, closed = [], []
        event.listen(engine, "connect", lambda *_: opened.append(1))
        event.listen(engine, "close", lambda *_: closed.append(1))
        together = threading.Barrier(WORKERS, timeout=20)
        errors: list[BaseException] = []

        def worker(rounds: int) -> None:
            try:
                for _ in range(rounds):  # every worker holds a connection at the same moment
                    with engine.connect() as conn:
                        together.wait()
                        conn.exec_driver_sql("SELECT 1")
                    svc.store.list_leases(limit=5)
            except BaseException as e:  # noqa: BLE001  (reported below)
                errors.append(e)

        def run(rounds: int) -> None:
            threads = [threading.Thread(target=worker, args=(rounds,)) for _ in range(WORKERS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not errors, errors

        run(1)  # the pool grows to the load, and keeps what it opened
        assert len(closed) == 0
        del opened[:]
        run(5)
        assert (len(opened), len(closed)) == (0, 0)
        assert engine.pool.size() == WORKERS + BACKGROUND_THREADS


@pytest.mark.parametrize("settings, size, overflow", [({"store.pool_size": 4, "store.max_overflow": 2}, 4, 2),
                                                      ({}, WORKERS + BACKGROUND_THREADS, 8)])
def test_the_pool_settings_reach_the_engine(tmp_path, db_url, settings, size, overflow):  # noqa: F811
    with running_server(tmp_path, config={"store.url": db_url, "server.workers": WORKERS, **settings}) as (_a, svc):
        assert (svc.store.engine.pool.size(), svc.store.engine.pool._max_overflow) == (size, overflow)


def test_pools_that_could_open_more_connections_than_postgresql_takes_are_named_at_start(tmp_path, db_url):  # noqa: F811
    """Each serving process has its own pool: `processes x (pool_size + max_overflow)` past the
    server's `max_connections` (less the reserved ones) fails calls under load, so start-up
    says so, with the figures and what to change; SQLite has no such limit."""
    from structlog.testing import capture_logs

    from broker.config import load
    from broker.service import Service
    from broker.store import Store

    small = Store(db_url, pool_size=2, max_overflow=1)
    try:
        if not db_url.startswith("postgresql"):
            assert small.connections_past_server(1000) == ""
            return
        with small.engine.connect() as conn:
            takes = (int(conn.exec_driver_sql("SHOW max_connections").scalar())
                     - int(conn.exec_driver_sql("SHOW superuser_reserved_connections").scalar()))
        assert small.connections_past_server(takes // 3) == ""  # 3 each: exactly what it takes, or less
        said = small.connections_past_server(takes // 3 + 1)
        assert f"= {3 * (takes // 3 + 1)} connections at most" in said and f"takes {takes} " in said
        assert "[store] pool_size" in said and "max_connections" in said
    finally:
        small.engine.dispose()
    cfg = load(None, environ={}, overrides={"store.url": db_url, "server.processes": 2,
                                            "store.pool_size": takes, "store.max_overflow": 0})
    svc = Service(cfg, providers={})
    try:
        with capture_logs() as logs:
            svc.warm_up(1.0)
        [warned] = [e for e in logs if e["event"] == "store.pool_past_max_connections"]
        assert f"2 serving process(es) x ([store] pool_size {takes} + max_overflow 0) = {2 * takes}" in warned["detail"]
    finally:
        svc.stop()
