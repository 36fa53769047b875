"""The replay: one event loop per policy over one trace, with the autoscaler's trigger.

Every ``tick_s`` while anything is pending the autoscaler predicts every pending job's wait
with the service's predictor (:func:`policies.waits.forecast`: the running jobs' ends, the
queue's runtimes), then calls :func:`policies.triggers.evaluate` with the queue's signals, the
jobs overdue by the wait rule (waited or predicted past their target) and, for the threshold
trigger, the jobs it would send first; a decision's ``wake_at`` adds a tick. Waits are submit to first start, on-prem or in the cloud. Money is integer micro-dollars.

The verdict is :func:`policies.triggers.allocation_verdict` (the allocation alone); under
*mixed* the replay does what the service does with the diagnosis' capacity jobs: the oldest
pending jobs the free GPUs could hold by count wait on scheduling (fragmentation, a drain for a
whole-node job), so they neither count as pending nor go until they have waited past their
class target (schedule first holds a job no longer, as the service's trigger), and the rest are the capacity jobs
(``tests/test_workloads.py`` hands the replay's queue to the service's path at every tick and
gets the same decisions). The threshold trigger's pool is ranked as
:func:`policies.selection.rank_key` ranks, job kind included.
"""
from __future__ import annotations

import heapq
import math
import time
from array import array
from dataclasses import replace
from typing import Callable, Iterable, Sequence

from policies.causes import Verdict
from policies.classes import JobClass, classify, wait_target_s
from policies.queue import PendingJob
from policies.selection import KIND_RANK, Candidate
from policies.triggers import BURST, Signals, TriggerState, allocation_verdict, evaluate
from providers.base import MICROS
from providers.catalog import Catalog

from broker.simulate.cloud import Cloud
from broker.simulate.model import (
    DONE, E_ARRIVE, E_CHECK, E_CLOUD_END, E_ONPREM_END, E_TICK, NEVER, NEW, PENDING, Policy, PolicyResult,
    SimConfig, builtin_policies,
)
from broker.simulate.onprem import Cluster
from broker.simulate.lifetimes import Lifetimes
from broker.simulate.table import JobTable, TraceJob


def simulate(
    jobs: Sequence[TraceJob],
    catalog: Catalog,
    policy: Policy,
    cfg: SimConfig,
    lifetimes: Lifetimes | None = None,
    progress: Callable[[int], None] | None = None,
) -> PolicyResult:
    """Replay ``jobs`` under ``policy``; see the package docstring for the model."""
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    res = Replay(jobs, catalog, policy, cfg, lifetimes, progress).run()
    res.wall_s = time.perf_counter() - t_wall
    res.cpu_s = time.process_time() - t_cpu
    return res


def run_policies(
    jobs: Sequence[TraceJob],
    catalog: Catalog,
    names: Iterable[str],
    cfg: SimConfig,
    lifetimes: Lifetimes | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, PolicyResult]:
    pols = builtin_policies()
    out: dict[str, PolicyResult] = {}
    for name in names:
        if name not in pols:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(pols)}")
        cb = (lambda k, _n=name: progress(_n, k)) if progress else None
        out[name] = simulate(jobs, catalog, pols[name], cfg, lifetimes, cb)
    return out


class JobClasses:
    """Each job's class from its trace label (one :func:`classify` per distinct label), by the
    table's label codes: ``cls[i]`` is job i's class, with no list of n references."""

    def __init__(self, jobs: JobTable, classes: Sequence[JobClass]):
        self.codes = jobs.job_class
        self.by_code = [classify(classes, s) for s in jobs.strings]

    def __getitem__(self, i: int) -> JobClass:
        return self.by_code[self.codes[i]]


class Replay:
    def __init__(self, jobs, catalog, policy, cfg, lifetimes, progress):
        jobs = JobTable.of(jobs)
        self.cls = cls = JobClasses(jobs, policy.trigger.classes)
        # A class kept off spot makes its jobs non-interruptible for every policy.
        off = [c.spot is False for c in cls.by_code]
        if any(off):
            codes = jobs.job_class
            jobs = jobs.with_interruptible(array("b", (0 if off[codes[i]] else v
                                                       for i, v in enumerate(jobs.interruptible))))
        self.jobs = jobs
        self.n = n = len(self.jobs)
        self.policy = policy
        self.cfg = cfg
        self.progress = progress
        self.events: list = []
        self.seq = 0
        self.state = array("b", [NEW]) * n  # one byte per job
        self.wait = array("d", bytes(8 * n))
        self.pred = array("d", bytes(8 * n))
        self.onprem = Cluster(self.jobs, cfg, self.state, self.wait, self.push)
        self.cloud = Cloud(self.jobs, catalog, policy, cfg, lifetimes, self.state, self.wait, self.push) \
            if policy.market != "none" else None
        self.burst_enabled = self.cloud is not None and (
            policy.trigger.threshold_trigger or policy.trigger.wait_trigger)
        # trigger
        self.tstate = TriggerState()
        self.next_tick: float | None = None
        self.overdue: list[int] = []
        self.no_offer: set[int] = set()
        self.held = bytearray(n)  # overdue and held by schedule first at some tick
        self.pool: list = []  # ranked heap of eligible pending jobs
        self.in_pool = array("b", bytes(n))
        self.ratio = policy.trigger.wait_runtime_ratio
        self.watch: dict[int, tuple[float, float]] = {}  # pending job: (wait target, pool bar)
        # series
        self.series = {"t_h": [], "pending_jobs": [], "pending_gpus": [], "cloud_gpus_spot": [],
                       "cloud_gpus_on_demand": [], "cloud_cost_usd": []}
        self.next_sample = 0.0
        self.last_time = 0.0
        self.ticks = 0  # trigger ticks handled (a replay's work grows with them)
        self.t0 = 0.0

    # -- events ---------------------------------------------------------------------------

    def push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def run(self) -> PolicyResult:
        sub, n, ev = self.jobs.submit, self.n, self.events
        self.next_sample = self.t0 = sub[0] if n else 0.0
        ai = 0  # arrivals are merged from the sorted list instead of all sitting in the heap
        prog_every = max(1000, n // 200)
        handled = 0
        while ai < n or ev:
            if ai < n and (not ev or sub[ai] < ev[0][0] or
                           (sub[ai] == ev[0][0] and ev[0][1] > E_ARRIVE)):
                t = sub[ai]
                kind, payload = E_ARRIVE, ai
                ai += 1
            else:
                t, kind, _, payload = heapq.heappop(ev)
                if kind == E_CHECK and self.state[payload if payload >= 0 else -1 - payload] != PENDING:
                    continue  # stale: the job started or left
            if t >= self.next_sample:
                self.sample(t)
            self.last_time = t
            if kind == E_ARRIVE:
                self.arrive(payload, t)
                handled += 1
                if self.progress and handled % prog_every == 0:
                    self.progress(handled)
            else:
                self.handle(kind, payload, t)
        if self.progress:
            self.progress(n)
        self.sample(self.last_time, force=True)
        return self.result()

    def handle(self, kind: int, payload, t: float) -> None:
        if kind == E_ONPREM_END:
            self.onprem.end(payload, t)
        elif kind == E_CLOUD_END:
            self.cloud.end(payload, t)
        elif kind == E_CHECK:
            if payload < 0:  # reached the minimum wait share: eligible for the pool
                i = -1 - payload
                if self.state[i] == PENDING:
                    self.add_pool(i)
                    if self.onprem.pending_gpus > self.policy.trigger.pending_gpus_threshold:
                        self.want_tick(t)
            elif self.state[payload] == PENDING:
                self.overdue.append(payload)
                self.want_tick(t)
        else:
            self.ticks += 1
            if payload == "tick":
                if self.next_tick is not None and t < self.next_tick:
                    return  # superseded
                self.next_tick = None
            self.tick(t)

    def result(self) -> PolicyResult:
        n, st, cl, c = self.n, self.state, self.onprem, self.cloud
        span = max(1.0, self.last_time - self.t0)
        # One pass; waits as doubles, not a float object each.
        waits = array("d")
        by_class: dict[str, array] = {}
        past: dict[str, tuple[float, int, int, int]] = {}
        wait, held, no_offer, cls = self.wait, self.held, self.no_offer, self.cls
        for i in range(n):
            if st[i] != DONE:
                continue
            w = wait[i]
            if w < 0:
                continue
            waits.append(w)
            jc = cls[i]
            by_class.setdefault(jc.name, array("d")).append(w)
            t, k, h, o = past.get(jc.name, (jc.max_wait_s, 0, 0, 0))
            if w > jc.max_wait_s:
                k, h, o = k + 1, h + held[i], o + (i in no_offer)
            past[jc.name] = (t, k, h, o)
        unserved = sum(1 for i in range(n) if st[i] in (PENDING, NEW, NEVER))
        return PolicyResult(
            name=self.policy.name, jobs=n, jobs_burst=c.jobs_burst if c else 0,
            cloud_cost_micros=c.cost if c else 0, lower_bound_micros=c.lower_bound if c else 0,
            hindsight_micros=c.hindsight if c else 0, deadline_misses=c.deadline_misses if c else 0,
            cost_by_market=c.cost_by_market if c else {}, cost_by_provider=c.cost_by_provider if c else {},
            cloud_gpu_hours=c.gpu_s / 3600.0 if c else 0.0, interruptions=c.interruptions if c else 0,
            onprem_utilization=cl.busy_gpu_s / (cl.N * span) if cl.N else 0.0,
            waits=waits, class_waits=dict[str, Sequence[float]](by_class), class_past_target=past, series=self.series, unserved=unserved, never_runnable=st.count(NEVER),
        )

    def sample(self, t: float, force: bool = False) -> None:
        s, cl, c = self.series, self.onprem, self.cloud
        cost = c.cost if c else 0
        by_market = c.gpus_by_market if c else {"spot": 0, "on_demand": 0, "reserved": 0}
        while self.next_sample <= t or force:
            s["t_h"].append((min(self.next_sample, t) - self.t0) / 3600.0 if not force else (t - self.t0) / 3600.0)
            s["pending_jobs"].append(cl.pending_jobs)
            s["pending_gpus"].append(cl.pending_gpus)
            s["cloud_gpus_spot"].append(by_market["spot"])
            s["cloud_gpus_on_demand"].append(by_market["on_demand"] + by_market["reserved"])
            s["cloud_cost_usd"].append(cost / MICROS)
            if force:
                break
            self.next_sample += self.cfg.sample_s

    # -- arrivals -----------------------------------------------------------------------------

    def arrive(self, i: int, t: float) -> None:
        jobs = self.jobs
        gpus = jobs.gpus[i]
        cl = self.onprem
        if gpus > cl.N:
            # No on-prem node set can ever hold it: waiting cannot help, so it goes to the cloud
            # as it arrives, or it never runs.
            if self.cloud is None or not self.cloud.burst(i, t):
                self.state[i] = NEVER
            return
        cl.enqueue(i)
        if cl.free_total >= gpus:
            cl.schedule(t)
        if self.state[i] != PENDING or not self.burst_enabled:
            return
        tc = self.policy.trigger
        cls = self.cls[i]
        if tc.order == "ranked" and cls.burst:
            # Eligible by wait now or later: add it to the pool when its (predicted) wait reaches
            # the minimum share, and to the overdue list when it reaches its wait target
            # (policies.classes.wait_target_s, as the trigger's).
            run = jobs.duration[i] if jobs.runtime_known[i] else 0.0
            ch = self.cloud.chooser.for_job(i)
            min_run = tc.selection.min_runtime_startups * ch.startup_s
            # A job shorter than a start-up may go only past its class's target
            # (policies.selection.eligibility): no runtime to go by, as a job with none.
            short = 0 < run < min_run
            if (not short or math.isfinite(cls.max_wait_s)) and gpus <= tc.max_gpus_in_flight:
                # The wait so far reaching either; the predicted wait is checked on every tick
                # (predict_all).
                target = wait_target_s(0.0 if short else run, 0.0, cls, self.ratio)
                if math.isfinite(target):
                    self.push(t + target + 1e-6, E_CHECK, i)
                bar = math.inf
                if tc.threshold_trigger:
                    share = tc.selection.min_wait_share * ch.price_ratio
                    bar = min(share * run, cls.max_wait_s) if run > 0 and not short else cls.max_wait_s
                    if math.isfinite(bar):
                        self.push(t + bar, E_CHECK, -1 - i)
                if self.policy.predict:
                    self.watch[i] = (target, bar)
        self.want_tick(t)

    def add_pool(self, i: int) -> None:
        if self.in_pool[i]:
            return
        j = self.jobs[i]
        self.in_pool[i] = True
        run = j.duration_s if j.runtime_known else math.inf  # as policies.selection.rank_key
        heapq.heappush(self.pool, ((-self.cls[i].priority, 0 if j.interruptible else 1, KIND_RANK.get(j.kind, 3),
                                    run, j.data_gb, j.submit_s), i))

    # -- the trigger --------------------------------------------------------------------------

    def want_tick(self, t: float, after: bool = False) -> None:
        """Ask for a trigger tick at the first tick boundary at or (``after``) past ``t``."""
        if not self.burst_enabled:
            return
        tick = self.cfg.tick_s
        nt = math.ceil(t / tick) * tick
        if after and nt <= t:
            # Strictly later, computed, not by adding an epsilon: past 2**23 s (97 days) a
            # nanosecond no longer changes a double, and the tick would repeat at the same t.
            nt += tick
        if self.next_tick is None or nt < self.next_tick:
            self.next_tick = nt
            self.push(nt, E_TICK, "tick")

    def candidate(self, i: int, t: float) -> Candidate:
        j = self.jobs[i]
        ch = self.cloud.chooser.for_job(i)
        run = int(math.ceil(j.duration_s)) if j.runtime_known else 0
        return Candidate(PendingJob(job_id=j.job_id, gpus=j.gpus, est_runtime_s=run,
                                    waited_s=int(t - j.submit_s), interruptible=j.interruptible,
                                    data_gb=j.data_gb, kind=j.kind, queue=j.queue, job_class=j.job_class),
                         self.pred[i], ch.price_ratio, ch.startup_s, self.cls[i])

    def threshold_jobs(self, want: int, skip: set[int], popped: list) -> list[int]:
        """Up to ``want`` GPUs of pending jobs the threshold trigger would send first (FIFO, or
        the ranked pool; items taken off the pool are appended to ``popped``)."""
        out: list[int] = []
        gpus, no_offer = self.jobs.gpus, self.no_offer
        if self.policy.trigger.order == "fifo":
            for i in self.onprem.fifo_iter():
                if want <= 0:
                    break
                if i in skip or i in no_offer:
                    continue
                skip.add(i)
                out.append(i)
                want -= gpus[i]
            return out
        pool, state = self.pool, self.state
        while pool and want > 0:
            item = heapq.heappop(pool)
            i = item[1]
            if state[i] != PENDING:
                self.in_pool[i] = False
                continue
            popped.append(item)
            if i in skip or i in no_offer:
                continue
            skip.add(i)
            out.append(i)
            want -= gpus[i]
        return out

    def predict_all(self, t: float) -> None:
        """Predict every pending job's wait (:func:`policies.waits.forecast`, as the service
        does on every snapshot); a watched job predicted past its pool bar joins the pool, past
        its wait target the overdue list."""
        order = list(self.onprem.fifo_iter())
        sub, pred, watch = self.jobs.submit, self.pred, self.watch
        for i, left in zip(order, self.onprem.waits(t, order)):
            p = pred[i] = int(t - sub[i]) + left
            w = watch.get(i)
            if w is not None:
                if p > w[0]:
                    self.overdue.append(i)
                if p >= w[1]:
                    self.add_pool(i)
        for i in [i for i in watch if self.state[i] != PENDING]:
            del watch[i]

    def tick(self, t: float) -> None:
        pol, cl, state = self.policy, self.onprem, self.state
        tc = pol.trigger
        if pol.predict:
            self.predict_all(t)
        sig = Signals(cl.pending_gpus, cl.N, cl.N - cl.free_total, self.cloud.gpus)
        verdict = allocation_verdict(sig) if pol.gate else "resource-bound"
        # Under mixed, as the diagnosis: the oldest jobs the free GPUs could hold by count wait
        # on scheduling, not capacity; they neither count as pending nor go.
        sched = self.scheduling_jobs() if verdict == Verdict.MIXED else set()
        full = sig
        if sched:
            sig = replace(sig, pending_gpus=sig.pending_gpus - sum(self.jobs.gpus[i] for i in sched))
        # Overdue jobs (wait rule), oldest first, then what the threshold trigger would send.
        od = [i for i in dict.fromkeys(self.overdue) if state[i] == PENDING and i not in self.no_offer]
        self.overdue = []
        held_all = verdict == Verdict.SCHEDULING_BOUND and not tc.burst_overdue_when_scheduling_bound
        # Schedule first holds a job only up to its class target (policies.triggers.evaluate).
        past = {i for i in od if (held_all or i in sched) and self.past_class_target(i, t)}
        for i in od:
            if (held_all or i in sched) and i not in past:
                self.held[i] = True
        chosen = [i for i in od if i not in sched or i in past]
        popped: list = []
        excess = sig.pending_gpus - tc.pending_gpus_threshold
        if tc.threshold_trigger and excess > 0:
            chosen += self.threshold_jobs(excess, set(od) | sched, popped)
        # Under mixed, once a scheduling job is past its class target, every scheduling job is a
        # candidate too, as the service's are: evaluate counts the pending GPUs without them and
        # sends those past their target (before that, the same decision without building them).
        release = any(self.past_class_target(i, t) for i in sched)
        offered = chosen + [i for i in sched if i not in past] if release else chosen
        cands = [self.candidate(i, t) for i in offered]
        idx = {c.job.job_id: i for c, i in zip(cands, offered)}
        cands.sort(key=lambda c: -c.job.waited_s)
        capacity = {c.job.job_id for c in cands if idx[c.job.job_id] not in sched} if release else None
        decision, self.tstate = evaluate(tc, self.tstate, t, full if release else sig, cands, verdict,
                                         capacity_jobs=capacity)
        for item in popped:
            if state[item[1]] == PENDING:
                heapq.heappush(self.pool, item)
        if decision.action == BURST:
            for c in decision.jobs:
                self.burst(idx[c.job.job_id], t)
        # Unchosen overdue jobs stay overdue.
        self.overdue.extend(i for i in od if state[i] == PENDING)
        if decision.wake_at is not None and decision.wake_at > t:
            self.push(decision.wake_at, E_TICK, "wake")
        if cl.pending_jobs and (cl.pending_gpus > tc.pending_gpus_threshold or self.overdue or self.watch):
            self.want_tick(t, after=True)

    def past_class_target(self, i: int, t: float) -> bool:
        """Whether pending job i has waited past its class's target
        (:func:`policies.triggers.past_class_target`, on the candidate's own figures)."""
        return int(t - self.jobs.submit[i]) > self.cls[i].max_wait_s

    def scheduling_jobs(self) -> set[int]:
        """The pending jobs, oldest first, that the free GPUs could hold by count (each claims
        its GPUs from a running tally, as :func:`policies.diagnose.diagnose` does)."""
        left = self.onprem.free_total
        out: set[int] = set()
        if left <= 0:
            return out
        for i in self.onprem.fifo_iter():
            g = self.jobs.gpus[i]
            if g <= left:
                out.add(i)
                left -= g
                if left <= 0:
                    break
        return out

    def burst(self, i: int, t: float) -> None:
        if self.cloud.burst(i, t):
            self.onprem.dequeue(i)
        else:
            self.no_offer.add(i)  # no cloud offering can hold it: it stays in the queue
