"""Observed spot lifetimes (policies.lifetimes): rows read, draws, merged observations, the
distributions the cost model reads, and the message that names a bad line."""
from __future__ import annotations

import math

import pytest

from policies.lifetimes import Lifetimes, LifetimesError, lifetimes_from_rows
from policies.spot import LifetimeDist

HEAD = ["cloud", "instance", "ended_by", "observed_lifetime_s"]


def rows(*lines: tuple[str, str, str]) -> list[dict[str, str]]:
    return [{"cloud": c, "instance": f"i{n}", "ended_by": e, "observed_lifetime_s": s}
            for n, (c, e, s) in enumerate(lines)]


def test_rows_are_grouped_by_cloud_sorted_and_marked_censored_by_still_running():
    lt = lifetimes_from_rows(rows((" GCP ", "still_running_at_log_end", "5000"),
                                  ("gcp", "not_running(preempted)", "700"),
                                  ("aws", " Still_Running ", "9000"),
                                  ("aws", "", "30.5")), HEAD)
    assert lt.by_cloud == {"gcp": ((700.0, False), (5000.0, True)), "aws": ((30.5, False), (9000.0, True))}
    # a row without the ended_by column is an observed preemption
    assert lifetimes_from_rows([{"cloud": "aws", "observed_lifetime_s": "60"}],
                               ["cloud", "observed_lifetime_s"]).by_cloud == {"aws": ((60.0, False),)}


def test_bad_files_are_refused_with_the_line_and_the_reason():
    def refused(rs, fieldnames=HEAD, **kw):
        with pytest.raises(LifetimesError) as e:
            lifetimes_from_rows(rs, fieldnames, **kw)
        return str(e.value)

    assert refused([], ["instance"]) == "lifetimes line 1 lacks column(s) cloud, observed_lifetime_s"
    assert refused([], None, name="life.csv") == "life.csv line 1 lacks column(s) cloud, observed_lifetime_s"
    assert refused([], ["observed_lifetime_s"]) == "lifetimes line 1 lacks column(s) cloud"
    assert refused([], name="x.csv") == "x.csv holds no lifetimes"
    assert refused(rows(("aws", "", "60"), ("aws", "", "abc")), name="x.csv") == (
        "x.csv line 3: observed_lifetime_s must be a number, got 'abc'")
    assert refused([{"cloud": "aws", "observed_lifetime_s": None}]) == (
        "lifetimes line 2: observed_lifetime_s must be a number, got None")
    for cloud, life in (("", "60"), ("  ", "60"), ("aws", "0"), ("aws", "-5"), ("aws", "inf"), ("aws", "nan")):
        assert refused(rows((cloud, "", life))) == "lifetimes line 2: needs a cloud and a positive lifetime"
    assert refused([{"observed_lifetime_s": "60"}]) == "lifetimes line 2: needs a cloud and a positive lifetime"
    assert lifetimes_from_rows(rows(("aws", "", "0.001")), HEAD).by_cloud == {"aws": ((0.001, False),)}


def test_a_draw_picks_by_u_and_a_censored_one_draws_again_at_most_eight_times():
    lt = Lifetimes({"gcp": ((100.0, True), (200.0, False)), "azure": ((10.0, True),), "aws": ()})
    assert lt.draw("gcp", 0.9, 0.0) == 200.0  # index int(0.9 * 2) = 1: preempted at 200 s
    # index 0, censored: again at u = (0.49 * 7919 + 0.5) % 1 = 0.81, index 1
    assert lt.draw("gcp", 0.49, 0.5) == 100.0 + 200.0
    # with u2 = 0: u = 0.31 (index 0, censored again), then 0.31 * 7919 % 1 = 0.89 (index 1)
    assert lt.draw("gcp", 0.49, 0.0) == 100.0 + 100.0 + 200.0
    assert lt.draw("azure", 0.3, 0.7) == 80.0  # never seen preempted: eight observed lives, then stop
    assert lt.draw("aws", 0.5, 0.5) is None and lt.draw("lambda", 0.5, 0.5) is None


def test_observations_are_merged_sorted_and_only_positive_finite_ones_kept():
    lt = Lifetimes({"gcp": ((700.0, False), (5000.0, True))})
    merged = lt.with_observations({"gcp": [(300, 0), (0.0, False), (-1.0, True), (math.inf, False)],
                                   "aws": [(60, 1), (math.nan, False)], "azure": [(0.0, False)]})
    assert merged.by_cloud == {"gcp": ((300.0, False), (700.0, False), (5000.0, True)), "aws": ((60.0, True),)}
    assert all(type(s) is float and type(c) is bool for obs in merged.by_cloud.values() for s, c in obs)
    assert lt.with_observations({}).by_cloud == lt.by_cloud


def test_distributions_leave_out_a_cloud_never_seen_preempted():
    lt = Lifetimes({"gcp": ((700.0, False), (5000.0, True)), "aws": ((60.0, True),),
                    "azure": ((30.0, False),)})
    d = lt.distributions()
    assert list(d) == ["azure", "gcp"]
    assert d["gcp"] == LifetimeDist.from_observations(((700.0, False), (5000.0, True)))
    assert d["azure"] == LifetimeDist.from_observations(((30.0, False),))


def test_censored_draws_draw_again_independently_of_the_first():
    """Three of four observations censored: a draw is still censored after its eight picks with
    chance (3/4)^8 = 10 %, whatever u it started from, and u2 moves every later pick."""
    lt = Lifetimes({"aws": ((1.0, True), (2.0, True), (3.0, True), (1000.0, False))})
    draws = [lt.draw("aws", (i + 0.5) / 1000, 0.37) for i in range(1000)]
    never = sum(d < 1000.0 for d in draws) / len(draws)
    assert 0.08 <= never <= 0.12, never
    gcp = Lifetimes({"gcp": ((100.0, True), (200.0, False))})
    # (0.49 * 7919 + 0.25) % 1 = 0.56: index 1 (u2 added, not taken away: 0.06 would pick index 0 again)
    assert gcp.draw("gcp", 0.49, 0.25) == 100.0 + 200.0


def test_observations_under_a_second_are_kept():
    merged = Lifetimes({}).with_observations({"aws": [(0.5, False)]})
    assert merged.by_cloud == {"aws": ((0.5, False),)}
