"""Several shapes in one request against one after another: what a 2-node AWS launch costs when the
first ``k`` of four ranked types have no capacity.

The mocked EC2 (broker_sandbox/aws.py, moto behind the front) on loopback, real boto3. Baseline:
``launch`` on each shape in turn until one runs (what a launch did before: one RunInstances per
offer, a refused one answered ``InsufficientInstanceCapacity``). Against it: ``launch_shapes``, one
CreateFleet ``instant`` with the four shapes as prioritized overrides. Printed per ``k``: the EC2
requests each made (all calls, describe and tag calls included), the wall time (median of
``--runs``) and its ratio to the baseline, and the load average.

Run: .venv/bin/python benchmarks/fleet_launch.py [--runs 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_sandbox.aws import AwsCloud  # noqa: E402
from providers.aws import AwsProvider  # noqa: E402
from providers.base import CapacityError, LaunchSpec, Market, Shape  # noqa: E402
from providers.catalog import bundled  # noqa: E402
from providers.registry import provider_settings  # noqa: E402

TYPES = ("g5.xlarge", "g6.xlarge", "g4dn.xlarge", "g6e.xlarge")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    for key, value in AwsCloud.client_env().items():
        os.environ[key] = value
    cat = bundled()
    shapes = [Shape(it, "us-east-1a", Market.ON_DEMAND) for it in (cat.instance("aws", t) for t in TYPES) if it]
    cloud = AwsCloud().start()
    try:
        settings = provider_settings("aws", cloud.provider_settings(["us-east-1"]))
        warm = AwsProvider(settings, "bench")  # the first call of a process fills caches: not timed
        warm.launch(LaunchSpec(lease_id="warm", provider="aws", region="us-east-1", zone="", instance=shapes[0].instance,
                               market=Market.ON_DEMAND, count=1, client_token="warm", node_names=("warm-0",)))
        warm.launch_shapes(LaunchSpec(lease_id="warm2", provider="aws", region="us-east-1", zone="",
                                      instance=shapes[0].instance, market=Market.ON_DEMAND, count=1,
                                      client_token="warm2", node_names=("warm2-0",)), shapes)
        cloud.reset()
        print(f"{'k':>2} {'seq req':>8} {'fleet req':>9} {'seq ms':>8} {'fleet ms':>9} {'fleet/seq':>9}")
        for k in range(len(shapes)):
            seq_t, fleet_t, seq_n, fleet_n = [], [], 0, 0
            for run in range(a.runs):
                p = AwsProvider(settings, "bench")
                spec = LaunchSpec(lease_id=f"s{k}-{run}", provider="aws", region="us-east-1", zone="",
                                  instance=shapes[0].instance, market=Market.ON_DEMAND, count=2,
                                  client_token=f"s{k}-{run}", node_names=(f"s{k}-{run}-0", f"s{k}-{run}-1"))
                cloud.inject("capacity", times=k, match="RunInstances") if k else None
                before = len(cloud.calls)
                t0 = time.perf_counter()
                for i, s in enumerate(shapes):
                    try:
                        p.launch(dataclasses.replace(spec, instance=s.instance, zone=s.zone,
                                                     client_token=f"{spec.client_token}-{i}"))
                        break
                    except CapacityError:
                        continue
                seq_t.append(time.perf_counter() - t0)
                seq_n = len(cloud.calls) - before
                cloud.clear_faults()
                for s in shapes[:k]:
                    cloud.set_capacity(s.instance.name, "", 0)
                fspec = dataclasses.replace(spec, lease_id=f"f{k}-{run}", client_token=f"f{k}-{run}",
                                            node_names=(f"f{k}-{run}-0", f"f{k}-{run}-1"))
                before = len(cloud.calls)
                t0 = time.perf_counter()
                p.launch_shapes(fspec, shapes)
                fleet_t.append(time.perf_counter() - t0)
                fleet_n = len(cloud.calls) - before
                cloud.reset()
            s_ms, f_ms = statistics.median(seq_t) * 1000, statistics.median(fleet_t) * 1000
            print(f"{k:>2} {seq_n:>8} {fleet_n:>9} {s_ms:>8.0f} {f_ms:>9.0f} {f_ms / s_ms:>9.2f}")
    finally:
        cloud.stop()
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
