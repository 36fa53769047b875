"""A big cluster's queue: ReportQueue and Diagnose at 1k / 10k / 40k / 100k pending jobs.

Each size runs in its own process (so its memory peak is its own): a generated cluster of
``--nodes`` nodes (8 GPUs each; mostly allocated, some mixed, idle, drained and down; three
partitions, two GPU models, a GPU sample per GPU, a running job per busy node) and N pending
jobs of every shape (1-16 GPUs, node counts, whole-node requests, every kind, Slurm's reasons
including Priority, Dependency, QOS limits, holds and unavailable nodes). The request is the
serialized protobuf a scheduler pushes; the server side is measured in process: parse, validate,
diagnose, store the snapshot (a real SQLite store), run the trigger (the autoscaler is on, with
``max_gpus_in_flight = 0`` so it decides but launches nothing), and build the answer.

Printed per size, in CPU seconds of the process (``time.process_time``, not wall time) beside
the load average: ReportQueue, Diagnose, the floor (parsing the request and reading every
job's fields once, which no decoder can avoid) and the ratio to it; the memory the calls added
over the process's resident size before them (peak VmHWM - VmRSS). ``--before N`` (default
1000; 0 = skip) also times the previous path on N jobs in the same run (the JSON mapping and
field-by-field validator, the jobs x nodes placement, ``json`` for the store), for the ratio.

Run: .venv/bin/python benchmarks/report_queue.py [--sizes 1000,10000,40000,100000] [--nodes 1000]
"""
from __future__ import annotations

import argparse
import json
import operator
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REASONS = (["Resources"] * 6 + ["Priority"] * 3
           + ["Dependency", "QOSMaxGRESPerUser", "JobHeldUser", "BeginTime", "PartitionTimeLimit",
              "ReqNodeNotAvail, UnavailableNodes:gpu-[0003-0005]", "None"])


def request_bytes(jobs: int, nodes: int, seed: int = 1) -> bytes:
    from broker.v1 import broker_pb2 as pb

    rng = random.Random(seed)
    s = pb.QueueSnapshot(source="bench")
    s.taken_at.FromSeconds(int(time.time()))
    for i in range(nodes):
        state = rng.choices(["alloc", "mix", "idle", "drain", "down"], [70, 20, 3, 4, 3])[0]
        alloc = {"alloc": 8, "idle": 0}.get(state, rng.randint(0, 8) if state != "mix" else rng.randint(1, 7))
        name = f"gpu-{i:04d}"
        s.nodes.add(name=name, state=state, gpus_total=8, gpus_allocated=alloc,
                    gpu_model=rng.choice(["A100", "H100"]),
                    partitions=rng.choice([["gpu"], ["gpu", "long"], ["debug"]]),
                    reason="ECC errors" if state in ("drain", "down") else "")
        for g in range(8):
            s.gpu_samples.add(node=name, index=g, utilization_pct=rng.uniform(0, 100), memory_used_mb=1000)
        if alloc:
            s.running.add(job_id=f"r{i}", gpus=alloc, nodes=[name], runtime_s=3600, time_limit_s=4 * 3600,
                          user="u", queue="gpu")
    for j in range(jobs):
        g = rng.choice([1, 1, 2, 4, 8, 16])
        s.pending.add(job_id=f"{100000 + j}" + ("+0" if j % 997 == 0 else ""), user=f"u{j % 50}",
                      queue=rng.choice(["gpu", "long", "debug", "gpu,long", ""]), gpus=g,
                      gpu_model=rng.choice(["", "A100", "H100"]),
                      nodes=rng.choice([0, 0, 1, 2]) if g >= 2 else 0, time_limit_s=4 * 3600,
                      est_runtime_s=rng.randint(60, 86400), waited_s=rng.randint(0, 86400),
                      pending_reason=rng.choice(REASONS), interruptible=rng.random() < 0.3,
                      checkpoint_minutes=30, data_gb=1.0,
                      kind=rng.choice(["", "training", "eval", "tuning", "inference"]),
                      exclusive=rng.random() < 0.05)
    return pb.ReportQueueRequest(snapshot=s).SerializeToString()


def vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def child(jobs: int, nodes: int, repeat: int, before: bool) -> dict:
    from broker import config as cfgmod
    from broker import queue_api
    from broker.service import Service
    from broker.v1 import broker_pb2 as pb

    data = request_bytes(jobs, nodes)
    get = operator.attrgetter(*[f.name for f in pb.PendingJob.DESCRIPTOR.fields])

    def floor():
        m = pb.ReportQueueRequest.FromString(data)
        for j in m.snapshot.pending:
            get(j)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfgmod.load(None, environ={}, overrides={
            "store.url": f"sqlite:///{tmp}/broker.db", "autoscaler.enabled": True,
            "autoscaler.trigger.max_gpus_in_flight": 0})
        svc = Service(cfg)
        out: dict = {"jobs": jobs, "nodes": nodes, "request_mb": len(data) / 1e6}
        if before:
            out["before_s"] = cpu(lambda: previous_path(svc, data), 1)
            return out
        rss = vm("VmRSS")
        verdict = []
        out["report_queue_s"] = cpu(lambda: verdict.append(queue_api.report_queue(
            svc, pb.ReportQueueRequest.FromString(data))), repeat)
        out["diagnose_s"] = cpu(lambda: queue_api.diagnose(
            svc, pb.DiagnoseRequest.FromString(data)), repeat)
        out["extra_mb"] = vm("VmHWM") - rss
        out["floor_s"] = cpu(floor, repeat)
        r = verdict[-1]
        out["verdict"] = pb.Verdict.Name(r.diagnosis.verdict)
        out["decision"] = (r.decisions[0].action if r.decisions else "")
        svc.stop()
    return out


def previous_path(svc, data: bytes) -> None:
    """What ReportQueue did before: the JSON mapping and validator, the jobs x nodes placement,
    ``json`` for the stored snapshot (the trigger and the answer are as now)."""
    import json as js

    from broker.queue_api import checked_snapshot
    from broker.v1 import broker_pb2 as pb
    from broker.watchers.snapshot_json import snapshot_to_dict
    from tests import diagnose_reference as ref

    snap = checked_snapshot(pb.ReportQueueRequest.FromString(data).snapshot, time.time())
    svc.store.save_snapshot(snap.source, snap.taken_at, js.dumps(snapshot_to_dict(snap)))
    ref.diagnose(snap, now=time.time())


def run(args, jobs: int, before: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", str(jobs), "--nodes", str(args.nodes),
           "--repeat", str(args.repeat)] + (["--as-before"] if before else [])
    load = os.getloadavg()[0]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["load"] = round((load + os.getloadavg()[0]) / 2, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,40000,100000")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=int, default=1000, help="jobs for the previous path (0: skip)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--as-before", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.nodes, args.repeat, args.as_before)))
        return
    print(f"ReportQueue / Diagnose on {args.nodes:,} nodes, server CPU seconds (median of "
          f"{args.repeat}), 2 cores shared; load = 1-min load average during the size\n")
    print(f"{'pending':>8} {'req MB':>7} {'ReportQueue':>11} {'Diagnose':>9} {'floor':>6} "
          f"{'RQ/floor':>8} {'extra MB':>8} {'load':>5}  verdict / decision")
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        r = run(args, n)
        rows.append(r)
        print(f"{n:>8,} {r['request_mb']:>7.2f} {r['report_queue_s']:>11.3f} {r['diagnose_s']:>9.3f} "
              f"{r['floor_s']:>6.3f} {r['report_queue_s'] / r['floor_s']:>7.1f}x "
              f"{r['extra_mb']:>8.0f} {r['load']:>5}  {r['verdict']} / {r['decision']}", flush=True)
    if args.before:
        b = run(args, args.before, before=True)
        now = run(args, args.before) if args.before not in [r["jobs"] for r in rows] else \
            next(r for r in rows if r["jobs"] == args.before)
        print(f"\nprevious path at {args.before:,} jobs: {b['before_s']:.2f} s CPU (load {b['load']}); "
              f"now {now['report_queue_s']:.3f} s: {b['before_s'] / now['report_queue_s']:,.0f}x less")
    big = rows[-1]
    print(f"\ntarget at 100,000 jobs: <= 2 s CPU and <= 200 MB extra; at {big['jobs']:,}: "
          f"{big['report_queue_s']:.2f} s, {big['extra_mb']:.0f} MB")


if __name__ == "__main__":
    main()
