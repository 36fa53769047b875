"""Soak: a real `broker serve` under mixed load for a fixed time, and its memory over that time.

32 concurrent clients (each with its own channel and TCP connection) send a mix of Quote,
ReportQueue, Launch followed by Release (real SDK calls against the three mocked clouds on
loopback), and ListLeases, for ``--seconds`` (default 600). The server runs as a subprocess, as a
user starts it; its resident memory (VmRSS) is sampled every second. Per store (SQLite, and
PostgreSQL when it answers on 127.0.0.1:5432) it prints throughput, p50/p99 and errors per RPC,
RSS over time, and the RSS growth over the last half of the run (target: under 10 %).

Run: .venv/bin/python benchmarks/load.py [--seconds 600] [--clients 32] [--store sqlite|postgresql|both]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The mix, by weight: most traffic reads (quotes, lease lists), a steady share of pushed queue
#: snapshots, and launches that are released again straight away.
MIX = (("Quote", 45), ("ListLeases", 20), ("ReportQueue", 20), ("Launch+Release", 15))
DEMANDS = (("H100", 8, 24.0), ("A100", 16, 12.0), ("L4", 1, 2.0), ("", 4, 6.0))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def snapshot_pb(pb, rng: random.Random):
    """A queue snapshot as a scheduler would push it: a few nodes, GPU samples, pending jobs."""
    from google.protobuf.timestamp_pb2 import Timestamp

    taken = Timestamp()
    taken.FromSeconds(int(time.time()))
    nodes = [pb.ClusterNode(name=f"gpu-{i}", state="mix", gpus_total=8, gpus_allocated=rng.randint(0, 8),
                            gpu_model="A100", partitions=["gpu"]) for i in range(8)]
    samples = [pb.GpuSample(node=f"gpu-{i}", index=g, utilization_pct=rng.uniform(0, 100), memory_used_mb=1000)
               for i in range(8) for g in range(8)]
    pending = [pb.PendingJob(job_id=str(1000 + j), user="alice", queue="gpu", gpus=rng.choice((1, 4, 8)),
                             gpu_model="A100", nodes=1, time_limit_s=3600 * 4, est_runtime_s=3600,
                             waited_s=rng.randint(0, 7200), pending_reason="Resources")
               for j in range(rng.randint(0, 20))]
    return pb.QueueSnapshot(source="load", taken_at=taken, nodes=nodes, gpu_samples=samples, pending=pending)


class Load:
    """The clients and what they saw."""

    def __init__(self, address: str, clients: int, seconds: float, seed: int) -> None:
        self.address, self.clients, self.seconds, self.seed = address, clients, seconds, seed
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, Counter] = defaultdict(Counter)
        self.first_error: dict[str, str] = {}  # per RPC and status: the first details seen
        self.lock = threading.Lock()

    def run(self) -> float:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(self.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.seconds + 120)
        return time.monotonic() - t0

    def _client(self, i: int) -> None:
        import grpc

        from broker.v1 import broker_pb2 as pb
        from broker.v1 import broker_pb2_grpc as pb_grpc

        rng = random.Random(self.seed * 1000 + i)
        names, weights = zip(*MIX)
        # Each client its own connection: a local subchannel pool stops grpc sharing one socket.
        with grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = pb_grpc.BrokerStub(ch)
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                op = rng.choices(names, weights)[0]
                t = time.perf_counter()
                try:
                    self._call(op, stub, pb, rng, i)
                except grpc.RpcError as e:
                    with self.lock:
                        self.errors[op][e.code().name] += 1
                        self.first_error.setdefault(f"{op} {e.code().name}", (e.details() or "")[:160])
                    continue
                with self.lock:
                    self.lat[op].append(time.perf_counter() - t)

    def _call(self, op: str, stub, pb, rng: random.Random, i: int) -> None:
        import grpc

        if op == "Quote":
            model, gpus, hours = rng.choice(DEMANDS)
            demand = pb.Demand(gpu_model=model, gpus=gpus, hours=hours, data_in_gb=rng.choice((0, 50, 500)),
                               min_gpu_memory_gb=0 if model else 24, interruptible=rng.random() < 0.5,
                               checkpoint_minutes=30)
            stub.Quote(pb.QuoteRequest(demand=demand, top=10), timeout=30)
        elif op == "ListLeases":
            stub.ListLeases(pb.ListLeasesRequest(limit=50), timeout=30)
        elif op == "ReportQueue":
            stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot_pb(pb, rng)), timeout=30)
        else:
            provider, region, itype = rng.choice((("aws", "us-east-1", "g5.xlarge"),
                                                  ("gcp", "us-central1", "g2-standard-8"),
                                                  ("azure", "eastus", "Standard_NV36ads_A10_v5")))
            offering = pb.Offering(provider=provider, region=region, instance_type=itype,
                                   market=pb.MARKET_ON_DEMAND, count=1)
            req = pb.LaunchRequest(idempotency_key=f"load-{i}-{uuid.uuid4().hex[:12]}", offering=offering)
            for attempt in range(3):
                # A launch whose answer was lost (deadline, unavailable) is asked again with the same
                # key, as a careful client does: the broker answers with the lease it already made.
                try:
                    lease = stub.Launch(req, timeout=60).lease
                    break
                except grpc.RpcError as e:
                    if attempt == 2 or e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                        grpc.StatusCode.UNAVAILABLE):
                        raise
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id, reason="load test"), timeout=60)


def settle(address: str, clouds, within_s: float) -> dict[str, int]:
    """After the load: release what is still running, then wait (polling, up to ``within_s``) until
    every lease has ended and every mocked cloud is empty again (the reconciler finishes releases
    whose cloud call failed); returns what is still left."""
    import grpc

    from broker.v1 import broker_pb2 as pb
    from broker.v1 import broker_pb2_grpc as pb_grpc

    live = [pb.LEASE_STATE_REQUESTED, pb.LEASE_STATE_PROVISIONING, pb.LEASE_STATE_RUNNING, pb.LEASE_STATE_DRAINING]
    deadline = time.monotonic() + within_s
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.BrokerStub(ch)
        # A client that gave up on a call may have left a lease running (the broker would end it at
        # its idle timeout): release what is still running, as an operator would, then wait.
        for lease in stub.ListLeases(pb.ListLeasesRequest(states=[pb.LEASE_STATE_RUNNING], limit=1000),
                                     timeout=60).leases:
            try:
                stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id, reason="load test: settle"), timeout=60)
            except grpc.RpcError:
                pass  # a lease still draining: the reconciler finishes it
        while True:
            leases = len(stub.ListLeases(pb.ListLeasesRequest(states=live, limit=1000), timeout=60).leases)
            left = {"live leases": leases} | {f"{c} instances": len(v) for c, v in clouds.alive_instances().items()}
            if not any(left.values()) or time.monotonic() > deadline:
                return left
            time.sleep(2.0)


def sample_rss(pid: int, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - t0, rss_mb(pid)))
        stop.wait(1.0)


def soak(store: str, args) -> dict:
    from tests.clouds.three import Clouds, ServeProcess, write_config
    from tests.stores import pg_url_or_skip

    import os

    clouds = Clouds()
    pg = None
    try:
        for k, v in __import__("tests.clouds.aws", fromlist=["AwsCloud"]).AwsCloud.client_env().items():
            os.environ[k] = v
        with tempfile.TemporaryDirectory() as tmp:
            tmpd = Path(tmp)
            if store == "postgresql":
                pg = pg_url_or_skip()
                try:
                    url = next(pg)
                except BaseException as e:  # pytest.skip raises; say why and move on
                    print(f"postgresql: skipped ({e})")
                    return {}
            else:
                url = f"sqlite:///{tmpd / 'broker.db'}"
            cfg = write_config(tmpd / "broker.toml", clouds, url, server={"workers": max(16, args.clients)})
            serve = ServeProcess(cfg, tmpd).start(timeout=60)
            rss: list[tuple[float, float]] = []
            stop = threading.Event()
            sampler = threading.Thread(target=sample_rss, args=(serve.proc.pid, stop, rss), daemon=True)
            sampler.start()
            load = Load(serve.address, args.clients, args.seconds, args.seed)
            try:
                elapsed = load.run()
                left = settle(serve.address, clouds, args.settle_s)
            finally:
                stop.set()
                sampler.join(5)
                serve.stop()
            logged = serve.log.read_text(errors="replace").splitlines()
            print(f"\n{store}: after the load, " + (", ".join(f"{n} {what}" for what, n in left.items() if n)
                                                     or "no live lease and no running instance is left"))
            return report(store, load, elapsed, rss, [line for line in logged if '"level": "error"' in line
                                                      or '"level":"error"' in line])
    finally:
        if pg is not None:
            pg.close()
        clouds.stop()


def report(store: str, load: Load, elapsed: float, rss: list[tuple[float, float]], errors_logged: list[str]) -> dict:
    print(f"\n== {store}: {load.clients} clients for {elapsed:.0f} s")
    print(f"{'rpc':15} {'calls':>7} {'per s':>7} {'p50 ms':>8} {'p99 ms':>8}  errors")
    total = 0
    for op, _ in MIX:
        lat = load.lat.get(op, [])
        total += len(lat)
        errs = ", ".join(f"{k} {v}" for k, v in sorted(load.errors.get(op, {}).items())) or "0"
        print(f"{op:15} {len(lat):7d} {len(lat) / elapsed:7.1f} {pct(lat, 50) * 1e3:8.1f} {pct(lat, 99) * 1e3:8.1f}  {errs}")
    print(f"{'all':15} {total:7d} {total / elapsed:7.1f}")
    for what, details in sorted(load.first_error.items()):
        print(f"  first {what}: {details}")
    if errors_logged:
        print(f"  the server logged {len(errors_logged)} errors; the first: {errors_logged[0][:600]}")
    marks = [rss[min(len(rss) - 1, int(len(rss) * f))] for f in (0.0, 0.25, 0.5, 0.75, 1.0)] if rss else []
    print("RSS MB over time: " + "  ".join(f"{t:5.0f}s {m:6.1f}" for t, m in marks))
    half = [m for t, m in rss if t >= rss[-1][0] / 2] if rss else []
    growth = (half[-1] - half[0]) / half[0] if len(half) > 1 else float("nan")
    peak = max(m for _, m in rss) if rss else float("nan")
    verdict = "met" if growth < 0.10 else "MISSED"
    print(f"RSS growth over the last half: {growth * 100:+.1f} % (target < 10 %: {verdict}); peak {peak:.0f} MB")
    n_err = sum(sum(c.values()) for c in load.errors.values())
    return {"store": store, "calls": total, "per_s": total / elapsed, "errors": n_err, "rss_growth": growth,
            "p99_ms": {op: pct(load.lat.get(op, []), 99) * 1e3 for op, _ in MIX}, "peak_mb": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--settle-s", type=float, default=180.0,
                    help="after the load, how long to wait for every lease and instance to be gone")
    args = ap.parse_args()
    stores = ("sqlite", "postgresql") if args.store == "both" else (args.store,)
    results = [r for s in stores if (r := soak(s, args))]
    if len(results) == 2:
        a, b = results
        print(f"\nPostgreSQL ÷ SQLite throughput: {b['per_s'] / a['per_s']:.2f}")
    sys.exit(1 if any(r["rss_growth"] >= 0.10 for r in results) else 0)


if __name__ == "__main__":
    main()
