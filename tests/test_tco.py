"""Build vs rent: cost lines, break-even, recommendation bands, Slurm accounting."""
import pytest

from policies.tco import (
    HOURS_PER_YEAR, CloudPrice, OnPrem, TcoError, advise, break_even, cheapest_prices, gpus_in_tres,
    parse_elapsed, rent_cost_per_year, sacct_usage,
)
from providers.base import InstanceType, Market, Offering

OD = CloudPrice("on_demand", 4.0, "aws", "us-east-1", "p5.48xlarge")
C1Y = CloudPrice("committed_1y", 2.5, "gcp", "us-central1", "a3-highgpu-8g")


def spec(**kw):
    base = dict(gpus=64, gpus_per_server=8, server_capex_usd=240_000, amortisation_years=4, kw_per_server=10,
                pue=1.5, usd_per_kwh=0.1, staff_usd_per_year=100_000, facility_usd_per_year=40_000,
                idle_power_share=0.4)
    base.update(kw)
    return OnPrem(**base)


def test_onprem_cost_lines():
    s = spec()
    assert s.servers == 8
    assert s.capex_per_year == 8 * 240_000 / 4
    full = 8 * 10 * 1.5 * HOURS_PER_YEAR * 0.1
    assert s.full_power_per_year == pytest.approx(full)
    assert s.cost_per_year(0) == pytest.approx(480_000 + 140_000 + 0.4 * full)
    assert s.cost_per_year(1) == pytest.approx(480_000 + 140_000 + full)


def test_break_even_is_where_the_lines_cross():
    s = spec()
    u = break_even(s, OD)
    assert 0 < u < 1
    assert s.cost_per_year(u) == pytest.approx(rent_cost_per_year(s.gpus, u, OD))
    # Cheap cloud: owning never pays within 0..100 %.
    assert break_even(s, CloudPrice("on_demand", 0.5, "x", "r", "t")) is None


@pytest.mark.parametrize("u,thumb", [(0.85, "build"), (0.2, "rent"), (0.5, "hybrid")])
def test_the_verdict_is_the_cheapest_option_and_the_rule_of_thumb_stands_beside_it(u, thumb):
    a = advise(spec(), u, {"on_demand": OD, "committed_1y": C1Y})
    yearly = {"build": a.costs["build"]["1y"], "hybrid": a.costs["hybrid"]["1y"],
              "rent": min(a.costs["rent_on_demand"]["1y"], a.costs["rent_committed_1y"]["1y"])}
    assert a.recommendation == min(yearly, key=yearly.get)
    assert a.rule_of_thumb == thumb and a.to_dict()["rule_of_thumb"] == thumb
    assert a.reason.startswith(a.recommendation)
    assert f"at {u * 100:.0f} % utilisation" in a.reason and "break-even" in a.reason
    assert f"Rule of thumb (>= 60 % build, <= 40 % rent): {thumb}" in a.reason
    assert set(a.costs) == {"build", "rent_on_demand", "rent_committed_1y", "hybrid"}
    for c in a.costs.values():
        assert c["3y"] == pytest.approx(3 * c["1y"])


def test_at_30_percent_owning_cheaper_than_renting_is_not_called_rent():
    # 512 GPUs at 30 %: owning costs less than renting on demand, the bands alone would say rent.
    a = advise(spec(gpus=512), 0.30, {"on_demand": OD})
    assert a.costs["build"]["1y"] < a.costs["rent_on_demand"]["1y"]
    assert a.recommendation != "rent" and a.rule_of_thumb == "rent"
    be = break_even(spec(gpus=512), OD)
    assert f"owning pays above {be * 100:.0f} % utilisation" in a.reason
    assert "which disagrees; the figures decide" in a.reason


def test_never_build_when_the_cloud_is_cheaper_even_at_high_utilisation():
    cheap = CloudPrice("on_demand", 0.5, "x", "r", "t")
    a = advise(spec(), 0.9, {"on_demand": cheap})
    assert a.recommendation == "rent" and "owning never pays against renting" in a.reason


def test_hybrid_owns_the_base_and_costs_less_than_either_extreme_midway():
    a = advise(spec(gpus=512), 0.5, {"on_demand": OD})
    assert a.recommendation == "hybrid"
    assert a.costs["hybrid"]["1y"] < a.costs["rent_on_demand"]["1y"]


def test_bad_inputs_raise_with_the_name():
    with pytest.raises(TcoError, match="utilisation"):
        advise(spec(), 1.5, {"on_demand": OD})
    with pytest.raises(TcoError, match="PUE"):
        advise(spec(pue=0.9), 0.5, {"on_demand": OD})
    with pytest.raises(TcoError, match="gpus"):
        advise(spec(gpus=0), 0.5, {"on_demand": OD})
    with pytest.raises(TcoError, match="no cloud price"):
        advise(spec(), 0.5, {})


def test_cheapest_prices_per_gpu_hour_from_offerings():
    it8 = InstanceType("aws", "p5.48xlarge", "H100", 8, 80, 192, 2048, "efa", 3200)
    it1 = InstanceType("gcp", "a3-1g", "H100", 1, 80, 26, 234, "ethernet", 50)
    other = InstanceType("aws", "p4d", "A100", 8, 40, 96, 1152, "efa", 400)
    offs = [
        Offering(it8, "us-east-1", (), Market.ON_DEMAND, 55_040_000, 99.5, "", ""),
        Offering(it8, "us-east-1", (), Market.SPOT, 20_000_000, 0, "", ""),
        Offering(it1, "us-central1", (), Market.ON_DEMAND, 11_060_000, 99.9, "", ""),
        Offering(other, "us-east-1", (), Market.ON_DEMAND, 1_000_000, 99.5, "", ""),
    ]
    committed = {("aws", "us-east-1", "p5.48xlarge"): 36_000_000, ("gcp", "us-central1", "a3-1g"): 5_000_000}
    p = cheapest_prices(offs, committed, "h100")
    assert p["on_demand"].usd_per_gpu_hour == pytest.approx(6.88) and p["on_demand"].provider == "aws"
    assert p["committed_1y"].usd_per_gpu_hour == pytest.approx(4.5) and p["committed_1y"].provider == "aws"
    assert cheapest_prices(offs, committed, "L4") == {}


def test_slurm_elapsed_and_tres_parsing():
    assert parse_elapsed("01:02:03") == 3723
    assert parse_elapsed("2-00:00:10") == 2 * 86400 + 10
    assert parse_elapsed("05:30") == 330
    assert parse_elapsed("00:00:01.500") == 1
    with pytest.raises(ValueError):
        parse_elapsed("soon")
    assert gpus_in_tres("billing=8,cpu=8,gres/gpu=4,mem=64G,node=1") == 4
    assert gpus_in_tres("cpu=8,gres/gpu:a100=2,mem=64G") == 2
    assert gpus_in_tres("gres/gpu=4,gres/gpu:a100=4") == 4  # typed repeats the total
    assert gpus_in_tres("cpu=8,mem=4G") == 0


SACCT = """JobID|JobName|Partition|AllocTRES|Elapsed|Start|End|State
100|train|gpu|billing=64,cpu=64,gres/gpu=8,mem=512G,node=1|12:00:00|2026-03-01T00:00:00|2026-03-01T12:00:00|COMPLETED
100.batch|batch||cpu=64,gres/gpu=8,mem=512G,node=1|12:00:00|2026-03-01T00:00:00|2026-03-01T12:00:00|COMPLETED
100.extern|extern||billing=64,cpu=64,gres/gpu=8,mem=512G,node=1|12:00:00|2026-03-01T00:00:00|2026-03-01T12:00:00|COMPLETED
101|eval|gpu|billing=8,cpu=8,gres/gpu:a100=2,mem=64G,node=1|1-00:00:00|2026-03-01T12:00:00|2026-03-02T12:00:00|COMPLETED
102|prep|cpu|billing=4,cpu=4,mem=16G,node=1|06:00:00|2026-03-01T00:00:00|2026-03-01T06:00:00|COMPLETED
103|tune|gpu|billing=16,cpu=16,gres/gpu=4,mem=128G,node=1|02:00:00|2026-03-02T22:00:00|Unknown|RUNNING
"""


def test_sacct_usage_skips_steps_and_measures_the_window():
    u = sacct_usage(SACCT)
    assert u.jobs == 4
    assert u.gpu_seconds == 8 * 12 * 3600 + 2 * 24 * 3600 + 4 * 2 * 3600
    assert u.window_s == 48 * 3600  # 03-01 00:00 to 03-03 00:00 (running job: start + elapsed)
    assert u.utilization(16) == pytest.approx(u.gpu_seconds / (16 * 48 * 3600))
    assert u.utilization(1) == 1.0  # capped


def test_sacct_errors_name_the_line():
    with pytest.raises(ValueError, match="lacks column"):
        sacct_usage("JobID|Elapsed\n1|00:10:00\n")
    bad = SACCT.replace("1-00:00:00", "forever")
    with pytest.raises(ValueError, match="line 5"):
        sacct_usage(bad, "acct.txt")
    with pytest.raises(ValueError, match="empty"):
        sacct_usage("")


# ------------------------------------------------------------------ boundaries and reasons, exactly
from policies.tco import SacctUsage, rule_of_thumb  # noqa: E402


def test_the_reason_gives_every_figure_an_operator_checks():
    a = advise(spec(), 0.5, {"on_demand": OD, "committed_1y": C1Y})
    assert a.reason == (
        "hybrid: at 50 % utilisation owning costs $693,584/yr, renting committed 1y (gcp a3-highgpu-8g "
        "us-central1, $2.50/GPU-h) $700,800/yr, hybrid (own 48 GPUs, burst the rest on demand) $563,072/yr; "
        "owning pays above 49 % utilisation (break-even: on demand 30 %, committed 1y 49 %). Rule of thumb "
        "(>= 60 % build, <= 40 % rent): hybrid, which agrees.")
    # power: 8 servers x 10 kW x PUE 1.5 x 8760 h x 0.1 $ = 105,120 $ at full use; 40 % of it idle,
    # the other 60 % x 50 % utilisation
    assert a.onprem_lines == pytest.approx({"capex_amortised": 480_000, "power": 0.4 * 105_120 + 0.6 * 105_120 * 0.5,
                                            "staff": 100_000, "facility": 40_000})
    a = advise(spec(gpus=4), 0.05, {"on_demand": OD}, build_at=0.9, rent_at=0.02)
    assert a.reason == (
        "rent: at 5 % utilisation owning costs $205,650/yr, renting on demand (aws p5.48xlarge us-east-1, "
        "$4.00/GPU-h) $7,008/yr, hybrid (own 0 GPUs, burst the rest on demand) $7,008/yr; owning never pays "
        "against renting (break-even: on demand never). Rule of thumb (>= 90 % build, <= 2 % rent): hybrid, "
        "which disagrees; the figures decide.")
    assert a.rule_of_thumb == "hybrid"


def test_the_json_rounds_each_figure_to_its_own_digits():
    od = CloudPrice("on_demand", 3.123456, "aws", "us-east-1", "p5.48xlarge")
    s = spec(usd_per_kwh=0.123457, staff_usd_per_year=100_000.126, facility_usd_per_year=40_000.004)
    a = advise(s, 0.123456, {"on_demand": od})
    d = a.to_dict()
    assert d["utilization"] == 0.1235 and d["recommendation"] == a.recommendation
    assert d["rule_of_thumb"] == "rent" and d["reason"] == a.reason
    own = s.cost_per_year(0.123456)
    assert d["onprem_per_year_usd"] == round(own, 2) and d["onprem_per_year_usd"] != round(own, 3)
    assert d["onprem_lines_per_year_usd"] == {k: round(v, 2) for k, v in a.onprem_lines.items()}
    assert d["onprem_lines_per_year_usd"]["staff"] == 100_000.13
    rent = 64 * HOURS_PER_YEAR * 0.123456 * 3.123456
    assert d["cloud"] == {"on_demand": {"usd_per_gpu_hour": 3.1235, "provider": "aws", "region": "us-east-1",
                                        "instance_type": "p5.48xlarge", "rent_per_year_usd": round(rent, 2),
                                        "break_even_utilization": round(break_even(s, od), 4)}}
    assert d["cost_usd"]["rent_on_demand"] == {"1y": round(rent, 2), "3y": round(3 * rent, 2)}
    assert set(d["cost_usd"]) == {"build", "rent_on_demand", "hybrid"}
    never = advise(s, 0.5, {"on_demand": CloudPrice("on_demand", 0.1, "x", "r", "t")}).to_dict()
    assert never["cloud"]["on_demand"]["break_even_utilization"] is None


def test_break_even_exactly_at_full_utilisation_counts_and_equal_slopes_never_pay():
    s = spec(gpus=8, gpus_per_server=8, server_capex_usd=0, staff_usd_per_year=0, facility_usd_per_year=0,
             idle_power_share=0.0, kw_per_server=10, pue=1.0, usd_per_kwh=0.1)
    # own: 8760 $/yr at full use, all of it variable; rent at 0.125 $/GPU-h is the same line
    assert break_even(s, CloudPrice("on_demand", 0.125, "x", "r", "t")) is None
    fixed = spec(gpus=8, server_capex_usd=0, staff_usd_per_year=8760, facility_usd_per_year=0, kw_per_server=0)
    # 8760 $/yr fixed, no power: renting 8 GPUs at 0.125 $/h costs exactly that at 100 %
    assert break_even(fixed, CloudPrice("on_demand", 0.125, "x", "r", "t")) == 1.0
    assert break_even(fixed, CloudPrice("on_demand", 0.12, "x", "r", "t")) is None


@pytest.mark.parametrize("u,bands", [(0.6, "build"), (0.59, "hybrid"), (0.4, "rent"), (0.41, "hybrid")])
def test_rule_of_thumb_bands_include_their_edges(u, bands):
    assert rule_of_thumb(u) == bands


@pytest.mark.parametrize("kw,message", [
    ({"gpus": 0}, "gpus must be positive, got 0"),
    ({"gpus_per_server": 0}, "gpus per server must be positive, got 0"),
    ({"server_capex_usd": -1}, "server capex usd must be zero or positive, got -1"),
    ({"facility_usd_per_year": -0.5}, "facility usd per year must be zero or positive, got -0.5"),
    ({"amortisation_years": 0}, "amortisation years must be positive, got 0"),
    ({"pue": 0.99}, "PUE is at least 1, got 0.99"),
    ({"idle_power_share": 1.01}, "idle power share must be between 0 and 1, got 1.01"),
    ({"idle_power_share": -0.01}, "idle power share must be between 0 and 1, got -0.01"),
])
def test_onprem_refusals_name_the_input(kw, message):
    with pytest.raises(TcoError) as e:
        spec(**kw).validate()
    assert str(e.value) == message


def test_onprem_inputs_at_their_least_are_accepted():
    s = spec(gpus=1, gpus_per_server=1, server_capex_usd=0, kw_per_server=0, usd_per_kwh=0, staff_usd_per_year=0,
             facility_usd_per_year=0, amortisation_years=0.01, pue=1, idle_power_share=0)
    assert s.validate() is s
    assert spec(idle_power_share=1).validate().idle_power_share == 1


def test_advise_bands_and_utilisation_at_their_edges():
    assert advise(spec(), 0, {"on_demand": OD}).utilization == 0
    assert advise(spec(), 1, {"on_demand": OD}, build_at=1, rent_at=1).rule_of_thumb == "build"
    assert advise(spec(), 0.5, {"on_demand": OD}, build_at=0.5, rent_at=0.5).rule_of_thumb == "build"
    assert advise(spec(), 0.5, {"on_demand": OD}, build_at=0.7, rent_at=0).rule_of_thumb == "hybrid"
    for build_at, rent_at in ((0.4, 0.5), (1.1, 0.5), (0.5, -0.1)):
        with pytest.raises(TcoError) as e:
            advise(spec(), 0.5, {"on_demand": OD}, build_at=build_at, rent_at=rent_at)
        assert str(e.value) == "the rent band must lie under the build band, both within 0..1"
    with pytest.raises(TcoError) as e:
        advise(spec(), -0.01, {"on_demand": OD})
    assert str(e.value) == "utilisation must be between 0 and 1 (or 0-100 %), got -0.01"


def test_cheapest_prices_skip_gpu_less_types_keep_the_first_of_equal_prices_and_name_the_offer():
    it0 = InstanceType("aws", "cpu-box", "H100", 0, 0, 8, 32, "", 10)
    a = InstanceType("aws", "p5.48xlarge", "H100", 8, 80, 192, 2048, "efa", 3200)
    b = InstanceType("gcp", "a3-highgpu-8g", "H100", 8, 80, 208, 1872, "", 1600)
    offs = [Offering(it0, "us-east-1", (), Market.ON_DEMAND, 1, 99.5, "", ""),
            Offering(a, "us-west-2", (), Market.ON_DEMAND, 80_000_000, 99.5, "", ""),
            Offering(b, "us-central1", (), Market.ON_DEMAND, 80_000_000, 99.5, "", "")]
    p = cheapest_prices(offs, {("gcp", "us-central1", "a3-highgpu-8g"): 40_000_000}, "H100")
    assert p == {"on_demand": CloudPrice("on_demand", 10.0, "aws", "us-west-2", "p5.48xlarge"),
                 "committed_1y": CloudPrice("committed_1y", 5.0, "gcp", "us-central1", "a3-highgpu-8g")}


@pytest.mark.parametrize("text,seconds", [
    ("1-02:03:04", 86400 + 7384), ("10-00:00:00", 864000), ("7", 7), ("1-7", 86407),
    ("00:01.25", 1), ("1:00:00:00", None), ("1.2.3", None), ("01:-2:00", None), ("", None), ("1--1:00", None),
])
def test_slurm_elapsed_forms(text, seconds):
    if seconds is None:
        with pytest.raises(ValueError) as e:
            parse_elapsed(text)
        assert str(e.value) == f"not a Slurm elapsed time: {text!r}" or "invalid literal" in str(e.value)
    else:
        assert parse_elapsed(text) == seconds


def test_tres_sums_repeated_gpu_entries_of_one_kind():
    assert gpus_in_tres("gres/gpu=2,gres/gpu=3") == 5
    assert gpus_in_tres("gres/gpu:a100=2,gres/gpu:h100=3") == 5
    with pytest.raises(ValueError):  # a malformed count is refused (sacct_usage names its line), not skipped
        gpus_in_tres("gres/gpu=4=4")


@pytest.mark.parametrize("gpus,window,u", [(0, 100, 0.0), (1, 0, 0.0), (-1, 100, 0.0), (2, 100, 0.25),
                                           (1, 50, 1.0)])
def test_sacct_utilisation_without_gpus_or_window_is_zero(gpus, window, u):
    assert SacctUsage(50.0, 1, window).utilization(gpus) == u


def test_sacct_window_without_start_columns_is_the_longest_job_and_errors_say_why():
    u = sacct_usage("JobID|AllocTRES|Elapsed\n1|gres/gpu=2|01:00:00\n2|gres/gpu=1|03:00:00\n3|cpu=1|00:10:00\n")
    assert (u.jobs, u.gpu_seconds, u.window_s) == (3, 2 * 3600 + 3 * 3600, 3 * 3600.0)
    # a Start but no End column: each job ends at its start plus its elapsed time
    u = sacct_usage("JobID|AllocTRES|Elapsed|Start\n1|gres/gpu=1|01:00:00|2026-03-01T00:00:00\n"
                    "2|gres/gpu=1|00:30:00|2026-03-01T02:00:00\n")
    assert u.window_s == 2.5 * 3600
    # an End before the start (clock trouble) leaves an empty window, never a negative one
    u = sacct_usage("JobID|AllocTRES|Elapsed|Start|End\n1|gres/gpu=1|00:00:00|2026-03-01T02:00:00|"
                    "2026-03-01T01:00:00\n")
    assert u.window_s == 0.0
    with pytest.raises(ValueError) as e:
        sacct_usage("JobID|AllocTRES|Elapsed\n1.batch|gres/gpu=1|00:10:00\n", "acct.txt")
    assert str(e.value) == "acct.txt holds no jobs"
    with pytest.raises(ValueError) as e:
        sacct_usage("JobID|AllocTRES|Elapsed\n1|gres/gpu=1\n", "acct.txt")
    assert str(e.value) == "acct.txt line 2: 2 fields, the header has 3"
    with pytest.raises(ValueError) as e:
        sacct_usage("JobID|Elapsed\n1|00:10:00\n", "acct.txt")
    assert str(e.value) == ("acct.txt line 1 lacks column(s) AllocTRES (export with sacct --parsable2 "
                            "--format=JobID,AllocTRES,Elapsed,Start,End)")


def test_the_hybrid_rents_on_demand_what_its_servers_cannot_hold():
    # build band at 100 %: own the whole servers 55 % of 64 GPUs fill (4 servers, 32 GPUs, fully
    # used) and rent the other 3.2 GPUs' hours on demand, even with a cheaper commitment on offer
    a = advise(spec(), 0.55, {"on_demand": OD, "committed_1y": C1Y}, build_at=1.0, rent_at=0.4)
    own32 = spec(gpus=32).cost_per_year(1.0)
    assert a.costs["hybrid"]["1y"] == pytest.approx(own32 + (0.55 * 64 - 32) * HOURS_PER_YEAR * 4.0)
    assert "hybrid (own 32 GPUs, burst the rest on demand)" in a.reason


def test_sacct_window_reads_the_end_column_and_its_missing_values():
    u = sacct_usage("JobID|AllocTRES|Elapsed|Start|End\n"
                    "1|gres/gpu=1|01:00:00|2026-03-01T00:00:00|2026-03-01T05:00:00\n"  # suspended: ends late
                    "2|gres/gpu=1|01:00:00|2026-03-01T01:00:00|2026-03-01T02:00:00\n"
                    "3|gres/gpu=1|00:30:00|2026-03-01T03:00:00|None\n")
    assert u.window_s == 5 * 3600 and u.jobs == 3
    with pytest.raises(ValueError) as e:
        sacct_usage("")
    assert str(e.value) == "sacct is empty"
    with pytest.raises(ValueError) as e:
        sacct_usage("JobID|Start\n1|x\n")
    assert str(e.value).startswith("sacct line 1 lacks column(s) AllocTRES, Elapsed (export")
    assert SacctUsage(50.0, 1, 1.0).utilization(100) == 0.5  # a one-second window is a window


def test_a_one_gpu_instance_is_a_price_like_any_other():
    it1 = InstanceType("gcp", "g2-standard-4", "L4", 1, 24, 4, 16, "ethernet", 16)
    it8 = InstanceType("aws", "g6.48xlarge", "L4", 8, 24, 192, 768, "ethernet", 100)
    none = InstanceType("aws", "c7i.large", "L4", 0, 0, 2, 4, "ethernet", 10)
    offs = [Offering(it1, "us-central1", (), Market.ON_DEMAND, 700_000, 99.9, "", ""),
            Offering(it8, "us-east-1", (), Market.ON_DEMAND, 13_352_000, 99.5, "", ""),
            Offering(none, "us-east-1", (), Market.ON_DEMAND, 1, 99.5, "", "")]
    p = cheapest_prices(offs, {}, "L4")
    assert set(p) == {"on_demand"}
    assert (p["on_demand"].instance_type, p["on_demand"].usd_per_gpu_hour) == ("g2-standard-4", pytest.approx(0.7))


def test_a_doubled_day_separator_is_not_an_elapsed_time():
    with pytest.raises(ValueError, match=r"not a Slurm elapsed time: '1-2-00:00:10'"):
        parse_elapsed("1-2-00:00:10")


def test_without_start_and_end_the_window_is_the_longest_job_even_when_none_ran():
    u = sacct_usage("JobID|AllocTRES|Elapsed\n1|gres/gpu=2|00:00:00\n2|cpu=4|00:00:00\n")
    assert (u.gpu_seconds, u.jobs, u.window_s, u.utilization(2)) == (0.0, 2, 0.0, 0.0)
    u = sacct_usage("JobID|AllocTRES|Elapsed\n1|gres/gpu=2|00:00:30\n2|cpu=4|00:01:00\n")
    assert (u.gpu_seconds, u.window_s, u.utilization(2)) == (60.0, 60.0, 0.5)


def test_without_a_price_to_compare_the_error_says_so():
    with pytest.raises(TcoError, match="^no cloud price to compare with$"):
        advise(spec(), 0.5, {})


def test_the_bands_are_said_as_given():
    a = advise(spec(), 0.7, {"on_demand": OD}, build_at=0.8, rent_at=0.6)
    assert "Rule of thumb (>= 80 % build, <= 60 % rent): hybrid" in a.reason


def test_the_cheapest_rent_is_the_lowest_price_whatever_its_kind_is_called():
    # a committed price above the on-demand one (an old contract): renting on demand is the cheaper
    dear = CloudPrice("committed_1y", 5.0, "gcp", "us-central1", "a3-highgpu-8g")
    a = advise(spec(), 0.3, {"on_demand": OD, "committed_1y": dear})
    assert "renting on demand (aws p5.48xlarge us-east-1, $4.00/GPU-h)" in a.reason


def test_above_the_build_band_the_hybrid_owns_every_gpu_and_costs_what_building_does():
    a = advise(spec(), 0.9, {"on_demand": OD})
    assert "hybrid (own 64 GPUs, burst the rest on demand)" in a.reason
    assert a.costs["hybrid"] == a.costs["build"]


def test_a_hybrid_may_own_a_single_gpu():
    # 2 one-GPU servers at 30 %: half the build band, so the hybrid owns one and runs it at 60 %
    s = spec(gpus=2, gpus_per_server=1)
    a = advise(s, 0.3, {"on_demand": OD})
    assert "hybrid (own 1 GPUs, burst the rest on demand)" in a.reason
    assert a.costs["hybrid"]["1y"] == pytest.approx(spec(gpus=1, gpus_per_server=1).cost_per_year(0.6))
