"""Uniform Progress (deadline-aware spot/on-demand mixing)."""
import math
import random
import statistics

import pytest

from policies.spot import LifetimeDist, SpotOutlook, decide, outlook, overhead_h, pause_budget_h, slack_h
from providers.base import Market


def test_on_the_line_with_spot_takes_spot():
    # 10 h job, 20 h deadline: at 4 h elapsed the line is at 2 h of progress.
    assert decide(2.0, 4.0, 10.0, 20.0, spot_available=True, on_spot=False, restart_overhead_h=0.1) is Market.SPOT


def test_ahead_without_spot_pauses_instead_of_paying_on_demand():
    assert decide(5.0, 4.0, 10.0, 20.0, spot_available=False, on_spot=False, restart_overhead_h=0.1) is None
    # ... and can stay paused until it meets the line.
    assert pause_budget_h(5.0, 4.0, 10.0, 20.0) == pytest.approx(6.0)


def test_behind_the_line_goes_on_demand():
    assert decide(1.0, 8.0, 10.0, 20.0, spot_available=True, on_spot=False, restart_overhead_h=0.1) is Market.ON_DEMAND


def test_barely_behind_on_spot_stays_rather_than_pay_a_restart():
    # line at 4.0; 3.95 + 0.1 restart >= 4.0: switching would cost more than it catches up.
    assert decide(3.95, 8.0, 10.0, 20.0, True, True, 0.1) is Market.SPOT
    assert decide(3.0, 8.0, 10.0, 20.0, True, True, 0.1) is Market.ON_DEMAND


def test_safety_net_forces_on_demand_near_the_deadline_even_when_ahead():
    # 9 h done of 10, 18.8 h of 20 elapsed: slack 0.2 h < restart 0.3 h + margin.
    assert slack_h(9.0, 18.8, 10.0, 20.0) == pytest.approx(0.2)
    assert decide(9.0, 18.8, 10.0, 20.0, True, True, 0.3) is Market.ON_DEMAND
    # With more slack the same job stays on spot.
    assert decide(9.0, 17.0, 10.0, 20.0, True, True, 0.3) is Market.SPOT


def test_hysteresis_leaves_on_demand_only_when_a_restart_ahead():
    # line at 5.0 (10 of 20 h). Just ahead: stay on on-demand.
    assert decide(5.1, 10.0, 10.0, 20.0, True, False, 0.5, on_demand=True) is Market.ON_DEMAND
    # Ahead by more than a restart, with spot on offer: go back to spot.
    assert decide(5.6, 10.0, 10.0, 20.0, True, False, 0.5, on_demand=True) is Market.SPOT
    # Ahead but no spot: stay on on-demand (it is running; pausing would waste the warm node).
    assert decide(5.6, 10.0, 10.0, 20.0, False, False, 0.5, on_demand=True) is Market.ON_DEMAND


def test_finished_job_holds_nothing_and_bad_input_raises():
    assert decide(10.0, 12.0, 10.0, 20.0, True, True, 0.1) is None
    with pytest.raises(ValueError):
        decide(0.0, 0.0, 0.0, 20.0, True, False, 0.1)
    with pytest.raises(ValueError):
        decide(0.0, 0.0, 10.0, -1.0, True, False, 0.1)


def test_a_run_of_preemptions_ends_on_demand_and_meets_the_deadline():
    """Drive the rule through a hostile spot market: preempted every 0.5 h, restart 0.2 h."""
    job, deadline, restart, ckpt = 6.0, 9.0, 0.2, 0.25
    t, done, market = 0.0, 0.0, None
    while done < job - 1e-9:
        market = decide(done, t, job, deadline, True, False, restart + ckpt,
                        on_demand=market is Market.ON_DEMAND)
        assert market is not None
        if market is Market.ON_DEMAND:
            t += restart + (job - done)
            done = job
            break
        # spot: boots, runs 0.3 h, keeps the last checkpoint, is preempted
        t += 0.5
        done += ckpt
    assert market is Market.ON_DEMAND
    assert t <= deadline


# -- the lifetime distribution -----------------------------------------------------------------

DIST = LifetimeDist((0.1, 0.3, 0.7, 1.5, 4.0))


def monte_carlo(dist, work, ckpt, startup, nodes, n=30_000, seed=1):
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        t = done = 0.0
        while True:
            life = min(rnd.choice(dist.hours) for _ in range(nodes))
            if life >= startup + work - done:
                t += startup + work - done
                break
            t += life
            if ckpt > 0:
                done += math.floor(max(0.0, life - startup) / ckpt) * ckpt
        out.append(t)
    return statistics.mean(out), statistics.pstdev(out)


@pytest.mark.parametrize("work,ckpt,startup,nodes", [(2, 0.5, 0.05, 1), (2, 0.25, 0.1, 2), (0.5, 0, 0.05, 1),
                                                     (3, 0.2, 0.05, 3)])
def test_outlook_matches_a_monte_carlo_of_the_same_model(work, ckpt, startup, nodes):
    o = outlook(DIST, work, ckpt, startup, nodes)
    mean, std = monte_carlo(DIST, work, ckpt, startup, nodes)
    assert o.mean_h == pytest.approx(mean, rel=0.02)
    assert o.std_h == pytest.approx(std, rel=0.05)


def test_spot_that_never_reaches_a_checkpoint_never_finishes_and_long_lives_cost_nothing_extra():
    short = LifetimeDist((0.2, 0.3))
    assert outlook(short, 5, 0.5, 0.05).mean_h == math.inf
    assert overhead_h(5, 1, 0.5, 0.05, 0.1, short) == math.inf
    long = LifetimeDist((1000.0,))
    assert outlook(long, 5, 0.5, 0.05) == SpotOutlook(pytest.approx(5.05), pytest.approx(0.0, abs=1e-6))
    assert overhead_h(5, 1, 0.5, 0.05, 0.1, long) == pytest.approx(0.0, abs=1e-9)
    # a bigger gang is preempted sooner: it takes longer
    assert outlook(DIST, 2, 0.25, 0.05, 4).mean_h > outlook(DIST, 2, 0.25, 0.05, 1).mean_h


def test_without_a_distribution_the_rate_rule_is_unchanged():
    # expected interruptions x (half a checkpoint + a restart)
    assert overhead_h(10, 2, 0.5, 0.1, 0.05) == pytest.approx(0.05 * 2 * 10 * (0.25 + 0.1))


def test_censored_observations_count_longer_and_the_finish_bound_holds_with_confidence():
    d = LifetimeDist.from_observations([(3600, False), (7200, True)])
    assert d.hours == (1.0, 2.0 + 1.5)
    o = outlook(DIST, 2, 0.25, 0.05)
    assert o.finish_by_h(0.9) == pytest.approx(o.mean_h + 3 * o.std_h)
    with pytest.raises(ValueError):
        LifetimeDist.from_observations([])


# ------------------------------------------------------------------ each rule at its edge
ODD = "job_h and deadline_h must be positive"


def test_a_job_or_deadline_of_zero_hours_is_refused_and_any_positive_one_is_taken():
    for job, deadline in ((0.0, 20.0), (10.0, 0.0)):
        with pytest.raises(ValueError) as e:
            decide(0.0, 0.0, job, deadline, True, False, 0.1)
        assert str(e.value) == ODD
    assert decide(0.0, 0.0, 0.5, 0.5, True, False, 0.0, margin_h=0.0) is Market.SPOT  # half an hour each


def test_the_safety_net_fires_below_one_restart_plus_the_margin_not_at_it():
    # job 10 h, deadline 10.25 h: slack 0.25 h, under a 0.1 h restart + the default 2 % margin (0.2 h)
    assert decide(0.0, 0.0, 10.0, 10.25, True, False, 0.1) is Market.ON_DEMAND
    # exactly one restart plus the margin of slack: still free to take spot
    assert decide(0.0, 0.0, 10.0, 11.0, True, False, 0.5, margin_h=0.5) is Market.SPOT
    # a margin given is the one used: 1 h of it on 0.5 h of slack
    assert decide(0.0, 0.0, 10.0, 10.5, True, False, 0.1, margin_h=1.0) is Market.ON_DEMAND
    assert decide(0.0, 0.0, 10.0, 10.5, True, False, 0.1) is Market.SPOT


def test_the_line_starts_at_the_hand_off_and_a_job_exactly_on_it_is_on_it():
    # half an hour in of a 10 h deadline, 5 h job: the line is at 0.25 h; 0.3 h done is ahead (pause)
    assert decide(0.3, 0.5, 5.0, 10.0, False, False, 0.1) is None
    # exactly on the line: ahead enough to wait for spot, not behind it
    assert decide(5.0, 10.0, 10.0, 20.0, False, False, 0.1) is None
    # on on-demand, exactly one restart ahead of the line: back to spot
    assert decide(5.5, 10.0, 10.0, 20.0, True, False, 0.5, on_demand=True) is Market.SPOT
    # on spot, behind the line by exactly one restart: staying costs no more than a switch
    assert decide(4.5, 10.0, 10.0, 20.0, True, True, 0.5) is Market.SPOT
    assert decide(4.25, 10.0, 10.0, 20.0, True, True, 0.5) is Market.ON_DEMAND


def test_a_paused_jobs_budget_at_its_edges():
    assert pause_budget_h(1.0, 0.0, 0.0, 10.0) == 0.0  # no work: no budget, no division by zero
    assert pause_budget_h(0.25, 0.0, 0.5, 1.0) == 0.5  # half an hour of work is work
    assert pause_budget_h(1.0, 5.0, 10.0, 20.0) == 0.0  # behind the line already: none left


def test_the_outlook_of_no_work_is_nothing_and_bad_inputs_are_named():
    assert outlook(DIST, 0.0, 0.5, 0.1) == SpotOutlook(0.0, 0.0)
    assert outlook(DIST, -1.0, 0.5, 0.1) == SpotOutlook(0.0, 0.0)
    for ckpt, startup, nodes in ((-0.1, 0.1, 1), (0.5, -0.1, 1), (0.5, 0.1, 0)):
        with pytest.raises(ValueError) as e:
            outlook(DIST, 5.0, ckpt, startup, nodes)
        assert str(e.value) == "checkpoint_h and startup_h must be >= 0 and nodes >= 1"
    assert outlook(DIST, 5.0, 0.0, 0.0, 1).mean_h > 5.0  # zero checkpoint and start-up are allowed


def test_inputs_within_a_millionth_of_an_hour_share_one_outlook():
    # the exact solve is cached by its inputs rounded to 1e-6 h (3.6 ms): what differs below that
    # is the same question, asked again
    assert outlook(DIST, 5.0000004, 0.5000004, 0.0500004, 2) == outlook(DIST, 5.0, 0.5, 0.05, 2)


def test_a_gangs_spot_overhead_counts_every_node():
    one, four = (overhead_h(5.0, n, 0.5, 0.05, 0.0, DIST) for n in (1, 4))
    assert four > one > 0.0  # the gang lives as long as its first node to go


def test_a_lifetime_distribution_needs_an_observation():
    with pytest.raises(ValueError) as e:
        LifetimeDist.from_observations([])
    assert str(e.value) == "a lifetime distribution needs at least one observation"
