"""What the workload targets ask, and what they cost: the broker's wait against its cloud bill.

For each workload of ``benchmarks/workloads.py`` and each seed, against the price-only burst
(``ondemand-cheapest``) of the same run, three kinds of rows:

- ``same jobs, full cost``: the price-only burst's own trigger (the oldest jobs out whenever more
  than 8 GPUs have been pending for 5 minutes, no gate, no wait rule) with the broker's market
  choice (full cost, spot for jobs that checkpoint). It sends the jobs the price-only burst sends
  (the ``burst`` column; spot interruptions and other start-ups move the on-prem schedule a
  little), so it keeps its waits; its cost is what the market choice alone saves at the
  price-only burst's waits.
- ``... gated``: the same with the schedule-first gate (no threshold burst on a
  scheduling-bound queue).
- ``broker, default N``: the broker as it runs, with the default class's wait target
  (``[autoscaler.classes.default] max_wait_s``) at N minutes (the built-in is 240).

Each row prints × the price-only cost, the p95 wait against what the target allows (1.05 × the
price-only p95 + 60 s), the p99 against 3 × the price-only p99 + 60 s, and the jobs burst. A
row that meets every target of ``workloads.check`` is marked ``met``. Deterministic; two worker
processes.

Run: .venv/bin/python benchmarks/wait_frontier.py [--data ../shared/data] [--only helios,mixed]
     [--seeds 0,1,2] [--targets 20,60,240]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from broker.simulate.model import NAIVE_TRIGGER, Policy, builtin_policies  # noqa: E402
from broker.simulate.replay import simulate  # noqa: E402
from policies.classes import DEFAULT_CLASS, JobClass, merge_classes  # noqa: E402
from policies.triggers import TriggerConfig  # noqa: E402
from providers.catalog import bundled  # noqa: E402
from workloads import check, observed_lifetimes, sim_config, workloads  # noqa: E402


def variants(targets_min: list[int]) -> dict[str, Policy]:
    out = {
        "same jobs, full cost": Policy("same-jobs", "full-cost", NAIVE_TRIGGER, predict=True,
                                       learn_interruptions=True),
        "same jobs, full cost, gated": Policy("same-jobs-gated", "full-cost",
                                              replace(NAIVE_TRIGGER, burst_verdicts=TriggerConfig().burst_verdicts),
                                              predict=True, gate=True, learn_interruptions=True),
    }
    broker = builtin_policies()["broker"]
    for m in targets_min:
        classes = merge_classes({DEFAULT_CLASS: JobClass(DEFAULT_CLASS, m * 60.0)})
        out[f"broker, default {m} min"] = replace(broker, trigger=replace(broker.trigger, classes=classes))
    return out


def run(job: tuple[Path, str, int, list[int]]) -> tuple[str, int, list[str]]:
    data, name, seed, targets_min = job
    lifetimes = observed_lifetimes(data)
    found = workloads(data, seed, 600, {name})
    if not found:
        return name, seed, [f"  skipped: no trace for {name} under {data / 'traces'}"]
    w = found[0]
    cfg = sim_config(w, seed)
    cat = bundled()
    po = simulate(w.jobs, cat, builtin_policies()["ondemand-cheapest"], cfg, lifetimes).to_dict()
    rows = [f"  {'price-only burst':<30} {'1.000':>7} {po['wait_p95_s'] / 60:7.1f} {'':>7} "
            f"{po['wait_p99_s'] / 60:7.1f} {'':>7} {po['jobs_burst']:>6,}"]
    for label, p in variants(targets_min).items():
        b = simulate(w.jobs, cat, p, cfg, lifetimes).to_dict()
        t = check({"broker": b, "ondemand-cheapest": po, "_name": w.name})
        rows.append(f"  {label:<30} {t['cost/price-only'][0]:7.3f} {b['wait_p95_s'] / 60:7.1f} "
                    f"{t['p95'][1] / 60:7.1f} {b['wait_p99_s'] / 60:7.1f} {t['p99'][1] / 60:7.1f} "
                    f"{b['jobs_burst']:>6,}" + ("  met" if all(v[2] for v in t.values()) else ""))
    return w.name, seed, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--only", default="helios,services-overloaded,mixed,bursty,philly")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--targets", default="20,60,240", help="default class targets to try, in minutes")
    a = ap.parse_args()
    targets_min = [int(x) for x in a.targets.split(",") if x.strip()]
    names = [x.strip() for x in a.only.split(",") if x.strip()]
    jobs = [(a.data, n, int(s), targets_min) for n in names for s in a.seeds.split(",")]
    print(f"  {'':<30} {'x price':>7} {'p95':>7} {'allowed':>7} {'p99':>7} {'allowed':>7} {'burst':>6}  (minutes)")
    with Pool(2) as pool:
        for name, seed, rows in pool.imap(run, jobs):
            print(f"{name}, seed {seed}", flush=True)
            print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
