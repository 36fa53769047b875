"""``[kubernetes] enabled = true`` against the fake API server gives the verdict and the burst
decision of the equivalent Slurm queue: one cluster (tests/kube_equivalent.py) written as
squeue/sinfo JSON and as pods, Workloads and nodes, both watchers built by the scheduler
registry from one configuration, both snapshots diagnosed and decided on as the autoscaler does."""
from __future__ import annotations

import time

import pytest

from broker import config as cfgmod
from broker.watchers.registry import build_watchers
from broker_sandbox.kubernetes import FakeKubeApi
from policies.diagnose import diagnose
from policies.triggers import (
    TriggerState,
    candidates_from_snapshot,
    evaluate,
    signals_from_snapshot,
)
from tests.kube_equivalent import OVERDUE, RESOURCE_BOUND, SCHEDULING_BOUND, Cluster

pytestmark = pytest.mark.timeout(120)
AUTOSCALER = {"enabled": True, "trigger": {"stabilization_s": 0, "cooldown_s": 0}}


@pytest.fixture
def kube():
    api = FakeKubeApi().start()
    yield api
    api.stop()


def decide(cfg, snap, now):
    """The autoscaler's pass over one snapshot (broker.autoscaler.Autoscaler.on_snapshot), no history."""
    trig = cfg.autoscaler.trigger_config()
    diag = diagnose(snap, [], now=now, thresholds=cfg.autoscaler.diagnose_config())
    decision, _ = evaluate(trig, TriggerState(), now, signals_from_snapshot(snap),
                           candidates_from_snapshot(snap, classes=trig.classes), diag.verdict,
                           capacity_jobs=diag.capacity_jobs, scheduling_causes=diag.scheduling_causes())
    return diag, decision


def both(cluster: Cluster, kube, tmp_path):
    now = int(time.time())
    cluster.load_into(kube, now)
    cfg = cfgmod.load(None, environ={}, overrides={
        "autoscaler": AUTOSCALER, "slurm": cluster.slurm_table(tmp_path / "slurm", now),
        "kubernetes": {"enabled": True, "cluster": "eq", "bootstrap": "",
                       "kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig"))}})
    watchers = build_watchers(cfg)
    assert set(watchers) == {"slurm:eq", "kubernetes:eq"}
    try:
        snaps = {name: w.snapshot(now) for name, w in watchers.items()}
    finally:
        watchers["kubernetes:eq"].stop()
    return cfg, now, snaps["slurm:eq"], snaps["kubernetes:eq"]


def same_queue(cluster, slurm, k8s):
    """Job by job, node by node: the records the diagnosis reads are the same."""
    fields = ("gpus", "nodes", "waited_s", "time_limit_s", "est_runtime_s", "pending_reason", "interruptible",
              "checkpoint_minutes", "kind", "priority")
    s = {j.job_id: tuple(getattr(j, f) for f in fields) + (j.gpu_model.lower(),) for j in slurm.pending}
    k = {cluster.kube_id(j.job_id): tuple(getattr(j, f) for f in fields) + (j.gpu_model.lower(),)
         for j in k8s.pending}
    assert k == s
    # Slurm's class label is the QOS, Kubernetes' the priority class: the same class either way
    assert {j.job_id: j.qos for j in slurm.pending} == {cluster.kube_id(j.job_id): j.job_class for j in k8s.pending}
    node = lambda n: (n.name, n.state, n.gpus_total, n.gpus_allocated, n.gpus_free, n.gpu_model.lower())
    assert [node(n) for n in k8s.nodes] == [node(n) for n in slurm.nodes]
    run = lambda r: (r.gpus, r.nodes, r.runtime_s, r.time_limit_s, r.est_runtime_s)
    assert {cluster.kube_id(r.job_id): run(r) for r in k8s.running} == {r.job_id: run(r) for r in slurm.running}


def same_decision(cluster, diags, decisions):
    (sd, kd), (sdec, kdec) = diags, decisions
    assert kd.verdict == sd.verdict
    assert (kd.allocation_rate, kd.pending_gpus, kd.gpus_total, kd.gpus_allocated, kd.gpus_free) == \
           (sd.allocation_rate, sd.pending_gpus, sd.gpus_total, sd.gpus_allocated, sd.gpus_free)
    causes = lambda d, ids: [(c.kind, sorted(map(ids, c.jobs)), sorted(c.nodes), c.gpus) for c in d.causes]
    assert causes(kd, cluster.kube_id) == causes(sd, str)
    assert {cluster.kube_id(j) for j in kd.capacity_jobs} == set(sd.capacity_jobs)
    assert (kdec.action, kdec.trigger, kdec.scale_in) == (sdec.action, sdec.trigger, sdec.scale_in)
    assert [cluster.kube_id(c.job.job_id) for c in kdec.jobs] == [c.job.job_id for c in sdec.jobs]
    assert [c.job_class for c in kdec.jobs] == [c.job_class for c in sdec.jobs]


def test_a_resource_bound_kubernetes_queue_bursts_the_jobs_the_same_slurm_queue_bursts(kube, tmp_path):
    cfg, now, slurm, k8s = both(RESOURCE_BOUND, kube, tmp_path)
    same_queue(RESOURCE_BOUND, slurm, k8s)
    (sd, sdec), (kd, kdec) = decide(cfg, slurm, now), decide(cfg, k8s, now)
    assert sd.verdict == "resource-bound" and sdec.action == "burst", sdec.reason
    same_decision(RESOURCE_BOUND, (sd, kd), (sdec, kdec))
    # the threshold trigger sends every job more capacity would start; the held one stays
    assert {c.job.job_id for c in sdec.jobs} == {"101", "102", "103", "104", "106"}
    # the sentence differs only in the job names
    reason = kdec.reason
    for c in kdec.jobs:
        reason = reason.replace(c.job.job_id, RESOURCE_BOUND.kube_id(c.job.job_id))
    assert reason == sdec.reason


def test_a_scheduling_bound_kubernetes_queue_holds_as_the_same_slurm_queue_does(kube, tmp_path):
    cfg, now, slurm, k8s = both(SCHEDULING_BOUND, kube, tmp_path)
    same_queue(SCHEDULING_BOUND, slurm, k8s)
    (sd, sdec), (kd, kdec) = decide(cfg, slurm, now), decide(cfg, k8s, now)
    assert sd.verdict == "scheduling-bound" and sdec.action != "burst", sdec.reason
    assert {c.kind for c in sd.causes} >= {"fragmentation", "drained-nodes"}
    same_decision(SCHEDULING_BOUND, (sd, kd), (sdec, kdec))


def test_an_overdue_job_of_a_short_kubernetes_queue_goes_out_by_the_wait_trigger_as_on_slurm(kube, tmp_path):
    cfg, now, slurm, k8s = both(OVERDUE, kube, tmp_path)
    same_queue(OVERDUE, slurm, k8s)
    (sd, sdec), (kd, kdec) = decide(cfg, slurm, now), decide(cfg, k8s, now)
    assert sdec.action == "burst" and sdec.trigger == "wait", sdec.reason
    # the wait predictor plays the queue forward from the running jobs' limits: both are overdue
    assert [c.job.job_id for c in sdec.jobs] == ["301", "302"]
    same_decision(OVERDUE, (sd, kd), (sdec, kdec))
