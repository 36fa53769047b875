"""Soak: a real `broker serve` under mixed load for a fixed time, and its memory over that time.

32 concurrent clients (each with its own channel and TCP connection, connected before the clock
starts; spread over ``--client-processes`` processes, 4 by default, so that the clients' own GIL
does not show in the latencies they report) send a mix of Quote,
ReportQueue, Launch followed by Release (real SDK calls against the three mocked clouds on
loopback), and ListLeases, for ``--seconds`` (default 600). The server runs as a subprocess, as a
user starts it, and so do the mocked clouds (``--clouds process``, the default: they then share
neither a process nor its GIL with the clients; ``--clouds inline`` runs them in this process).
The load starts once the server's first market refresh has answered for every cloud (seen on its
/metrics), so the run measures a server pricing from the live market, not its start-up step; and
the clock ``--warmup-s`` (default 30) later. Those first seconds are the clients', not the
server's: every client starts with a fast call at once, before the steady share of them waits in
a Launch or Release (about 8 s at 32 clients: in the first 2 s clients asked 1.6x the Quotes
of the 2 s that followed, and every RPC's median was 1.7-1.8x its steady value; warming the
quote cache for every demand first left that as it was). ``--warmup-s 0`` counts them.
The server's resident memory (VmRSS) and threads are sampled every second, and its own RPC
timings are read from its /metrics every ``--window`` seconds (default 60).

Per store (SQLite, and PostgreSQL when it answers on 127.0.0.1:5432) it prints throughput,
p50/p99 and errors per RPC; then one row per window: calls per second, the Quote p99 the clients
saw, the server's own handling time per RPC (count and p99 from its histogram), the calls it
refused as busy (``limits.max_cloud_calls``), its CPU time per call, its threads and the load
average; below it, per window, the Release p99 the clients saw per cloud and the instances each
mocked cloud holds (terminated ones EC2 still lists included); then its verdicts: throughput and Quote p99 flat (every window within 20 % of
the windows' median; the last window is left out when shorter than half a window) and RSS growth
over the last half of the run under 10 %. It exits 1 when a verdict is missed.

The mocked EC2 forgets a terminated instance ``--ec2-retention-s`` (default 60) after its
termination, as EC2 does about an hour after: a soak of minutes then holds what an hour's traffic
leaves EC2 listing, not everything it ever launched.

``--seed-terminated N`` starts the mocked EC2 with N of the broker's instances launched and
terminated already (as a long run leaves them), to see in minutes what a long run's history costs.
``--seed-ended-leases N`` starts the store with N ended leases (released or failed, each with its
events, as ten minutes of this load leave about 6,400), for the same reason on the broker's side.

Run: .venv/bin/python benchmarks/load.py [--seconds 600] [--clients 32] [--store sqlite|postgresql|both]
     [--window 60] [--clouds process|inline] [--ec2-retention-s 60] [--seed-terminated 0]
     [--seed-ended-leases 0]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.load_history import seed_ended_leases, seed_terminated  # noqa: E402

#: The mix, by weight: most traffic reads (quotes, lease lists), a steady share of pushed queue
#: snapshots, and launches that are released again straight away.
MIX = (("Quote", 45), ("ListLeases", 20), ("ReportQueue", 20), ("Launch+Release", 15))
DEMANDS = (("H100", 8, 24.0), ("A100", 16, 12.0), ("L4", 1, 2.0), ("", 4, 6.0))
#: The server-side RPCs shown per window (their handling time, from the server's own histogram).
SERVER_RPCS = ("Quote", "ListLeases", "ReportQueue", "Launch", "Release")
FLAT = 0.20  # a window's figure within this share of the windows' median is "flat"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def proc_status(pid: int, key: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return float("nan")


def rss_mb(pid: int) -> float:
    return proc_status(pid, "VmRSS") / 1024


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) ``pid`` has used: the server's own work, whatever the load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


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


def _clients_process(address: str, clients: int, seconds: float, seed: int, first: int, start_at: float,
                     warmup_s: float, out) -> None:
    """One process's share of the clients (numbered from ``first``), its results sent back."""
    load = Load(address, clients, seconds, seed, warmup_s)
    took = load._run_here(lambda t0: None, first, start_at)
    out.put((load.calls, load.releases, {op: dict(c) for op, c in load.errors.items()}, load.first_error,
             load.busy, took))


class Load:
    """The clients and what they saw: each answered call as (seconds since start, op, latency)."""

    def __init__(self, address: str, clients: int, seconds: float, seed: int, warmup_s: float = 0.0) -> None:
        self.address, self.clients, self.seconds, self.seed = address, clients, seconds, seed
        self.warmup_s = warmup_s  # the load runs this long before the clock starts, uncounted
        self.calls: list[tuple[float, str, float]] = []
        self.releases: list[tuple[float, str, float]] = []  # (seconds since start, cloud, Release latency)
        self.errors: dict[str, Counter] = defaultdict(Counter)
        self.first_error: dict[str, str] = {}  # per RPC and status: the first details seen
        self.lock = threading.Lock()
        self.t0 = 0.0
        self.busy = 0  # calls a busy server refused and the client asked again

    def lat(self, op: str, since: float = 0.0, until: float = float("inf")) -> list[float]:
        return [lat for t, o, lat in self.calls if o == op and since <= t < until]

    def run(self, processes: int = 1, on_start: Callable[[float], Any] = lambda t0: None) -> float:
        """Run the clients, spread over ``processes`` processes (so that their own GIL is not in
        the latencies they see); ``on_start(t0)`` is called as the clock starts."""
        if processes > 1:
            return self._run_processes(processes, on_start)
        return self._run_here(on_start)

    def _run_here(self, on_start: Callable[[float], Any], first: int = 0, start_at: float | None = None) -> float:
        import grpc

        # Each client its own connection (a local subchannel pool stops grpc sharing one socket),
        # connected before the clock starts: a first call's connection set-up is not its latency.
        channels = [grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(self.clients)]
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=60)
        threads = [threading.Thread(target=self._client, args=(first + i, ch), daemon=True)
                   for i, ch in enumerate(channels)]
        # the processes start together (CLOCK_MONOTONIC is the machine's), the warm-up before the clock
        self.t0 = time.monotonic() + self.warmup_s if start_at is None else start_at
        time.sleep(max(0.0, self.t0 - self.warmup_s - time.monotonic()))
        for t in threads:
            t.start()
        time.sleep(max(0.0, self.t0 - time.monotonic()))
        on_start(self.t0)
        for t in threads:
            t.join(self.seconds + 120)
        return time.monotonic() - self.t0

    def _run_processes(self, processes: int, on_start: Callable[[float], Any]) -> float:
        mp = multiprocessing.get_context("spawn")
        out = mp.Queue()
        shares = [self.clients // processes + (k < self.clients % processes) for k in range(processes)]
        # time for each process to import grpc and connect its clients, then the warm-up
        start_at = time.monotonic() + 15.0 + self.warmup_s
        procs, first = [], 0
        for n in shares:
            procs.append(mp.Process(target=_clients_process, daemon=True,
                                    args=(self.address, n, self.seconds, self.seed, first, start_at,
                                          self.warmup_s, out)))
            procs[-1].start()
            first += n
        time.sleep(max(0.0, start_at - time.monotonic()))
        self.t0 = start_at
        on_start(start_at)
        elapsed = 0.0
        for _ in procs:
            calls, releases, errors, first_error, busy, took = out.get(timeout=self.seconds + 300)
            self.calls += calls
            self.releases += releases
            for op, counts in errors.items():
                self.errors[op].update(counts)
            for k, v in first_error.items():
                self.first_error.setdefault(k, v)
            self.busy += busy
            elapsed = max(elapsed, took)
        for p in procs:
            p.join(30)
        self.calls.sort()
        return elapsed

    def _client(self, i: int, channel) -> None:
        import grpc

        from broker.v1 import broker_pb2 as pb
        from broker.v1 import broker_pb2_grpc as pb_grpc

        rng = random.Random(self.seed * 1000 + i)
        names, weights = zip(*MIX)
        with channel as ch:
            stub = pb_grpc.BrokerStub(ch)
            deadline = self.t0 + self.seconds
            while time.monotonic() < deadline:
                op = rng.choices(names, weights)[0]
                t, began = time.perf_counter(), time.monotonic()
                try:
                    self._call(op, stub, pb, rng, i)
                except grpc.RpcError as e:
                    if began < self.t0:  # the warm-up is not counted
                        continue
                    with self.lock:
                        self.errors[op][e.code().name] += 1
                        self.first_error.setdefault(f"{op} {e.code().name}", (e.details() or "")[:160])
                    continue
                if began >= self.t0:  # the warm-up is not counted
                    with self.lock:
                        self.calls.append((time.monotonic() - self.t0, op, time.perf_counter() - t))

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
                    lease = self._patient(stub.Launch, req, 60).lease
                    break
                except grpc.RpcError as e:
                    if attempt == 2 or e.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                        grpc.StatusCode.UNAVAILABLE):
                        raise
            t, began = time.perf_counter(), time.monotonic()
            self._patient(stub.Release, pb.ReleaseRequest(lease_id=lease.lease_id, reason="load test"), 60)
            if began >= self.t0:  # the warm-up is not counted
                with self.lock:
                    self.releases.append((time.monotonic() - self.t0, provider, time.perf_counter() - t))

    def _patient(self, method, request, budget_s: float):
        """``method(request)`` within ``budget_s``; a server busy with as many calls that wait on
        a cloud as it takes (limits.max_cloud_calls) is asked again after a growing, jittered
        pause, as broker.client does."""
        import grpc

        from broker.limits import BUSY

        deadline, pause = time.monotonic() + budget_s, 0.25
        while True:
            try:
                return method(request, timeout=max(0.001, deadline - time.monotonic()))
            except grpc.RpcError as e:
                wait = pause * (0.5 + random.random())
                busy = e.code() == grpc.StatusCode.UNAVAILABLE and any(k == BUSY for k, _ in e.trailing_metadata() or ())
                if not busy or time.monotonic() + wait >= deadline:
                    raise
                if time.monotonic() >= self.t0:
                    with self.lock:
                        self.busy += 1
            time.sleep(wait)
            pause = min(pause * 2, 5.0)


class ServerTimings:
    """The server's own view, read every ``window`` seconds: its RPC handling-time histogram
    (``broker_rpc_duration_seconds`` on /metrics), its threads, and the host's load average."""

    def __init__(self, metrics_url: str, pid: int, window: float, held=None) -> None:
        self.url, self.pid, self.window = metrics_url, pid, window
        self.held = held  # () -> {cloud: instances it holds}, read with each sample
        self.held_samples: list[dict[str, int]] = []
        self.samples: list[tuple[float, dict, float, float, float]] = []  # (t, buckets, threads, load, cpu s)
        self.max_threads = 0.0
        self.failed, self.first_failure = 0, ""  # scrapes of /metrics that failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, t0: float) -> "ServerTimings":
        self.t0 = t0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # /metrics opens just after SERVING
            try:
                self._histogram()
                break
            except OSError:
                time.sleep(0.2)
        self._take()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._take()

    def _run(self) -> None:
        n = 1
        while not self._stop.wait(max(0.0, self.t0 + n * self.window - time.monotonic())):
            self._take()
            n += 1

    def _take(self) -> None:
        try:
            buckets = self._histogram()
        except OSError as e:  # an HTTP error too: the window is shown without the server's timings
            buckets = None
            self.failed += 1
            self.first_failure = self.first_failure or str(e)[:200]
        self.samples.append((time.monotonic() - self.t0, buckets, proc_status(self.pid, "Threads"), load_average(),
                             cpu_s(self.pid)))
        try:
            self.held_samples.append(self.held() if self.held else {})
        except (OSError, RuntimeError, ValueError):
            self.held_samples.append({})

    def watch_threads(self) -> None:
        self.max_threads = max(self.max_threads, proc_status(self.pid, "Threads"))

    def _histogram(self) -> dict[str, dict[float, float]]:
        """Cumulative bucket counts per RPC method (all status codes together)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=30) as r:
            text = r.read().decode()
        out: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for fam in text_string_to_metric_families(text):
            if fam.name != "broker_rpc_duration_seconds":
                continue
            for s in fam.samples:
                if s.name.endswith("_bucket"):  # calls refused as busy (UNAVAILABLE) apart
                    method = s.labels["method"] + (" refused" if s.labels["code"] == "UNAVAILABLE" else "")
                    out[method][float(s.labels["le"])] += s.value
        return out

    def windows(self) -> list[tuple[float, float, dict[str, tuple[int, float]], float, float, float]]:
        """Per window: (start, end, {method: (calls, p99 s)}, threads, load average at its end,
        the server's CPU seconds in it)."""
        rows = []
        for (t_a, a, _, _, cpu_a), (t_b, b, threads, load, cpu_b) in zip(self.samples, self.samples[1:]):
            per: dict[str, tuple[int, float]] = {}
            if a is None or b is None:
                rows.append((t_a, t_b, per, threads, load, cpu_b - cpu_a))
                continue
            for method in SERVER_RPCS + tuple(f"{m} refused" for m in SERVER_RPCS):
                delta = {le: b.get(method, {}).get(le, 0) - a.get(method, {}).get(le, 0)
                         for le in b.get(method, {})}
                per[method] = (int(delta.get(float("inf"), 0)), quantile(delta, 0.99))
            rows.append((t_a, t_b, per, threads, load, cpu_b - cpu_a))
        return rows


def quantile(cumulative: dict[float, float], q: float) -> float:
    """``q`` of a cumulative histogram, interpolated within its bucket as Prometheus'
    histogram_quantile does (the top bucket's bound when it falls in +Inf)."""
    bounds = sorted(cumulative)
    total = cumulative.get(float("inf"), 0)
    if not total:
        return float("nan")
    rank, prev_le, prev_n = q * total, 0.0, 0.0
    for le in bounds:
        n = cumulative[le]
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / (n - prev_n) if n > prev_n else 1.0)
        prev_le, prev_n = le, n
    return prev_le


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
            alive = {c: (v if isinstance(v, int) else len(v)) for c, v in clouds.alive_instances().items()}
            left = {"live leases": leases} | {f"{c} instances": n for c, n in alive.items()}
            if not any(left.values()) or time.monotonic() > deadline:
                return left
            time.sleep(2.0)


def wait_for_market(metrics_url: str, providers: list[str], within_s: float = 60.0) -> str:
    """Wait until the server's first market refresh has answered for every provider (a sample of
    ``broker_market_age_seconds`` or ``broker_market_source_errors_total`` names it on /metrics),
    so the clock starts on a server pricing from the live market, not on its start-up step;
    returns what was seen, as a sentence."""
    t, seen, body = time.monotonic(), set(), ""
    while time.monotonic() - t < within_s:
        try:
            body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        except OSError:
            body = ""
        seen = {p for p in providers for line in body.splitlines()
                if line.startswith(("broker_market_age_seconds{", "broker_market_source_errors_total{"))
                and f'provider="{p}"' in line}
        if seen == set(providers):
            break
        time.sleep(0.1)
    failed = sorted(p for p in seen if f'broker_market_source_errors_total{{provider="{p}"' in body)
    return (f"the first market refresh answered for {', '.join(sorted(seen)) or 'no provider'} after "
            f"{time.monotonic() - t:.1f} s" + (f" ({', '.join(failed)} with errors)" if failed else "")
            + ("" if seen == set(providers) else f"; still waiting for {', '.join(sorted(set(providers) - seen))}"))


def sample_rss(pid: int, stop: threading.Event, out: list[tuple[float, float]], timings: ServerTimings) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - t0, rss_mb(pid)))
        timings.watch_threads()
        stop.wait(1.0)


def held_instances(clouds) -> dict[str, int]:
    """The instances each mocked cloud holds, in any state."""
    if hasattr(clouds, "ask"):
        return {name: s["instances"] for name, s in clouds.ask("stats").items()}
    return {name: len(fake.instances()) for name, cloud in clouds.clouds.items()
            if (fake := cloud.fakes.get(name)) is not None}


def start_clouds(mode: str):
    if mode == "inline":
        from tests.clouds.three import Clouds

        return Clouds(market=True)
    from tests.clouds.serve import CloudsProcess

    return CloudsProcess()


def soak(store: str, args) -> dict:
    from tests.clouds.aws import AwsCloud
    from tests.clouds.three import ServeProcess, _free_port, write_config
    from tests.stores import pg_url_or_skip

    from broker_sandbox.aws import RETENTION_ENV

    os.environ.update(AwsCloud.client_env())
    os.environ[RETENTION_ENV] = str(args.ec2_retention_s)  # the mocked clouds (this process or theirs) read it
    clouds = start_clouds(args.clouds)
    os.environ.update(clouds.env)  # the fake credentials a broker needs (Lambda Cloud's API key)
    pg = None
    try:
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
            metrics = f"127.0.0.1:{_free_port()}"
            cfg = write_config(tmpd / "broker.toml", clouds, url, server={"workers": max(16, args.clients)},
                               telemetry={"metrics_listen": metrics})
            if args.seed_terminated:
                seed_terminated(clouds, "broker-test", args.seed_terminated)
                print(f"{store}: the mocked EC2 starts with {args.seed_terminated} terminated instances")
            if args.seed_ended_leases:
                seed_ended_leases(url, args.seed_ended_leases)
                print(f"{store}: the store starts with {args.seed_ended_leases} ended leases")
            serve = ServeProcess(cfg, tmpd).start(timeout=90)
            enabled = sorted(p for p, t in clouds.provider_tables().items() if t.get("enabled", True))
            print(f"{store}: {wait_for_market(f'http://{metrics}/metrics', enabled)}")
            rss: list[tuple[float, float]] = []
            stop = threading.Event()
            load = Load(serve.address, args.clients, args.seconds, args.seed, args.warmup_s)
            timings = ServerTimings(f"http://{metrics}/metrics", serve.proc.pid, args.window,
                                    held=lambda: held_instances(clouds))
            sampler = threading.Thread(target=sample_rss, args=(serve.proc.pid, stop, rss, timings), daemon=True)
            sampler.start()
            try:
                elapsed = load.run(args.client_processes, timings.start)
                timings.stop()
                left = settle(serve.address, clouds, args.settle_s)
            finally:
                stop.set()
                sampler.join(5)
                serve.stop()
            logged = serve.log.read_text(errors="replace").splitlines()
            print(f"\n{store}: after the load, " + (", ".join(f"{n} {what}" for what, n in left.items() if n)
                                                     or "no live lease and no running instance is left"))
            return report(store, load, elapsed, rss, timings, [line for line in logged if '"level": "error"' in line
                                                               or '"level":"error"' in line])
    finally:
        if pg is not None:
            pg.close()
        clouds.stop()


def flat(values: list[float]) -> tuple[float, bool]:
    """The largest deviation of ``values`` from their median, as a share of it, and whether every
    value is within :data:`FLAT` of it."""
    vals = [v for v in values if v == v]
    if len(vals) < 2:
        return float("nan"), True
    mid = sorted(vals)[len(vals) // 2] if len(vals) % 2 else sum(sorted(vals)[len(vals) // 2 - 1:][:2]) / 2
    worst = max(abs(v - mid) for v in vals) / mid if mid else float("inf")
    return worst, worst <= FLAT


def report(store: str, load: Load, elapsed: float, rss: list[tuple[float, float]], timings: ServerTimings,
           errors_logged: list[str]) -> dict:
    print(f"\n== {store}: {load.clients} clients for {elapsed:.0f} s")
    print(f"{'rpc':15} {'calls':>7} {'per s':>7} {'p50 ms':>8} {'p99 ms':>8}  errors")
    total = 0
    for op, _ in MIX:
        lat = load.lat(op)
        total += len(lat)
        errs = ", ".join(f"{k} {v}" for k, v in sorted(load.errors.get(op, {}).items())) or "0"
        print(f"{op:15} {len(lat):7d} {len(lat) / elapsed:7.1f} {pct(lat, 50) * 1e3:8.1f} {pct(lat, 99) * 1e3:8.1f}  {errs}")
    print(f"{'all':15} {total:7d} {total / elapsed:7.1f}")
    if load.busy:
        print(f"  {load.busy} calls were refused by a busy server (limits.max_cloud_calls) and asked again")
    for what, details in sorted(load.first_error.items()):
        print(f"  first {what}: {details}")
    if errors_logged:
        print(f"  the server logged {len(errors_logged)} errors; the first: {errors_logged[0][:600]}")

    windows = [w for w in timings.windows() if w[0] < load.seconds]
    if windows and windows[-1][1] - windows[-1][0] < timings.window / 2:
        windows = windows[:-1]  # a short last window (the run's end) is not judged
    print(f"\nper {timings.window:.0f} s window: the clients' calls/s and Quote p99; the server's own "
          "handling time (calls, p99 ms), the calls it refused as busy, its CPU ms per call")
    print(f"{'window':>11} {'calls/s':>7} {'Quote p99':>9} " + " ".join(f"{m[:11]:>15}" for m in SERVER_RPCS)
          + f" {'busy':>5} {'cpu/call':>8} {'threads':>7} {'load':>5}")
    per_s, quote_p99 = [], []
    for t_a, t_b, per, threads, la, cpu in windows:
        n = sum(1 for t, _, _ in load.calls if t_a <= t < t_b)
        q = pct(load.lat("Quote", t_a, t_b), 99) * 1e3
        per_s.append(n / (t_b - t_a))
        quote_p99.append(q)
        if per:
            cells = " ".join(f"{c:6d} {p * 1e3:8.1f}" for c, p in (per[m] for m in SERVER_RPCS))
            busy = sum(per[f"{m} refused"][0] for m in SERVER_RPCS)
            served = sum(per[m][0] for m in SERVER_RPCS) + busy
        else:  # /metrics did not answer: the clients' count of answered calls and refusals instead
            cells = " ".join(f"{'-':>15}" for _ in SERVER_RPCS)
            busy, served = -1, n
        ms = cpu / served * 1e3 if served else float("nan")
        print(f"{t_a:5.0f}-{t_b:<5.0f} {per_s[-1]:7.1f} {q:9.1f} {cells} {busy if busy >= 0 else '-':>5} {ms:8.2f} "
              f"{threads:7.0f} {la:5.1f}")
    clouds_seen = sorted({c for _, c, _ in load.releases})
    print("\nper window: the Release p99 ms the clients saw per cloud, and the instances each mocked cloud "
          "holds at the window's end")
    held_names = sorted({c for h in timings.held_samples for c in h})
    print(f"{'window':>11} " + " ".join(f"{'Release ' + c:>14}" for c in clouds_seen)
          + " " + " ".join(f"{'held ' + c:>12}" for c in held_names))
    for n, (t_a, t_b, *_rest) in enumerate(windows):
        rel = " ".join(f"{pct([lat for t, c, lat in load.releases if c == cl and t_a <= t < t_b], 99) * 1e3:14.1f}"
                       for cl in clouds_seen)
        held = timings.held_samples[n + 1] if n + 1 < len(timings.held_samples) else {}
        print(f"{t_a:5.0f}-{t_b:<5.0f} {rel} " + " ".join(f"{held.get(c, -1):12d}" for c in held_names))
    if timings.failed:
        print(f"  {timings.failed} reads of the server's /metrics failed (rows without its timings show '-', "
              f"their CPU per call is per answered call); the first: {timings.first_failure}")
    worst_tp, tp_ok = flat(per_s)
    worst_q, q_ok = flat(quote_p99)
    print(f"throughput per window: {min(per_s, default=0):.1f}–{max(per_s, default=0):.1f} calls/s, "
          f"at most {worst_tp * 100:.0f} % from the median (flat within {FLAT:.0%}: {'met' if tp_ok else 'MISSED'})")
    print(f"Quote p99 per window: {min(quote_p99, default=0):.0f}–{max(quote_p99, default=0):.0f} ms, "
          f"at most {worst_q * 100:.0f} % from the median (flat within {FLAT:.0%}: {'met' if q_ok else 'MISSED'})")
    print(f"server threads at most {timings.max_threads:.0f}")

    marks = [rss[min(len(rss) - 1, int(len(rss) * f))] for f in (0.0, 0.25, 0.5, 0.75, 1.0)] if rss else []
    print("RSS MB over time: " + "  ".join(f"{t:5.0f}s {m:6.1f}" for t, m in marks))
    half = [m for t, m in rss if t >= rss[-1][0] / 2] if rss else []
    growth = (half[-1] - half[0]) / half[0] if len(half) > 1 else float("nan")
    peak = max(m for _, m in rss) if rss else float("nan")
    verdict = "met" if growth < 0.10 else "MISSED"
    print(f"RSS growth over the last half: {growth * 100:+.1f} % (target < 10 %: {verdict}); peak {peak:.0f} MB")
    n_err = sum(sum(c.values()) for c in load.errors.values())
    return {"store": store, "calls": total, "per_s": total / elapsed, "errors": n_err, "rss_growth": growth,
            "p99_ms": {op: pct(load.lat(op), 99) * 1e3 for op, _ in MIX}, "peak_mb": peak,
            "flat": tp_ok and q_ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--client-processes", type=int, default=4,
                    help="processes the clients are spread over (their own GIL otherwise shows in their latencies)")
    ap.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--warmup-s", type=float, default=30.0,
                    help="seconds the load runs before the clock starts, not counted (see the module doc)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds per row of the over-time report")
    ap.add_argument("--clouds", choices=("process", "inline"), default="process",
                    help="the mocked clouds in a subprocess of their own (default) or in this process")
    ap.add_argument("--ec2-retention-s", type=float, default=60.0,
                    help="how long the mocked EC2 lists a terminated instance (EC2: about an hour)")
    ap.add_argument("--seed-terminated", type=int, default=0,
                    help="start the mocked EC2 with this many of the broker's instances terminated already")
    ap.add_argument("--seed-ended-leases", type=int, default=0,
                    help="start the store with this many ended leases (ten minutes of this load leave ~6,400)")
    ap.add_argument("--settle-s", type=float, default=180.0,
                    help="after the load, how long to wait for every lease and instance to be gone")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when the output goes to a file
    stores = ("sqlite", "postgresql") if args.store == "both" else (args.store,)
    results = [r for s in stores if (r := soak(s, args))]
    if len(results) == 2:
        a, b = results
        print(f"\nPostgreSQL ÷ SQLite throughput: {b['per_s'] / a['per_s']:.2f}")
    sys.exit(1 if any(r["rss_growth"] >= 0.10 or not r["flat"] for r in results) else 0)


if __name__ == "__main__":
    main()
