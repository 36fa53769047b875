"""The replay's work grows with its jobs, not faster, wherever the trace's clock starts, and
the jobs it replays are held as columns (operations counted, never timed)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from broker.simulate import SimConfig
from broker.simulate.model import builtin_policies
from broker.simulate.replay import Replay
from broker.simulate.table import JobTable
from broker.simulate.workloads import generate
from providers.catalog import bundled

CAT = bundled()
DAY = 86_400.0
# Whole ticks past 2**23 s (97 days), where adding a nanosecond no longer changes a double.
FAR = 500_000 * 60.0


class Bounded(Replay):
    """A replay that stops with an error once its ticks pass ``limit`` instead of spinning."""

    limit = 10**9

    def tick(self, t: float) -> None:
        if self.ticks > self.limit:
            raise RuntimeError(f"{self.ticks} ticks, past the bound {self.limit}, at t={t}")
        super().tick(t)


def replay(jobs, w, limit: int = 10**9) -> tuple[Bounded, dict]:
    cfg = SimConfig(onprem_gpus=w.onprem_gpus, gpus_per_node=w.gpus_per_node, default_gpu_model="A100")
    r = Bounded(jobs, CAT, builtin_policies()["broker"], cfg, None, None)
    r.limit = limit
    d = r.run().to_dict()
    return r, {k: v for k, v in d.items() if not k.startswith("replay_jobs_per")}


def whole(jobs):
    """Whole-second times: the same sums at any clock origin."""
    return [replace(j, submit_s=float(round(j.submit_s)), duration_s=float(round(j.duration_s))) for j in jobs]


def tiled(jobs, copies: int, span: float):
    return [replace(j, job_id=f"{c}-{j.job_id}", submit_s=j.submit_s + c * span)
            for c in range(copies) for j in jobs]


def test_a_trace_whose_clock_starts_late_replays_as_one_that_starts_at_zero():
    w = generate("bursty", 0, 300)
    jobs = whole(w.jobs)
    near, a = replay(jobs, w)
    assert near.ticks > 50 and a["jobs_burst"] > 0  # the trigger had work to do
    far, b = replay([replace(j, submit_s=j.submit_s + FAR) for j in jobs], w, limit=2 * near.ticks)
    assert far.ticks == near.ticks and far.seq == near.seq
    assert b == a


def test_the_replays_work_grows_with_its_jobs():
    w = generate("bursty", 0, 200, days=7.0)
    jobs = whole(w.jobs)
    one, _ = replay(tiled(jobs, 1, 8 * DAY), w)
    copies = 16  # 128 days: past 2**23 s
    many, r = replay(tiled(jobs, copies, 8 * DAY), w, limit=2 * copies * one.ticks)
    assert r["jobs"] == copies * len(jobs) and r["unserved_jobs"] == 0
    assert many.ticks <= 1.2 * copies * one.ticks
    assert many.seq <= 1.2 * copies * one.seq  # events pushed


@pytest.mark.parametrize("n", [1, 5])
def test_a_table_gives_back_the_jobs_it_was_given(n):
    jobs = generate("mixed", 1, 50).jobs[:n] * 1
    t = JobTable.of(jobs)
    assert list(t) == jobs and t == jobs and len(t) == n and t[-1] == jobs[-1] and t[0:2] == jobs[0:2]
    assert JobTable.of(t) is t
