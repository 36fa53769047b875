"""Where a waiting job would fit: the diagnosis' placement, made cheap for 100,000 jobs.

The diagnosis explains each waiting GPU job against a running tally of free GPUs (see
:mod:`policies.diagnose`). Asked naively that is jobs x nodes: 100,000 jobs on 1,000 nodes
took minutes. Three facts make it cheap without changing a single answer:

* **Eligibility depends on the job's (queue, GPU model) only**, a handful of pairs per cluster:
  the eligible nodes of each pair are found once, from indexes by partition and by model.
* **The tallies only ever shrink.** A claim takes GPUs and wholeness away and gives none back,
  so a job shape (eligible set, GPUs, node count, whole-node) that does not fit now never fits
  later in the same pass: the refusal is remembered and every later job of that shape is
  answered by one dict lookup. Successful placements each take at least one GPU, so there are
  at most as many of them as there are GPUs.
* **The free GPUs of an eligible set** (the fragmentation test) are summed once per set and
  again only after a claim has changed the tally.

The plans themselves are the reference rules: spread over the nodes with the most free GPUs
first (any node count), or ``nodes`` nodes of ``ceil(gpus / nodes)`` free GPUs each, best fit
first (whole nodes for ``exclusive``).
"""
from __future__ import annotations

import heapq
import math
from typing import Sequence

from policies.queue import ClusterNode, PendingJob

Plan = list[tuple[str, int]]
# What placement depends on: (queue, model, GPUs) or (queue, model, GPUs, nodes, whole-node).
Shape = tuple[str, str, int] | tuple[str, str, int, int, bool]


class Tally:
    """Free GPUs per node (``whole``: nothing runs there); ``version`` counts the claims."""

    __slots__ = ("free", "whole", "version", "refused")

    def __init__(self, free: dict[str, int], whole: dict[str, bool]) -> None:
        self.free, self.whole, self.version = free, whole, 0
        self.refused: set[Shape] = set()  # shapes that did not fit (and so never will)

    def take(self, plan: Plan, floor: bool) -> None:
        """Take ``plan``'s GPUs; ``floor``: never below zero (the if-up tally)."""
        free, whole = self.free, self.whole
        for name, g in plan:
            free[name] = max(0, free[name] - g) if floor else free[name] - g
            whole[name] = False
        self.version += 1


def plan(job: PendingJob, elig: Sequence[str], free: dict[str, int],
         whole: dict[str, bool]) -> Plan | None:
    """Where ``job`` would go on ``free`` GPUs of the ``elig`` nodes (every one a key of ``free``
    and ``whole``), or None."""
    got = free.__getitem__
    if job.nodes <= 0 and not job.exclusive:
        # scheduler's choice of node count: any spread, the freest nodes first
        if sum(map(got, elig)) < job.gpus:
            return None
        left, out = job.gpus, []
        # the first nodes of a stable sort by most free; each takes a GPU at least, so the job
        # is placed within its GPU count of them
        for n in heapq.nlargest(min(job.gpus, len(elig)), elig, key=got):
            take = min(left, free[n])
            if take:
                out.append((n, take))
                left -= take
            if not left:
                break
        return out
    count = max(job.nodes, 1)
    per = math.ceil(job.gpus / count)
    if job.exclusive:
        cands = [n for n in elig if whole[n] and free[n] >= per]
    else:
        cands = [n for n in elig if free[n] >= per]
    if len(cands) < count:
        return None
    cands.sort(key=got)  # best fit first
    return [(n, free[n] if job.exclusive else per) for n in cands[:count]]


class Placer:
    """The on-prem nodes indexed for placement, with the tallies a diagnosis pass claims from:
    ``now`` (free GPUs now) and ``if_up`` (with drained and down nodes back in service)."""

    def __init__(self, onprem: Sequence[ClusterNode]) -> None:
        self.gpu_nodes = [(i, n) for i, n in enumerate(onprem) if n.gpus_total > 0]
        self.by_part: dict[str, list[int]] = {}
        self.by_model: dict[str, list[int]] = {}
        no_part: list[int] = []
        no_model: list[int] = []
        for i, n in self.gpu_nodes:
            for p in set(n.partitions):
                self.by_part.setdefault(p, []).append(i)
            if not n.partitions:
                no_part.append(i)
            (self.by_model.setdefault(n.gpu_model.lower(), []) if n.gpu_model
             else no_model).append(i)
        self.no_part, self.no_model = no_part, no_model
        self.names = [n.name for n in onprem]
        free = {n.name: n.gpus_free for n in onprem}
        whole = {n.name: n.state == "idle" and n.gpus_allocated == 0 for n in onprem}
        free_up, whole_up = dict(free), dict(whole)
        for n in onprem:
            if n.state in ("drain", "down"):
                free_up[n.name] = max(0, n.gpus_total - n.gpus_allocated)
                whole_up[n.name] = n.gpus_allocated == 0
        self.now, self.if_up = Tally(free, whole), Tally(free_up, whole_up)
        self.empty = Tally({n.name: n.gpus_total for n in onprem}, {n.name: True for n in onprem})
        self._elig: dict[tuple[str, str], tuple[str, ...]] = {}
        self._sums: dict[tuple[str, str], tuple[int, int]] = {}
        self._fits_empty: dict[Shape, bool] = {}

    def eligible(self, job: PendingJob) -> tuple[str, ...]:
        """Names of the nodes that could ever hold ``job`` (GPUs, partition, model), in order."""
        key = (job.queue, job.gpu_model.lower())
        names = self._elig.get(key)
        if names is None:
            picked = None
            if job.queue:
                parts = set(job.queue.split(","))
                picked = set(self.no_part).union(*(self.by_part.get(p, ()) for p in parts))
            if job.gpu_model:
                models = set(self.no_model).union(self.by_model.get(key[1], ()))
                picked = models if picked is None else picked & models
            idx = [i for i, _ in self.gpu_nodes] if picked is None else sorted(picked)
            names = self._elig[key] = tuple(self.names[i] for i in idx)
        return names

    @staticmethod
    def shape(job: PendingJob) -> Shape:
        """What placement depends on: (queue, model, GPUs) to spread, or (queue, model, GPUs,
        nodes, whole-node) for a node count."""
        if job.nodes <= 0 and not job.exclusive:
            return job.queue, job.gpu_model.lower(), job.gpus
        return job.queue, job.gpu_model.lower(), job.gpus, max(job.nodes, 1), job.exclusive

    def place(self, job: PendingJob, shape: Shape, tally: Tally) -> Plan | None:
        """Where ``job`` fits on ``tally`` now, or None (remembered: it never will)."""
        if shape in tally.refused:
            return None
        got = plan(job, self.eligible(job), tally.free, tally.whole)
        if got is None:
            tally.refused.add(shape)
        return got

    def free_now(self, job: PendingJob) -> int:
        """Free GPUs now on the nodes eligible for ``job`` (fragmentation: enough, but scattered)."""
        key = (job.queue, job.gpu_model.lower())
        got = self._sums.get(key)
        if got is None or got[0] != self.now.version:
            got = self._sums[key] = (self.now.version,
                                     sum(map(self.now.free.__getitem__, self.eligible(job))))
        return got[1]

    def fits_empty(self, job: PendingJob, shape: Shape) -> bool:
        """Whether some on-prem nodes could hold ``job`` with nothing else running."""
        got = self._fits_empty.get(shape)
        if got is None:
            got = self._fits_empty[shape] = plan(job, self.eligible(job), self.empty.free,
                                                 self.empty.whole) is not None
        return got
