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
