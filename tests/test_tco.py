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
