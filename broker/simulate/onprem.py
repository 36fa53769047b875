"""The on-prem cluster: a queue per job size, nodes of whole GPUs, FIFO with EASY backfill.

``onprem_gpus`` GPUs in nodes of ``gpus_per_node``. A job of up to one node's GPUs takes them
on one node (best fit); a bigger job takes whole nodes. When the head of the queue does not fit
it gets a reservation (the earliest time enough GPUs free up, from the running jobs' ends) and
later jobs may start only where they do not delay it. Backfill looks at most ``BACKFILL_DEPTH``
jobs of each size per pass, like Slurm's ``bf_max_job_test``. Runtimes are known exactly (the
trace's), as in most replays.
"""
from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import deque
from typing import Callable, Iterable, MutableSequence, Sequence

from policies.waits import forecast

from broker.simulate.model import DONE, E_ONPREM_END, ONPREM, PENDING, SimConfig
from broker.simulate.table import JobTable

BACKFILL_DEPTH = 64


class Cluster:
    """The on-prem queue and nodes. ``state`` and ``wait`` are the replay's per-job lists,
    shared; ``push(t, kind, payload)`` schedules the replay's events."""

    def __init__(self, jobs: JobTable, cfg: SimConfig, state: MutableSequence[int], wait: MutableSequence[float],
                 push: Callable[[float, int, object], None]):
        self.jobs = jobs
        self.gpus, self.dur, self.sub, self.known = jobs.gpus, jobs.duration, jobs.submit, jobs.runtime_known
        self.state = state
        self.wait = wait
        self.push = push
        self.G = G = cfg.gpus_per_node
        self.N = cfg.onprem_gpus
        self.nodes = cfg.onprem_gpus // G
        n = len(jobs)
        self.start = array("d", bytes(8 * n))  # doubles, not a float object per job
        self.place: dict[int, list] = {}  # running job -> its (node, GPUs)
        self.free = [G] * self.nodes
        self.buckets: list[set] = [set() for _ in range(G + 1)]  # nodes by free GPUs
        self.buckets[G] = set(range(self.nodes))
        self.free_total = self.N
        self.node_jobs: list[list] = [[] for _ in range(self.nodes)]  # (end, gpus, job), sorted
        self.classes: dict[int, deque] = {}  # pending jobs per size, oldest first
        self.class_gpus: dict[int, int] = {}  # pending GPUs per job size
        self.pending_gpus = 0
        self.pending_jobs = 0
        self.busy_gpu_s = 0.0
        self.running: set[int] = set()  # jobs running on-prem now
        self.resv = None  # (head job, shadow time, reserved nodes frozenset)
        self.fifo: deque[int] = deque()  # every queued job in arrival order (left ones dropped lazily)
        # Per node, when the current head's size could start there (-inf: now), for
        # reservation(); recomputed only for the nodes a start or an end touched since.
        self.when_g = 0
        self.when: list[float] = []
        self.touched: set[int] = set()

    # -- the queue ------------------------------------------------------------------------

    def enqueue(self, i: int) -> int:
        """Queue job i; returns the GPUs queued ahead that compete with it: jobs no bigger than
        it (bigger ones ahead are mostly backfilled around while they wait for whole nodes)."""
        g = self.gpus[i]
        self.state[i] = PENDING
        self.pending_gpus += g
        self.pending_jobs += 1
        q = self.classes.get(g)
        if q is None:
            q = self.classes[g] = deque()
        cg = self.class_gpus
        ahead = 0
        for c, v in cg.items():
            if c <= g:
                ahead += v
        cg[g] = cg.get(g, 0) + g
        q.append(i)
        self.fifo.append(i)
        return ahead

    def dequeue(self, i: int) -> None:
        """Job i leaves the queue for elsewhere (the cloud); its entry is dropped lazily."""
        g = self.gpus[i]
        self.class_gpus[g] -= g
        self.pending_gpus -= g
        self.pending_jobs -= 1

    def head(self, g: int) -> int | None:
        q = self.classes.get(g)
        st = self.state
        while q and st[q[0]] != PENDING:
            q.popleft()
        return q[0] if q else None

    def global_head(self) -> int | None:
        """The oldest pending job (every queued job can run on-prem: bigger ones never queue)."""
        q, st = self.fifo, self.state
        while q and st[q[0]] != PENDING:
            q.popleft()
        return q[0] if q else None

    def fifo_iter(self) -> Iterable[int]:
        """Pending jobs oldest first."""
        st = self.state
        return (i for i in self.fifo if st[i] == PENDING)

    # -- placing ----------------------------------------------------------------------------

    def fits(self, g: int) -> bool:
        G = self.G
        if g <= G:
            b = self.buckets
            for f in range(g, G + 1):
                if b[f]:
                    return True
            return False
        return len(self.buckets[G]) * G >= g

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

    def _nodes_for(self, g: int, avoid, ok_avoid: bool) -> list[tuple[int, int]] | None:
        """(node, GPUs) to place g GPUs on now, or None: best fit on one node, else whole nodes."""
        G, b = self.G, self.buckets
        if g <= G:
            for f in range(g, G + 1):
                for nd in b[f]:
                    if ok_avoid or nd not in avoid:
                        return [(nd, g)]
            return None
        k = -(-g // G)
        whole = [nd for nd in b[G] if ok_avoid or nd not in avoid]
        if len(whole) < k:
            return None
        whole.sort()
        chosen, left = [], g
        for nd in whole[:k]:
            take = min(G, left)
            chosen.append((nd, take))
            left -= take
        return chosen

    def occupy(self, i: int, t: float, avoid=frozenset(), until: float | None = None) -> bool:
        """Place job i on-prem now if it fits (not on ``avoid`` nodes unless it ends by
        ``until``). Returns True when started."""
        g = self.gpus[i]
        end = t + self.dur[i]
        chosen = self._nodes_for(g, avoid, until is not None and end <= until)
        if chosen is None:
            return False
        free, b = self.free, self.buckets
        for nd, take in chosen:
            f = free[nd]
            b[f].discard(nd)
            free[nd] = f - take
            b[f - take].add(nd)
            bisect.insort(self.node_jobs[nd], (end, take, i))
            self.touched.add(nd)
        self.free_total -= g
        self.place[i] = chosen
        self.state[i] = ONPREM
        self.running.add(i)
        self.start[i] = t
        self.wait[i] = t - self.sub[i]
        self.pending_gpus -= g
        self.pending_jobs -= 1
        self.class_gpus[g] -= g
        self.push(end, E_ONPREM_END, i)
        return True

    def end(self, i: int, t: float) -> None:
        """Job i finished on-prem: free its GPUs and start what can start."""
        g, dur = self.gpus[i], self.dur[i]
        free, b = self.free, self.buckets
        place = self.place.pop(i)  # a finished job holds no nodes
        for nd, take in place:
            f = free[nd]
            b[f].discard(nd)
            free[nd] = f + take
            b[f + take].add(nd)
            self.node_jobs[nd].remove((self.start[i] + dur, take, i))
            self.touched.add(nd)
        self.free_total += g
        self.busy_gpu_s += g * dur
        self.running.discard(i)
        self.state[i] = DONE
        self.resv = None
        self.schedule(t)

    # -- scheduling ---------------------------------------------------------------------------

    def node_when(self, nd: int, g: int) -> float:
        """When node ``nd`` could hold g GPUs from its running jobs' ends (-inf: now); for a job
        of whole nodes (g > GPUs per node), when the node is empty."""
        js = self.node_jobs[nd]
        if g > self.G:
            return js[-1][0] if js else -math.inf
        f = self.free[nd]
        if f >= g:
            return -math.inf
        for end, take, _ in js:
            f += take
            if f >= g:
                return end
        return math.inf  # unreachable: a node's GPUs all free up

    def reservation(self, h: int, t: float):
        """Earliest start of head job h and the nodes it will use: the node that frees enough
        GPUs first (the lowest-numbered of a tie), or the whole nodes that empty first."""
        g, G = self.gpus[h], self.G
        k = -(-g // G)
        if k > self.nodes:
            return (h, math.inf, frozenset())
        when, touched = self.when, self.touched
        if self.when_g != g or len(when) != self.nodes:
            self.when = when = [self.node_when(nd, g) for nd in range(self.nodes)]
            self.when_g = g
        else:
            for nd in touched:
                when[nd] = self.node_when(nd, g)
        touched.clear()
        # Every time is >= t (ends not yet past; -inf: now), so "now" ties at t.
        if g <= G:
            best = min(when)
            if best == math.inf:
                return (h, math.inf, frozenset())
            if best <= t:
                return (h, t, frozenset((next(nd for nd, w in enumerate(when) if w <= t),)))
            return (h, best, frozenset((when.index(best),)))
        order = sorted(range(self.nodes), key=when.__getitem__)
        now = 0
        while now < len(order) and when[order[now]] <= t:
            now += 1
        if now > 1:
            order[:now] = sorted(order[:now])
        chosen = order[:k]
        return (h, max(t, when[chosen[-1]]), frozenset(chosen))

    def schedule(self, t: float) -> None:
        """Start what can start: the FIFO head while it fits, then EASY backfill."""
        if not self.pending_jobs or not self.free_total:
            return
        while True:
            h = self.global_head()
            if h is None:
                return
            if not self.fits(self.gpus[h]) or not self.occupy(h, t):
                break
            if not self.free_total:
                return
        r = self.resv
        if r is None or r[0] != h:
            r = self.resv = self.reservation(h, t)
        self._backfill(t, self.gpus[h], r[1], r[2])

    def _backfill(self, t: float, head_gpus: int, shadow: float, avoid) -> None:
        """Walk size classes by their heads' age. The head's own size cannot start anywhere,
        and a size that cannot start now is done for this pass (free capacity only shrinks
        while we place)."""
        heads = []
        for g in self.classes:
            if g == head_gpus or g > self.N:
                continue
            hh = self.head(g)
            if hh is not None:
                heads.append((hh, g))
        heapq.heapify(heads)
        dur, state = self.dur, self.state
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
                    if state[i] != PENDING:
                        continue
                    depth += 1
                    if depth > BACKFILL_DEPTH:
                        break
                    if dur[i] <= left and self.occupy(i, t, avoid, shadow):
                        started = True
                        break
                if not started:
                    continue
            nh = self.head(g)
            if nh is not None:
                heapq.heappush(heads, (nh, g))

    # -- prediction ---------------------------------------------------------------------------

    def waits(self, t: float, order: Sequence[int]) -> list[float]:
        """Remaining waits of the pending jobs ``order`` (oldest first) by
        :func:`policies.waits.forecast`, from what a scheduler reports: the running jobs' time
        run and runtimes (none when the trace does not know it), the queue's runtimes."""
        gpus, dur, known, start = self.gpus, self.dur, self.known, self.start
        running = [(gpus[i], int(t - start[i]), math.ceil(dur[i]) if known[i] else 0) for i in self.running]
        queue = [(gpus[i], math.ceil(dur[i]) if known[i] else 0) for i in order]
        return forecast(queue, running, self.free_total, self.N)
