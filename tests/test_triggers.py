"""Burst triggers: hysteresis, diagnosis gate, wait rule, cooldown, limits, scale-in."""
import pytest

from policies.classes import JobClass
from policies.queue import ClusterNode, PendingJob, QueueSnapshot
from policies.selection import Candidate, SelectionConfig
from policies.triggers import (
    BURST, HOLD, SCALE_IN, Signals, TriggerConfig, TriggerState, allocation_verdict,
    candidates_from_snapshot, evaluate, fluid_wait_s, signals_from_snapshot,
)

SEL = SelectionConfig(min_wait_share=0.0, startup_s=60, min_runtime_startups=1)


def cand(jid, gpus=8, runtime=7200, waited=0, pred=0.0, **kw):
    return Candidate(PendingJob(job_id=jid, gpus=gpus, est_runtime_s=runtime, waited_s=waited, **kw), pred)


def busy(pending, allocated=512, total=512, cloud=0, idle=()):
    return Signals(pending, total, allocated, cloud, tuple(idle))


def run(cfg, steps):
    """Feed (now, signals, candidates, verdict) steps through evaluate; return the decisions."""
    st = TriggerState()
    out = []
    for now, sig, cands, verdict in steps:
        d, st = evaluate(cfg, st, now, sig, cands, verdict)
        out.append(d)
    return out, st


def test_threshold_must_hold_for_the_stabilization_window():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=300, wait_trigger=False, selection=SEL)
    c = [cand("a", waited=100, pred=5000)]
    ds, _ = run(cfg, [(0, busy(16), c, "resource-bound"), (200, busy(16), c, "resource-bound"),
                      (300, busy(16), c, "resource-bound")])
    assert ds[0].action == HOLD and "0 s of the 300 s window" in ds[0].reason
    assert ds[0].wake_at == 300
    assert ds[1].action == HOLD and "200 s of the 300 s window" in ds[1].reason
    assert ds[2].action == BURST and ds[2].job_ids == ("a",) and ds[2].trigger == "threshold"
    assert "over the threshold of 8" in ds[2].reason


def test_dipping_under_the_threshold_restarts_the_window():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=300, wait_trigger=False, selection=SEL)
    c = [cand("a", waited=100, pred=5000)]
    ds, st = run(cfg, [(0, busy(16), c, "resource-bound"), (250, busy(4), [], "resource-bound"),
                       (400, busy(16), c, "resource-bound"), (650, busy(16), c, "resource-bound")])
    assert "not over the threshold" in ds[1].reason
    assert st.above_since == 400
    assert ds[3].action == HOLD  # only 250 s since it rose again


def test_scheduling_bound_queue_bursts_nothing_by_default_and_overdue_jobs_only_by_opt_in():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, selection=SEL)
    waiting = cand("fresh", waited=10, pred=100, runtime=7200)
    overdue = cand("old", waited=4000, pred=4000, runtime=7200)  # waited > half its runtime
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16, allocated=200), [waiting], "scheduling-bound")
    assert d.action == HOLD and "scheduling-bound" in d.reason and d.reason.startswith("did not burst, because")
    assert "burst_overdue_when_scheduling_bound" not in d.reason  # nothing is overdue yet
    # schedule first: the overdue job does not go either, and the decision says why
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16, allocated=200), [waiting, overdue], "scheduling-bound",
                    scheduling_causes="1 node drained with 8 GPUs out of service (g3: ECC). "
                                      "Fix: Repair the drained nodes.")
    assert d.action == HOLD and not d.jobs
    assert d.reason == ("did not burst, because scheduling-bound: 1 node drained with 8 GPUs out of "
                        "service (g3: ECC). Fix: Repair the drained nodes; 1 job (8 GPUs) waits past "
                        "the wait target (class default 4.0 h; the lesser of the class target and 0.5 x "
                        "runtime): burst_overdue_when_scheduling_bound = true would send it anyway")
    # the explicit opt-in sends the longest waiters anyway
    opt_in = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, selection=SEL,
                           burst_overdue_when_scheduling_bound=True)
    d, _ = evaluate(opt_in, TriggerState(), 0, busy(16, allocated=200), [waiting, overdue], "scheduling-bound")
    assert d.action == BURST and d.job_ids == ("old",) and d.trigger == "wait" and d.n_wait == 1
    # naming scheduling-bound among the threshold's verdicts is an opt-in too
    d, _ = evaluate(TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, selection=SEL,
                                  wait_trigger=False, burst_verdicts=("scheduling-bound",)),
                    TriggerState(), 0, busy(16, allocated=200), [waiting, overdue], "scheduling-bound")
    assert d.action == BURST and d.trigger == "threshold"


def test_mixed_queue_bursts_only_what_capacity_can_fix():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, selection=SEL,
                        burst_verdicts=("resource-bound", "mixed"))
    cap = [cand(f"c{i}", gpus=8, waited=4000, pred=4000) for i in range(2)]  # need capacity
    frag = [cand(f"f{i}", gpus=8, waited=5000, pred=5000, exclusive=True) for i in range(3)]
    everyone = frag + cap
    d, _ = evaluate(cfg, TriggerState(), 0, busy(40, allocated=480), everyone, "mixed",
                    capacity_jobs={"c0", "c1"})
    assert d.action == BURST and set(d.job_ids) == {"c0", "c1"}, d.reason
    # only 16 GPUs of the 40 are capacity's: one job brings them back to the threshold of 8
    d, _ = evaluate(TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, selection=SEL,
                                  wait_trigger=False, burst_verdicts=("mixed",)),
                    TriggerState(), 0, busy(40, allocated=480), everyone, "mixed", capacity_jobs={"c0", "c1"})
    assert d.job_ids == ("c0",) and "16 GPUs pending" in d.reason
    # no capacity-bound job: nothing goes, even overdue
    d, _ = evaluate(cfg, TriggerState(), 0, busy(40, allocated=480), frag, "mixed", capacity_jobs=set())
    assert d.action == HOLD and "0 GPUs pending is not over the threshold" in d.reason
    # without the diagnosis' job list (the simulator's allocation-only verdict) every job counts
    d, _ = evaluate(cfg, TriggerState(), 0, busy(40, allocated=480), everyone, "mixed")
    assert {"f0", "f1", "f2"} <= set(d.job_ids)


def test_predicted_wait_alone_fires_the_wait_rule():
    # the runtime rule alone (a class with no wait target): policies.classes has the class rule
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, classes=(JobClass("default"),))
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("p", waited=0, pred=5000, runtime=7200)], "healthy")
    assert d.action == BURST and d.trigger == "wait"
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("p", waited=0, pred=3000, runtime=7200)], "healthy")
    assert d.action == HOLD


def test_cooldown_between_threshold_bursts():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, cooldown_s=120, wait_trigger=False, selection=SEL)
    c1, c2 = [cand("a", pred=1e4)], [cand("b", pred=1e4)]
    ds, _ = run(cfg, [(0, busy(8), c1, "resource-bound"), (60, busy(8), c2, "resource-bound"),
                      (120, busy(8), c2, "resource-bound")])
    assert ds[0].action == BURST
    assert ds[1].action == HOLD and "cooldown 120 s" in ds[1].reason and ds[1].wake_at == 120
    assert ds[2].action == BURST and ds[2].job_ids == ("b",)


def test_threshold_burst_sends_only_the_excess_in_rank_order():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, wait_trigger=False, selection=SEL)
    cands = [cand("old-train", gpus=8, waited=900, pred=1e4),
             cand("ckpt", gpus=4, waited=100, pred=1e4, interruptible=True),
             cand("eval", gpus=4, waited=100, pred=1e4, kind="eval"),
             cand("other", gpus=4, waited=50, pred=1e4)]
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16), cands, "resource-bound")
    assert d.job_ids == ("ckpt", "eval")  # 8 GPUs of excess, interruptible and eval first
    fifo = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, wait_trigger=False, order="fifo",
                         burst_verdicts=())
    d, _ = evaluate(fifo, TriggerState(), 0, busy(16), cands, "scheduling-bound")
    assert d.job_ids == ("old-train",)  # naive: oldest first, no gate


def test_in_flight_limit_and_burst_rate_bucket():
    cfg = TriggerConfig(threshold_trigger=False, max_gpus_in_flight=16, max_burst_gpus_per_hour=12, selection=SEL)
    overdue = [cand(f"j{k}", gpus=4, waited=5000, pred=5000, runtime=7200) for k in range(5)]
    d, st = evaluate(cfg, TriggerState(), 0, busy(20, cloud=8), overdue, "resource-bound")
    assert d.gpus == 8  # 16 in flight allowed, 8 already there
    d, st = evaluate(cfg, TriggerState(), 0, busy(20, cloud=16), overdue, "resource-bound")
    assert d.action == HOLD and "16 cloud GPUs are already in flight (limit 16)" in d.reason
    # The bucket holds 12 GPUs: 12 go at t=0, then nothing until it refills (1 GPU per 300 s).
    d, st = evaluate(cfg, TriggerState(), 0, busy(20), overdue, "resource-bound")
    assert d.gpus == 12
    d, st2 = evaluate(cfg, st, 60, busy(8), overdue[3:], "resource-bound")
    assert d.action == HOLD and "burst-rate limit" in d.reason
    assert d.wake_at == pytest.approx(60 + (4 - 0.2) * 300)
    d, _ = evaluate(cfg, st2, 1200, busy(8), overdue[3:], "resource-bound")
    assert d.gpus == 4


def test_scale_in_after_the_idle_window():
    cfg = TriggerConfig(scale_in_idle_s=300, selection=SEL)
    sig = busy(0, allocated=100, idle=[("cloud-1", 0.0), ("cloud-2", 200.0)])
    d, _ = evaluate(cfg, TriggerState(), 350, sig, [], "healthy")
    assert d.action == SCALE_IN and d.scale_in == ("cloud-1",) and d.wake_at == 500
    d, _ = evaluate(cfg, TriggerState(), 100, sig, [], "healthy")
    assert d.action == HOLD and d.scale_in == ()


def test_config_and_verdict_validation():
    with pytest.raises(ValueError):
        TriggerConfig(stabilization_s=-1)
    with pytest.raises(ValueError):
        TriggerConfig(order="random")
    with pytest.raises(ValueError):
        TriggerConfig(burst_verdicts=("busy",))
    with pytest.raises(ValueError):
        evaluate(TriggerConfig(), TriggerState(), 0, busy(0), [], "stuck")


def test_allocation_verdict():
    assert allocation_verdict(busy(0)) == "healthy"
    assert allocation_verdict(busy(16, allocated=500)) == "resource-bound"
    assert allocation_verdict(busy(16, allocated=100)) == "scheduling-bound"
    assert allocation_verdict(busy(160, allocated=400)) == "mixed"


def test_snapshot_adapters_skip_non_capacity_reasons_and_predict_in_order():
    snap = QueueSnapshot(
        source="slurm", taken_at=0,
        pending=(PendingJob("held", 8, waited_s=9000, est_runtime_s=3600, pending_reason="JobHeldUser"),
                 PendingJob("first", 8, waited_s=600, est_runtime_s=3600, pending_reason="Resources"),
                 PendingJob("second", 8, waited_s=60, est_runtime_s=3600, pending_reason="Resources")),
        nodes=(ClusterNode("n1", "alloc", 8, 8), ClusterNode("n2", "mix", 8, 4)),
    )
    sig = signals_from_snapshot(snap, cloud_gpus_in_flight=4, idle_cloud_nodes={"c1": 5.0})
    assert (sig.pending_gpus, sig.gpus_total, sig.gpus_allocated) == (16, 16, 12)
    assert sig.idle_cloud_nodes == (("c1", 5.0),)
    cs = candidates_from_snapshot(snap)
    assert [c.job.job_id for c in cs] == ["first", "second"]
    # first: 8 GPUs, 4 free, nothing ahead -> waits for the work ahead (none): its own wait so far
    assert cs[0].predicted_wait_s == 600 + fluid_wait_s(8, 0, 4, 16)
    # second sits behind first's 8 x 3600 GPU-s on 16 GPUs
    assert cs[1].predicted_wait_s == pytest.approx(60 + 8 * 3600 / 16)
    assert candidates_from_snapshot(snap, {"first": 42.0})[0].predicted_wait_s == 42.0
