"""The diagnosis with its fast placement (policies.placement: indexed eligibility, remembered
refusals) gives the answers of the jobs x nodes diagnosis it replaced
(tests/diagnose_reference.py, the previous module verbatim), on
generated clusters: every job attributed to the same cause in the same order, the same
verdict, causes, actions and capacity jobs, and so the same trigger decision."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import diagnose as dg
from policies.diagnose import _Cluster, diagnose
from policies.queue import ClusterNode, GpuSample, PendingJob, QueueSnapshot, RunningJob
from policies.triggers import (TriggerConfig, TriggerState, candidates_from_snapshot, evaluate,
                               signals_from_snapshot)
from tests import diagnose_reference as ref

NOW = 1_767_225_600.0
NAMES = [f"gpu-{i}" for i in range(8)]
REASONS = ["Resources", "Priority", "None", "", "Dependency", "QOSMaxGRESPerUser", "JobHeldUser",
           "ReqNodeNotAvail, UnavailableNodes:gpu-[1-2]", "ReqNodeNotAvail, UnavailableNodes:gpu-5",
           "PartitionTimeLimit", "BeginTime"]

nodes = st.builds(
    ClusterNode, name=st.sampled_from(NAMES),  # names repeat: duplicates are inputs too
    state=st.sampled_from(["idle", "alloc", "mix", "drain", "down", "cloud"]),
    gpus_total=st.integers(0, 8), gpus_allocated=st.integers(0, 9),
    gpu_model=st.sampled_from(["", "A100", "a100", "H100"]),
    partitions=st.lists(st.sampled_from(["gpu", "long", "debug", ""]), max_size=2).map(tuple),
    reason=st.sampled_from(["", "ECC"]))
jobs = st.builds(
    PendingJob, job_id=st.text("abc123", min_size=1, max_size=4), gpus=st.integers(0, 20),
    queue=st.sampled_from(["", "gpu", "long", "gpu,long", "debug", "nope", "gpu,,x"]),
    gpu_model=st.sampled_from(["", "A100", "h100", "V100"]), nodes=st.integers(0, 4),
    waited_s=st.integers(0, 4000), est_runtime_s=st.integers(0, 7200),
    pending_reason=st.sampled_from(REASONS), interruptible=st.booleans(),
    kind=st.sampled_from(["training", "eval", "tuning", "inference"]), exclusive=st.booleans())
snapshots = st.builds(
    lambda n, p, r, util: QueueSnapshot(
        source="t", taken_at=NOW, nodes=tuple(n), pending=tuple(p),
        running=tuple(RunningJob(f"r{i}", 2, nodes=(x.name,)) for i, x in enumerate(n[:r])),
        gpu_samples=tuple(GpuSample(x.name, 0, util) for x in n)),
    st.lists(nodes, max_size=10), st.lists(jobs, max_size=40), st.integers(0, 4),
    st.floats(0, 100))


def ids(attributed):
    return {k: [j.job_id for j in v] for k, v in attributed.items() if v}


def assert_same(snap):
    gpu_jobs = sorted((j for j in snap.pending if j.gpus > 0), key=lambda j: (-j.waited_s, j.job_id))
    cluster = _Cluster.of(snap)
    assert ids(dg._attribute(gpu_jobs, cluster)) == ids(ref._attribute(gpu_jobs, ref._Cluster.of(snap)))
    new, old = diagnose(snap, now=NOW), ref.diagnose(snap, now=NOW)
    assert new.to_dict() == old.to_dict()
    assert [c.gpus for c in new.causes] == [c.gpus for c in old.causes]
    assert new.capacity_jobs == old.capacity_jobs
    assert new.scheduling_causes() == old.scheduling_causes()
    cands = candidates_from_snapshot(snap)
    decisions = [evaluate(TriggerConfig(stabilization_s=0), TriggerState(), NOW,
                          signals_from_snapshot(snap), cands, d.verdict,
                          capacity_jobs=d.capacity_jobs, scheduling_causes=d.scheduling_causes())
                 for d in (new, old)]
    assert decisions[0] == decisions[1]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=snapshots)
def test_same_diagnosis_as_the_reference(snap):
    assert_same(snap)


@pytest.mark.parametrize("seed", range(6))
def test_same_diagnosis_on_a_big_generated_cluster(seed):
    """A cluster of 300 nodes and 3,000 waiting jobs of every shape: many claims, many refusals
    remembered, and the fragmentation sums recomputed after claims."""
    rng = random.Random(seed)
    states = ["alloc"] * 6 + ["mix"] * 3 + ["idle", "drain", "down"]
    ns = []
    for i in range(300):
        st_ = rng.choice(states)
        total = rng.choice([4, 8, 8, 8])
        alloc = {"alloc": total, "idle": 0}.get(st_, rng.randint(0, total))
        ns.append(ClusterNode(f"n{i}", st_, total, alloc, rng.choice(["A100", "H100", ""]),
                              tuple(rng.sample(["gpu", "long", "debug"], rng.randint(0, 2)))))
    pend = [PendingJob(f"j{k}", rng.choice([1, 1, 2, 4, 8, 16]),
                       queue=rng.choice(["", "gpu", "long", "gpu,long", "debug"]),
                       gpu_model=rng.choice(["", "A100", "H100"]), nodes=rng.choice([0, 0, 1, 2]),
                       waited_s=rng.randint(0, 10 ** 5), est_runtime_s=rng.randint(60, 10 ** 5),
                       pending_reason=rng.choice(["Resources"] * 5 + REASONS),
                       exclusive=rng.random() < 0.1, interruptible=rng.random() < 0.3)
            for k in range(3000)]
    assert_same(QueueSnapshot("big", NOW, tuple(pend), tuple(ns)))
