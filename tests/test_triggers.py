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
                        "runtime) but within its class target, up to which schedule first holds a job: "
                        "burst_overdue_when_scheduling_bound = true would send it anyway")
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
    # no capacity-bound job: nothing goes, even overdue (within its class target)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(24, allocated=480), frag, "mixed", capacity_jobs=set())
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



@pytest.mark.parametrize("reason,counts", [
    ("ReqNodeNotAvail, UnavailableNodes:gpu-[1-2]", False),  # as squeue writes it (NOTES-slurm)
    ("ReqNodeNotAvail", False), ("Dependency", False), ("JobHeldAdmin, held by admin", False),
    ("Resources", True), ("Resources, extra words", True), ("", True),
    ("Priority,", False),
])
def test_a_reason_with_slurms_detail_after_a_comma_is_read_by_its_head(reason, counts):
    """Slurm writes some reasons with detail after a comma; the job waits for the same thing
    (nodes that are down or reserved, not capacity), so it is no burst candidate and its GPUs do
    not count as pending, as the diagnosis already reads it."""
    snap = QueueSnapshot(source="slurm", taken_at=0, nodes=(ClusterNode("n1", "alloc", 8, 8),),
                         pending=(PendingJob("j", 8, waited_s=9000, est_runtime_s=3600, pending_reason=reason),))
    assert signals_from_snapshot(snap).pending_gpus == (8 if counts else 0)
    assert [c.job.job_id for c in candidates_from_snapshot(snap)] == (["j"] if counts else [])


# ------------------------------------------------------------------ boundaries and reasons, exactly
from policies.causes import Verdict  # noqa: E402
from policies.classes import DEFAULT_CLASSES  # noqa: E402
from policies.triggers import Decision  # noqa: E402

URGENT = DEFAULT_CLASSES + (JobClass("urgent", 300.0, min_priority=1000),)
TARGETS = "; the lesser of the class target and 0.5 x runtime)"


@pytest.mark.parametrize("sig,verdict", [
    (Signals(1, 10, 0), "scheduling-bound"),  # one GPU pending is pending
    (Signals(1, 1, 0), "scheduling-bound"),  # a one-GPU cluster with it free
    (Signals(5, 10, 9), "resource-bound"),  # exactly 90 % allocated
    (Signals(5, 10, 8), "mixed"),
    (Signals(8, 10, 2), "scheduling-bound"),  # exactly as many GPUs free as pending
    (Signals(9, 10, 2), "mixed"),
    (Signals(8, 0, 0), "resource-bound"),  # no on-prem GPUs at all
])
def test_allocation_verdict_at_its_boundaries(sig, verdict):
    assert allocation_verdict(sig) == verdict


def test_fifo_wait_rule_classifies_by_label_qos_queue_and_priority_and_says_so():
    cfg = TriggerConfig(threshold_trigger=False, order="fifo", burst_verdicts=(), classes=URGENT)
    cs = [cand("q", gpus=1, qos="production", pred=2000), cand("q2", gpus=1, qos="prod", pred=1900),
          cand("u", gpus=2, queue="interactive", pred=1000), cand("l", gpus=4, job_class="latency", pred=700),
          cand("p", gpus=8, priority=1500, pred=400), cand("d", gpus=16, pred=3000),
          cand("r0", gpus=1, runtime=0, waited=20_000, pred=20_000), cand("r1", gpus=1, runtime=1, pred=20_000)]
    d, st = evaluate(cfg, TriggerState(), 0, busy(34), cs, "resource-bound")
    assert d == Decision(BURST, tuple(c for c in cs if c.job.job_id not in ("d", "r0")), (),
                         "burst 6 job(s), 17 GPUs, because the wait exceeds the wait target (class production "
                         "30 min: 2 jobs; class interactive 15 min: 1 job; class latency-sensitive 10 min: 1 job; "
                         "class urgent 5 min: 1 job; class default 4.0 h: 1 job" + TARGETS, "wait", None, 6)
    assert st == TriggerState(above_since=0, last_burst_at=None, tokens=512 - 17, tokens_at=0)


def test_a_single_job_names_its_class_without_a_count():
    cfg = TriggerConfig(threshold_trigger=False, order="fifo", burst_verdicts=())
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("q", qos="production", pred=2000)], "resource-bound")
    assert d.reason == ("burst 1 job(s), 8 GPUs, because the wait exceeds the wait target (class production "
                        "30 min" + TARGETS)


def test_ranked_wait_rule_keeps_a_class_the_caller_set_and_classifies_by_priority():
    custom = JobClass("custom", 100.0)
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, classes=URGENT)
    given = Candidate(PendingJob("c", 8, est_runtime_s=7200), 200.0, job_class=custom)
    by_priority = cand("p", gpus=4, priority=1500, pred=400)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(12), [given, by_priority], "resource-bound")
    assert d.job_ids == ("c", "p") and d.jobs[0].job_class == custom
    assert d.jobs[1].job_class.name == "urgent"
    assert "class custom 100 s: 1 job; class urgent 5 min: 1 job" in d.reason


def test_the_stabilization_and_cooldown_reasons_count_from_when_they_started():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=300, cooldown_s=120, wait_trigger=False,
                        selection=SEL)
    c = [cand("a", pred=1e4), cand("b", pred=1e4)]
    ds, _ = run(cfg, [(1000, busy(24), c, "resource-bound"), (1200, busy(24), c, "resource-bound"),
                      (1300, busy(24), c, "resource-bound"), (1360, busy(24), c[1:], "resource-bound")])
    assert ds[1].reason == ("did not burst, because 24 GPUs have been pending over the threshold for 200 s of "
                            "the 300 s window") and ds[1].wake_at == 1300
    assert ds[2].action == BURST and ds[2].job_ids == ("a", "b")
    assert ds[3].reason == "did not burst, because the last burst was 60 s ago (cooldown 120 s)"
    assert ds[3].wake_at == 1420


def test_pending_exactly_at_the_threshold_is_not_over_it():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, wait_trigger=False, selection=SEL)
    d, st = evaluate(cfg, TriggerState(), 5, busy(8), [cand("a", pred=1e4)], "resource-bound")
    assert d == Decision(HOLD, (), (), "did not burst, because 8 GPUs pending is not over the threshold of 8",
                         "", None)
    assert st.above_since is None
    d, _ = evaluate(cfg, TriggerState(), 5, busy(9), [cand("a", gpus=1, pred=1e4)], "resource-bound")
    assert d.action == BURST and d.job_ids == ("a",)  # an excess of one GPU is an excess


def test_wait_and_threshold_together_never_send_a_job_twice_and_the_threshold_counts_what_went():
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, selection=SEL)
    a, b, c = cand("a", waited=5000, pred=5000), cand("b", pred=3000), cand("c", pred=3000)
    d, st = evaluate(cfg, TriggerState(), 50, busy(24), [a, b, c], "resource-bound")
    assert d.job_ids == ("a", "b") and d.trigger == "wait+threshold" and d.n_wait == 1
    assert st.last_burst_at == 50
    # the wait rule alone brings the pending GPUs back to the threshold: the threshold does not fire
    d, st = evaluate(cfg, TriggerState(), 50, busy(16), [a, b], "resource-bound")
    assert d.job_ids == ("a",) and d.trigger == "wait" and st.last_burst_at is None and d.wake_at is None


def test_a_job_too_big_for_what_is_left_is_skipped_for_a_smaller_one():
    cfg = TriggerConfig(pending_gpus_threshold=4, stabilization_s=0, wait_trigger=False, selection=SEL,
                        max_gpus_in_flight=4)
    # 8 GPUs over the threshold; the first in rank needs 8, only 4 may go: the 4-GPU job goes
    d, _ = evaluate(cfg, TriggerState(), 0, busy(12), [cand("big", gpus=8, waited=99, pred=1e4),
                                                       cand("small", gpus=4, pred=1e4)], "resource-bound")
    assert d.job_ids == ("small",)


@pytest.mark.parametrize("order", ["ranked", "fifo"])
def test_a_numeric_class_label_is_read_as_the_priority_in_either_order(order):
    cfg = TriggerConfig(threshold_trigger=False, order=order, burst_verdicts=(), selection=SEL, classes=URGENT)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("n", job_class="1500", pred=400)], "resource-bound")
    assert d.job_ids == ("n",) and "(class urgent 5 min;" in d.reason
    # no priority at all is not priority 0: a class from priority 0 up does not take it
    floor = DEFAULT_CLASSES + (JobClass("floor", 300.0, min_priority=0),)
    cfg = TriggerConfig(threshold_trigger=False, order=order, burst_verdicts=(), selection=SEL, classes=floor)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("n", pred=400)], "resource-bound")
    assert d.action == HOLD


def test_limit_reasons_name_the_limit_that_binds():
    # in flight over the limit: even a one-GPU job waits
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, max_gpus_in_flight=16)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(1, cloud=20), [cand("one", gpus=1, waited=5000, pred=5000)],
                    "resource-bound")
    assert d == Decision(HOLD, (), (), "did not burst, because 20 cloud GPUs are already in flight (limit 16)",
                         "", None)
    # room for exactly the job, but not the tokens: the bucket is the reason
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, max_gpus_in_flight=16, max_burst_gpus_per_hour=12)
    st = TriggerState(tokens=4.0, tokens_at=100.0)
    d, _ = evaluate(cfg, st, 100, busy(8, cloud=8), [cand("j", gpus=8, waited=5000, pred=5000)], "resource-bound")
    assert d.reason == ("did not burst, because the burst-rate limit is spent (4 of 12 GPUs/h left, the smallest "
                        "job needs 8)")
    assert d.wake_at == pytest.approx(100 + 4 * 300)
    d, _ = evaluate(cfg, TriggerState(tokens=7.25, tokens_at=100.0), 100, busy(8, cloud=8),
                    [cand("j", gpus=8, waited=5000, pred=5000)], "resource-bound")
    assert d.wake_at == pytest.approx(100 + 0.75 * 300)  # a fraction of a GPU to wait for
    # a job bigger than the whole bucket never fits: no wake-up is promised for it
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16), [cand("huge", gpus=16, waited=5000, pred=5000)],
                    "resource-bound")
    assert "12 of 12 GPUs/h left, the smallest job needs 16" in d.reason and d.wake_at is None
    # one GPU over the threshold, none may go: the threshold's reason is the limit
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, wait_trigger=False, selection=SEL,
                        max_gpus_in_flight=4)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(9, cloud=4), [cand("a", pred=1e4)], "resource-bound")
    assert d.reason == "did not burst, because 4 cloud GPUs are already in flight (limit 4)"


def test_the_bucket_refills_from_when_it_was_last_spent():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, max_burst_gpus_per_hour=12)
    jobs = [cand(f"j{k}", gpus=4, waited=5000, pred=5000) for k in range(4)]
    d, st = evaluate(cfg, TriggerState(), 3600, busy(16), jobs, "resource-bound")
    assert d.gpus == 12 and st == TriggerState(above_since=3600, tokens=0.0, tokens_at=3600)
    d, st = evaluate(cfg, st, 3660, busy(4), jobs[3:], "resource-bound")
    assert d.action == HOLD and "burst-rate" in d.reason and st.tokens == pytest.approx(0.2)


def test_a_wait_burst_does_not_wait_for_the_bucket_the_threshold_found_spent():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, selection=SEL, max_burst_gpus_per_hour=8)
    d, _ = evaluate(cfg, TriggerState(), 10, busy(16), [cand("a", waited=5000, pred=5000), cand("b", pred=3000)],
                    "resource-bound")
    assert d.job_ids == ("a",) and d.trigger == "wait" and d.wake_at is None


def test_why_nothing_went_when_no_job_is_worth_sending_or_none_was_offered():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, wait_trigger=False, selection=SEL)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("short", runtime=10, pred=1e4)], "resource-bound")
    assert d.reason == ("did not burst, because no pending job is worth sending: each would wait only briefly "
                        "on-prem or run too short for a cloud start-up")
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [], "resource-bound")
    assert d == Decision(HOLD, (), (), "did not burst, because no pending job was offered", "", None)
    d, _ = evaluate(TriggerConfig(threshold_trigger=False), TriggerState(), 0, busy(0), [], "healthy")
    assert d.reason == "did not burst, because nothing asked for it"
    d, _ = evaluate(TriggerConfig(wait_trigger=False, burst_verdicts=("resource-bound",), stabilization_s=0),
                    TriggerState(), 0, busy(16), [cand("a", pred=1e4)], "mixed")
    assert d.reason == "did not burst, because the queue is mixed, and more GPUs do not fix that"


def test_several_overdue_jobs_held_by_a_scheduling_bound_queue_are_them():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL)
    old = [cand("a", waited=5000, pred=5000), cand("b", gpus=4, waited=5000, pred=5000)]
    d, _ = evaluate(cfg, TriggerState(), 0, busy(12, allocated=100), old, "scheduling-bound")
    assert d.reason == ("did not burst, because scheduling-bound: GPUs are free or wasted while jobs wait; "
                        "2 jobs (12 GPUs) wait past the wait target (class default 4.0 h: 2 jobs" + TARGETS
                        + " but within their class target, up to which schedule first holds a job: "
                        "burst_overdue_when_scheduling_bound = true would send them anyway")


def test_a_burst_names_each_trigger_and_its_verdict_and_carries_the_scale_in():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, scale_in_idle_s=300, selection=SEL)
    a = cand("a", waited=5000, pred=5000)
    b = cand("b", pred=3000)
    sig = busy(16, idle=[("cloud-2", 10.0), ("cloud-1", 0.0), ("cloud-3", 200.0)])
    d, _ = evaluate(cfg, TriggerState(), 310, sig, [a, b], Verdict.MIXED)
    assert d.job_ids == ("a", "b")
    assert d == Decision(BURST, d.jobs, ("cloud-2", "cloud-1"),
                         "burst 2 job(s), 16 GPUs, because the wait exceeds the wait target (class default 4.0 h"
                         + TARGETS + " and 16 GPUs pending stayed over the threshold of 0 for 0 s on a mixed queue",
                         "wait+threshold", 500.0, 1)


def test_scale_in_at_exactly_the_idle_window_with_nothing_else_to_wake_for():
    cfg = TriggerConfig(scale_in_idle_s=300, threshold_trigger=False)
    d, _ = evaluate(cfg, TriggerState(), 300, busy(0, idle=[("cloud-1", 0.0)]), [], "healthy")
    assert d == Decision(SCALE_IN, (), ("cloud-1",), "scale in 1 idle cloud node(s); did not burst, because "
                         "nothing asked for it", "", None)


@pytest.mark.parametrize("kw,message", [
    ({"stabilization_s": -1}, "stabilization_s must be zero or positive, got -1"),
    ({"scale_in_idle_s": -0.5}, "scale_in_idle_s must be zero or positive, got -0.5"),
    ({"pending_gpus_threshold": -1}, "pending_gpus_threshold must be zero or positive, got -1"),
    ({"max_gpus_in_flight": -1}, "max_gpus_in_flight must be >= 0 and max_burst_gpus_per_hour > 0"),
    ({"max_burst_gpus_per_hour": 0}, "max_gpus_in_flight must be >= 0 and max_burst_gpus_per_hour > 0"),
    ({"order": "random"}, "order must be 'ranked' or 'fifo', got 'random'"),
])
def test_config_refusals_say_which_setting_and_why(kw, message):
    with pytest.raises(ValueError) as e:
        TriggerConfig(**kw)
    assert str(e.value) == message


def test_config_limits_may_be_at_their_least():
    cfg = TriggerConfig(pending_gpus_threshold=0, max_gpus_in_flight=0, max_burst_gpus_per_hour=1,
                        stabilization_s=0, cooldown_s=0, scale_in_idle_s=0, wait_runtime_ratio=0)
    assert (cfg.max_gpus_in_flight, cfg.max_burst_gpus_per_hour) == (0, 1)


def test_snapshot_signals_default_to_nothing_in_flight_and_list_idle_nodes_by_name():
    snap = QueueSnapshot(source="slurm", taken_at=0, pending=(PendingJob("a", 8, pending_reason="Resources"),),
                         nodes=(ClusterNode("n1", "alloc", 8, 8),))
    assert signals_from_snapshot(snap) == Signals(8, 8, 8, 0, ())
    sig = signals_from_snapshot(snap, 3, {"z": 2.0, "a": 1.0})
    assert sig == Signals(8, 8, 8, 3, (("a", 1.0), ("z", 2.0)))
    # predictions that name none of the jobs: every job gets the queue's own estimate
    assert candidates_from_snapshot(snap, {"other": 1.0}) == candidates_from_snapshot(snap)


def test_eligibility_uses_the_configured_selection_thresholds():
    # 100 s of runtime: over the configured start-up of 60 s, under the default 120 s
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(8), [cand("short", runtime=100, pred=1000)], "resource-bound")
    assert d.job_ids == ("short",)
    d, _ = evaluate(TriggerConfig(threshold_trigger=False), TriggerState(), 0, busy(8),
                    [cand("short", runtime=100, pred=1000)], "resource-bound")
    assert d.action == HOLD


def test_the_scheduling_causes_are_quoted_whole_less_their_closing_stop():
    d, _ = evaluate(TriggerConfig(), TriggerState(), 0, busy(16, allocated=100), [], "scheduling-bound",
                    scheduling_causes="1 node drained. Fix: Resume node gX. ")
    assert d.reason == "did not burst, because scheduling-bound: 1 node drained. Fix: Resume node gX"


# -- the first-in-first-out order classes each job itself; classing keeps a candidate's figures ----

SHORT_DEFAULT = (JobClass("default", 3600.0),)


def test_fifo_holds_a_scheduling_bound_job_to_its_class_target_then_lets_it_go():
    cfg = TriggerConfig(pending_gpus_threshold=0, stabilization_s=0, order="fifo", classes=SHORT_DEFAULT)
    past = cand("past", waited=3601, pred=3601, runtime=7200)  # overdue and past the hour
    kept = cand("kept", waited=3600, pred=3700, runtime=7200)  # overdue, at the hour exactly
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16, allocated=200), [past, kept], "scheduling-bound")
    assert d.action == BURST and d.job_ids == ("past",)
    assert "schedule first holds a job only up to its class target, and 1 job passed it" in d.reason
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16, allocated=200), [kept], "scheduling-bound")
    assert d.action == HOLD and "1 job (8 GPUs)" in d.reason


def test_fifo_under_mixed_sends_a_scheduling_job_past_its_class_target_by_the_wait_rule():
    cfg = TriggerConfig(pending_gpus_threshold=64, stabilization_s=0, order="fifo", classes=SHORT_DEFAULT)
    cap = cand("cap", waited=10, pred=10, runtime=7200)
    sched = cand("sched", waited=4000, pred=4000, runtime=7200)
    young = cand("young", waited=3000, pred=4000, runtime=7200)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(24, allocated=400), [sched, young, cap], "mixed",
                    capacity_jobs={"cap"})
    assert d.action == BURST and d.job_ids == ("sched",) and d.trigger == "wait"


def test_past_class_target_and_target_s_class_an_unclassed_candidate_by_the_config():
    from policies.triggers import past_class_target, target_s

    cfg = TriggerConfig(classes=(JobClass("urgent", 600.0, match=("urgent",)), JobClass("default", 7200.0)))
    urgent = cand("u", waited=601, runtime=100_000, qos="urgent")
    plain = cand("p", waited=601, runtime=100_000)
    assert past_class_target(cfg, urgent) and not past_class_target(cfg, plain)
    assert (target_s(cfg, urgent), target_s(cfg, plain)) == (600.0, 7200.0)


def test_classing_keeps_each_candidates_prediction_price_ratio_and_start_up():
    from policies.triggers import classed

    cfg = TriggerConfig(classes=(JobClass("urgent", 600.0, match=("urgent",)), JobClass("default", 7200.0)))
    job = PendingJob(job_id="a", gpus=8, est_runtime_s=3600, waited_s=10, qos="urgent")
    (c,) = classed(cfg, [Candidate(job, 123.0, 0.25, 45.0)])
    assert (c.job, c.predicted_wait_s, c.price_ratio, c.startup_s, c.job_class.name) == (job, 123.0, 0.25, 45.0,
                                                                                        "urgent")
    (d,) = classed(cfg, [Candidate(job, 5.0)])
    assert (d.price_ratio, d.startup_s) == (1.0, None)


def test_candidates_from_a_snapshot_with_classes_keep_their_jobs_and_predictions():
    classes = (JobClass("urgent", 600.0, match=("urgent",)), JobClass("default", 7200.0))
    jobs = (PendingJob(job_id="old", gpus=8, est_runtime_s=3600, waited_s=900, qos="urgent"),
            PendingJob(job_id="new", gpus=8, est_runtime_s=3600, waited_s=100))
    snap = QueueSnapshot(source="slurm", taken_at=0, pending=jobs, nodes=(ClusterNode("n1", "alloc", 8, 8),))
    out = candidates_from_snapshot(snap, {"old": 1000.0, "new": 250.0}, classes)
    assert [(c.job, c.predicted_wait_s, c.price_ratio, c.job_class.name) for c in out] == [
        (jobs[0], 1000.0, 1.0, "urgent"), (jobs[1], 250.0, 1.0, "default")]
