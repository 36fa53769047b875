"""Replaying many pool sizes and policies at once, in worker processes.

Each (pool size, policy) replay is independent and CPU-bound, so a sweep runs them in a
:class:`concurrent.futures.ProcessPoolExecutor`. The trace, catalog and lifetimes reach each
worker once, through the initializer (inherited without pickling where the platform forks); a
task is only a size and a policy name, and a worker keeps the priced offers and spot outlooks
between its tasks (both depend on neither). The slowest replays (the smallest pools burst the
most, the broker policies price the most) are handed out first, so no worker is left with a long
one at the end.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from typing import Callable, Sequence

from providers.catalog import Catalog

from broker.simulate.lifetimes import Lifetimes
from broker.simulate.model import PolicyResult, SimConfig, builtin_policies
from broker.simulate.replay import simulate
from broker.simulate.trace import TraceJob

_inputs: tuple | None = None  # (jobs, catalog, lifetimes, cfg) in a worker


def _init(jobs, catalog, lifetimes, cfg) -> None:
    global _inputs
    _inputs = (jobs, catalog, lifetimes, cfg)


def _one(size: int, name: str) -> tuple[int, str, PolicyResult]:
    jobs, catalog, lifetimes, cfg = _inputs
    res = simulate(jobs, catalog, builtin_policies()[name], replace(cfg, onprem_gpus=size), lifetimes)
    res.series = {}  # the plot of a sweep is per size, not over time
    return size, name, res


def _weight(size: int, name: str) -> tuple:
    """Sort key, slowest first: smaller pools burst more; the full-cost policies do the most per job."""
    pol = builtin_policies()[name]
    return (size, {"full-cost": 0, "spot-greedy": 1, "ondemand-cheapest": 2}.get(pol.market, 3))


def _context():
    """Fork where the platform can (the workers share the parent's trace); else the default."""
    return multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


def run_sweep(
    jobs: Sequence[TraceJob],
    catalog: Catalog,
    names: Sequence[str],
    sizes: Sequence[int],
    cfg: SimConfig,
    lifetimes: Lifetimes | None = None,
    workers: int | None = None,
    progress: Callable[[int, str, int, int], None] | None = None,
) -> dict[int, dict[str, PolicyResult]]:
    """Every policy at every pool size; ``workers`` processes (default: the CPU count).
    ``progress(size, policy, done, total)`` is called as each replay finishes."""
    pols = builtin_policies()
    bad = [n for n in names if n not in pols]
    if bad:
        raise ValueError(f"unknown policy {bad[0]!r}; known: {', '.join(pols)}")
    for s in sizes:
        replace(cfg, onprem_gpus=s)  # validates the size against gpus_per_node
    tasks = sorted(((s, n) for s in sizes for n in names), key=lambda sn: _weight(*sn))
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    out: dict[int, dict[str, PolicyResult]] = {s: {} for s in sizes}
    jobs = jobs if isinstance(jobs, list) else list(jobs)
    done: list[tuple[int, str, PolicyResult]] = []

    def finished(result: tuple[int, str, PolicyResult]) -> None:
        done.append(result)
        if progress:
            progress(result[0], result[1], len(done), len(tasks))

    if workers == 1:
        _init(jobs, catalog, lifetimes, cfg)
        for s, n in tasks:
            finished(_one(s, n))
    else:
        with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init,
                                 initargs=(jobs, catalog, lifetimes, cfg)) as ex:
            for f in as_completed([ex.submit(_one, s, n) for s, n in tasks]):
                finished(f.result())
    for s, n, r in done:
        out[s][n] = r
    return {s: {n: out[s][n] for n in names} for s in sizes}
