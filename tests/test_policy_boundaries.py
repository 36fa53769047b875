"""The pure policies at their limits: each threshold tested exactly on it and just beside it, so a
comparison turned from ``>=`` into ``>`` (or the reverse) fails a test."""
from __future__ import annotations

import pytest

from policies.budget import Caps, launch_refusal, over_budget, to_release
from policies.classes import JobClass, wait_target_s
from policies.cost import ExclusionKind
from policies.demand import Demand
from policies.diagnose import DiagnoseConfig, diagnose
from policies.queue import ClusterNode, PendingJob, QueueSnapshot
from policies.selection import Candidate, SelectionConfig
from policies.triggers import BURST, HOLD, Signals, TriggerConfig, TriggerState, evaluate
from providers.base import Market

M = 10**6  # micro-dollars per dollar


# ------------------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("live,new,refused", [(8, 2, False), (8, 2.000001, True), (10, 0, False), (10, 1e-6, True)])
def test_a_launch_may_bring_the_hourly_rate_up_to_the_cap_not_past_it(live, new, refused):
    why = launch_refusal("ml", Caps(usd_per_hour_micros=10 * M), int(live * M), 0, round(new * M))
    assert (why is not None) is refused
    if refused:
        assert why.startswith("budget ml.usd_per_hour = 10 would be exceeded: ")


@pytest.mark.parametrize("spent,refused", [(499.999999, False), (500, True), (501, True)])
def test_a_month_spent_to_the_cap_refuses_every_launch(spent, refused):
    why = launch_refusal("ml", Caps(usd_per_month_micros=500 * M), 0, round(spent * M), 1)
    assert (why is not None) is refused
    if refused:
        assert why == f"budget ml.usd_per_month = 500 is spent: {spent:.2f} $ accrued this month"


def test_no_caps_refuse_nothing_and_release_nothing():
    assert launch_refusal("ml", Caps(), 10**15, 10**15, 10**15) is None
    assert over_budget("ml", Caps(), 10**15, 10**15) is None
    assert to_release("ml", Caps(), [("a", 10**15)], 10**15, 10**15) == {}


@pytest.mark.parametrize("spent,over", [(499.999999, False), (500, True)])
def test_running_leases_are_over_budget_from_the_moment_the_month_is_spent(spent, over):
    caps = Caps(usd_per_month_micros=500 * M)
    why = over_budget("ml", caps, 0, round(spent * M))
    assert (why is not None) is over
    released = to_release("ml", caps, [("old", 3 * M), ("new", 2 * M)], 5 * M, round(spent * M))
    if over:
        assert why == "budget ml.usd_per_month = 500 exhausted (500.00 $ accrued)"
        assert released == {"old": why, "new": why}
    else:
        assert released == {}


@pytest.mark.parametrize("rate,over", [(10, False), (10.000001, True)])
def test_running_at_exactly_the_hourly_cap_is_within_budget(rate, over):
    caps = Caps(usd_per_hour_micros=10 * M)
    why = over_budget("ml", caps, round(rate * M), 0)
    assert (why is not None) is over
    if over:
        assert why == "budget ml.usd_per_hour = 10 exceeded (10.00 $/h running)"


def test_an_hourly_cap_lowered_releases_the_newest_until_the_rest_fits_exactly():
    caps = Caps(usd_per_hour_micros=5 * M)
    running = [("a", 2 * M), ("b", 3 * M), ("c", 1 * M), ("d", 1 * M)]  # oldest first: 7 $/h
    why = "budget ml.usd_per_hour = 5 exceeded (7.00 $/h running)"
    assert to_release("ml", caps, running, 7 * M, 0) == {"d": why, "c": why}  # 5 $/h left: fits exactly
    assert to_release("ml", caps, running, 7 * M + 1, 0) == {"d": why, "c": why, "b": why}
    assert to_release("ml", caps, running, 5 * M, 0) == {}


# ------------------------------------------------------------------------------------ diagnose
NOW = 100_000.0


def _cluster(allocated: int, total: int = 10):
    """One on-prem node of ``total`` GPUs, ``allocated`` of them busy, and an 8-GPU job waiting an hour."""
    node = ClusterNode("g1", "mix" if 0 < allocated < total else "alloc" if allocated else "idle", total,
                       allocated, "a100", ("gpu",), "")
    waiting = PendingJob("p1", 8, queue="gpu", pending_reason="Resources", waited_s=3600)
    return QueueSnapshot("test", NOW, (waiting,), (node,))


@pytest.mark.parametrize("allocated,low", [(6, True), (7, False)])
def test_allocation_under_70_percent_is_low_and_exactly_70_is_not(allocated, low):
    d = diagnose(_cluster(allocated), now=NOW)
    assert d.allocation_rate == allocated / 10
    assert any("under 70%" in s for s in d.signals) is low


@pytest.mark.parametrize("allocated,high", [(8, False), (9, True)])
def test_allocation_from_exactly_90_percent_is_high(allocated, high):
    d = diagnose(_cluster(allocated), now=NOW)
    assert any(s.startswith(f"allocation {allocated}0% >= 90%") for s in d.signals) is high


@pytest.mark.parametrize("low_samples,persistent", [(3, True), (2, False)])
def test_allocation_is_persistently_low_from_exactly_80_percent_of_the_samples(low_samples, persistent):
    """Five values (four in the window and now): four low ones are 80 %, three are not enough."""
    history = [(NOW - 600 * (i + 1), 0.4 if i < low_samples else 0.95) for i in range(4)]
    d = diagnose(_cluster(6), history, now=NOW)
    assert any("persistently under 70%" in s for s in d.signals) is persistent


@pytest.mark.parametrize("at,persistent", [(NOW - 3600, False), (NOW - 3600.5, True), (NOW, False),
                                           (NOW + 0.5, True)])
def test_the_window_holds_samples_from_exactly_an_hour_ago_up_to_now(at, persistent):
    """Three low samples, one busy one and now (low): 4 low of 5, persistent. A second busy sample
    makes it 4 of 6, not persistent, only when it lies inside the window."""
    history = [(NOW - 600 * (i + 1), 0.4) for i in range(3)] + [(NOW - 900, 0.95), (at, 0.95)]
    d = diagnose(_cluster(6), history, now=NOW)
    assert any("persistently under 70%" in s for s in d.signals) is persistent


# ------------------------------------------------------------------------------- the wait rule
SEL = SelectionConfig(min_wait_share=0.0, startup_s=60, min_runtime_startups=1)


def _wait_rule(pred_s: float, runtime_s: float = 7200, cls: JobClass | None = None) -> str:
    cfg = TriggerConfig(threshold_trigger=False, selection=SEL, classes=(cls or JobClass("default"),))
    job = PendingJob(job_id="p", gpus=8, est_runtime_s=int(runtime_s), waited_s=0)
    d, _ = evaluate(cfg, TriggerState(), 0, Signals(8, 512, 512, 0, ()), [Candidate(job, pred_s)], "healthy")
    return d.action


@pytest.mark.parametrize("pred,action", [(3600, HOLD), (3601, BURST)])
def test_a_job_goes_once_its_wait_exceeds_half_its_runtime_not_at_it(pred, action):
    assert _wait_rule(pred, runtime_s=7200) == action


@pytest.mark.parametrize("pred,action", [(1800, HOLD), (1801, BURST)])
def test_a_class_target_under_half_the_runtime_is_the_one_that_counts(pred, action):
    assert _wait_rule(pred, runtime_s=7200, cls=JobClass("default", max_wait_s=1800)) == action


def test_wait_target_takes_the_time_limit_for_a_missing_runtime_and_the_class_target_for_neither():
    cls = JobClass("default", max_wait_s=5000)
    assert wait_target_s(7200, 0, cls, 0.5) == 3600
    assert wait_target_s(0, 4000, cls, 0.5) == 2000  # the time limit stands in
    assert wait_target_s(0, 0, cls, 0.5) == 5000
    assert wait_target_s(20_000, 0, cls, 0.5) == 5000  # the lesser of the two


# ------------------------------------------------------------ spot only for checkpointing jobs
def test_spot_is_offered_only_to_an_interruptible_job(mini_catalog):
    from broker.quote import QuoteEngine

    engine = QuoteEngine(mini_catalog)
    steady = engine.quote(Demand(gpus=8, hours=1, gpu_model="H100"))
    assert steady.offers and all(r.offering.market is not Market.SPOT for r in steady.offers)
    spot_out = [x for x in steady.excluded if x.offering.market is Market.SPOT]
    assert spot_out and all(x.kind == ExclusionKind.MARKET and
                            x.reason == "spot capacity needs an interruptible (checkpointing) job" for x in spot_out)
    checkpointing = engine.quote(Demand(gpus=8, hours=1, gpu_model="H100", interruptible=True))
    assert any(r.offering.market is Market.SPOT for r in checkpointing.offers)


@pytest.mark.parametrize("name", ["low_allocation", "high_allocation", "persistence", "queue_gpu_fraction",
                                  "scheduling_share"])
def test_diagnose_shares_may_be_exactly_0_or_1_and_nothing_outside(name):
    edge = {"low_allocation": 0.0} if name == "high_allocation" else {"high_allocation": 1.0}
    for v in (0.0, 1.0):
        if (name, v) not in (("low_allocation", 1.0), ("high_allocation", 0.0)):
            assert getattr(DiagnoseConfig(**{**edge, name: v}), name) == v
    for v in (-0.001, 1.001):
        with pytest.raises(ValueError, match=f"^{name} must be between 0 and 1, got {v}$"):
            DiagnoseConfig(**{**edge, name: v})


def test_diagnose_low_mark_may_equal_the_high_mark_not_exceed_it():
    assert DiagnoseConfig(low_allocation=0.8, high_allocation=0.8).low_allocation == 0.8
    with pytest.raises(ValueError, match="^low_allocation must not exceed high_allocation$"):
        DiagnoseConfig(low_allocation=0.81, high_allocation=0.8)


@pytest.mark.parametrize("v,ok", [(0.0, True), (100.0, True), (-0.1, False), (100.1, False)])
def test_diagnose_idle_utilization_is_a_percentage(v, ok):
    if ok:
        assert DiagnoseConfig(idle_utilization_pct=v).idle_utilization_pct == v
    else:
        with pytest.raises(ValueError, match="^idle_utilization_pct must be between 0 and 100$"):
            DiagnoseConfig(idle_utilization_pct=v)


@pytest.mark.parametrize("name", ["window_s", "long_wait_s", "min_queue_gpus"])
def test_diagnose_durations_and_counts_may_be_zero_not_negative(name):
    assert getattr(DiagnoseConfig(**{name: 0}), name) == 0
    with pytest.raises(ValueError, match="^window_s, long_wait_s and min_queue_gpus must not be negative$"):
        DiagnoseConfig(**{name: -1})
