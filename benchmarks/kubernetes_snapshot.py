"""A big Kubernetes/Kueue cluster read by the watcher: what one snapshot costs.

A generated cluster on the fake API server (broker_sandbox/kubernetes.py) over loopback:
``--nodes`` GPU nodes (8 GPUs), two running pods per node, ``--pods`` pending GPU pods (1-8
GPUs) and ``--workloads`` Kueue Workloads waiting for quota (1-4 pods of 8 GPUs). Printed: the
mapping of the cached objects to the queue model (``broker.kubernetes.objects.queue_records``)
in CPU seconds of the process (``time.process_time``, median of 5); the first snapshot (four
lists over loopback, JSON decode, mapping) and later ones (from the watch caches), wall time;
and the load average.

Run: .venv/bin/python benchmarks/kubernetes_snapshot.py [--nodes 1000] [--pods 5000] [--workloads 5000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.kubernetes.objects import queue_records  # noqa: E402
from broker.kubernetes.settings import KubernetesSettings  # noqa: E402
from broker.kubernetes.watcher import KubernetesWatcher  # noqa: E402
from broker_sandbox.kubernetes import FakeKubeApi, local_queue, node, pod, workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--workloads", type=int, default=5000)
    a = ap.parse_args()
    now = time.time()
    nodes = [node(f"gpu-{i}") for i in range(a.nodes)]
    pods = [pod(f"run-{i}", "ml", gpus=4, phase="Running", node=f"gpu-{i % a.nodes}") for i in range(2 * a.nodes)]
    pods += [pod(f"wait-{i}", "ml", gpus=1 + i % 8, created=now - i) for i in range(a.pods)]
    wls = [workload(f"wl-{i}", "ml", gpus_per_pod=8, count=1 + i % 4, created=now - i) for i in range(a.workloads)]
    lqs = [local_queue("team-a", "ml", "cq")]
    cpu = []
    for _ in range(5):
        t = time.process_time()
        pending, _, running = queue_records(pods, nodes, wls, lqs, now)
        cpu.append(time.process_time() - t)
    print(f"{a.nodes} nodes, {len(pods)} pods, {len(wls)} workloads -> {len(pending)} waiting, {len(running)} running")
    print(f"mapping: {statistics.median(cpu) * 1000:.0f} ms CPU (median of 5)")
    api = FakeKubeApi().start()
    try:
        for kind, objs in (("nodes", nodes), ("pods", pods), ("workloads", wls), ("localqueues", lqs)):
            for o in objs:
                api.put(kind, o)
        kc = api.kubeconfig(Path(tempfile.mkdtemp()) / "kubeconfig")
        w = KubernetesWatcher(KubernetesSettings(enabled=True, kubeconfig=str(kc), watch_timeout_s=30))
        t = time.perf_counter()
        w.snapshot()
        first = time.perf_counter() - t
        later = []
        for _ in range(5):
            t = time.perf_counter()
            w.snapshot()
            later.append(time.perf_counter() - t)
        w.stop()
    finally:
        api.stop()
    print(f"first snapshot: {first:.2f} s wall; later snapshots: {statistics.median(later) * 1000:.0f} ms wall (median of 5)")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
