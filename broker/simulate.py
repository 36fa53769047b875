"""Trace replay: the same trigger, selection, cost and spot code as the live broker, on a trace.

One event-driven replay per policy over one job trace:

- on-prem: ``onprem_gpus`` GPUs in nodes of ``gpus_per_node``; FIFO with EASY backfill on whole
  GPUs. A job of up to one node's GPUs takes them on one node (best fit); a bigger job takes
  whole nodes. When the head of the queue does not fit it gets a reservation (the earliest time
  enough GPUs free up, from the running jobs' ends) and later jobs may start only where they do
  not delay it. Backfill looks at most ``BACKFILL_DEPTH`` jobs of each size per pass, like
  Slurm's ``bf_max_job_test``. Runtimes are known exactly (the trace's), as in most replays.
- the autoscaler: every ``tick_s`` while anything is pending it calls
  :func:`policies.triggers.evaluate` with the queue's signals, the jobs overdue by the wait rule
  and, for the threshold trigger, the jobs it would send first; a decision's ``wake_at`` adds a
  tick.
- the cloud: each burst job gets its own nodes of the offering the policy picks from the catalog
  (priced by :func:`policies.cost.price`), after the provider's ``startup_s``, billed from launch
  to teardown at job end. Spot nodes are preempted after a lifetime drawn from real observed
  lifetimes (per cloud) or, without them, from the catalog's interruption rate; a preempted job
  resumes from its last checkpoint and the rework is billed.

Waits are submit to first start, on-prem or in the cloud. Money is integer micro-dollars.
Per-job randomness (interruptible flag, lifetimes) is a seeded hash of the job id, so every
policy meets the same luck.
"""
from __future__ import annotations

import bisect
import csv
import hashlib
import heapq
import math
import struct
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from policies.cost import Context, Exclusion, PricedOffer, price
from policies.demand import Demand
from policies.queue import PendingJob
from policies.selection import Candidate
from policies import spot as spot_rule
from policies.triggers import (
    BURST, Signals, TriggerConfig, TriggerState, allocation_verdict, evaluate,
)
from providers.base import MICROS, Market, Offering
from providers.catalog import Catalog

BACKFILL_DEPTH = 64
RATE_WINDOW_S = 3600.0  # how far back the wait predictor looks at the release rate
BILLING_MINIMUM_S = 60.0
KINDS = ("training", "tuning", "eval", "inference")


class TraceError(ValueError):
    """A trace or lifetimes file is unusable; the message names the file and line."""


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    queue: str = ""
    interruptible: bool = False
    gpu_model: str = ""
    data_gb: float = 0.0
    kind: str = "training"
    checkpoint_minutes: int = 0


def hash_unit(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): the same job draws the same in every policy."""
    h = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return struct.unpack("<Q", h)[0] / 2.0**64


_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}
_ALIASES = {
    "queue": ("queue", "vc", "partition"),
    "gpu_model": ("gpu_model", "gpu", "gpu_type"),
    "data_gb": ("data_gb", "data_in_gb", "dataset_gb"),
}


def load_trace(
    path: Path | str,
    interruptible_share: float = 0.5,
    seed: int = 0,
    default_gpu_model: str = "",
) -> list[TraceJob]:
    """Read a trace CSV: ``job_id, submit_time_s, num_gpus, duration_s`` plus optional
    ``queue``/``vc``, ``interruptible``, ``gpu_model``/``gpu``, ``data_gb``, ``kind``,
    ``checkpoint_minutes``. Without an ``interruptible`` column, ``interruptible_share`` of
    the jobs are marked interruptible by a seeded hash of the job id. Rows come back sorted by
    submit time; any bad row raises :class:`TraceError` naming its line."""
    p = Path(path)
    if not 0.0 <= interruptible_share <= 1.0:
        raise TraceError(f"interruptible share must be between 0 and 1, got {interruptible_share}")
    try:
        f = p.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    jobs: list[TraceJob] = []
    with f:
        reader = csv.reader(f)
        try:
            header = [h.strip().lower() for h in next(reader)]
        except StopIteration:
            raise TraceError(f"{p.name} is empty") from None
        col = {h: i for i, h in enumerate(header)}
        missing = [c for c in ("job_id", "submit_time_s", "num_gpus", "duration_s") if c not in col]
        if missing:
            raise TraceError(f"{p.name} line 1 lacks column(s) {', '.join(missing)}")

        def opt(name: str) -> int | None:
            for a in _ALIASES.get(name, (name,)):
                if a in col:
                    return col[a]
            return None

        ci, cs, cg, cd = col["job_id"], col["submit_time_s"], col["num_gpus"], col["duration_s"]
        cq, cint, cm, cdata = opt("queue"), opt("interruptible"), opt("gpu_model"), opt("data_gb")
        ck, cc = opt("kind"), opt("checkpoint_minutes")
        width = len(header)
        seen: set[str] = set()
        for line, row in enumerate(reader, start=2):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise TraceError(f"{p.name} line {line}: {len(row)} fields, the header has {width}")
            jid = row[ci].strip()
            if not jid:
                raise TraceError(f"{p.name} line {line}: job_id is empty")
            if jid in seen:
                raise TraceError(f"{p.name} line {line}: job_id {jid} appears twice")
            seen.add(jid)
            try:
                submit = float(row[cs])
                gpus_f = float(row[cg])
                dur = float(row[cd])
            except ValueError:
                raise TraceError(f"{p.name} line {line}: submit_time_s, num_gpus and duration_s "
                                 f"must be numbers, got {row[cs]!r}, {row[cg]!r}, {row[cd]!r}") from None
            if not (math.isfinite(submit) and submit >= 0):
                raise TraceError(f"{p.name} line {line}: submit_time_s must be zero or positive, got {row[cs]}")
            if not (gpus_f >= 1 and gpus_f == int(gpus_f)):
                raise TraceError(f"{p.name} line {line}: num_gpus must be a whole number of at least 1, got {row[cg]}")
            if not (math.isfinite(dur) and dur >= 0):
                raise TraceError(f"{p.name} line {line}: duration_s must be zero or positive, got {row[cd]}")
            if cint is not None:
                v = row[cint].strip().lower()
                if v in _TRUE:
                    intr = True
                elif v in _FALSE:
                    intr = False
                else:
                    raise TraceError(f"{p.name} line {line}: interruptible must be true or false, got {row[cint]!r}")
            else:
                intr = hash_unit(seed, jid) < interruptible_share
            data = 0.0
            if cdata is not None and row[cdata].strip():
                try:
                    data = float(row[cdata])
                except ValueError:
                    data = -1.0
                if not (math.isfinite(data) and data >= 0):
                    raise TraceError(f"{p.name} line {line}: data_gb must be zero or positive, got {row[cdata]!r}")
            kind = "training"
            if ck is not None and row[ck].strip():
                kind = row[ck].strip().lower()
                if kind not in KINDS:
                    raise TraceError(f"{p.name} line {line}: kind must be one of {', '.join(KINDS)}, got {row[ck]!r}")
            ckpt = 0
            if cc is not None and row[cc].strip():
                try:
                    ckpt = int(row[cc])
                except ValueError:
                    ckpt = -1
                if ckpt < 0:
                    raise TraceError(f"{p.name} line {line}: checkpoint_minutes must be a whole number >= 0, got {row[cc]!r}")
            model = (row[cm].strip().upper() if cm is not None else "") or default_gpu_model.upper()
            jobs.append(TraceJob(jid, submit, int(gpus_f), dur, row[cq].strip() if cq is not None else "",
                                 intr, model, data, kind, ckpt))
    if not jobs:
        raise TraceError(f"{p.name} holds no jobs")
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


@dataclass(frozen=True, slots=True)
class Lifetimes:
    """Observed spot lifetimes per cloud, seconds; ``censored`` ones were still running."""

    by_cloud: dict[str, tuple[tuple[float, bool], ...]]

    def draw(self, cloud: str, u: float, u2: float) -> float | None:
        """A lifetime for one node from ``cloud``'s observations, or None if none were seen.
        A censored draw (the instance outlived the log) survives at least that long and then
        draws again, memorylessly."""
        obs = self.by_cloud.get(cloud)
        if not obs:
            return None
        total = 0.0
        for _ in range(8):
            life, censored = obs[int(u * len(obs)) % len(obs)]
            total += life
            if not censored:
                return total
            u = (u * 7919.0 + u2) % 1.0
        return total


def load_lifetimes(path: Path | str) -> Lifetimes:
    """Read ``spot_instance_lifetimes_aws_gcp_2020.csv``-shaped data: ``cloud``,
    ``observed_lifetime_s`` and ``ended_by`` (``still_running...`` marks censored rows)."""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read spot lifetimes {p}: {e.strerror or e}") from None
    out: dict[str, list[tuple[float, bool]]] = {}
    with f:
        r = csv.DictReader(f)
        need = [c for c in ("cloud", "observed_lifetime_s") if c not in (r.fieldnames or [])]
        if need:
            raise TraceError(f"{p.name} line 1 lacks column(s) {', '.join(need)}")
        for line, row in enumerate(r, start=2):
            cloud = (row.get("cloud") or "").strip().lower()
            try:
                life = float(row["observed_lifetime_s"])
            except (TypeError, ValueError):
                raise TraceError(f"{p.name} line {line}: observed_lifetime_s must be a number, "
                                 f"got {row.get('observed_lifetime_s')!r}") from None
            if not cloud or not (math.isfinite(life) and life > 0):
                raise TraceError(f"{p.name} line {line}: needs a cloud and a positive lifetime")
            censored = (row.get("ended_by") or "").strip().lower().startswith("still_running")
            out.setdefault(cloud, []).append((life, censored))
    if not out:
        raise TraceError(f"{p.name} holds no lifetimes")
    return Lifetimes({k: tuple(sorted(v)) for k, v in out.items()})


# ---------------------------------------------------------------------------------------------
# Policies


@dataclass(frozen=True, slots=True)
class Policy:
    """How one simulated autoscaler bursts.

    ``market``: "none" (never bursts), "ondemand-cheapest" (lowest on-demand hourly price for
    the gang, nothing else counted), "spot-greedy" (lowest spot hourly price for interruptible
    jobs, relaunched on spot after every preemption, on-demand otherwise), "full-cost" (lowest
    full cost from :func:`policies.cost.price`, spot mixed with on-demand by
    :func:`policies.spot.decide` toward a deadline).
    """

    name: str
    market: str
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    predict: bool = False  # predict on-prem waits at submission (wait trigger ahead of time)
    gate: bool = False  # diagnosis gate (allocation verdict) for the threshold trigger
    deadline_slack: float = 1.0  # cloud deadline = start-up + runtime x (1 + slack): twice the runtime
    learn_interruptions: bool = False  # update spot interruption rates from what it saw
    max_spot_attempts: int = 20  # spot-greedy gives up on spot after this many preemptions


NAIVE_TRIGGER = TriggerConfig(order="fifo", burst_verdicts=(), wait_trigger=False)
BROKER_TRIGGER = TriggerConfig()


def builtin_policies() -> dict[str, Policy]:
    return {
        "onprem-only": Policy("onprem-only", "none", TriggerConfig(threshold_trigger=False, wait_trigger=False)),
        "ondemand-cheapest": Policy("ondemand-cheapest", "ondemand-cheapest", NAIVE_TRIGGER),
        "spot-greedy": Policy("spot-greedy", "spot-greedy", NAIVE_TRIGGER),
        "broker": Policy("broker", "full-cost", BROKER_TRIGGER, predict=True, gate=True,
                         learn_interruptions=True),
    }


POLICY_NAMES = tuple(builtin_policies())


@dataclass(frozen=True, slots=True)
class SimConfig:
    onprem_gpus: int
    gpus_per_node: int = 8
    tick_s: float = 60.0
    seed: int = 0
    default_gpu_model: str = "V100"
    checkpoint_minutes: int = 30  # for interruptible jobs whose trace row names none
    onprem_egress_usd_per_gb: float = 0.0
    sample_s: float = 3600.0  # time-series resolution for plots

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0:
            raise ValueError("gpus_per_node must be positive")
        if self.onprem_gpus < 0 or self.onprem_gpus % self.gpus_per_node:
            raise ValueError(f"onprem_gpus ({self.onprem_gpus}) must be a non-negative multiple of "
                             f"gpus_per_node ({self.gpus_per_node})")
        if self.tick_s <= 0 or self.sample_s <= 0:
            raise ValueError("tick_s and sample_s must be positive")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class PolicyResult:
    name: str
    jobs: int
    jobs_burst: int
    cloud_cost_micros: int
    lower_bound_micros: int
    cost_by_market: dict[str, int]
    cost_by_provider: dict[str, int]
    cloud_gpu_hours: float
    interruptions: int
    onprem_utilization: float
    waits: list[float]
    wall_s: float = 0.0
    series: dict[str, list[float]] = field(default_factory=dict)
    unserved: int = 0  # jobs bigger than the cluster with no cloud offer

    def percentile(self, q: float) -> float:
        if not self.waits:
            return 0.0
        w = sorted(self.waits)
        k = (len(w) - 1) * q
        lo = int(k)
        hi = min(lo + 1, len(w) - 1)
        return w[lo] + (w[hi] - w[lo]) * (k - lo)

    def to_dict(self) -> dict:
        n = len(self.waits)
        return {
            "cloud_cost_usd": round(self.cloud_cost_micros / MICROS, 2),
            "wait_p50_s": round(self.percentile(0.50), 1),
            "wait_p95_s": round(self.percentile(0.95), 1),
            "wait_p99_s": round(self.percentile(0.99), 1),
            "wait_mean_s": round(sum(self.waits) / n, 1) if n else 0.0,
            "jobs": self.jobs,
            "jobs_burst": self.jobs_burst,
            "cloud_gpu_hours": round(self.cloud_gpu_hours, 1),
            "interruptions": self.interruptions,
            "onprem_utilization": round(self.onprem_utilization, 4),
            "lower_bound_cost_usd": round(self.lower_bound_micros / MICROS, 2),
            "execution_loss_usd": round((self.cloud_cost_micros - self.lower_bound_micros) / MICROS, 2),
            "cost_by_market_usd": {k: round(v / MICROS, 2) for k, v in sorted(self.cost_by_market.items())},
            "cost_by_provider_usd": {k: round(v / MICROS, 2) for k, v in sorted(self.cost_by_provider.items())},
            "unserved_jobs": self.unserved,
            "replay_jobs_per_s": round(self.jobs / self.wall_s, 1) if self.wall_s > 0 else None,
        }


# ---------------------------------------------------------------------------------------------
# Offer choice, cached per job shape


@dataclass(frozen=True, slots=True)
class _Pick:
    offering: Offering
    nodes: int
    stretch: float  # cloud runtime / trace runtime
    extra_micros: int  # storage + transfer for the job
    startup_s: float


@dataclass(frozen=True, slots=True)
class _Choice:
    first: _Pick | None  # where the job launches
    fallback: _Pick | None  # on-demand for a spot job that must switch
    lower_bound_rate: float  # micro-dollars per trace-second, cheapest eligible, no overheads
    lower_bound_extra: int


def _hours_bucket(h: float) -> int:
    return int(round(4 * math.log2(max(h, 1 / 60))))


class _Chooser:
    def __init__(self, catalog: Catalog, policy: Policy, cfg: SimConfig):
        self.catalog = catalog
        self.policy = policy
        self.cfg = cfg
        self.cache: dict[tuple, _Choice] = {}
        self.terms = dict(catalog.terms)
        self.ctx = Context(self.terms, catalog.regions, catalog.gpu_perf, 0.0,
                           int(cfg.onprem_egress_usd_per_gb * MICROS))
        # Learned spot interruption rates: provider -> [node-hours seen, interruptions seen].
        self.seen: dict[str, list[float]] = {p: [0.0, 0.0] for p in catalog.terms}
        self.rates_in_use = {p: t.spot_interruptions_per_hour for p, t in catalog.terms.items()}

    def observe(self, provider: str, node_hours: float, interrupted: int) -> None:
        if not self.policy.learn_interruptions:
            return
        s = self.seen.setdefault(provider, [0.0, 0.0])
        s[0] += node_hours
        s[1] += interrupted
        prior = self.catalog.terms[provider].spot_interruptions_per_hour
        prior_h = 20.0  # the catalog's rate counts as 20 node-hours of observation
        est = (prior * prior_h + s[1]) / (prior_h + s[0])
        cur = self.rates_in_use[provider]
        if abs(est - cur) > 0.15 * max(cur, 1e-3):
            self.rates_in_use[provider] = est
            self.terms[provider] = replace(self.terms[provider], spot_interruptions_per_hour=est)
            self.ctx = replace(self.ctx, terms=self.terms)
            self.cache.clear()

    def choose(self, j: TraceJob) -> _Choice:
        hb = _hours_bucket(j.duration_s / 3600.0)
        key = (j.gpus, j.interruptible, j.gpu_model, round(j.data_gb), hb, j.checkpoint_minutes)
        c = self.cache.get(key)
        if c is None:
            c = self._choose(j, 2.0 ** (hb / 4.0))
            self.cache[key] = c
        return c

    def _choose(self, j: TraceJob, hours: float) -> _Choice:
        d = Demand(gpus=j.gpus, hours=hours, gpu_model=j.gpu_model, data_in_gb=j.data_gb,
                   interruptible=j.interruptible,
                   checkpoint_minutes=j.checkpoint_minutes or self.cfg.checkpoint_minutes)
        offers = self.catalog.by_gpu.get(j.gpu_model, ())
        priced: list[PricedOffer] = []
        for o in offers:
            r = price(d, o, self.ctx)
            if type(r) is not Exclusion:
                priced.append(r)
        if not priced:
            return _Choice(None, None, 0.0, 0)

        def pick(p: PricedOffer) -> _Pick:
            return _Pick(p.offering, p.nodes, p.runtime_hours / hours,
                         p.cost.storage + p.cost.data_transfer,
                         float(self.terms[p.offering.provider].startup_s))

        def hourly(p: PricedOffer) -> tuple:
            return (p.offering.hourly_micros * p.nodes * p.runtime_hours, p.cost.total)

        od = [p for p in priced if p.offering.market is not Market.SPOT]
        sp = [p for p in priced if p.offering.market is Market.SPOT]
        best_od_full = min(od, key=lambda p: p.cost.total) if od else None
        lb = min(priced, key=lambda p: p.cost.compute + p.cost.storage + p.cost.data_transfer)
        lb_rate = lb.cost.compute / (hours * 3600.0)
        lb_extra = lb.cost.storage + lb.cost.data_transfer
        m = self.policy.market
        if m == "ondemand-cheapest":
            od_cheap = [p for p in od if p.offering.market is Market.ON_DEMAND] or od
            first = min(od_cheap, key=hourly) if od_cheap else None
            fb = first
        elif m == "spot-greedy":
            od_cheap = min(od, key=hourly) if od else None
            first = min(sp, key=hourly) if sp else od_cheap
            fb = od_cheap
        else:
            first = min(priced, key=lambda p: p.cost.total)
            fb = best_od_full
        return _Choice(pick(first) if first else None, pick(fb) if fb else None, lb_rate, lb_extra)


# ---------------------------------------------------------------------------------------------
# The replay


# Event kinds, in tie-break order at one instant: finishes free capacity before arrivals.
_E_ONPREM_END, _E_CLOUD_END, _E_ARRIVE, _E_CHECK, _E_TICK = 0, 1, 2, 3, 4

# Job states.
_NEW, _PENDING, _ONPREM, _CLOUD, _DONE = 0, 1, 2, 3, 4


@dataclass(slots=True)
class _Attempt:
    job: int
    pick: _Pick
    launched: float
    ready: float
    end: float  # when this attempt ends (finish or preemption)
    finishes: bool
    gpus: int  # GPUs held (nodes x GPUs per node)


def simulate(
    jobs: Sequence[TraceJob],
    catalog: Catalog,
    policy: Policy,
    cfg: SimConfig,
    lifetimes: Lifetimes | None = None,
    progress: Callable[[int], None] | None = None,
) -> PolicyResult:
    """Replay ``jobs`` under ``policy``; see the module docstring for the model."""
    import time as _time

    t_wall = _time.perf_counter()
    sim = _Sim(jobs, catalog, policy, cfg, lifetimes, progress)
    res = sim.run()
    res.wall_s = _time.perf_counter() - t_wall
    return res


class _Sim:
    def __init__(self, jobs, catalog, policy, cfg, lifetimes, progress):
        self.jobs = list(jobs)
        self.n = len(self.jobs)
        self.catalog = catalog
        self.policy = policy
        self.cfg = cfg
        self.lifetimes = lifetimes
        self.progress = progress
        self.G = cfg.gpus_per_node
        self.N = cfg.onprem_gpus
        self.nodes = cfg.onprem_gpus // cfg.gpus_per_node
        self.chooser = _Chooser(catalog, policy, cfg) if policy.market != "none" else None
        self.burst_enabled = policy.market != "none" and (
            policy.trigger.threshold_trigger or policy.trigger.wait_trigger)

        self.events: list = []
        self.seq = 0
        # per job
        n = self.n
        self.state = [_NEW] * n
        self.wait = [0.0] * n
        self.start = [0.0] * n
        self.place: list = [None] * n
        self.pred = [0.0] * n
        self.done_work = [0.0] * n  # checkpointed cloud progress (trace seconds)
        self.burst_at = [0.0] * n
        self.interrupts = [0] * n
        self.on_od = [False] * n
        self.why = [0] * n  # 1 = wait rule, 2 = threshold
        # on-prem
        G = self.G
        self.free = [G] * self.nodes
        self.buckets: list[set] = [set() for _ in range(G + 1)]
        self.buckets[G] = set(range(self.nodes))
        self.free_total = self.N
        self.node_jobs: list[list] = [[] for _ in range(self.nodes)]  # (end, gpus, job)
        self.classes: dict[int, deque] = {}
        self.pending_gpus = 0
        self.class_gpus: dict[int, int] = {}  # pending GPUs per job size
        self.busy_gpu_s = 0.0
        self.released = 0.0  # exponentially decayed GPUs released (see release_rate)
        self.released_at = 0.0
        self.resv = None  # (head job, shadow time, reserved nodes frozenset)
        # trigger
        self.tstate = TriggerState()
        self.next_tick: float | None = None
        self.overdue: list[int] = []
        self.no_offer: set[int] = set()
        self.pool: list = []  # ranked heap of eligible pending jobs
        self.in_pool = [False] * n
        # cloud
        self.cloud_gpus = 0
        self.cloud_by_market = {"spot": 0, "on_demand": 0, "reserved": 0}
        self.cost = 0
        self.lb = 0
        self.cost_by_market: dict[str, int] = {}
        self.cost_by_provider: dict[str, int] = {}
        self.cloud_gpu_s = 0.0
        self.interruptions = 0
        self.jobs_burst = 0
        self.unserved = 0
        # series
        self.series = {"t_h": [], "pending_jobs": [], "pending_gpus": [], "cloud_gpus_spot": [],
                       "cloud_gpus_on_demand": [], "cloud_cost_usd": []}
        self.next_sample = 0.0
        self.pending_jobs = 0
        self.last_time = 0.0
        self.ratio = policy.trigger.wait_runtime_ratio

    # -- events ---------------------------------------------------------------------------

    def push(self, t: float, kind: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def run(self) -> PolicyResult:
        jobs = self.jobs
        t0 = jobs[0].submit_s if jobs else 0.0
        self.next_sample = t0
        self.t0 = t0
        # Arrivals are merged from the sorted list instead of all sitting in the heap.
        ai = 0
        n = self.n
        ev = self.events
        prog_every = max(1000, n // 200)
        handled = 0
        while ai < n or ev:
            if ai < n and (not ev or jobs[ai].submit_s < ev[0][0] or
                           (jobs[ai].submit_s == ev[0][0] and ev[0][1] > _E_ARRIVE)):
                t = jobs[ai].submit_s
                kind, payload = _E_ARRIVE, ai
                ai += 1
            else:
                t, kind, _, payload = heapq.heappop(ev)
                if kind == _E_CHECK and self.state[payload if payload >= 0 else -1 - payload] != _PENDING:
                    continue  # stale: the job started or left
            if t >= self.next_sample:
                self.sample(t)
            self.last_time = t
            if kind == _E_ARRIVE:
                self.arrive(payload, t)
                handled += 1
                if self.progress and handled % prog_every == 0:
                    self.progress(handled)
            elif kind == _E_ONPREM_END:
                self.onprem_end(payload, t)
            elif kind == _E_CLOUD_END:
                self.cloud_end(payload, t)
            elif kind == _E_CHECK:
                if payload < 0:  # reached the minimum wait share: eligible for the pool
                    i = -1 - payload
                    if self.state[i] == _PENDING:
                        self.add_pool(i)
                        if self.pending_gpus > self.policy.trigger.pending_gpus_threshold:
                            self.want_tick(t)
                elif self.state[payload] == _PENDING:
                    self.overdue.append(payload)
                    self.want_tick(t)
            else:
                if payload == "tick":
                    if self.next_tick is not None and t < self.next_tick:
                        continue  # superseded
                    self.next_tick = None
                self.tick(t)
        if self.progress:
            self.progress(n)
        self.sample(self.last_time, force=True)
        span = max(1.0, self.last_time - t0)
        waits = [self.wait[i] for i in range(n) if self.state[i] == _DONE and self.wait[i] >= 0]
        self.unserved += sum(1 for i in range(n) if self.state[i] in (_PENDING, _NEW))
        return PolicyResult(
            name=self.policy.name, jobs=n, jobs_burst=self.jobs_burst, cloud_cost_micros=self.cost,
            lower_bound_micros=self.lb, cost_by_market=self.cost_by_market,
            cost_by_provider=self.cost_by_provider, cloud_gpu_hours=self.cloud_gpu_s / 3600.0,
            interruptions=self.interruptions,
            onprem_utilization=self.busy_gpu_s / (self.N * span) if self.N else 0.0,
            waits=waits, series=self.series, unserved=self.unserved,
        )

    def sample(self, t: float, force: bool = False) -> None:
        s = self.series
        while self.next_sample <= t or force:
            s["t_h"].append((min(self.next_sample, t) - self.t0) / 3600.0 if not force else (t - self.t0) / 3600.0)
            s["pending_jobs"].append(self.pending_jobs)
            s["pending_gpus"].append(self.pending_gpus)
            s["cloud_gpus_spot"].append(self.cloud_by_market["spot"])
            s["cloud_gpus_on_demand"].append(self.cloud_by_market["on_demand"] + self.cloud_by_market["reserved"])
            s["cloud_cost_usd"].append(self.cost / MICROS)
            if force:
                break
            self.next_sample += self.cfg.sample_s

    # -- on-prem --------------------------------------------------------------------------

    def fits(self, g: int) -> bool:
        G = self.G
        if g <= G:
            b = self.buckets
            for f in range(g, G + 1):
                if b[f]:
                    return True
            return False
        return len(self.buckets[G]) * G >= g

    def occupy(self, i: int, t: float, avoid=frozenset(), until: float | None = None) -> bool:
        """Place job i on-prem now if it fits (not on ``avoid`` nodes unless it ends by
        ``until``). Returns True when started."""
        j = self.jobs[i]
        g, G, b = j.gpus, self.G, self.buckets
        end = t + j.duration_s
        ok_avoid = until is not None and end <= until
        chosen: list[tuple[int, int]] = []
        if g <= G:
            node = -1
            for f in range(g, G + 1):
                for nd in b[f]:
                    if ok_avoid or nd not in avoid:
                        node = nd
                        break
                if node >= 0:
                    break
            if node < 0:
                return False
            chosen.append((node, g))
        else:
            k = -(-g // G)
            whole = [nd for nd in b[G] if ok_avoid or nd not in avoid]
            if len(whole) < k:
                return False
            whole.sort()
            left = g
            for nd in whole[:k]:
                take = min(G, left)
                chosen.append((nd, take))
                left -= take
        free = self.free
        for nd, take in chosen:
            f = free[nd]
            b[f].discard(nd)
            free[nd] = f - take
            b[f - take].add(nd)
            bisect.insort(self.node_jobs[nd], (end, take, i))
        self.free_total -= g
        self.place[i] = chosen
        self.state[i] = _ONPREM
        self.start[i] = t
        self.wait[i] = t - j.submit_s
        self.pending_gpus -= g
        self.pending_jobs -= 1
        self.class_gpus[g] -= g
        self.push(end, _E_ONPREM_END, i)
        return True

    def head(self, g: int) -> int | None:
        q = self.classes.get(g)
        st = self.state
        while q and st[q[0]] != _PENDING:
            q.popleft()
        return q[0] if q else None

    def global_head(self) -> int | None:
        """The oldest pending job that could ever run on-prem."""
        best = None
        N = self.N
        for g in self.classes:
            if g > N:
                continue
            h = self.head(g)
            if h is None:
                continue
            if best is None or h < best:
                best = h
        return best

    def reservation(self, h: int, t: float):
        """Earliest start of head job h and the nodes it will use."""
        j = self.jobs[h]
        g, G = j.gpus, self.G
        if g <= G:
            best_t, best_n = math.inf, -1
            for nd in range(self.nodes):
                f = self.free[nd]
                when = t
                if f < g:
                    for end, take, _ in self.node_jobs[nd]:
                        f += take
                        if f >= g:
                            when = end
                            break
                    else:
                        continue
                if when < best_t:
                    best_t, best_n = when, nd
            return (h, best_t, frozenset((best_n,)) if best_n >= 0 else frozenset())
        k = -(-g // G)
        if k > self.nodes:
            return (h, math.inf, frozenset())
        fulls = []
        for nd in range(self.nodes):
            js = self.node_jobs[nd]
            fulls.append((js[-1][0] if js else t, nd))
        fulls.sort()
        chosen = fulls[:k]
        return (h, max(t, chosen[-1][0]), frozenset(nd for _, nd in chosen))

    def schedule(self, t: float) -> None:
        """Start what can start: the FIFO head while it fits, then EASY backfill."""
        if not self.pending_jobs or not self.free_total:
            return
        while True:
            h = self.global_head()
            if h is None:
                return
            if not self.fits(self.jobs[h].gpus) or not self.occupy(h, t):
                break
            if not self.free_total:
                return
        r = self.resv
        if r is None or r[0] != h:
            r = self.resv = self.reservation(h, t)
        _, shadow, avoid = r
        hg = self.jobs[h].gpus
        # Backfill: walk size classes by their heads' age. The head's own size cannot start
        # anywhere, and a size that cannot start now is done for this pass (free capacity only
        # shrinks while we place).
        heads = []
        for g in self.classes:
            if g == hg or g > self.N:
                continue
            hh = self.head(g)
            if hh is not None:
                heads.append((hh, g))
        heapq.heapify(heads)
        jobs, state = self.jobs, self.state
        left = shadow - t
        while heads and self.free_total:
            hh, g = heapq.heappop(heads)
            if not self.fits(g):
                continue
            if self.fits_outside(g, avoid):
                self.occupy(hh, t, avoid, shadow)
            else:
                # Only the head's reserved nodes have room: a job may use them only if it
                # ends before the head's reserved start.
                depth = 0
                started = False
                for i in self.classes[g]:
                    if state[i] != _PENDING:
                        continue
                    depth += 1
                    if depth > BACKFILL_DEPTH:
                        break
                    if jobs[i].duration_s <= left and self.occupy(i, t, avoid, shadow):
                        started = True
                        break
                if not started:
                    continue
            nh = self.head(g)
            if nh is not None:
                heapq.heappush(heads, (nh, g))

    def fits_outside(self, g: int, avoid) -> bool:
        """Whether g GPUs fit now without touching the ``avoid`` nodes."""
        G, b = self.G, self.buckets
        if g <= G:
            for f in range(g, G + 1):
                for nd in b[f]:
                    if nd not in avoid:
                        return True
            return False
        k = -(-g // G)
        return sum(1 for nd in b[G] if nd not in avoid) >= k

    def onprem_end(self, i: int, t: float) -> None:
        j = self.jobs[i]
        free, b = self.free, self.buckets
        for nd, take in self.place[i]:
            f = free[nd]
            b[f].discard(nd)
            free[nd] = f + take
            b[f + take].add(nd)
            js = self.node_jobs[nd]
            js.remove((self.start[i] + j.duration_s, take, i))
        self.free_total += j.gpus
        self.busy_gpu_s += j.gpus * j.duration_s
        self.released = self.released * math.exp(-(t - self.released_at) / RATE_WINDOW_S) + j.gpus
        self.released_at = t
        self.state[i] = _DONE
        self.resv = None
        self.schedule(t)

    # -- arrivals and the trigger ---------------------------------------------------------

    def arrive(self, i: int, t: float) -> None:
        j = self.jobs[i]
        self.state[i] = _PENDING
        self.pending_gpus += j.gpus
        self.pending_jobs += 1
        g = j.gpus
        q = self.classes.get(g)
        if q is None:
            q = self.classes[g] = deque()
        # GPUs queued ahead that compete with it: jobs no bigger than it (bigger ones ahead
        # are mostly backfilled around while they wait for whole nodes).
        cg = self.class_gpus
        ahead = 0
        for c, v in cg.items():
            if c <= g:
                ahead += v
        cg[g] = cg.get(g, 0) + g
        q.append(i)
        if self.free_total >= g:
            self.schedule(t)
        if self.state[i] != _PENDING or not self.burst_enabled:
            return
        pol = self.policy
        if pol.predict:
            self.pred[i] = self.predict(i, t, ahead)
        tc = pol.trigger
        if tc.order == "ranked":
            # Eligible by wait now or later: add it to the pool when its (predicted) wait reaches
            # the minimum share, and to the overdue list when it reaches the wait ratio.
            run = j.duration_s
            min_run = tc.selection.min_runtime_startups * self._startup(j)
            if run >= min_run and g <= tc.max_gpus_in_flight:
                pred = self.pred[i]
                if pred > self.ratio * run:
                    self.overdue.append(i)
                    self.want_tick(t)
                else:
                    self.push(t + self.ratio * run + 1e-6, _E_CHECK, i)
                if tc.threshold_trigger:
                    share = tc.selection.min_wait_share * self.price_ratio(j)
                    if pred >= share * run:
                        self.add_pool(i)
                    else:
                        self.push(t + share * run, _E_CHECK, -1 - i)
        self.want_tick(t)

    def add_pool(self, i: int) -> None:
        if self.in_pool[i]:
            return
        j = self.jobs[i]
        self.in_pool[i] = True
        heapq.heappush(self.pool, ((0 if j.interruptible else 1, 3, j.duration_s, j.data_gb, j.submit_s), i))

    def price_ratio(self, j: TraceJob) -> float:
        c = self.chooser.choose(j)
        if c.first is None or c.fallback is None:
            return 1.0
        a = c.first.offering.hourly_micros * c.first.nodes * c.first.stretch
        b = c.fallback.offering.hourly_micros * c.fallback.nodes * c.fallback.stretch
        return min(1.0, a / b) if b else 1.0

    def _startup(self, j: TraceJob) -> float:
        c = self.chooser.choose(j)
        return c.first.startup_s if c.first else math.inf

    def predict(self, i: int, t: float, ahead_gpus: int) -> float:
        """Predicted wait of a job that could not start at once, in O(1): the GPUs queued ahead
        of it plus its own, less those free now, over the rate at which the cluster has been
        releasing GPUs lately; at the head of the queue, its reservation (when its GPUs free
        up, from the running jobs' ends)."""
        j = self.jobs[i]
        if j.gpus > self.N:
            return math.inf
        if ahead_gpus <= 0:
            return max(0.0, self.reservation(i, t)[1] - t)
        rate = self.release_rate(t)
        need = ahead_gpus + j.gpus - self.free_total
        if need <= 0:
            return 0.0
        return need / rate if rate > 0 else math.inf

    def release_rate(self, t: float) -> float:
        """GPUs released per second on-prem, exponentially weighted over ``RATE_WINDOW_S``."""
        return self.released * math.exp(-(t - self.released_at) / RATE_WINDOW_S) / RATE_WINDOW_S

    def want_tick(self, t: float) -> None:
        if not self.burst_enabled:
            return
        tick = self.cfg.tick_s
        nt = math.ceil(t / tick) * tick
        if self.next_tick is None or nt < self.next_tick:
            self.next_tick = nt
            self.push(nt, _E_TICK, "tick")

    def tick(self, t: float) -> None:
        pol = self.policy
        tc = pol.trigger
        jobs, state = self.jobs, self.state
        sig = Signals(self.pending_gpus, self.N, self.N - self.free_total, self.cloud_gpus)
        verdict = allocation_verdict(sig) if pol.gate else "resource-bound"
        cands: list[Candidate] = []
        seen: set[int] = set()

        def cand(i: int) -> Candidate:
            j = jobs[i]
            return Candidate(PendingJob(job_id=j.job_id, gpus=j.gpus, est_runtime_s=int(math.ceil(j.duration_s)),
                                        waited_s=int(t - j.submit_s), interruptible=j.interruptible,
                                        data_gb=j.data_gb, kind=j.kind, queue=j.queue),
                             self.pred[i], self.price_ratio(j), self._startup(j))

        idx: dict[str, int] = {}
        # Overdue jobs (wait rule), oldest first.
        no_offer = self.no_offer
        od = [i for i in dict.fromkeys(self.overdue) if state[i] == _PENDING and i not in no_offer]
        self.overdue = []
        for i in od:
            seen.add(i)
            c = cand(i)
            idx[c.job.job_id] = i
            cands.append(c)
        popped: list = []
        excess = self.pending_gpus - tc.pending_gpus_threshold
        if tc.threshold_trigger and excess > 0:
            want = excess
            if tc.order == "fifo":
                for i in self.fifo_iter():
                    if want <= 0:
                        break
                    if i in seen or i in no_offer:
                        continue
                    seen.add(i)
                    c = cand(i)
                    idx[c.job.job_id] = i
                    cands.append(c)
                    want -= jobs[i].gpus
            else:
                pool = self.pool
                while pool and want > 0:
                    item = heapq.heappop(pool)
                    i = item[1]
                    if state[i] != _PENDING:
                        self.in_pool[i] = False
                        continue
                    popped.append(item)
                    if i in seen or i in no_offer:
                        continue
                    seen.add(i)
                    c = cand(i)
                    idx[c.job.job_id] = i
                    cands.append(c)
                    want -= jobs[i].gpus
        cands.sort(key=lambda c: -c.job.waited_s)
        decision, self.tstate = evaluate(tc, self.tstate, t, sig, cands, verdict)
        for item in popped:
            if state[item[1]] == _PENDING:
                heapq.heappush(self.pool, item)
        if decision.action == BURST:
            for k, c in enumerate(decision.jobs):
                i = idx[c.job.job_id]
                self.why[i] = 1 if k < decision.n_wait else 2
                self.burst(i, t)
        # Unchosen overdue jobs stay overdue.
        for i in od:
            if state[i] == _PENDING:
                self.overdue.append(i)
        if decision.wake_at is not None and decision.wake_at > t:
            self.push(decision.wake_at, _E_TICK, "wake")
        if self.pending_jobs and (self.pending_gpus > tc.pending_gpus_threshold or self.overdue):
            self.want_tick(t + 1e-9)

    def fifo_iter(self) -> Iterable[int]:
        """Pending jobs oldest first (merging the per-size queues)."""
        its = []
        for g, q in self.classes.items():
            it = iter(q)
            for i in it:
                if self.state[i] == _PENDING:
                    its.append((i, g, it))
                    break
        heapq.heapify(its)
        while its:
            i, g, it = heapq.heappop(its)
            yield i
            for k in it:
                if self.state[k] == _PENDING:
                    heapq.heappush(its, (k, g, it))
                    break

    # -- the cloud ------------------------------------------------------------------------

    def burst(self, i: int, t: float) -> None:
        j = self.jobs[i]
        ch = self.chooser.choose(j)
        if ch.first is None:
            self.no_offer.add(i)  # no cloud offering can hold it: it stays in the queue
            return
        self.state[i] = _CLOUD
        self.class_gpus[j.gpus] -= j.gpus
        self.pending_gpus -= j.gpus
        self.pending_jobs -= 1
        self.jobs_burst += 1
        self.burst_at[i] = t
        self.wait[i] = -1.0
        self.lb += int(ch.lower_bound_rate * j.duration_s) + ch.lower_bound_extra
        first = ch.first
        self.cost += first.extra_micros
        self._book(first, first.extra_micros)
        self.launch(i, t, first)

    def _book(self, p: _Pick, micros: int) -> None:
        m = p.offering.market.value
        self.cost_by_market[m] = self.cost_by_market.get(m, 0) + micros
        pr = p.offering.provider
        self.cost_by_provider[pr] = self.cost_by_provider.get(pr, 0) + micros

    def launch(self, i: int, t: float, p: _Pick) -> None:
        j = self.jobs[i]
        spot = p.offering.market is Market.SPOT
        work_left = (j.duration_s - self.done_work[i]) * p.stretch
        ready = t + p.startup_s
        end = ready + work_left
        finishes = True
        if spot:
            life = self.lifetime(i, p)
            if t + life < end:
                end = t + life
                finishes = False
        gpus = p.nodes * p.offering.instance.gpus
        self.cloud_gpus += gpus
        self.cloud_by_market[p.offering.market.value] += gpus
        self.on_od[i] = not spot
        self.push(end, _E_CLOUD_END, _Attempt(i, p, t, ready, end, finishes, gpus))

    def lifetime(self, i: int, p: _Pick) -> float:
        """Time to the first preemption of any node of the gang, from launch."""
        j = self.jobs[i]
        key = f"{j.job_id}:{self.interrupts[i]}"
        seed = self.cfg.seed
        provider = p.offering.provider
        best = math.inf
        for k in range(p.nodes):
            u = hash_unit(seed, f"life:{key}:{k}")
            life = None
            if self.lifetimes is not None:
                life = self.lifetimes.draw(provider, u, hash_unit(seed, f"life2:{key}:{k}"))
            if life is None:
                rate = self.catalog.terms[provider].spot_interruptions_per_hour
                life = math.inf if rate <= 0 else -math.log(1.0 - u) * 3600.0 / rate
            best = min(best, life)
        return best

    def cloud_end(self, a: _Attempt, t: float) -> None:
        i, p = a.job, a.pick
        j = self.jobs[i]
        self.cloud_gpus -= a.gpus
        self.cloud_by_market[p.offering.market.value] -= a.gpus
        billed = max(t - a.launched, BILLING_MINIMUM_S)
        micros = int(p.offering.hourly_micros * p.nodes * billed / 3600.0)
        self.cost += micros
        self._book(p, micros)
        self.cloud_gpu_s += a.gpus * billed
        if self.wait[i] < 0 and t >= a.ready:
            self.wait[i] = a.ready - j.submit_s
        spot = p.offering.market is Market.SPOT
        if spot and self.chooser is not None:
            self.chooser.observe(p.offering.provider, p.nodes * (t - a.launched) / 3600.0,
                                 0 if a.finishes else p.nodes)
        if a.finishes:
            self.state[i] = _DONE
            return
        # Preempted: keep the checkpointed progress, decide where to go on.
        self.interruptions += 1
        self.interrupts[i] += 1
        ckpt = 60.0 * (j.checkpoint_minutes or self.cfg.checkpoint_minutes)
        ran = max(0.0, t - a.ready) / p.stretch
        if ckpt > 0:
            self.done_work[i] = min(j.duration_s, self.done_work[i] + (ran // ckpt) * ckpt)
        ch = self.chooser.choose(j)
        fb = ch.fallback
        pol = self.policy
        if pol.market == "spot-greedy":
            nxt = p if self.interrupts[i] < pol.max_spot_attempts or fb is None else fb
        elif pol.market == "full-cost":
            job_h = (j.duration_s * p.stretch) / 3600.0
            deadline_h = (p.startup_s + j.duration_s * p.stretch * (1.0 + pol.deadline_slack)) / 3600.0
            restart_h = (p.startup_s + ckpt) / 3600.0
            m = spot_rule.decide(self.done_work[i] * p.stretch / 3600.0, (t - self.burst_at[i]) / 3600.0,
                                 job_h, deadline_h, True, False, restart_h)
            spot_pick = ch.first if ch.first is not None and ch.first.offering.market is Market.SPOT else p
            nxt = spot_pick if m is Market.SPOT or fb is None else fb
        else:
            nxt = fb or p
        self.launch(i, t, nxt)


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
