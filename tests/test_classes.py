"""Job classes and their wait targets: matching, the wait rule, decisions, configuration."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from broker.config import ConfigError, load
from policies.classes import DEFAULT_CLASSES, JobClass, classify, merge_classes, wait_target_s
from policies.queue import ClusterNode, PendingJob, QueueSnapshot
from policies.selection import Candidate, SelectionConfig
from policies.triggers import BURST, HOLD, Signals, TriggerConfig, TriggerState, candidates_from_snapshot, evaluate

SEL = SelectionConfig(min_wait_share=0.0, startup_s=60, min_runtime_startups=1)
WEEK = 7 * 86400


def cand(jid, runtime=WEEK, waited=0, pred=0.0, gpus=8, **kw):
    return Candidate(PendingJob(job_id=jid, gpus=gpus, est_runtime_s=runtime, waited_s=waited, **kw), pred)


def busy(pending=8):
    return Signals(pending, 512, 512)


@pytest.mark.parametrize("label,qos,queue,priority,name", [
    ("LS", "", "", None, "latency-sensitive"),
    ("", "Production", "", None, "production"),
    ("", "", "debug", None, "interactive"),
    ("guaranteed", "low", "", None, "guaranteed"),  # the explicit label first
    ("", "normal", "gpu", None, "default"),
    ("6214e9", "", "", None, "default"),  # a Philly virtual cluster names no class
    ("", "", "", 5000, "default"),  # no class says min_priority
])
def test_a_job_is_classed_from_what_its_scheduler_says(label, qos, queue, priority, name):
    assert classify(DEFAULT_CLASSES, label, qos, queue, priority).name == name


def test_priority_names_a_class_when_a_class_asks_for_it():
    classes = merge_classes({"urgent": JobClass("urgent", 60.0, min_priority=10000)})
    assert classify(classes, "", "normal", "gpu", 20000).name == "urgent"
    assert classify(classes, "15000").name == "urgent"  # a numeric trace priority column
    assert classify(classes, "", "normal", "gpu", 9999).name == "default"


def test_the_wait_target_is_the_lesser_of_the_runtime_rule_and_the_class_target():
    prod = JobClass("production", 1800.0)
    assert wait_target_s(600, 0, prod, 0.5) == 300  # a short job: half its runtime
    assert wait_target_s(WEEK, 0, prod, 0.5) == 1800  # a week-long one: the class target
    assert wait_target_s(0, 7200, prod, 0.5) == 1800  # no runtime: the time limit stands in
    assert wait_target_s(0, 0, prod, 0.5) == 1800  # neither: the class target
    assert math.isinf(wait_target_s(0, 0, JobClass("x"), 0.5))


def test_a_week_long_job_goes_when_its_predicted_wait_passes_its_class_target_and_the_decision_names_it():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("svc", pred=2000, qos="prod")], "resource-bound")
    assert d.action == BURST and d.job_ids == ("svc",) and d.trigger == "wait"
    assert "class production 30 min" in d.reason and "0.5 x runtime" in d.reason
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("svc", pred=1700, qos="prod")], "resource-bound")
    assert d.action == HOLD  # within its target: it stays
    # under the old rule alone it would wait three and a half days
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("svc", pred=15000, job_class="best-effort")],
                    "resource-bound")
    assert d.action == BURST and "class default 4.0 h" in d.reason  # no built-in "best-effort"


def test_a_job_with_no_runtime_goes_at_its_class_target_only():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("u", runtime=0, pred=700, job_class="ls")], "resource-bound")
    assert d.action == BURST and "class latency-sensitive 10 min" in d.reason
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("u", runtime=0, pred=500, job_class="ls")], "resource-bound")
    assert d.action == HOLD


def test_a_class_that_may_not_burst_stays_and_one_kept_off_spot_takes_no_spot():
    classes = merge_classes({"onprem": JobClass("onprem", 60.0, burst=False),
                             "nospot": JobClass("nospot", 60.0, spot=False)})
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, classes=classes)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("a", pred=1e5, job_class="onprem")], "resource-bound")
    assert d.action == HOLD
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("b", pred=1e5, job_class="nospot", interruptible=True)],
                    "resource-bound")
    assert d.action == BURST and d.jobs[0].job.interruptible is False


def test_higher_classes_go_first_when_the_limits_leave_room_for_one():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, max_gpus_in_flight=8)
    cands = [cand("batch", pred=1e5), cand("ls", pred=1e5, job_class="latency-sensitive")]
    d, _ = evaluate(cfg, TriggerState(), 0, busy(16), cands, "resource-bound")
    assert d.job_ids == ("ls",)


def test_schedule_first_holds_a_job_up_to_its_class_target_and_not_a_second_past_it():
    """Scheduling-bound: the scheduling fix is the operator's and may never come, so schedule
    first holds an overdue job only while the wait it has suffered is within its class's
    target; past it, the job goes and the decision names the class and the target."""
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL)
    # a 20-minute production job, overdue at 10 min (its runtime share), held up to 30 min
    at = cand("p", runtime=1200, waited=1800, pred=1800, qos="prod")
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [at], "scheduling-bound")
    assert d.action == HOLD and "scheduling-bound" in d.reason and "but within its class target" in d.reason
    past = cand("p", runtime=1200, waited=1801, pred=0, qos="prod")
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [past], "scheduling-bound")
    assert d.action == BURST and d.job_ids == ("p",) and d.trigger == "wait"
    assert d.reason == ("burst 1 job(s), 8 GPUs, because the wait exceeds the wait target (class production "
                        "30 min; the lesser of the class target and 0.5 x runtime); the queue is "
                        "scheduling-bound, but schedule first holds a job only up to its class target, "
                        "and 1 job passed it")
    # predicted past it is not enough: on a queue that waits on scheduling the GPU-count
    # predictor is no guide (the wait rule would send it at once on any other queue)
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("svc", pred=1e5, qos="prod")], "scheduling-bound")
    assert d.action == HOLD and "class production 30 min" in d.reason
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("svc", pred=1e5, qos="prod")], "resource-bound")
    assert d.action == BURST
    # past its runtime share (2 h of a 4 h job) but within the default class's 4 hours: held
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("b", runtime=4 * 3600, waited=7201)],
                    "scheduling-bound")
    assert d.action == HOLD and "but within its class target" in d.reason
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("b", runtime=4 * 3600, waited=14401)],
                    "scheduling-bound")
    assert d.action == BURST and "class default 4.0 h" in d.reason


def test_schedule_first_never_releases_a_class_with_no_target_or_one_that_never_bursts():
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL,
                        classes=(JobClass("onprem", 600.0, burst=False), JobClass("default")))
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("x", waited=10 ** 7)], "scheduling-bound")
    assert d.action == HOLD  # no class target: the runtime share alone, which schedule first holds
    d, _ = evaluate(cfg, TriggerState(), 0, busy(), [cand("y", waited=10 ** 7, job_class="onprem")],
                    "scheduling-bound")
    assert d.action == HOLD


def test_under_mixed_a_job_waiting_on_scheduling_goes_past_its_class_target_and_counts_for_no_threshold():
    """Mixed: a whole-node job the free GPUs hold by count waits on scheduling, so it neither
    counts as pending nor goes, until its wait passes its class target; then the wait rule
    sends it, and the threshold still counts only the capacity jobs' GPUs."""
    cfg = TriggerConfig(pending_gpus_threshold=8, stabilization_s=0, selection=SEL)
    frag = cand("frag", runtime=1200, waited=1000, qos="prod")  # overdue by its runtime share
    cap = [cand(f"c{i}", waited=10, pred=10) for i in range(2)]  # 16 GPUs of capacity's
    sig = Signals(24, 512, 480)
    d, _ = evaluate(cfg, TriggerState(), 0, sig, [frag, *cap], "mixed", capacity_jobs={"c0", "c1"})
    assert d.job_ids == ("c0",) and "16 GPUs pending" in d.reason  # frag neither counts nor goes
    late = cand("frag", runtime=1200, waited=1801, qos="prod")
    d, _ = evaluate(cfg, TriggerState(), 0, sig, [late, *cap], "mixed", capacity_jobs={"c0", "c1"})
    assert d.job_ids == ("frag", "c0") and d.n_wait == 1 and d.trigger == "wait+threshold"
    assert "class production 30 min" in d.reason and "16 GPUs pending" in d.reason
    assert "the queue is mixed, but schedule first holds a job only up to its class target" in d.reason


def test_snapshot_candidates_carry_their_class():
    snap = QueueSnapshot("s", 0, pending=(PendingJob("1", 8, queue="interactive", est_runtime_s=3600),),
                         nodes=(ClusterNode("n", "alloc", 8, 8),))
    (c,) = candidates_from_snapshot(snap, classes=DEFAULT_CLASSES)
    assert c.job_class.name == "interactive"


@settings(max_examples=200, deadline=None)
@given(runtime=st.one_of(st.just(0), st.integers(0, 10**9)),
       limit=st.one_of(st.just(0), st.integers(0, 10**9)),
       target=st.one_of(st.floats(0, 1e9), st.just(math.inf)),
       ratio=st.floats(0, 100),
       label=st.text(max_size=80))
def test_the_target_never_exceeds_the_class_target_nor_the_runtime_rule(runtime, limit, target, ratio, label):
    cls = JobClass("c", target)
    t = wait_target_s(runtime, limit, cls, ratio)
    assert t <= target
    run = runtime or limit
    if run:
        assert t <= ratio * run
    assert classify(merge_classes({"c": cls}), label).name in {c.name for c in merge_classes({"c": cls})}


def _cfg(tmp_path, text):
    p = tmp_path / "b.toml"
    p.write_text(text)
    return load(p, environ={})


def test_classes_are_configured_key_by_key_over_the_built_in_ones(tmp_path):
    cfg = _cfg(tmp_path, '[autoscaler.classes.production]\nmax_wait_s = 600\n'
                         '[autoscaler.classes.research]\nmax_wait_s = 14400\nmatch = ["res", "research"]\nspot = true\n')
    classes = {c.name: c for c in cfg.autoscaler.trigger_config().classes}
    assert classes["production"].max_wait_s == 600 and "prod" in classes["production"].labels
    assert classes["research"].max_wait_s == 14400 and classes["research"].labels == ("res", "research")
    assert classes["default"].max_wait_s == 14400


@pytest.mark.parametrize("text,key", [
    ('[autoscaler.classes.production]\nmax_wait_s = -1\n', "max_wait_s"),
    ('[autoscaler.classes.production]\nmax_wait = 60\n', "max_wait"),
    ('[autoscaler.classes.production]\nmax_wait_s = "soon"\n', "max_wait_s"),
    ('[autoscaler.classes."a b"]\nmax_wait_s = 60\n', "classes"),
    ('[autoscaler.classes.production]\nmatch = ["\\u0000"]\nmax_wait_s = nan\n', "max_wait_s"),
])
def test_a_careless_class_table_is_refused_with_one_sentence(tmp_path, text, key):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, text)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_a_job_class_is_refused_with_its_reason():
    with pytest.raises(ValueError, match=r"^name of a job class must be 1 to 64 characters, got ''$"):
        JobClass("")
    with pytest.raises(ValueError, match=r"^name of a job class must be 1 to 64 characters, got 'x{65}'$"):
        JobClass("x" * 65)
    assert JobClass("x" * 64).name == "x" * 64
    with pytest.raises(ValueError, match=r"^max_wait_s must be zero or positive, got -1$"):
        JobClass("a", max_wait_s=-1)
    assert JobClass("a", max_wait_s=0).max_wait_s == 0


def test_wait_targets_are_written_in_seconds_minutes_or_hours_at_their_edges():
    from policies.classes import fmt_wait

    assert [fmt_wait(s) for s in (math.inf, 119, 120, 5400, 7199, 7200, 9000)] == [
        "none", "119 s", "2 min", "90 min", "120 min", "2.0 h", "2.5 h"]


def test_an_unknown_class_name_is_the_default_class():
    from policies.classes import class_named

    assert class_named(DEFAULT_CLASSES, "interactive") is DEFAULT_CLASSES[1]
    assert class_named(DEFAULT_CLASSES, "nope") is DEFAULT_CLASSES[-1]
    assert class_named((JobClass("a"),), "nope") == JobClass("default")


def test_classify_by_name_and_by_the_highest_priority_bar_reached():
    heavy = JobClass("Gpu-Heavy", match=("big",))
    assert classify((heavy,), label="gpu-heavy") is heavy  # its name names it too, in any case
    low, high, zero = JobClass("low", min_priority=10), JobClass("high", min_priority=100), JobClass("zero", min_priority=0)
    classes = (low, high, *DEFAULT_CLASSES)
    assert classify(classes, priority=150) is high and classify(classes, priority=100) is high
    assert classify(classes, priority=99) is low
    assert classify(classes, label="150") is high  # a numeric label is a priority
    assert classify(classes, qos="150").name == "default"  # a numeric QOS is not
    assert classify((zero, JobClass("one", min_priority=1)), priority=5).name == "one"
    assert classify((zero,), priority=0.5) is zero


def test_a_configured_class_replaces_the_built_in_one_of_its_name():
    merged = merge_classes({"interactive": JobClass("interactive", 60.0)})
    assert [c.name for c in merged] == [c.name for c in DEFAULT_CLASSES]
    assert merged[1].max_wait_s == 60.0


def test_a_job_with_no_label_is_of_the_default_class_whatever_the_classes_are_named():
    from policies.classes import fmt_wait

    for name in ("xxxx", "none", "unknown"):
        assert classify((JobClass(name), *DEFAULT_CLASSES)).name == "default"
        assert classify((JobClass(name), *DEFAULT_CLASSES), "", "", "").name == "default"
    assert fmt_wait(1_000_000) == "277.8 h"
