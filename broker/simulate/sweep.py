"""Replaying many pool sizes and policies at once, in worker processes.

Each (pool size, policy) replay is independent and CPU-bound, so a sweep runs them in a
:class:`concurrent.futures.ProcessPoolExecutor` (the standard library's pool: one pickled copy
of the trace, catalog and lifetimes per worker, through the initializer).
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Sequence

from providers.catalog import Catalog

from broker.simulate.lifetimes import Lifetimes
from broker.simulate.model import PolicyResult, SimConfig, builtin_policies
from broker.simulate.replay import simulate
from broker.simulate.trace import TraceJob

_inputs: tuple | None = None  # (jobs, catalog, lifetimes) in a worker


def _init(jobs, catalog, lifetimes) -> None:
    global _inputs
    _inputs = (jobs, catalog, lifetimes)


def _one(size: int, name: str, cfg: SimConfig) -> tuple[int, str, PolicyResult]:
    jobs, catalog, lifetimes = _inputs
    res = simulate(jobs, catalog, builtin_policies()[name], replace(cfg, onprem_gpus=size), lifetimes)
    res.series = {}  # the plot of a sweep is per size, not over time
    return size, name, res


def run_sweep(
    jobs: Sequence[TraceJob],
    catalog: Catalog,
    names: Sequence[str],
    sizes: Sequence[int],
    cfg: SimConfig,
    lifetimes: Lifetimes | None = None,
    workers: int | None = None,
) -> dict[int, dict[str, PolicyResult]]:
    """Every policy at every pool size; ``workers`` processes (default: the CPU count)."""
    pols = builtin_policies()
    bad = [n for n in names if n not in pols]
    if bad:
        raise ValueError(f"unknown policy {bad[0]!r}; known: {', '.join(pols)}")
    for s in sizes:
        replace(cfg, onprem_gpus=s)  # validates the size against gpus_per_node
    tasks = [(s, n) for s in sizes for n in names]
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    out: dict[int, dict[str, PolicyResult]] = {s: {} for s in sizes}
    if workers == 1:
        _init(list(jobs), catalog, lifetimes)
        done = [_one(s, n, cfg) for s, n in tasks]
    else:
        with ProcessPoolExecutor(workers, initializer=_init, initargs=(list(jobs), catalog, lifetimes)) as ex:
            done = list(ex.map(_one, [s for s, _ in tasks], [n for _, n in tasks], [cfg] * len(tasks)))
    for s, n, r in done:
        out[s][n] = r
    return {s: {n: out[s][n] for n in names} for s in sizes}
