"""One reconciler pass over 10,000 live leases and their instances.

The store is a real SQLite file; the provider listings come from an in-process provider that
answers `list_managed` from memory (the cloud round-trips are not what is measured here).
The baseline, run in the same process, is the pass's unavoidable floor: reading the live
leases from the store and indexing the listings by lease, with no decisions taken.

Run: .venv/bin/python benchmarks/reconcile.py [--leases 10000] [--passes 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.lifecycle import Lifecycle  # noqa: E402
from broker.quote import QuoteEngine  # noqa: E402
from broker.reconciler import Reconciler  # noqa: E402
from broker.lease import LIVE  # noqa: E402
from broker.store import LeaseRecord, Store  # noqa: E402
from providers.base import Instance, InstanceState, Market  # noqa: E402
from providers.catalog import bundled  # noqa: E402


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


def populate(store: Store, n: int, now: float) -> dict[str, list[Instance]]:
    from sqlmodel import Session

    providers = ("aws", "gcp", "azure")
    listings: dict[str, list[Instance]] = {p: [] for p in providers}
    rows = []
    for k in range(n):
        p = providers[k % 3]
        lid = f"l-bench-{k:06d}"
        nodes = 1 + (k % 4 == 0)
        insts = [Instance(p, f"i-{k:06d}-{j}", "r1", "r1-a", "t1", Market.ON_DEMAND, InstanceState.RUNNING, lid,
                          f"{lid}-{j}", "10.0.0.1", launched_at=now - 3600) for j in range(nodes)]
        listings[p].extend(insts)
        rows.append(LeaseRecord(
            lease_id=lid, idempotency_key=lid, state="running", provider=p, region="r1", zone="r1-a",
            instance_type="t1", market="on_demand", nodes=nodes, hourly_micros=1_000_000, client_token=f"{lid}-1",
            created_at=now - 3600, updated_at=now - 3600, state_since=now - 3600, started_at=now - 3600,
            accrued_at=now - 3600, idle_since=0.0, job=json.dumps({"job_id": str(k)}),
            instances=json.dumps([{"instance_id": i.instance_id, "node_name": i.node_name, "zone": i.zone,
                                   "private_ip": i.private_ip, "state": "running"} for i in insts]),
        ))
    with Session(store.engine) as s:
        s.add_all(rows)
        s.commit()
    return listings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leases", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/bench.db")
        listings = populate(store, args.leases, now)
        providers = {p: ListingProvider(p, insts) for p, insts in listings.items()}
        lc = Lifecycle(store, providers, QuoteEngine(bundled()), owner="bench", clock=lambda: now)
        rec = Reconciler(lc, clock=lambda: now)

        def baseline() -> None:
            by_lease: dict[str, list] = {}
            for prov in providers.values():
                for i in prov.list_managed():
                    by_lease.setdefault(i.lease_id, []).append(i)
            store.list_leases(states=LIVE)

        base, passes = [], []
        for _ in range(args.passes):
            t = time.perf_counter()
            baseline()
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            report = rec.run_pass()
            passes.append(time.perf_counter() - t)
        assert not any((report.adopted, report.released, report.orphans_terminated, report.failed)), report
        n_inst = sum(len(v) for v in listings.values())
        p, b = statistics.median(passes), statistics.median(base)
        print(f"reconciler pass over {args.leases:,} live leases / {n_inst:,} instances (3 providers):")
        print(f"  pass     median {p * 1000:8.1f} ms  (min {min(passes) * 1000:.1f}, max {max(passes) * 1000:.1f})")
        print(f"  baseline median {b * 1000:8.1f} ms  (read leases + index listings, no decisions)")
        print(f"  ratio pass / baseline: {p / b:.2f}x   target <= 1 s: {'met' if p <= 1.0 else 'MISSED'}")
        store.close()


if __name__ == "__main__":
    main()
