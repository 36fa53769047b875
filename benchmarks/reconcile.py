"""One reconciler pass over 10,000 live leases and their instances.

The store is a real SQLite file; the provider listings come from an in-process provider that
answers `list_managed` from memory (the cloud round-trips are not what is measured here).
The baseline, run in the same process, is the pass's unavoidable floor: reading the live
leases from the store and indexing the listings by lease, with no decisions taken.
Both are timed in wall time and in the CPU time of the thread that runs them
(``time.thread_time``: what the machine's other work and the memory sampler do not inflate).

Run: .venv/bin/python benchmarks/reconcile.py [--leases 10000] [--passes 5]
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.config import ReconcilerSettings  # noqa: E402
from broker.lifecycle import Lifecycle  # noqa: E402
from broker.quote import QuoteEngine  # noqa: E402
from broker.reconciler import PASS_COLUMNS, Reconciler  # noqa: E402
from broker.lease import LIVE  # noqa: E402
from broker.store import LeaseRecord, Store  # noqa: E402
from providers.base import Instance, InstanceState, Market  # noqa: E402
from providers.catalog import bundled  # noqa: E402

PROVIDERS = ("aws", "gcp", "azure")


class ListingProvider:
    """Answers list_managed from memory; launch/terminate are never reached in a steady pass."""

    def __init__(self, name: str, instances: list[Instance]) -> None:
        self.name = name
        self.instances = instances

    def list_managed(self, regions=None):
        return list(self.instances)

    def describe(self, lease_id, region):
        return [i for i in self.instances if i.lease_id == lease_id]

    def launch(self, spec):
        raise AssertionError("a steady-state pass launches nothing")

    def terminate(self, instances):
        raise AssertionError("a steady-state pass terminates nothing")


def instances_of(k: int, p: str, now: float) -> list[Instance]:
    lid = f"l-bench-{k:06d}"
    return [Instance(p, f"i-{k:06d}-{j}", "r1", "r1-a", "t1", Market.ON_DEMAND, InstanceState.RUNNING, lid,
                     f"{lid}-{j}", "10.0.0.1", launched_at=now - 3600) for j in range(1 + (k % 4 == 0))]


def listings_for(n: int, now: float) -> dict[str, list[Instance]]:
    listings: dict[str, list[Instance]] = {p: [] for p in PROVIDERS}
    for k in range(n):
        p = PROVIDERS[k % 3]
        listings[p].extend(instances_of(k, p, now))
    return listings


def populate(url: str, n: int, now: float) -> None:
    """Write ``n`` running leases (run in a child process, so its memory is not the pass's)."""
    from sqlalchemy import insert

    store = Store(url)
    table = LeaseRecord.__table__
    for start in range(0, n, 10_000):
        rows = []
        for k in range(start, min(n, start + 10_000)):
            p, lid = PROVIDERS[k % 3], f"l-bench-{k:06d}"
            insts = instances_of(k, p, now)
            rows.append(dict(
                lease_id=lid, tenant="default", idempotency_key=lid, state="running", state_reason="", version=1,
                provider=p, region="r1", zone="r1-a", instance_type="t1", market="on_demand", nodes=len(insts),
                hourly_micros=1_000_000, reservation="", client_token=f"{lid}-1", attempt=1, quote_id="",
                offer_rank=0, bootstrap="", job=json.dumps({"job_id": str(k)}), demand="{}", attempts="[]",
                instances=json.dumps([{"instance_id": i.instance_id, "node_name": i.node_name, "zone": i.zone,
                                       "private_ip": i.private_ip, "state": "running", "region": "r1"}
                                      for i in insts]),
                created_at=now - 3600, updated_at=now - 3600, state_since=now - 3600, started_at=now - 3600,
                ended_at=0.0, accrued_micros=0, accrued_at=now - 3600, max_lifetime_s=0, idle_since=0.0,
                replaces="", job_state="running"))
        with store.engine.begin() as conn:
            conn.execute(insert(table), rows)
    store.close()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """The highest resident set size seen while the block runs (sampled every 2 ms)."""

    def __enter__(self) -> "PeakRss":
        self.before = self.peak = rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_mb())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        child = multiprocessing.get_context("fork").Process(target=populate, args=(url, args.leases, now))
        child.start()
        child.join()
        store = Store(url)
        listings = listings_for(args.leases, now)
        providers = {p: ListingProvider(p, insts) for p, insts in listings.items()}
        lc = Lifecycle(store, providers, QuoteEngine(bundled()), owner="bench", clock=lambda: now)
        rec = Reconciler(lc, orphan_grace_s=ReconcilerSettings().orphan_grace_s, clock=lambda: now)

        def baseline() -> None:
            by_lease: dict[str, list] = {}
            for prov in providers.values():
                for i in prov.list_managed():
                    by_lease.setdefault(i.lease_id, []).append(i)
            store.lease_rows(PASS_COLUMNS, states=LIVE)

        gc.collect()
        base, passes, peaks, base_cpu, pass_cpu = [], [], [], [], []
        for _ in range(args.passes):
            t, c = time.perf_counter(), time.thread_time()
            baseline()
            base.append(time.perf_counter() - t)
            base_cpu.append(time.thread_time() - c)
            gc.collect()
            with PeakRss() as mem:
                t, c = time.perf_counter(), time.thread_time()
                report = rec.run_pass()
                passes.append(time.perf_counter() - t)
                pass_cpu.append(time.thread_time() - c)
            peaks.append(mem)
        assert not any((report.adopted, report.released, report.orphans_terminated, report.failed)), report
        n_inst = sum(len(v) for v in listings.values())
        p, b = statistics.median(passes), statistics.median(base)
        pc, bc = statistics.median(pass_cpu), statistics.median(base_cpu)
        print(f"reconciler pass over {args.leases:,} live leases / {n_inst:,} instances (3 providers), "
              f"load average {os.getloadavg()[0]:.1f}:")
        print(f"  pass     median {p * 1000:8.1f} ms wall (min {min(passes) * 1000:.1f}, max {max(passes) * 1000:.1f}), "
              f"CPU {pc * 1000:.1f} ms (min {min(pass_cpu) * 1000:.1f}, max {max(pass_cpu) * 1000:.1f})")
        print(f"  baseline median {b * 1000:8.1f} ms wall, CPU {bc * 1000:.1f} ms "
              f"(read leases + index listings, no decisions)")
        top = max(peaks, key=lambda m: m.peak)
        grew = max(m.peak - m.before for m in peaks)
        print(f"  ratio pass / baseline: {p / b:.2f}x wall, {pc / bc:.2f}x CPU")
        print(f"  memory   process peak {top.peak:6.0f} MB during a pass (the listings held: {top.before:.0f} MB "
              f"before it); a pass adds at most {grew:.0f} MB")
        goal_s, goal_mb = (1.5, 300) if args.leases >= 100_000 else (1.0, 300)
        met = pc <= goal_s and top.peak <= goal_mb
        print(f"  target <= {goal_s:g} s of CPU and <= {goal_mb} MB: {'met' if met else 'MISSED'}")
        store.close()


if __name__ == "__main__":
    main()
