"""Start-up of `broker serve`: start-to-listen and start-to-SERVING, against a bare interpreter.

    python benchmarks/startup.py [--runs 5]

Starts `broker serve` as a subprocess (SQLite store in a temporary directory, 127.0.0.1 only) and
measures, from the moment the process is spawned:

- listen: the port accepts a TCP connection (the gRPC health service answers, NOT_SERVING);
- serving: grpc.health.v1 says SERVING for broker.v1.Broker (store open, quote engine built; the
  enabled clouds' providers are built after it, in the background);
- cli: `broker --help` to exit, the cost every command pays.

``--cli-only`` measures, instead of the above, `broker --help` and a cold in-process
`broker quote --gpu H100:8 --hours 24` (table and ``-o json``) as whole processes, wall and CPU
(user + system of the child, from ``getrusage``: steadier than wall on a loaded machine);
``--before DIR`` adds the same quotes on the code of checkout DIR, interleaved in the same run.
A quote keeps a compiled catalog and the settings it reads in the user's cache directory
(``~/.cache/broker``): the warm-up runs write them, the timed runs read them, as every quote
after the first does.
Compile the bytecode first (``python -m compileall broker policies providers``) where
``PYTHONDONTWRITEBYTECODE`` is set: an install has it.

three times: with no provider enabled, the same with ``--processes 2`` (a parent starts the
serving processes: the first listens and serves, the second joins the port once built), and
with all three providers enabled (built lazily behind SERVING; endpoints on a closed loopback
port, anonymous credentials: nothing leaves the machine). ``BROKER_BENCH_ROOT=DIR`` runs the
code of another checkout (a before/after in one sitting); every child runs outside this one.
The baseline is `python -c pass` in the same run; figures are medians, with their ratio to it.
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = """
[providers.aws]
enabled = true
regions = ["us-east-1"]
image_id = "ami-0abc12345def67890"
endpoint_url = "http://127.0.0.1:9"
credentials = "anonymous"
[providers.gcp]
enabled = true
project = "bench"
regions = ["us-central1"]
api_endpoint = "http://127.0.0.1:9"
credentials = "anonymous"
[providers.azure]
enabled = true
subscription_id = "00000000-0000-0000-0000-000000000000"
resource_group = "rg-bench"
regions = ["eastus"]
base_url = "http://127.0.0.1:9"
credentials = "anonymous"
subnet_id = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/s"
ssh_public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBench bench@example"
"""


def env(root: str | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    # another checkout, for a before/after
    e["PYTHONPATH"] = root or os.environ.get("BROKER_BENCH_ROOT", str(ROOT))
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(argv: list[str]) -> float:
    return timed_cpu(argv)[0]


def timed_cpu(argv: list[str], root: str | None = None) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``argv`` (the code of ``root``) to its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, env=env(root), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=tempfile.gettempdir())  # not the checkout: PYTHONPATH picks the code
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


QUOTE = ["quote", "--gpu", "H100:8", "--hours", "24"]


def cli_only(runs: int, before: str | None = None) -> None:
    cases: dict[str, tuple[list[str], str | None]] = {
        "python -c pass": (["-c", "pass"], None), "broker --help": (["-m", "broker", "--help"], None),
        "broker quote": (["-m", "broker", *QUOTE], None),
        "broker quote -o json": (["-m", "broker", *QUOTE, "-o", "json"], None)}
    if before:  # the same quotes on the code of another checkout, in the same run
        cases |= {f"before: {k}": (argv, before) for k, (argv, _) in cases.items() if k.startswith("broker quote")}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(2):  # warm-up: the page cache (and any cache the command keeps)
        for argv, root in cases.values():
            timed_cpu([sys.executable, *argv], root)
    for _ in range(runs):  # interleaved, so load on the machine touches every figure alike
        for name, (argv, root) in cases.items():
            got[name].append(timed_cpu([sys.executable, *argv], root))
    bw = statistics.median(w for w, _ in got["python -c pass"])
    bc = statistics.median(c for _, c in got["python -c pass"])
    for name, rs in got.items():
        w, c = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        print(f"{name}: wall {w * 1000:.0f} ms ({w / bw:.1f}x), CPU {c * 1000:.0f} ms ({c / bc:.1f}x)"
              f" (median of {runs})")


def serve_once(config: Path, db: Path, deadline_s: float = 120.0, processes: int = 1) -> tuple[float, float]:
    port = free_port()
    argv = [sys.executable, "-m", "broker", "serve", "--config", str(config), "--db", f"sqlite:///{db}",
            "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=tempfile.gettempdir())
    listen = serving = None
    try:
        end = t0 + deadline_s
        while listen is None and time.perf_counter() < end:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                listen = time.perf_counter() - t0
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"broker serve exited: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.005)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest(service="broker.v1.Broker")
            while serving is None and time.perf_counter() < end:
                try:
                    if stub.Check(req, timeout=1).status == health_pb2.HealthCheckResponse.SERVING:
                        serving = time.perf_counter() - t0
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if listen is None or serving is None:
        raise SystemExit("broker serve did not answer within the deadline")
    return listen, serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli-only", action="store_true", help="only `--help` and `quote`, no server")
    ap.add_argument("--before", metavar="DIR", help="with --cli-only: also the quotes on the code of checkout DIR")
    a = ap.parse_args()
    if a.cli_only:
        return cli_only(a.runs, a.before)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        configs = {"no provider": tmp / "none.toml", "no provider, --processes 2": tmp / "none.toml",
                   "aws+gcp+azure": tmp / "three.toml"}
        configs["no provider"].write_text('owner = "broker-bench"\n[catalog]\nrefresh_interval_s = 0\n')
        configs["aws+gcp+azure"].write_text('owner = "broker-bench"\n[catalog]\nrefresh_interval_s = 0\n' + PROVIDERS)
        base, cli, runs = [], [], {k: [] for k in configs}
        for i in range(a.runs):  # interleaved, so load on the machine touches every figure alike
            base.append(timed([sys.executable, "-c", "pass"]))
            cli.append(timed([sys.executable, "-m", "broker", "--help"]))
            for name, cfg in configs.items():
                runs[name].append(serve_once(cfg, tmp / f"{len(runs[name])}-{len(name)}-{i}.db",
                                             processes=2 if "--processes" in name else 1))
    b = statistics.median(base)
    print(f"baseline `python -c pass`: {b * 1000:.0f} ms (median of {a.runs})")
    print(f"`broker --help`: {statistics.median(cli) * 1000:.0f} ms ({statistics.median(cli) / b:.1f}x)")
    for name, rs in runs.items():
        listen = statistics.median(r[0] for r in rs)
        serving = statistics.median(r[1] for r in rs)
        print(f"broker serve, {name}: listen {listen * 1000:.0f} ms ({listen / b:.1f}x), "
              f"SERVING {serving * 1000:.0f} ms ({serving / b:.1f}x)")


if __name__ == "__main__":
    main()
