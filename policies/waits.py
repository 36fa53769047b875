"""Predicted on-prem waits: one predictor for the live service and the simulator.

:func:`forecast` plays the queue forward by GPU count. The queue is taken in the order the
scheduler serves it (longest waiting first); the running jobs release their GPUs at their
expected ends (start + estimated runtime, else time limit: what the scheduler reports); each
queued job starts once the GPUs free now and those released since cover it, and releases them
again after its own runtime. Its predicted remaining wait is that start less now. Backfill, as
the scheduler's: a job competes only with the jobs ahead of it that are no bigger (bigger ones
wait for more GPUs and are backfilled around), so the queue is played once per job size. Node
shapes are left out.

Runtimes nobody reports are guessed from the ones the queue does report, not from a constant: a
pending job without one holds its GPUs for the typical runtime; a running job without one runs
as long again as it has run, and at least to the typical runtime. The typical runtime is the
median of the runtimes reported by the queued jobs and by the running ones, each running job
counted in inverse proportion to its runtime (:func:`typical_runtime_s`): the jobs running at
one moment are a length-biased sample (a week-long service is on the pool for a whole week, a
one-hour job for an hour), so a plain median of them is the runtime of the services, not of a
job. Weighted so, the running jobs give the median of the runtimes jobs are submitted with.

When the scheduler reports no end times at all (GPUs allocated, no running job with a runtime
or limit), it falls back to the queue-ahead estimate (:func:`fluid_wait_s`): the queued work
ahead over the pool's GPUs.

The caller re-evaluates on every snapshot (the service) or tick (the simulator); a job that
has already waited past its target goes regardless (``policies.triggers``: the wait counted is
the larger of the wait so far and the prediction). Pure: ``now`` is implicit, every time is
relative to the snapshot.
"""
from __future__ import annotations

import heapq
import math
from typing import Sequence

from policies.queue import PendingJob, QueueSnapshot


def fluid_wait_s(gpus: int, work_ahead_gpu_s: float, free_gpus: int, capacity_gpus: int) -> float:
    """Queue-ahead estimate of the remaining on-prem wait of a job behind ``work_ahead_gpu_s``
    of queued work: none when it fits and nothing is ahead; otherwise the time the pool's
    capacity takes to drain the work ahead (the running work is not counted)."""
    if capacity_gpus <= 0:
        return math.inf
    if work_ahead_gpu_s <= 0 and gpus <= free_gpus:
        return 0.0
    return max(0.0, work_ahead_gpu_s) / capacity_gpus


def typical_runtime_s(queued: list[int], running: list[int]) -> int:
    """The median runtime of the jobs as submitted: the queued jobs' runtimes (each counted
    once) and the running jobs' (together counted as many times as there are of them, each in
    inverse proportion to its runtime, undoing the length bias of a sample of running jobs).
    The lower median, as a plain median of equal weights; 0 when no runtime is reported."""
    queued.sort()
    if not running:
        return queued[(len(queued) - 1) // 2] if queued else 0
    running.sort()
    inv = math.fsum(1.0 / r for r in running)
    scale = len(running) / inv  # running job of runtime r weighs scale / r
    half = (len(queued) + len(running)) / 2.0
    acc, qi, ri = 0.0, 0, 0
    while True:  # merge the two sorted lists until half the weight is passed
        if ri < len(running) and (qi >= len(queued) or running[ri] <= queued[qi]):
            value = running[ri]
            acc += scale / value
            ri += 1
        else:
            value = queued[qi]
            acc += 1.0
            qi += 1
        if acc >= half * (1 - 1e-12) or (qi >= len(queued) and ri >= len(running)):
            return value


def forecast(queue: Sequence[tuple[int, int]], running: Sequence[tuple[int, int, int]],
             free_gpus: int, capacity_gpus: int) -> list[float]:
    """Remaining on-prem wait (s) of each queued job.

    ``queue``: (GPUs, runtime s; 0 unknown) in service order. ``running``: (GPUs, seconds run
    so far, runtime s; 0 unknown) of the jobs on the pool now. ``free_gpus`` of the pool's
    ``capacity_gpus`` are free now. A job bigger than the pool never starts (inf). One pass
    per distinct job size, each O(n log n).
    """
    allocated = capacity_gpus - free_gpus
    if allocated > 0 and not any(r[2] > 0 for r in running):
        return _fluid(queue, free_gpus, capacity_gpus)
    typical = typical_runtime_s([r for _, r in queue if r > 0], [r for _, _, r in running if r > 0])
    ends: list[tuple[int, int]] = []
    for gpus, ran, runtime in running:
        if gpus > 0:
            left = runtime - ran if runtime > 0 else max(ran, typical - ran)
            ends.append((max(0, left), gpus))
    heapq.heapify(ends)
    out = [0.0] * len(queue)
    last = {g: k for k, (g, _) in enumerate(queue)}  # no job after a size's last one matters to it
    for size in sorted(last):
        idx = [k for k, (g, _) in enumerate(queue[:last[size] + 1]) if g <= size]
        for k, w in zip(idx, _play(queue, idx, ends, free_gpus, capacity_gpus, typical)):
            if queue[k][0] == size:
                out[k] = w
    return out


def _play(queue: Sequence[tuple[int, int]], idx: Sequence[int], ends0: list[tuple[int, int]],
          free_gpus: int, capacity_gpus: int, typical: int) -> list[float]:
    """The queued jobs ``idx`` (in order) played forward from the running jobs' ``ends0``."""
    ends: list[tuple[int, int]] = list(ends0)
    pop, push, fluid = heapq.heappop, heapq.heappush, fluid_wait_s
    free, clock, ahead = free_gpus, 0, 0.0
    out: list[float] = []
    append = out.append
    for k in idx:
        gpus, runtime = queue[k]
        if gpus > capacity_gpus:
            append(math.inf)
            continue
        while free < gpus and ends:
            at, g = pop(ends)
            if at > clock:
                clock = at
            free += g
        run = runtime if runtime > 0 else typical
        if free < gpus:  # GPUs held by work nobody reported: the queue-ahead estimate
            append(max(clock, fluid(gpus, ahead, free_gpus, capacity_gpus)))
        else:
            append(clock)
            free -= gpus
            push(ends, (clock + run, gpus))
        ahead += gpus * run
    return out


def _fluid(queue: Sequence[tuple[int, int]], free_gpus: int, capacity_gpus: int) -> list[float]:
    out, ahead = [], 0.0
    for gpus, runtime in queue:
        if gpus > capacity_gpus:  # never starts on-prem: no work ahead of the jobs behind it
            out.append(math.inf)
            continue
        out.append(fluid_wait_s(gpus, ahead, free_gpus, capacity_gpus))
        ahead += gpus * max(0, runtime)
    return out


def snapshot_waits(snap: QueueSnapshot, jobs: Sequence[PendingJob]) -> list[float]:
    """:func:`forecast` for ``jobs`` (pending, in service order) on ``snap``'s on-prem pool;
    running jobs on cloud nodes do not free on-prem GPUs and are left out."""
    total = snap.gpus_total
    cloud = {n.name for n in snap.nodes if n.state == "cloud"}
    running = [(r.gpus, r.runtime_s, r.est_runtime_s or r.time_limit_s) for r in snap.running
               if r.gpus > 0 and not (r.nodes and cloud.issuperset(r.nodes))]
    return forecast([(j.gpus, j.runtime_s) for j in jobs], running,
                    total - snap.gpus_allocated, total)
