"""Quote latency: in-process (p50/p99), over gRPC with 32 concurrent clients, and `broker quote`
as a whole process. Ratios are against baselines run in the same process:

* in-process: the indexed engine vs. re-loading (re-parsing) the catalog for every request,
  which is what a broker without a load-time index does;
* in-process, cold: the same with the result cache off (every offering priced anew);
* response path, in-process: the server's encoding of a Quote (money from integer micro-dollars,
  the encoded body of a repeated result cached) vs. the Decimal-per-cost-line protobuf it
  replaced, and the server's CPU per cached Quote call (handler, store write and encoding);
* gRPC: `broker serve` as a user starts it, with 1 and with N processes (`--processes`), in the
  same run. A no-op RPC (the standard health Check) is interleaved with the quotes on the same
  32 clients, each on its own channel and TCP connection (a local subchannel pool), the clients
  spread over several client processes so the load generator is not one GIL: the no-op is the
  floor that grpcio's Python server sets under that load. Then health only and Quote only, for
  the server's CPU per call (all its processes, from /proc). Ratios against 1 process;
* CLI: a bare `python -c pass` start-up (the floor any Python CLI pays), wall and CPU time.

Run: .venv/bin/python benchmarks/quote.py [--requests 2000] [--clients 32] [--processes 2]
     [--only-in-process | --only-cli | --only-grpc]
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


def time_calls(fn, n: int, clock=time.perf_counter) -> list[float]:
    """``n`` calls of ``fn``, each timed by ``clock`` (wall time; time.thread_time for the CPU
    the call itself used, which a loaded machine inflates far less)."""
    out = []
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--cli-runs", type=int, default=7)
    ap.add_argument("--only-in-process", action="store_true", help="skip the gRPC and CLI parts")
    ap.add_argument("--only-cli", action="store_true", help="only `broker quote` as a whole process")
    ap.add_argument("--processes", type=int, default=2, help="serving processes to compare with 1")
    ap.add_argument("--only-grpc", action="store_true", help="only the gRPC part (1 and N processes)")
    ap.add_argument("--client-processes", type=int, default=2, help="processes the clients are spread over")
    ap.add_argument("--load-worker", nargs=5, metavar=("ADDR", "MODE", "CLIENTS", "PER_CLIENT", "START_AT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_worker:
        return load_worker(*args.load_worker)
    if args.only_cli:
        return cli_process(args.cli_runs)
    if args.only_grpc:
        return grpc_processes(None, args)

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
    cold_engine = uncached(QuoteEngine(cat))
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

    response_path(args.requests)
    grpc_processes(h100, args)

    cli_process(args.cli_runs)


def cli_process(runs: int) -> None:
    """`broker quote` as a whole process against a bare `python -c pass`, interleaved so both see
    the same load: wall time and CPU time (user + system; what the process itself costs, which
    the machine's load does not inflate much). Both run from compiled bytecode, as an installed
    broker does (pip compiles at install): the project's modules are compiled first into a
    temporary cache (PYTHONPYCACHEPREFIX), so nothing is written next to the code."""
    import resource

    print("\n== `broker quote` as a whole process (start-up included), from compiled bytecode")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": cache, "PYTHONPATH": str(ROOT)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([sys.executable, "-c", "import compileall, sys; sys.exit(not all("
                        "compileall.compile_dir(d, quiet=1) for d in sys.argv[1:]))",
                        *(str(ROOT / d) for d in ("broker", "policies", "providers"))], env=env, check=True)
        quote = [sys.executable, "-m", "broker.cli", "quote", "--gpu", "H100:8", "--hours", "24",
                 "--data-in-gb", "500"]
        cmds = {"bare python -c pass": [sys.executable, "-c", "pass"],
                "broker quote --format json": quote + ["--format", "json"],
                "broker quote (table)": quote}
        with tempfile.TemporaryDirectory() as home:  # no config; the embedded store holds a
            env["BROKER_HOME"] = home                 # live market of every offering
            env.pop("BROKER_CONFIG", None)
            store_market(f"sqlite:///{home}/broker.db")
            for c in cmds.values():  # warm the page cache and the bytecode
                subprocess.run(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=True)
            wall: dict[str, list[float]] = {k: [] for k in cmds}
            cpu: dict[str, list[float]] = {k: [] for k in cmds}
            for _ in range(runs):
                for name, c in cmds.items():
                    r0, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                    subprocess.run(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, check=True)
                    wall[name].append(time.perf_counter() - t)
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    bare_w, bare_c = statistics.median(wall["bare python -c pass"]), statistics.median(cpu["bare python -c pass"])
    for name in cmds:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:27} median wall {ms(w)}  cpu {ms(c)}   -> {w / bare_w:5.1f}x / {c / bare_c:5.1f}x "
              f"a bare interpreter")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def store_market(url: str) -> None:
    """A refreshed market of all three clouds (every offering) in the store at ``url`` (opened,
    so made and migrated, as `broker serve` would)."""
    from broker import market_store
    from broker.store import Store
    from providers.catalog import bundled

    now = time.time()
    store = Store(url)
    for snap in full_snapshots(bundled(), now).values():
        market_store.save(store.engine, snap, now)
    store.engine.dispose()


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
        engine = uncached(QuoteEngine(c))
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
        cpu = time_calls(lambda: engine.quote(d, now=now), max(200, requests // 4), clock=time.thread_time)
        n = sum(len(g) for _, g in groups)
        print(f"{name:17} {n:5d} offerings  quote p50 {ms(pct(bulk, 50))}  p99 {ms(pct(bulk, 99))}  "
              f"(CPU p50 {ms(pct(cpu, 50))})   scalar pricing alone p50 {ms(pct(base, 50))}  -> "
              f"{pct(base, 50) / pct(bulk, 50):4.1f}x, {pct(bulk, 50) / n * 1e6:5.2f} us/offering")


def decimal_quote_pb(q):
    """The Quote protobuf as it was built before: every cost line through two Decimal
    conversions (usd(), then money()), the total a Decimal sum. The baseline of the response path."""
    from broker.convert import MARKET_TO_PB, EXCLUSION_TO_PB, demand_to_pb, money, ts
    from broker.quote import usd
    from broker.v1 import broker_pb2 as pb
    from broker.views import market_fields

    m = pb.Quote(quote_id=q.quote_id, catalog_as_of=q.catalog_as_of, demand=demand_to_pb(q.demand))
    m.valid_until.CopyFrom(ts(q.valid_until))
    for r in q.offers:
        p, o, it, c = r.priced, r.priced.offering, r.priced.offering.instance, r.priced.cost
        m.offers.add(
            rank=r.rank, provider=it.provider, region=o.region, zone=p.zone, instance_type=it.name,
            gpu=it.gpu, gpus_per_node=it.gpus, gpu_memory_gb=it.gpu_memory_gb, nodes=p.nodes,
            market=MARKET_TO_PB[o.market.value], hourly_usd=money(usd(o.hourly_micros)),
            interconnect=it.interconnect, interconnect_gbps=it.interconnect_gbps, sla_pct=o.sla_pct,
            runtime_hours=p.runtime_hours, **market_fields(o),
            cost=pb.CostBreakdown(
                compute_usd=money(usd(c.compute)), interruption_usd=money(usd(c.interruption)),
                storage_usd=money(usd(c.storage)), data_transfer_usd=money(usd(c.data_transfer)),
                sla_risk_usd=money(usd(c.sla_risk)),
                total_usd=money(sum(usd(x) for x in (c.compute, c.interruption, c.storage, c.data_transfer,
                                                     c.sla_risk)))))
    for e in q.excluded:
        o = e.offering
        m.excluded.add(provider=o.instance.provider, region=o.region, instance_type=o.instance.name,
                       market=MARKET_TO_PB[o.market.value], reason=e.reason, kind=EXCLUSION_TO_PB[e.kind])
    return m


def cpu_per_call(fn, n: int) -> float:
    """Process CPU time (every thread: the store's writer too) per call of ``fn``, in seconds."""
    for _ in range(min(50, n)):
        fn()
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n


def response_path(requests: int) -> None:
    """The server's Quote response in-process: encoding a new result (integers vs. Decimal), and
    the CPU of a whole cached Quote call as the servicer runs it (handler, store write, bytes)."""
    from broker import config, convert
    from broker.server import BrokerServicer
    from broker.service import Service
    from broker.v1 import broker_pb2 as pb
    from policies.demand import Demand

    class Context:
        def invocation_metadata(self):
            return ()

    print("\n== the Quote response, in-process (CPU per call; baseline: the Decimal protobuf, same run)")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.load(None, environ={}, overrides={"store.url": f"sqlite:///{tmp}/b.db"})
        svc = Service(cfg, providers={})
        servicer, ctx = BrokerServicer(svc), Context()
        try:
            for name, d, top in (("H100:8 top 10", Demand(gpus=8, hours=24, gpu_model="H100", data_in_gb=500,
                                                              data_out_gb=50), 10),
                                 ("whole catalog", Demand(gpus=8, hours=24, min_gpu_memory_gb=1, data_in_gb=500,
                                                          interruptible=True), 0)):
                q = svc.quote(d, top=top)
                n = max(20, requests // (4 if top else 40))
                ints = cpu_per_call(lambda: convert.quote_to_pb(q).SerializeToString(), n)
                decimal = cpu_per_call(lambda: decimal_quote_pb(q).SerializeToString(), n)
                req = pb.QuoteRequest(demand=convert.demand_to_pb(d), top=top)
                before = old_handler(svc)
                call = cpu_per_call(lambda: servicer.Quote(req, ctx), max(200, requests // 2))
                old = cpu_per_call(lambda: before(req), max(200, requests // 2))
                size = len(servicer.Quote(req, ctx))
                print(f"{name:14} ({len(q.offers)} offers, {len(q.excluded)} excluded, {size:,} bytes)")
                print(f"{'':14} new result's protobuf: {ms(ints)} from integers, {ms(decimal)} with Decimal "
                      f"-> {decimal / ints:4.1f}x less CPU")
                print(f"{'':14} cached Quote call:     {ms(call)} encoded once, {ms(old)} message copied and "
                      f"serialised per call -> {old / call:4.1f}x less CPU (both with the store's commit)")
        finally:
            svc.stop()


def old_handler(svc):
    """The Quote handler as it was: a cached protobuf template (Decimal money) copied, the id and
    validity stamped, and the whole message serialised per call."""
    from dataclasses import replace

    from broker import convert
    from broker.quote import DerivedCache
    from broker.v1 import broker_pb2 as pb

    templates = DerivedCache()

    def handle(request) -> bytes:
        demand = convert.demand_from_pb(request.demand)
        q = svc.quote(replace(demand, tenant="default"), top=request.top)
        template = templates.get((q.offers, q.excluded), lambda: decimal_quote_pb(q))
        m = pb.Quote()
        m.CopyFrom(template)
        m.quote_id = q.quote_id
        m.valid_until.CopyFrom(convert.ts(q.valid_until))
        return pb.QuoteResponse(quote=m).SerializeToString()

    return handle


def uncached(engine):
    """``engine`` with its result cache holding nothing (every demand priced anew)."""
    engine._cache.max_items = engine._cache.max_bytes = 0
    return engine


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def start_serve(tmp: Path, processes: int) -> tuple[subprocess.Popen, str, Path]:
    """`broker serve` (SQLite, 32 workers per process, no market refresh) on a free port, once
    every one of its processes serves."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp / f"p{processes}.toml"
    cfg.write_text('owner = "broker-bench"\n[server]\nworkers = 32\n[catalog]\nrefresh_interval_s = 0\n')
    log = tmp / f"p{processes}.log"
    argv = [sys.executable, "-m", "broker", "serve", "--config", str(cfg), "--db", f"sqlite:///{tmp}/p{processes}.db",
            "--listen", f"127.0.0.1:{port}", "--log-level", "info"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    env.update(PYTHONPATH=str(ROOT), BROKER_HOME=str(tmp))
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=out)
    deadline = time.monotonic() + 300
    while log.read_text().count('"event": "serving"') < processes:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"broker serve did not serve: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, f"127.0.0.1:{port}", log


def grpc_processes(_demand, args) -> None:
    print(f"\n== gRPC: `broker serve` with 1 and {args.processes} processes, {args.clients} clients (one "
          f"connection each, over {args.client_processes} client processes)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for processes in sorted({1, args.processes}):
            proc, addr, _ = start_serve(Path(tmp), processes)
            try:
                lat, elapsed, _ = run_load(addr, "mixed", args)
                cpu = {}
                for mode in ("health", "Quote"):
                    before = tree_cpu(proc.pid)
                    got, _, calls = run_load(addr, mode, args)
                    cpu[mode] = (tree_cpu(proc.pid) - before) / calls
                rows.append((processes, lat, elapsed, cpu))
            finally:
                proc.terminate()
                proc.wait(60)
    base = None
    for processes, lat, elapsed, cpu in rows:
        quote, health = lat["Quote"], lat["health"]
        qps, hps = len(quote) / elapsed, len(health) / elapsed
        print(f"{processes} process{'es' if processes > 1 else '  '}: Quote p50 {ms(pct(quote, 50))} p99 {ms(pct(quote, 99))}"
              f"   health p50 {ms(pct(health, 50))} p99 {ms(pct(health, 99))}"
              f"   Quote p99 / health p99 {pct(quote, 99) / pct(health, 99):4.1f}x")
        print(f"{'':12}{qps:7,.0f} quotes/s + {hps:7,.0f} health/s;  server CPU per call: health {ms(cpu['health'])},"
              f" Quote {ms(cpu['Quote'])}")
        if base is None:
            base = (qps + hps, pct(quote, 99), pct(health, 99))
        else:
            print(f"{'':12}vs 1 process: throughput {(qps + hps) / base[0]:4.2f}x, Quote p99 "
                  f"{pct(quote, 99) / base[1]:4.2f}x, health p99 {pct(health, 99) / base[2]:4.2f}x")


def run_load(addr: str, mode: str, args) -> tuple[dict[str, list[float]], float, int]:
    """``args.clients`` clients over ``args.client_processes`` processes, ``args.requests`` calls
    in all; returns latencies per call kind, the wall time from the common start and the calls."""
    import json

    k = max(1, min(args.client_processes, args.clients))
    per_proc = [args.clients // k + (1 if i < args.clients % k else 0) for i in range(k)]
    per_client = max(2, args.requests // args.clients)
    start_at = time.time() + 3.0 + 0.5 * k  # after every worker's imports and warm-up
    workers = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--load-worker", addr, mode, str(n),
                                 str(per_client), repr(start_at)], stdout=subprocess.PIPE, cwd=ROOT)
               for n in per_proc]
    lat: dict[str, list[float]] = {"Quote": [], "health": []}
    end = start_at
    for w in workers:
        out, _ = w.communicate(timeout=600)
        if w.returncode != 0:
            raise SystemExit(f"a load worker failed ({w.returncode})")
        doc = json.loads(out)
        for name, xs in doc["lat"].items():
            lat[name].extend(xs)
        end = max(end, doc["end"])
    warm_up = args.clients * 3 * (2 if mode == "mixed" else 1)  # each client's first calls
    return lat, end - start_at, sum(len(v) for v in lat.values()) + warm_up


def load_worker(addr: str, mode: str, clients: str, per_client: str, start_at: str) -> None:
    """One client process: ``clients`` threads, each with its own channel (a local subchannel
    pool, so its own TCP connection), each making ``per_client`` calls from ``start_at`` (wall
    clock): health and Quote alternating ("mixed"), or one of them only. Prints JSON."""
    import json

    import grpc

    from broker.v1 import broker_pb2 as pb
    from broker.v1 import broker_pb2_grpc as pb_grpc

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    quote_req = pb.QuoteRequest(demand=pb.Demand(gpu_model="H100", gpus=8, hours=24, data_in_gb=500,
                                                 data_out_gb=50), top=10)
    health_req = health_pb2.HealthCheckRequest()
    lat: dict[str, list[float]] = {"Quote": [], "health": []}
    lock = threading.Lock()
    n_clients, per = int(clients), int(per_client)

    def worker(i: int) -> None:
        with grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            calls = (("Quote", pb_grpc.BrokerStub(ch).Quote, quote_req),
                     ("health", health_pb2_grpc.HealthStub(ch).Check, health_req))
            if mode != "mixed":
                calls = tuple(c for c in calls if c[0] == mode)
            for _, call, arg in calls * 3:
                call(arg, timeout=60)
            time.sleep(max(0.0, float(start_at) - time.time()))
            mine: dict[str, list[float]] = {"Quote": [], "health": []}
            for n in range(per):
                name, call, arg = calls[(n + i) % len(calls)]
                t = time.perf_counter()
                call(arg, timeout=60)
                mine[name].append(time.perf_counter() - t)
            with lock:
                for key, v in mine.items():
                    lat[key].extend(v)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write(json.dumps({"lat": lat, "end": time.time()}))


if __name__ == "__main__":
    main()
