"""Workloads beyond one job trace: generated ones, and jobs derived from a queue-depth series.

A policy that wins on one trace is not done, so the simulator also replays workloads generated
from a seed (:func:`generate`), each a mix the Philly trace does not have:

- ``services-overloaded``: a small pool (24 GPUs) overloaded by long-running services (12 % of
  the jobs run 5 to 9 days), batch jobs and bursts of short jobs, in mixed classes, a fifth of
  them with no runtime estimate;
- ``mixed``: the same kinds of jobs (3 % services) on a pool they mostly fit (most jobs stay
  on-prem);
- ``bursty``: short jobs arriving in bursts of tens within minutes, on a mid-sized pool.

:func:`queue_depth_jobs` reads a per-minute queue-depth series (Helios' ``vc, minute,
total_gpu, running_gpu, pending_gpu, running_jobs, pending_jobs``). Such a file has no jobs: it
says how many jobs and GPUs were in the system each minute. What it does give is arrivals: a
minute in which the jobs in the system (running + pending) grew by k saw at least k arrivals, and
the GPUs in the system grew by their GPUs. It does not give runtimes; the derived jobs run for
durations drawn (seeded, lognormal) to the mean the series implies by Little's law on GPUs (mean
busy GPUs / GPUs arriving per second), so the replay reproduces its arrivals, sizes and load,
not its jobs.
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from broker.simulate.trace import TraceError, TraceJob, unreadable
from providers.files import lines

PROFILES = ("services-overloaded", "mixed", "bursty")
MAX_GENERATED_JOBS = 1_000_000
DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    jobs: list[TraceJob]
    onprem_gpus: int
    gpus_per_node: int = 8
    note: str = ""


# class labels as schedulers write them (policies.classes matches them case-insensitively)
_SERVICE_CLASSES = ("guaranteed", "production", "LS", "", "prod")
_BATCH_CLASSES = ("", "", "best-effort", "BE", "production", "interactive", "latency-sensitive")
_BURST_CLASSES = ("", "interactive", "best-effort", "debug")


def generate(profile: str, seed: int = 0, jobs: int = 600, days: float = 14.0,
             gpu_model: str = "A100") -> Workload:
    """A seeded workload of ``jobs`` jobs over ``days`` (see the module docstring)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown workload {profile!r}; known: {', '.join(PROFILES)}")
    if not 1 <= jobs <= MAX_GENERATED_JOBS:
        raise ValueError(f"jobs must be between 1 and {MAX_GENERATED_JOBS:,}, got {jobs}")
    if not (math.isfinite(days) and 0 < days <= 3650):
        raise ValueError(f"days must be between 0 and 3650, got {days}")
    rng = random.Random(f"{profile}:{seed}")
    span = days * DAY
    share = {"services-overloaded": (0.12, 0.28), "mixed": (0.03, 0.20), "bursty": (0.0, 0.70)}[profile]
    pool = {"services-overloaded": 24, "mixed": 48, "bursty": 64}[profile]
    out: list[TraceJob] = []
    n_services = round(jobs * share[0])
    n_burst = round(jobs * share[1])
    n_batch = max(0, jobs - n_services - n_burst)
    for k in range(n_services):
        out.append(_job(rng, f"svc{k}", rng.uniform(0, span), rng.choice((1, 1, 2, 4)),
                        rng.uniform(5 * DAY, 9 * DAY), rng.choice(_SERVICE_CLASSES), "training", 0.5))
    for k in range(n_batch):
        dur = min(3 * DAY, max(60.0, rng.lognormvariate(math.log(5400), 1.2)))
        out.append(_job(rng, f"b{k}", rng.uniform(0, span), rng.choice((1, 1, 2, 4, 8)), dur,
                        rng.choice(_BATCH_CLASSES), rng.choice(("training", "training", "tuning", "eval")),
                        0.2))
    k = 0
    while k < n_burst:  # bursts of 10-40 short jobs within ten minutes
        t0 = rng.uniform(0, span)
        for _ in range(min(n_burst - k, rng.randint(10, 40))):
            out.append(_job(rng, f"s{k}", t0 + rng.uniform(0, 600), rng.choice((1, 1, 2, 4, 8)),
                            rng.uniform(300, 3600), rng.choice(_BURST_CLASSES),
                            rng.choice(("training", "eval", "inference")), 0.2))
            k += 1
    out.sort(key=lambda j: (j.submit_s, j.job_id))
    return Workload(profile, [replace(j, gpu_model=gpu_model.upper()) for j in out], pool)


def _job(rng: random.Random, jid: str, t: float, gpus: int, dur: float, cls: str, kind: str,
         unknown: float) -> TraceJob:
    return TraceJob(jid, round(t, 1), gpus, round(dur, 1), interruptible=rng.random() < 0.5, kind=kind,
                    job_class=cls, runtime_known=rng.random() >= unknown)


_DEPTH_COLUMNS = ("minute", "total_gpu", "running_gpu", "pending_gpu", "running_jobs", "pending_jobs")


def is_queue_depth(header: list[str]) -> bool:
    return all(c in header for c in _DEPTH_COLUMNS)


def _depth_rows(p: Path, rd: Iterator[list[str]]) -> list[tuple[int, ...]]:
    header = [h.strip().lower() for h in next(rd, [])]
    if not is_queue_depth(header):
        raise TraceError(f"{p.name} is not a queue-depth series (needs columns {', '.join(_DEPTH_COLUMNS)})")
    at = {c: header.index(c) for c in _DEPTH_COLUMNS}
    rows = []
    for line, row in enumerate(rd, start=2):
        if not row:
            continue
        try:
            rows.append(tuple(int(float(row[at[c]])) for c in _DEPTH_COLUMNS))
        except (ValueError, IndexError):
            raise TraceError(f"{p.name} line {line}: {', '.join(_DEPTH_COLUMNS)} must be numbers") from None
    return rows


def queue_depth_jobs(path: Path | str, seed: int = 0, gpu_model: str = "A100") -> Workload:
    """Jobs derived from a per-minute queue-depth CSV (see the module docstring)."""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot read {p}: {e.strerror or e}") from None
    with f:
        rd = csv.reader(lines(f))
        try:
            rows = _depth_rows(p, rd)
        except (csv.Error, UnicodeDecodeError) as e:
            raise unreadable(p, rd.line_num, e) from None
        except OSError as e:
            raise TraceError(f"{p.name}: {e.strerror or e}") from None
    if len(rows) < 2:
        raise TraceError(f"{p.name} holds fewer than two minutes")
    rows.sort()
    total = max(r[1] for r in rows)
    arrivals: list[tuple[float, int]] = []  # (minute, gpus)
    mean_gpus = max(1.0, sum(r[2] for r in rows) / max(1, sum(r[4] for r in rows)))
    for prev, cur in zip(rows, rows[1:]):
        dn = (cur[4] + cur[5]) - (prev[4] + prev[5])
        if dn <= 0:
            continue
        dg = (cur[2] + cur[3]) - (prev[2] + prev[3])
        per = dg / dn if dg > 0 else mean_gpus
        for _ in range(dn):
            arrivals.append((cur[0] * 60.0, max(1, min(total, round(per)))))
    if not arrivals:
        raise TraceError(f"{p.name}: the jobs in the system never grow, so no arrival can be derived")
    minutes = rows[-1][0] - rows[0][0] + 1
    # Little's law on GPUs: the GPUs busy on average = GPU arrivals per second x mean duration,
    # so the derived jobs offer the load the series measured
    busy_gpus = sum(r[2] for r in rows) / len(rows)
    gpu_rate = sum(g for _, g in arrivals) / (minutes * 60.0)
    mean_dur = busy_gpus / gpu_rate
    rng = random.Random(f"depth:{p.name}:{seed}")
    sigma = 1.0
    mu = math.log(mean_dur) - sigma * sigma / 2
    jobs = [TraceJob(f"d{k}", t + rng.uniform(0, 59.0), g, round(max(60.0, rng.lognormvariate(mu, sigma)), 1),
                     interruptible=rng.random() < 0.5, gpu_model=gpu_model.upper())
            for k, (t, g) in enumerate(arrivals)]
    jobs.sort(key=lambda j: j.submit_s)
    per_node = 8 if total % 8 == 0 else 1
    return Workload(p.stem, jobs, total, per_node,
                    f"{len(jobs):,} arrivals derived from {minutes:,} minutes of queue depth ({busy_gpus / total:.0%} of "
                    f"its GPUs busy); durations drawn to the {mean_dur / 3600:.1f} h mean Little's law gives "
                    f"for that load (the series has none)")
