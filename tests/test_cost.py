"""The full-cost model: arithmetic checked by hand on a tiny catalog, and every exclusion reason."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cost import Context, Exclusion, ExclusionKind, PricedOffer, price
from policies.demand import Demand, DemandError
from providers.base import Market
from providers.registry import names

HOUR = 3600.0


def ctx(cat, now=0.0, terms=None, regions=None, **kw):
    """The catalog's context at ``now``, with ``terms`` and ``regions`` laid over its own."""
    return Context({**cat.terms, **(terms or {})}, {**cat.regions, **(regions or {})}, cat.gpu_perf, now, **kw)


def offering(cat, provider, region, itype, market=Market.ON_DEMAND):
    o = cat.find(provider, region, itype, market)
    assert o is not None
    return o


def test_compute_storage_transfer_and_sla_lines_by_hand(mini_catalog):
    d = Demand(gpus=8, hours=10, gpu_model="H100", data_in_gb=1000, data_out_gb=100).validate()
    o = offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge")
    p = price(d, o, ctx(mini_catalog, onprem_egress_micros_per_gb=10_000))
    assert isinstance(p, PricedOffer)
    assert p.nodes == 1
    assert p.cost.compute == 983_200_000  # 98.32 $/h x 10 h
    # (1000 + 100) GB x 0.08 $/GB-month x (10 h + 180 s start-up) / 730 h
    assert p.cost.storage == int(1100 * 80_000 * (10 + 0.05) / 730)
    # 1000 GB at 0.01 $/GB on-prem egress + 100 GB at the first AWS tier 0.09 $/GB
    assert p.cost.data_transfer == 10_000_000 + 9_000_000
    assert p.cost.sla_risk == int(983_200_000 * 0.005)
    assert p.cost.interruption == 0
    assert p.cost.total == sum((p.cost.compute, p.cost.storage, p.cost.data_transfer, p.cost.sla_risk))


def test_spot_rework_from_expected_interruptions(mini_catalog):
    d = Demand(gpus=8, hours=10, gpu_model="H100", interruptible=True, checkpoint_minutes=30).validate()
    o = offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge", Market.SPOT)
    p = price(d, o, ctx(mini_catalog))
    assert isinstance(p, PricedOffer)
    expected = 0.05 * 1 * 10  # interruptions per node-hour x nodes x hours
    rework_h = 0.25 + 180 / HOUR  # half the checkpoint interval + restart
    assert p.cost.interruption == int(expected * rework_h * 40_000_000)
    assert p.cost.sla_risk == 0  # spot has no SLA; its risk is the interruption line


def test_multi_node_stretch_follows_interconnect(mini_catalog):
    d = Demand(gpus=16, hours=10, gpu_model="H100").validate()
    aws = price(d, offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge"), ctx(mini_catalog))
    gcp = price(d, offering(mini_catalog, "gcp", "us-central1", "a3-highgpu-8g"), ctx(mini_catalog))
    assert aws.nodes == gcp.nodes == 2
    assert aws.runtime_hours == pytest.approx(10.0)  # 3200 Gbps / 8 GPUs = full speed
    assert gcp.runtime_hours == pytest.approx(10 * (1 + 0.3 * (1 - 125 / 400)))
    assert gcp.cost.compute == int(88_250_000 * 2 * gcp.runtime_hours)


def test_single_node_job_is_not_stretched(mini_catalog):
    d = Demand(gpus=8, hours=10, gpu_model="H100").validate()
    p = price(d, offering(mini_catalog, "gcp", "us-central1", "a3-highgpu-8g"), ctx(mini_catalog))
    assert p.runtime_hours == 10


def test_memory_matched_demand_scales_hours_by_gpu_speed(mini_catalog):
    d = Demand(gpus=1, hours=10, min_gpu_memory_gb=20).validate()
    a10 = price(d, offering(mini_catalog, "aws", "us-east-1", "g5.xlarge"), ctx(mini_catalog))
    assert a10.runtime_hours == pytest.approx(10 / 0.4)  # A10G at 0.4 of an A100


K = ExclusionKind


@pytest.mark.parametrize(
    "demand_kw, where, kind, reason",
    [
        ({}, ("aws", "us-east-1", "p5.48xlarge", Market.SPOT), K.MARKET, "spot capacity needs an interruptible"),
        ({"gpu_model": "", "min_gpu_memory_gb": 48, "gpus": 1}, ("aws", "us-east-1", "g5.xlarge", Market.ON_DEMAND),
         K.SHAPE, "too little GPU memory: 24 GB"),
        ({"gpu_model": "A100"}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.SHAPE, "GPU is H100, not A100"),
        ({"providers": ("gcp",)}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.PROVIDER,
         "provider aws not allowed"),
        ({"regions": ("us-east-1",)}, ("aws", "eu-west-1", "p5.48xlarge", Market.ON_DEMAND), K.REGION,
         "not in allowed regions"),
        ({"residency": ("eu",)}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.RESIDENCY,
         "outside data residency eu"),
        ({"min_sla_pct": 99.9}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.SLA,
         "SLA 99.5% is under the minimum 99.9%"),
        ({"min_sla_pct": 90, "interruptible": True}, ("aws", "us-east-1", "p5.48xlarge", Market.SPOT), K.SLA,
         "no SLA is under"),
        ({"gpu_model": "A100", "gpus": 2, "nodes": 2}, ("gcp", "us-central1", "a2-highgpu-1g", Market.ON_DEMAND),
         K.SHAPE, "no interconnect for a 2-node job"),
        ({"gpus": 16, "nodes": 4}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.SHAPE,
         "cannot make 4 nodes of 4 GPUs"),
        ({"deadline": 5 * HOUR}, ("aws", "us-east-1", "p5.48xlarge", Market.ON_DEMAND), K.DEADLINE,
         "finishes after the deadline"),
    ],
)
def test_every_exclusion_reason_has_its_kind(mini_catalog, demand_kw, where, kind, reason):
    base = dict(gpus=8, hours=10, gpu_model="H100")
    d = Demand(**{**base, **demand_kw}).validate()
    r = price(d, offering(mini_catalog, *where), ctx(mini_catalog))
    assert isinstance(r, Exclusion)
    assert reason in r.reason
    assert r.kind is kind


def test_blocked_scope_excludes_with_its_reason(mini_catalog):
    d = Demand(gpus=8, hours=10, gpu_model="H100").validate()
    o = offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge")
    r = price(d, o, ctx(mini_catalog, blocked={"aws/us-east-1": "InsufficientInstanceCapacity on aws/us-east-1"}))
    assert isinstance(r, Exclusion) and "InsufficientInstanceCapacity" in r.reason
    assert r.kind is ExclusionKind.BLOCKED


def test_a_reservation_too_small_for_the_gang_is_its_own_kind(mini_catalog):
    d = Demand(gpus=16, hours=10, gpu_model="H100").validate()
    o = replace(offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge"), market=Market.RESERVED,
                reservation="cr-1", reserved_nodes=1)
    r = price(d, o, ctx(mini_catalog))
    assert isinstance(r, Exclusion) and r.kind is ExclusionKind.RESERVATION
    assert "reservation cr-1 holds 1 nodes, demand needs 2" == r.reason


def test_data_in_another_cloud_pays_that_clouds_egress(mini_catalog):
    o = offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge")
    base = Demand(gpus=8, hours=1, gpu_model="H100", data_in_gb=100).validate()
    same_region = price(replace(base, data_location="aws:us-east-1"), o, ctx(mini_catalog))
    cross_region = price(replace(base, data_location="aws:eu-west-1"), o, ctx(mini_catalog))
    cross_cloud = price(replace(base, data_location="gcp:us-central1"), o, ctx(mini_catalog))
    assert same_region.cost.data_transfer == 0
    assert cross_region.cost.data_transfer == 100 * 20_000
    assert cross_cloud.cost.data_transfer == 100 * 120_000  # GCP internet egress


def test_egress_tiers_walk_from_the_first_gb(mini_catalog):
    aws = mini_catalog.terms["aws"]
    assert aws.egress_micros(10_240) == 10_240 * 90_000
    assert aws.egress_micros(20_240) == 10_240 * 90_000 + 10_000 * 50_000


@pytest.mark.parametrize(
    "kw, field",
    [({"gpus": 0}, "gpus"), ({"hours": -1}, "hours"), ({"hours": float("nan")}, "hours"),
     ({"data_in_gb": -5}, "data_in_gb"), ({"gpu_model": "H101"}, "gpu_model"), ({"nodes": 3}, "nodes"),
     ({"providers": ("ibm",)}, "providers"), ({"min_sla_pct": 101}, "min_sla_pct"),
     ({"data_location": "somewhere"}, "data_location"), ({"gpu_model": "", "min_gpu_memory_gb": 0}, "gpu_model")],
)
def test_invalid_demands_name_the_field(kw, field):
    with pytest.raises(DemandError) as e:
        Demand(**{"gpus": 8, "hours": 1, "gpu_model": "H100", **kw}).validate(("A100", "H100"), names())
    assert e.value.field == field
    assert str(e.value).endswith(".")


def test_the_marginal_job_pays_egress_on_every_cloud():
    """The free 100 GB/month of AWS and Azure is account-wide, spent by the account's other
    traffic: no cloud prices a job's first GB out at $0, so 50 GB out costs 50 GB at the first
    paid tier everywhere (Azure used to price it at $0 while AWS did not)."""
    from providers.catalog import bundled

    cat = bundled()
    d = Demand(gpus=1, hours=1, gpu_model="A100", data_out_gb=50).validate()
    for provider, region, itype in (("aws", "us-east-1", "p4d.24xlarge"), ("gcp", "us-central1", "a2-highgpu-1g"),
                                    ("azure", "eastus", "Standard_NC24ads_A100_v4")):
        terms = cat.terms[provider]
        first_paid = terms.egress_tiers[0][1]
        assert first_paid > 0, f"{provider} prices a job's first GB out at $0"
        p = price(replace(d, gpus=cat.instance(provider, itype).gpus), offering(cat, provider, region, itype),
                  ctx(cat))
        assert isinstance(p, PricedOffer), p
        assert p.cost.data_transfer == 50 * first_paid, provider


def test_the_spot_line_follows_the_observed_lifetimes_when_the_context_has_them(mini_catalog):
    from policies.spot import LifetimeDist, outlook

    d = Demand(gpus=8, hours=10, gpu_model="H100", interruptible=True, checkpoint_minutes=30).validate()
    o = offering(mini_catalog, "aws", "us-east-1", "p5.48xlarge", Market.SPOT)
    by_rate = price(d, o, ctx(mini_catalog))
    lives = LifetimeDist((0.4, 0.9, 2.0, 6.0))
    by_dist = price(d, o, ctx(mini_catalog, spot_lifetimes={"aws": lives}))
    startup_h = mini_catalog.terms["aws"].startup_s / 3600
    lost = outlook(lives, by_dist.runtime_hours, 0.5, startup_h).mean_h - startup_h - by_dist.runtime_hours
    assert by_dist.cost.interruption == int(lost * o.hourly_micros * by_dist.nodes)
    assert by_dist.cost.interruption > by_rate.cost.interruption > 0
    assert by_dist.cost.compute == by_rate.cost.compute
    never = price(d, o, ctx(mini_catalog, spot_lifetimes={"aws": LifetimeDist((0.1, 0.2))}))
    assert isinstance(never, Exclusion) and never.kind is ExclusionKind.MARKET and "checkpoint" in never.reason


# -- SLA risk: per lease, never more than the compute it covers ---------------------------------


@settings(max_examples=300, deadline=None)
@given(sla=st.floats(0.0, 100.0), nodes=st.integers(1, 10**9), more=st.integers(0, 10**6))
def test_the_lease_down_share_is_a_chance_that_grows_with_the_gang(sla, nodes, more):
    from policies.cost import lease_down_share

    share = lease_down_share(sla, nodes)
    assert 0.0 <= share <= 1.0
    assert lease_down_share(sla, nodes + more) >= share  # a bigger gang is hit at least as often
    assert lease_down_share(sla, 1) == (100.0 - sla) / 100.0  # one node: exactly the published share


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(1, 200_000), hours=st.floats(0.01, 87_600), sla=st.floats(0.001, 100.0),
       model=st.sampled_from(["H100", "A100"]))
def test_sla_risk_never_exceeds_the_compute_it_covers_for_any_size(mini_catalog, gpus, hours, sla, model):
    d = Demand(gpus=gpus, hours=hours, gpu_model=model).validate()
    c = ctx(mini_catalog)
    for o in mini_catalog.offerings:
        p = price(d, replace(o, sla_pct=sla), c)
        if isinstance(p, PricedOffer):
            assert 0 <= p.cost.sla_risk <= p.cost.compute, (o.instance.name, p.nodes, p.cost)


def test_a_huge_quote_prices_its_sla_risk_under_its_compute():
    """`quote --gpu H100:99999` quoted an SLA risk of $15.4 M against $1.2 M of compute: the
    risk was counted once per node on top of a compute line that already held every node. (That
    count is now refused; the largest the catalog allows, 8 GPUs x 1,024 nodes, is asked.)"""
    from broker.quote import QuoteEngine
    from providers.catalog import bundled

    eng = QuoteEngine(bundled())
    q = eng.quote(eng.validate(Demand(gpus=8 * 1024, hours=1, gpu_model="H100"), 0.0), now=0.0)
    priced = [r.priced for r in q.offers if r.offering.sla_pct]
    assert priced
    for p in priced:
        assert p.cost.sla_risk <= p.cost.compute, (p.offering.instance.name, p.nodes, p.cost)


def test_a_demand_is_refused_with_one_sentence_naming_the_field_and_its_edge():
    clouds = ("aws", "gcp")

    def refused(**kw):
        with pytest.raises(DemandError) as e:
            Demand(**{"gpus": 8, "hours": 1, "gpu_model": "H100", **kw}).validate(("A100", "H100"), clouds)
        return e.value.field, str(e.value)

    def ok(**kw):
        return Demand(**{"gpus": 8, "hours": 1, "gpu_model": "H100", **kw}).validate(("A100", "H100"), clouds)

    assert refused(gpus=0) == ("gpus", "gpus must be a positive whole number, got 0.")
    assert refused(gpus=2.0) == ("gpus", "gpus must be a positive whole number, got 2.0.")
    assert ok(gpus=1).gpus == 1
    assert refused(hours=0) == ("hours", "hours must be a positive number of at most 87840 (ten years), got 0.")
    assert refused(hours=87_840.5)[1].endswith("got 87840.5.")
    assert refused(hours="1")[0] == "hours"
    assert ok(hours=87_840).hours == 87_840 and ok(hours=0.01).hours == 0.01
    assert refused(nodes=-1) == ("nodes", "nodes must be zero (choose) or positive, got -1.")
    assert refused(nodes=3) == ("nodes", "8 GPUs do not split evenly over 3 nodes.")
    assert ok(nodes=2).nodes == 2 and ok(nodes=0).nodes == 0
    assert refused(data_in_gb=-0.5) == ("data_in_gb", "data_in_gb must be zero or positive and at most 1e+09, got -0.5.")
    assert refused(data_out_gb=1e9 + 1) == (
        "data_out_gb", "data_out_gb must be zero or positive and at most 1e+09, got 1000000001.0.")
    assert refused(min_sla_pct=float("nan"))[0] == "min_sla_pct"
    assert ok(data_in_gb=1e9, data_out_gb=0).data_in_gb == 1e9
    assert refused(min_sla_pct=100.5) == ("min_sla_pct", "min_sla_pct is a percentage, got 100.5.")
    assert ok(min_sla_pct=100).min_sla_pct == 100
    assert refused(min_gpu_memory_gb=-1) == (
        "min_gpu_memory_gb", "min_gpu_memory_gb must be zero or positive, got -1.")
    assert refused(checkpoint_minutes=-1) == (
        "checkpoint_minutes", "checkpoint_minutes must be zero or positive, got -1.")
    assert refused(gpu_model=" ") == ("gpu_model", "name a GPU model (e.g. H100) or a minimum GPU memory.")
    assert ok(gpu_model="", min_gpu_memory_gb=40).gpu_model == ""
    assert refused(gpu_model="h101") == ("gpu_model", "unknown GPU model 'h101'; known: A100, H100.")
    assert Demand(gpus=1, hours=1, gpu_model="h101").validate().gpu_model == "H101"  # no catalog: any name
    assert refused(providers=("aws", " IBM ")) == ("providers", "unknown provider 'ibm'; known: aws, gcp.")
    assert refused(data_location="us-east-1") == (
        "data_location", "data_location must be 'onprem' or PROVIDER:REGION, got 'us-east-1'.")
    assert refused(data_location=" azure:eastus ")[1].endswith("got 'azure:eastus'.")
    assert ok(data_location="gcp:us-central1:a").data_location == "gcp:us-central1:a"
    assert Demand(gpus=1, hours=1, gpu_model="H100", providers=("ibm",), data_location="ibm:x").validate(
        ("H100",)).data_location == "ibm:x"  # clouds not given: names unchecked


def test_a_valid_demand_comes_back_normalised():
    d = Demand(gpus=8, hours=1, gpu_model=" h100 ", providers=(" AWS", "gcp", "aws", ""),
               regions=(" us-east-1", "us-east-1 ", "", "eu-west-1"), residency=("EU", " eu", "us"),
               data_location="  ", tenant="").validate(("H100",), ("aws", "gcp"))
    assert (d.gpu_model, d.providers, d.regions, d.residency, d.data_location, d.tenant) == (
        "H100", ("aws", "gcp"), ("us-east-1", "eu-west-1"), ("eu", "us"), "onprem", "default")
    assert Demand(gpus=1, hours=1, gpu_model="H100", tenant="t1").validate().tenant == "t1"
    assert Demand(gpus=1, hours=1, interruptible=True).checkpoint_hours == 1.0
    assert Demand(gpus=1, hours=1, checkpoint_minutes=30).checkpoint_hours == 0.5
