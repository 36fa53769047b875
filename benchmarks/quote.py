"""Quote latency: in-process (p50/p99), over gRPC with 32 concurrent clients, and `broker quote`
as a whole process. Ratios are against baselines run in the same process:

* in-process: the indexed engine vs. re-loading (re-parsing) the catalog for every request,
  which is what a broker without a load-time index does;
* in-process, cold: the same with the result cache off (every offering priced anew);
* gRPC: a no-op RPC (the standard health Check) interleaved with the quotes on the same 32
  clients, each on its own connection: the floor that grpcio's Python server sets under that load;
* CLI: a bare `python -c pass` start-up (the floor any Python CLI pays).

Run: .venv/bin/python benchmarks/quote.py [--requests 2000] [--clients 32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:8.3f} ms"


def time_calls(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--cli-runs", type=int, default=7)
    ap.add_argument("--only-in-process", action="store_true", help="skip the gRPC and CLI parts")
    args = ap.parse_args()

    from broker.quote import QuoteEngine
    from policies.demand import Demand
    from providers.catalog import bundled, load

    cat = bundled()
    engine = QuoteEngine(cat)
    h100 = engine.validate(Demand(gpus=8, hours=24, gpu_model="H100", data_in_gb=500, data_out_gb=50))
    whole = engine.validate(Demand(gpus=8, hours=24, min_gpu_memory_gb=1, data_in_gb=500, interruptible=True))
    print(f"catalog: {len(cat.offerings)} offerings (provider x region x instance x market), as of {cat.as_of}")
    n_whole = len(engine.quote(whole).offers) + len(engine.quote(whole).excluded)
    n_h100 = len(engine.quote(h100).offers) + len(engine.quote(h100).excluded)
    print(f"H100:8 prices {n_h100} offerings; the whole-catalog demand (any GPU >= 1 GB, spot allowed) {n_whole}")

    print("\n== in-process (warm: a repeated demand is served from the result cache; cold: cache off)")
    cold_engine = QuoteEngine(cat)
    cold_engine.CACHE_SIZE = 0
    for name, d in (("H100:8", h100), ("whole catalog", whole)):
        for _ in range(50):
            engine.quote(d)
            cold_engine.quote(d)
        warm = time_calls(lambda: engine.quote(d), args.requests)
        cold = time_calls(lambda: cold_engine.quote(d), args.requests)
        base = time_calls(lambda: QuoteEngine(load()).quote(d), max(20, args.requests // 50))
        print(f"{name:14} warm p50 {ms(pct(warm, 50))}  p99 {ms(pct(warm, 99))}   "
              f"cold p50 {ms(pct(cold, 50))}  p99 {ms(pct(cold, 99))}")
        print(f"{'':14} baseline (re-parse per request) p50 {ms(pct(base, 50))}  -> cold is "
              f"{pct(base, 50) / pct(cold, 50):6.1f}x faster, warm {pct(base, 50) / pct(warm, 50):8.1f}x")

    live_market(args.requests)
    if args.only_in_process:
        return

    print(f"\n== gRPC, {args.clients} concurrent clients (one connection each), server in a subprocess;"
          f" health checks and quotes interleaved on every client")
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        env = {**os.environ, "BROKER_HOME": tmp}
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER_SNIPPET, str(port_file), f"sqlite:///{tmp}/b.db"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(400):
                if port_file.exists() and port_file.read_text().strip():
                    break
                time.sleep(0.05)
            addr = f"127.0.0.1:{port_file.read_text().strip()}"
            lat, elapsed = run_grpc_load(addr, h100, args.clients, args.requests)
        finally:
            proc.terminate()
            proc.wait(10)
    quote, health = lat["Quote"], lat["health"]
    print(f"Quote H100:8   p50 {ms(pct(quote, 50))}  p99 {ms(pct(quote, 99))}   {len(quote) / elapsed:,.0f} quotes/s")
    print(f"health (floor) p50 {ms(pct(health, 50))}  p99 {ms(pct(health, 99))}   {len(health) / elapsed:,.0f} calls/s")
    print(f"-> Quote p99 / health p99 under the same load: {pct(quote, 99) / pct(health, 99):4.1f}x")

    print("\n== `broker quote` as a whole process (start-up included)")
    cmd = [sys.executable, "-m", "broker.cli", "quote", "--gpu", "H100:8", "--hours", "24", "--data-in-gb", "500",
           "--format", "json"]
    cli = []
    for _ in range(args.cli_runs):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        cli.append(time.perf_counter() - t)
    bare = []
    for _ in range(args.cli_runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
    print(f"broker quote   median {ms(statistics.median(cli))}   bare python start-up {ms(statistics.median(bare))}"
          f"  -> {statistics.median(cli) / statistics.median(bare):5.1f}x a bare interpreter")


def full_snapshots(cat, now: float) -> dict:
    """A live market for every offering of ``cat``: prices (spot per zone), zones, quotas, needs
    and placement scores, as a refresh of all three clouds would store."""
    from providers.market import LivePrice, Quota, QuotaNeed, Snapshot, SpotSignal, Zones

    snaps = {p: Snapshot(p, now) for p in ("aws", "gcp", "azure")}
    for o in cat.offerings:
        s, name = snaps[o.provider], o.instance.name
        zones = cat.region(o.provider, o.region).zones or ("1", "2", "3")
        if o.market.value == "spot":
            s.prices += [LivePrice(o.region, name, "spot", int(o.hourly_micros * (0.9 + 0.05 * i)), "bench", "t",
                                   zone=z) for i, z in enumerate(zones)]
        else:
            s.prices.append(LivePrice(o.region, name, o.market.value, int(o.hourly_micros * 1.05), "bench", "t"))
        s.zones.append(Zones(o.region, name, tuple(zones)))
        s.spot.append(SpotSignal(o.region, name, 7, "bench"))
        s.quotas.append(Quota(o.region, f"q-{name}", "GPUs", 1000, 10))
        s.needs.append(QuotaNeed(name, o.market.value, f"q-{name}", o.instance.gpus))
    return snaps


def per_zone(cat):
    """``cat`` with every offering split into one offering per zone: what pricing each zone of
    every region separately would cost (the catalog grows by the zones per region)."""
    import dataclasses

    out = [dataclasses.replace(o, zones=(z,)) for o in cat.offerings for z in (o.zones or ("",))]
    return dataclasses.replace(cat, offerings=tuple(out))


def live_market(requests: int) -> None:
    """The whole-catalog quote with the live market laid over the catalog, and with every zone
    priced as its own offering; bulk (numpy columns) against the scalar cost model, same run."""
    from broker.quote import QuoteEngine
    from policies.cost import Context, Exclusion, pricer
    from policies.demand import Demand
    from providers.catalog import bundled
    from providers.market.overlay import overlay

    now = time.time()
    cat = bundled()
    live, _ = overlay(cat, full_snapshots(cat, now), now=now, max_age_h=48)
    print("\n== whole-catalog quote (any GPU >= 1 GB, spot allowed), cache off: bulk vs. the scalar model")
    for name, c in (("bundled", cat), ("live overlay", live), ("live, every zone", per_zone(live))):
        engine = QuoteEngine(c)
        engine.CACHE_SIZE = 0
        d = engine.validate(Demand(gpus=8, hours=24, min_gpu_memory_gb=1, data_in_gb=500, interruptible=True))
        groups = engine.shapes(d)
        ctx = Context(c.terms, c.regions, c.gpu_perf, now, 0)

        def scalar():
            price_one, ok = pricer(d, ctx), []
            for _, offerings in groups:
                for o in offerings:
                    r = price_one(o)
                    if type(r) is not Exclusion:
                        ok.append(r)
            ok.sort(key=lambda p: p.cost.total)

        for _ in range(30):
            engine.quote(d, now=now)
            scalar()
        bulk = time_calls(lambda: engine.quote(d, now=now), max(200, requests // 4))
        base = time_calls(scalar, max(200, requests // 4))
        n = sum(len(g) for _, g in groups)
        print(f"{name:17} {n:5d} offerings  quote p50 {ms(pct(bulk, 50))}  p99 {ms(pct(bulk, 99))}   "
              f"scalar pricing alone p50 {ms(pct(base, 50))}  -> {pct(base, 50) / pct(bulk, 50):4.1f}x, "
              f"{pct(bulk, 50) / n * 1e6:5.2f} us/offering")


SERVER_SNIPPET = """
import sys, threading
from broker import config
from broker.service import Service
from broker.server import build_server
cfg = config.load(None, environ={}, overrides={"store.url": sys.argv[2], "server.workers": 32})
svc = Service(cfg, providers={})
server, port = build_server(svc, "127.0.0.1:0")
server.start()
open(sys.argv[1], "w").write(str(port))
server.wait_for_termination()
"""


def run_grpc_load(addr: str, demand, clients: int, total: int) -> tuple[dict[str, list[float]], float]:
    """``clients`` threads, each with its own channel (a local subchannel pool, so its own TCP
    connection), each alternating a health Check and a Quote: the no-op floor and the quote are
    measured under the same load at the same time. Returns latencies per call and the wall time."""
    import grpc

    from broker.convert import demand_to_pb
    from broker.v1 import broker_pb2 as pb
    from broker.v1 import broker_pb2_grpc as pb_grpc

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    quote_req = pb.QuoteRequest(demand=demand_to_pb(demand), top=10)
    health_req = health_pb2.HealthCheckRequest()
    lat: dict[str, list[float]] = {"Quote": [], "health": []}
    lock = threading.Lock()
    per = max(1, total // clients)
    start = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        with grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            calls = (("Quote", pb_grpc.BrokerStub(ch).Quote, quote_req),
                     ("health", health_pb2_grpc.HealthStub(ch).Check, health_req))
            for _, call, arg in calls * 3:
                call(arg, timeout=30)
            start.wait()
            mine: dict[str, list[float]] = {"Quote": [], "health": []}
            for n in range(per):
                name, call, arg = calls[(n + i) % 2]
                t = time.perf_counter()
                call(arg, timeout=30)
                mine[name].append(time.perf_counter() - t)
            with lock:
                for k, v in mine.items():
                    lat[k].extend(v)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return lat, time.perf_counter() - t0


if __name__ == "__main__":
    main()
