"""A trace of millions of jobs: read (and optionally replay) a tiled Philly trace.

The real Philly trace (76,590 jobs over 82 days) is tiled end to end, each copy after the last
with its own job ids, into a temporary directory (never the repository) until it holds
``--rows`` rows (default 2,000,000, about 65 MB). Then, each in a child process of its own:

- the floor: ``csv.reader`` over the file, touching every row and nothing else;
- ``read_trace`` (what ``broker simulate`` reads the trace with);
- with ``--replay``, ``broker simulate --policy broker`` on 512 GPUs as a user runs it (its
  progress lines on stderr are passed through).

Printed: CPU seconds of each child (``os.wait4``), its own peak resident memory, the
ratio to the floor, and the load average over each.

Run: .venv/bin/python benchmarks/trace_stream.py [--rows 2000000] [--replay] [--data ../shared/data]
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

READ = "import sys; from broker.simulate import read_trace; t = read_trace(sys.argv[1], 0.5, 0, 'A100'); print(len(t.jobs))"
FLOOR = "import csv, sys; print(sum(1 for _ in csv.reader(open(sys.argv[1], newline=''))) - 1)"


def tile(src: Path, rows: int, out: Path) -> None:
    with src.open(newline="") as f:
        data = list(csv.reader(f))
    header, body = data[0], data[1:]
    span = max(float(r[1]) for r in body) + 1
    with out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for k in range(rows):
            rep, r = divmod(k, len(body))
            w.writerow([f"{rep}-{body[r][0]}", f"{float(body[r][1]) + rep * span:.0f}", *body[r][2:]])


def child(cmd: list[str]) -> dict:
    """Run ``cmd``; its own CPU and peak RSS (``os.wait4``), wall time and the load over it."""
    load = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": wall, "peak_mb": ru.ru_maxrss / 1024,
            "load": round((load + os.getloadavg()[0]) / 2, 1), "out": out.strip()[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--replay", action="store_true", help="also replay the broker policy on it")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    a = ap.parse_args()
    src = a.data / "traces" / "philly_2017_jobs.csv"
    if not src.exists():
        print(f"SKIP: {src} is absent; pass --data DIR.")
        return 0
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiled.csv"
        tile(src, a.rows, path)
        print(f"{a.rows:,} rows, {path.stat().st_size / 1e6:.0f} MB (Philly tiled), in {tmp}")
        runs = [("floor: csv.reader", [py, "-c", FLOOR, str(path)]),
                ("read_trace", [py, "-c", READ, str(path)])]
        if a.replay:
            runs.append(("broker simulate --policy broker", [
                py, "-m", "broker", "simulate", "--trace", str(path), "--onprem-gpus", "512",
                "--policy", "broker", "--spot-lifetimes", "catalog", "-o", "json"]))
        floor = None
        for name, cmd in runs:
            r = child(cmd)
            floor = floor or r["cpu_s"]
            print(f"{name:34} CPU {r['cpu_s']:7.1f} s ({r['cpu_s'] / floor:5.1f}x the floor)  "
                  f"wall {r['wall_s']:7.1f} s  peak RSS {r['peak_mb']:6.0f} MB  load {r['load']}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
