"""Reads whose cost grew with the store's history, before and after they were bounded.

    python benchmarks/history_reads.py [--ended 6000] [--repeat 20] [--pool-seconds 10]
        [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres] [--store sqlite|postgresql|both]

On a SQLite file and a throwaway PostgreSQL database, with ``--ended`` ended leases and their
events (benchmarks/load_history.py, one tenant, ended over the last three hours) and 20 running
leases, the median of ``--repeat`` runs of:

- **listing**: ListLeases with limit 0 used to return every lease (the store's whole listing);
  now it is one page (100 leases and the probe for a next page);
- **launch admission**: the budget check inside a Launch's insert used to read every lease of
  the tenant that counts this month as a full lease; now the live and prorated ones as rows and
  one SUM (broker/spend.py);
- **budget use**: the same without the insert (the reconciler, /metrics per tenant);
- **/metrics store read**: the old grouped counts over every lease, event and decision, against
  a scrape after the first (broker/store_metrics.py); and a process's first scrape (which counts
  the history once) against a later one;

then ``--pool-seconds`` of 32 threads reading the store at once, with the old pool (10 + 20
overflow) and the new default (32 workers + 8, 8 overflow): connections opened and closed per
second after start-up.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, func, select  # noqa: E402

from benchmarks.load_history import seed_ended_leases  # noqa: E402
from benchmarks.tokens import pg_database  # noqa: E402
from broker import spend  # noqa: E402
from broker.budget import Budgets, lease_spend_since, month_start  # noqa: E402
from broker.engine import pool_size_for  # noqa: E402
from broker.lease import LIVE, Lease, LeaseState  # noqa: E402
from broker.store import DecisionRecord, LeaseEventRecord, LeaseRecord, Store  # noqa: E402
from broker.telemetry import StoreCollector  # noqa: E402

WORKERS = 32


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def old_admission(store: Store, tenant: str, since: float) -> list[Lease]:
    t = store._leases
    with store.engine.connect() as conn:
        return store._read_leases(conn, select(t).where(
            t.c.tenant == tenant, t.c.state.in_([s.value for s in LIVE]) | (t.c.ended_at == 0) | (t.c.ended_at >= since)))


def old_usage(store: Store, tenant: str, now: float) -> tuple[int, int]:
    since = month_start(now)
    t = store._leases.c
    with store.engine.connect() as conn:
        rows = conn.execute(select(*(t[c] for c in spend.SPEND_COLUMNS)).where(
            t.tenant == tenant, t.state.in_([s.value for s in LIVE]) | (t.ended_at == 0) | (t.ended_at >= since))).all()
    rate = total = 0
    for l in rows:
        if l.state in LIVE:
            rate += l.hourly_micros * l.nodes
        if (l.ended_at or now) >= since:
            total += lease_spend_since(l, since, now)
    return rate, total


def old_metrics(store: Store) -> None:
    L = LeaseRecord
    with store.engine.connect() as conn:
        conn.execute(select(L.state, L.provider, L.market, L.instance_type, func.count(), func.sum(L.nodes),
                            func.sum(L.hourly_micros * L.nodes), func.sum(L.accrued_micros))
                     .group_by(L.state, L.provider, L.market, L.instance_type)).all()
        conn.execute(select(LeaseEventRecord.kind, func.count()).group_by(LeaseEventRecord.kind)).all()
        conn.execute(select(DecisionRecord.action, func.count()).group_by(DecisionRecord.action)).all()


class _Catalog:
    def instance(self, provider, itype):
        return None


def reads(url: str, ended: int, repeat: int) -> dict[str, tuple[float, float]]:
    seed_ended_leases(url, ended)
    store = Store(url)
    now = time.time()
    try:
        for i in range(20):
            store.create_lease(Lease(lease_id=f"run-{i}", tenant="default", idempotency_key=f"run-{i}",
                                     state=LeaseState.RUNNING, provider="aws", region="us-east-1",
                                     instance_type="g5.xlarge", market="on_demand", nodes=1, hourly_micros=1_006_000,
                                     client_token=f"run-{i}", created_at=now, updated_at=now, state_since=now,
                                     started_at=now - 600, accrued_at=now - 60, accrued_micros=1_000))
        budgets = Budgets(store, {})
        assert old_usage(store, "default", now) == budgets.usage("default", now)
        since = month_start(now)
        collector = StoreCollector(store, _Catalog(), clock=lambda: now)
        list(collector.collect())  # a process's first scrape counts the history once
        with store.engine.connect() as conn:
            new_admission = lambda: spend.counted(conn, store._leases, "default", since)  # noqa: E731
            out = {
                "listing": (median_ms(lambda: store.list_leases(), repeat),
                            median_ms(lambda: store.list_leases(limit=101), repeat)),
                "launch admission": (median_ms(lambda: old_admission(store, "default", since), repeat),
                                     median_ms(new_admission, repeat)),
            }
        out["budget use"] = (median_ms(lambda: old_usage(store, "default", now), repeat),
                             median_ms(lambda: budgets.usage("default", now), repeat))
        out["/metrics store read"] = (median_ms(lambda: old_metrics(store), repeat),
                                      median_ms(lambda: list(collector.collect()), repeat))
        out["/metrics first scrape"] = (median_ms(lambda: list(StoreCollector(store, _Catalog(), clock=lambda: now)
                                                             .collect()), repeat),
                                         median_ms(lambda: list(collector.collect()), repeat))
        return out
    finally:
        store.close()


def churn(url: str, seconds: float, pool_size: int, overflow: int) -> tuple[float, float]:
    """(connections opened/s, closed/s) after start-up, ``WORKERS`` threads reading at once."""
    store = Store(url, pool_size=pool_size, max_overflow=overflow)
    try:
        store.open_connections(at_most=pool_size)  # steady state: the pool at its size
        opened, closed = [], []
        event.listen(store.engine, "connect", lambda *_: opened.append(1))
        event.listen(store.engine, "close", lambda *_: closed.append(1))
        stop = time.monotonic() + seconds

        def work() -> None:
            while time.monotonic() < stop:
                store.list_leases(limit=20)

        threads = [threading.Thread(target=work) for _ in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(opened) / seconds, len(closed) / seconds
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ended", type=int, default=6000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--pool-seconds", type=float, default=10.0)
    ap.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("sqlite", "postgresql"):
            if args.store not in (name, "both"):
                continue
            url, drop = (f"sqlite:///{tmp}/b.db", lambda: None) if name == "sqlite" else pg_database(args.pg)
            try:
                print(f"{name}, {args.ended:,} ended leases: median of {args.repeat}, ms (before -> after)")
                for what, (before, after) in reads(url, args.ended, args.repeat).items():
                    print(f"  {what:22} {before:9.2f} -> {after:7.2f}  ({before / max(after, 1e-9):.0f}x)")
                for label, size, overflow in (("pool 10 + 20 overflow", 10, 20),
                                              (f"pool {pool_size_for(WORKERS)} + 8", pool_size_for(WORKERS), 8)):
                    o, c = churn(url, args.pool_seconds, size, overflow)
                    print(f"  {label:22} {WORKERS} threads: {o:.2f} connections opened/s, {c:.2f} closed/s")
            finally:
                drop()


if __name__ == "__main__":
    main()
