"""Store tokens: what authenticating with one costs, and how soon a revocation is honoured.

    python benchmarks/tokens.py [--calls 2000] [--trials 20] [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

On a SQLite file and on a throwaway PostgreSQL database (127.0.0.1), ``Auth.authenticate`` per
call for:

- a config-file token (the baseline: a digest and a constant-time comparison per entry);
- a store token answered from the replica's cache ([auth] store_cache_s = 2);
- a store token with no cache (store_cache_s = 0: one indexed read of the store per call);

with each one's ratio to the baseline in the same run. Then, on PostgreSQL, two replicas (two
``Auth`` objects, each with its own cache, on one database) and ``--trials`` revocations: the
token is used on both, the revocation is written at a random moment of the second replica's
cache time, and the second replica is asked every 10 ms until it refuses; the figure is the time
from the revocation's commit to the first refusal.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.auth import Auth  # noqa: E402
from broker.store import Store  # noqa: E402
from broker.tokens import IssuedTokens, TokenStore  # noqa: E402

CONFIG_TOKEN = "bench-config-token"
# a realistic table: a handful of clear and hashed entries
CONFIG = {CONFIG_TOKEN: "team-a", **{f"other-{i}": "team-b" for i in range(4)},
          **{"sha256:" + hashlib.sha256(f"h-{i}".encode()).hexdigest(): "*" for i in range(3)}}


def per_call_us(auth: Auth, token: str, calls: int) -> float:
    md = (("authorization", f"Bearer {token}"),)
    auth.authenticate(md)  # warm
    start = time.perf_counter()
    for _ in range(calls):
        auth.authenticate(md)
    return (time.perf_counter() - start) / calls * 1e6


def costs(url: str, calls: int) -> dict[str, float]:
    store = Store(url)
    try:
        tokens = TokenStore(store.engine)
        _, token = tokens.create("tenant", ["team-a"], None, "benchmark")
        return {
            "config token": per_call_us(Auth(CONFIG), CONFIG_TOKEN, calls),
            "store token, cached": per_call_us(Auth(CONFIG, issued=IssuedTokens(tokens, 2.0)), token, calls),
            "store token, no cache": per_call_us(Auth(CONFIG, issued=IssuedTokens(tokens, 0.0)), token,
                                                 max(calls // 10, 50)),
        }
    finally:
        store.close()


def revocation_delays(url: str, trials: int, ttl: float) -> list[float]:
    a_store, b_store = Store(url), Store(url)  # two replicas: two engines, two caches
    try:
        tokens = TokenStore(a_store.engine)
        a = Auth(CONFIG, issued=IssuedTokens(tokens, ttl))
        b = Auth(CONFIG, issued=IssuedTokens(TokenStore(b_store.engine), ttl))
        delays = []
        for _ in range(trials):
            rec, token = tokens.create("tenant", ["team-a"], None)
            md = (("authorization", f"Bearer {token}"),)
            a.authenticate(md), b.authenticate(md)  # both replicas hold it now
            time.sleep(random.uniform(0, ttl))
            tokens.revoke(rec.id)
            revoked = time.monotonic()
            while True:
                try:
                    b.authenticate(md)
                except Exception as e:  # noqa: BLE001
                    assert type(e).__name__ == "Unauthenticated", e
                    break
                time.sleep(0.01)
            delays.append(time.monotonic() - revoked)
        return delays
    finally:
        a_store.close(), b_store.close()


def pg_database(admin: str):
    import psycopg

    dsn = admin.replace("postgresql+psycopg://", "postgresql://")
    name = f"broker_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{admin.rsplit('/', 1)[0]}/{name}", lambda: _drop(dsn, name)


def _drop(dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ttl", type=float, default=2.0, help="[auth] store_cache_s of the replicas")
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    from broker.telemetry import configure

    configure("warning")
    with tempfile.TemporaryDirectory() as tmp:
        pg_url, drop = pg_database(args.pg)
        try:
            for name, url in (("sqlite", f"sqlite:///{tmp}/b.db"), ("postgresql", pg_url)):
                c = costs(url, args.calls)
                base = c["config token"]
                print(f"{name}: authenticate per call")
                for what, us in c.items():
                    print(f"  {what:24} {us:9.1f} µs  {us / base:7.1f}x")
            d = revocation_delays(pg_url, args.trials, args.ttl)
            print(f"postgresql: revocation honoured by the second replica, store_cache_s = {args.ttl:g}, "
                  f"{len(d)} trials: median {statistics.median(d):.2f} s, max {max(d):.2f} s, "
                  f"min {min(d):.2f} s")
        finally:
            drop()


if __name__ == "__main__":
    main()
