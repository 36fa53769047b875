"""The wait predictor against the replay's own scheduler, job by job, for the jobs the broker sends.

For every job the broker policy sends to the cloud: what it paid, the remaining on-prem wait
:func:`policies.waits.forecast` predicted at the tick it went, and the wait the replay's own
scheduler would have given it: the on-prem cluster copied at that tick and played forward to
the job's start, with no new arrivals and without the other jobs sent in the same tick (they
leave). Printed: the largest bills, the share of the bill for jobs whose wait so played forward
passes their class target (the wait rule sends them rightly), and the bursts predicted more than
twice their played-forward wait + 10 min.

Run: .venv/bin/python benchmarks/wait_forecast.py [--workload mixed] [--seed 1] [--jobs 600] [--top 8]
"""
from __future__ import annotations

import argparse
import copy
import heapq
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import broker.simulate.replay as rp  # noqa: E402
from broker.simulate.model import CLOUD, PENDING, builtin_policies  # noqa: E402
from broker.simulate.onprem import Cluster  # noqa: E402
from broker.simulate.workloads import PROFILES, generate  # noqa: E402
from policies.classes import wait_target_s  # noqa: E402
from providers.catalog import bundled  # noqa: E402
from workloads import observed_lifetimes, sim_config  # noqa: E402

LEFT = 99  # a job taken off the copied queue


def copy_cluster(cl: Cluster) -> Cluster:
    """A copy of the on-prem cluster that shares the job table and schedules no replay events."""
    c = copy.deepcopy(cl, {id(cl.jobs): cl.jobs, id(cl.push): None})
    c.push = lambda *_: None
    return c


def played_forward(cl: Cluster, t: float, job: int, leaving: list[int]) -> float:
    """Seconds from ``t`` until ``job`` starts on a copy of ``cl`` played forward (inf: never)."""
    c = copy_cluster(cl)
    ends: list[tuple[float, int]] = [(c.start[i] + c.dur[i], i) for i in c.running]
    c.push = lambda at, _kind, i: heapq.heappush(ends, (at, i))
    heapq.heapify(ends)
    for i in leaving:
        if i != job and c.state[i] == PENDING:
            c.dequeue(i)
            c.state[i] = LEFT
    c.resv = None
    c.schedule(t)
    while c.state[job] == PENDING and ends:
        at, i = heapq.heappop(ends)
        c.end(i, at)
    return math.inf if c.state[job] == PENDING else c.start[job] - t


class Watched(rp.Replay):
    """The broker's replay, recording what each burst job cost and the queue at the tick it went."""

    def __init__(self, *a: object) -> None:
        super().__init__(*a)
        self.bill: dict[int, int] = {}
        self.went: dict[int, tuple[float, Cluster, list[int]]] = {}
        cloud = self.cloud
        burst, end = cloud.burst, cloud.end

        def billed(fn, job_of):  # type: ignore[no-untyped-def]
            def call(x, t):  # type: ignore[no-untyped-def]
                before = cloud.cost
                out = fn(x, t)
                i = job_of(x)
                self.bill[i] = self.bill.get(i, 0) + cloud.cost - before
                return out
            return call
        cloud.burst = billed(burst, lambda i: i)
        cloud.end = billed(end, lambda a: a.job)

    def tick(self, t: float) -> None:
        before = copy_cluster(self.onprem)
        queued = list(self.onprem.fifo_iter())
        super().tick(t)
        gone = [i for i in queued if self.state[i] == CLOUD]
        for i in gone:
            self.went[i] = (t, before, gone)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=PROFILES, default="mixed")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    a = ap.parse_args()
    w = generate(a.workload, a.seed, a.jobs)
    pol = builtin_policies()["broker"]
    r = Watched(w.jobs, bundled(), pol, sim_config(w, a.seed), observed_lifetimes(a.data), None)
    res = r.run()
    total = res.cloud_cost_micros or 1
    rows = []
    for i, micros in sorted(r.bill.items(), key=lambda kv: -kv[1]):
        if i not in r.went:
            continue
        t, cl, gone = r.went[i]
        j = r.jobs[i]
        waited = t - j.submit_s
        target = wait_target_s(j.duration_s if j.runtime_known else 0.0, 0.0, r.cls[i], pol.trigger.wait_runtime_ratio)
        rows.append((micros, j, r.cls[i].name, waited, r.pred[i] - waited, played_forward(cl, t, i, gone), target))
    print(f"{a.workload} seed {a.seed}: the broker sends {res.jobs_burst} jobs for ${total / 1e6:,.0f}")
    for micros, j, cls, waited, pred, fwd, target in rows[:a.top]:
        print(f"  {j.job_id:>6} {j.gpus} GPUs {j.duration_s / 3600:5.1f} h {cls:<17} {micros / total:6.1%} of the bill; waited {waited / 60:.0f} min, predicted {pred / 60:.0f} min more, "
              f"played forward {fwd / 60:.0f} min; target {target / 60:.0f} min")
    due = sum(m for m, _, _, waited, _, fwd, target in rows if waited + fwd > target)
    over = [m for m, _, _, _, pred, fwd, _ in rows if pred > 2 * fwd + 600]
    print(f"  {due / total:.1%} of the bill is for jobs whose played-forward wait passes their class target; "
          f"{len(over)} of {len(rows)} bursts ({sum(over) / total:.1%} of the bill) were predicted more than twice "
          "their played-forward wait + 10 min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
