"""The cost model line by line, at its edges: each figure against arithmetic done by hand, each
exclusion by its whole sentence, each limit exactly on it and just beside it."""
from __future__ import annotations

from dataclasses import replace

import pytest

from policies.cost import (
    Exclusion,
    ExclusionKind,
    PricedOffer,
    lease_down_share,
    price,
    queued_reason,
    runtime_hours,
    utc,
)
from policies.demand import Demand
from policies.spot import LifetimeDist
from providers.base import Market
from providers.catalog import Region
from tests.test_cost import ctx

HOUR = 3600.0
K = ExclusionKind


def p5(cat, market=Market.ON_DEMAND, region="us-east-1"):
    o = cat.find("aws", region, "p5.48xlarge", market if market is not Market.QUEUED else Market.ON_DEMAND)
    assert o is not None
    return o if market is not Market.QUEUED else replace(o, market=Market.QUEUED)


def h100(**kw):
    return Demand(**{"gpus": 8, "hours": 10, "gpu_model": "H100", **kw}).validate()


def slow_start(cat, seconds=1800):
    """AWS terms with a start-up that is a whole number of binary fractions of an hour, so the
    wall-clock edges below are exact."""
    return {"aws": replace(cat.terms["aws"], startup_s=seconds)}


def excluded(r, o=None):
    assert isinstance(r, Exclusion), r
    assert r.offering is not None and (o is None or r.offering is o)
    return r.kind, r.reason


def priced(r, o):
    assert isinstance(r, PricedOffer) and r.offering is o, r
    return r


def test_utc_is_rfc3339_to_the_minute(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # whatever the machine's zone, the sentence says UTC
    time.tzset()
    try:
        assert utc(0) == "1970-01-01T00:00Z"
    finally:
        monkeypatch.undo()
        time.tzset()
    assert utc(1_796_000_000) == "2026-11-30T00:53Z"
    assert utc(59.9) == "1970-01-01T00:00Z"


# -- queued capacity -------------------------------------------------------------------------


def test_a_queued_run_longer_than_the_capacity_allows_is_refused_at_its_edge(mini_catalog):
    o = replace(p5(mini_catalog, Market.QUEUED), max_run_h=24)
    d = h100()
    assert queued_reason(o, 24.0, 24.0, d, 0.0) is None
    r = queued_reason(o, 24.5, 24.5, d, 0.0)
    assert (r.kind, r.text) == (K.MARKET, "runs 24.5 h, longer than the 24 h this queued capacity allows")
    assert queued_reason(replace(o, max_run_h=0), 10_000.0, 10_000.0, d, 0.0) is None  # no limit named


def test_a_queued_start_on_or_after_the_deadline_is_refused(mini_catalog):
    o = replace(p5(mini_catalog, Market.QUEUED), starts_at=50_000)
    assert queued_reason(o, 1.0, 1.0, h100(), 0.0) is None  # no deadline
    r = queued_reason(o, 1.0, 1.0, h100(deadline=50_000), 0.0)
    assert (r.kind, r.text) == (K.DEADLINE, "starts at 1970-01-01T13:53Z, after the deadline 1970-01-01T13:53Z")
    r = queued_reason(o, 1.0, 1.0, h100(deadline=50_001), 0.0)
    assert r is None or "after the deadline 1970-01-01T13:53Z:" in r.text
    # the expected wait counts from the quote's time when the cloud names no start
    waits = replace(o, starts_at=0, wait_s=3600)
    assert queued_reason(waits, 1.0, 1.0, h100(deadline=7200 + 3600), 7200) is not None
    assert queued_reason(waits, 1.0, 2.0, h100(deadline=7200 + 3600 + 7200), 7200) is None


def test_a_queued_finish_after_the_deadline_is_refused_at_its_edge(mini_catalog):
    o = replace(p5(mini_catalog, Market.QUEUED), wait_s=7200)
    assert queued_reason(o, 10.0, 12.5, h100(deadline=45_000), 0.0) is None  # exactly on time
    r = queued_reason(o, 10.0, 12.5, h100(deadline=44_999), 0.0)
    assert (r.kind, r.text) == (K.DEADLINE, "starts at 1970-01-01T02:00Z and finishes after the deadline "
                                            "1970-01-01T12:29Z: needs 12.5 h from now")


def test_a_queued_offer_waits_for_its_start_and_a_block_is_paid_whole(mini_catalog):
    terms = slow_start(mini_catalog)
    o = replace(p5(mini_catalog, Market.QUEUED), hourly_micros=30_000_000, wait_s=7200, zones=("us-east-1b",))
    d = h100(gpus=16, data_in_gb=730, data_out_gb=0)
    p = price(d, o, ctx(mini_catalog, terms=terms))
    assert isinstance(p, PricedOffer) and p.nodes == 2 and p.zone == "us-east-1b"
    assert p.cost.compute == 30_000_000 * 2 * 10
    # storage is held for the wall time: 10 h run + 0.5 h start-up + 2 h wait
    assert p.cost.storage == 730 * 80_000 * 12.5 // 730
    assert p.cost.interruption == 0
    assert price(replace(d, deadline=45_000), o, ctx(mini_catalog, terms=terms)).cost.compute == 600_000_000
    assert excluded(price(replace(d, deadline=44_999), o, ctx(mini_catalog, terms=terms)))[0] is K.DEADLINE
    block = replace(o, upfront_micros=500_000_000, max_run_h=24)
    assert price(d, block, ctx(mini_catalog, terms=terms)).cost.compute == 1_000_000_000
    assert excluded(price(replace(d, hours=25), block, ctx(mini_catalog, terms=terms))) == (
        K.MARKET, "runs 25.0 h, longer than the 24 h this queued capacity allows")


# -- deadlines ---------------------------------------------------------------------------------


def test_the_deadline_counts_start_up_and_spot_losses_and_says_which(mini_catalog):
    terms = slow_start(mini_catalog)
    od = p5(mini_catalog)
    assert isinstance(price(h100(deadline=10.5 * HOUR), od, ctx(mini_catalog, terms=terms)), PricedOffer)
    assert excluded(price(h100(deadline=10.5 * HOUR - 1), od, ctx(mini_catalog, terms=terms))) == (
        K.DEADLINE, "finishes after the deadline: needs 10.5 h from now")
    spot = replace(p5(mini_catalog, Market.SPOT), spot_rate=0.0)
    d = h100(interruptible=True, checkpoint_minutes=60, deadline=10.5 * HOUR - 1)
    assert excluded(price(d, spot, ctx(mini_catalog, terms=terms)))[1] == \
        "finishes after the deadline: needs 10.5 h from now"
    lives = {"aws": LifetimeDist.from_observations([(3600 * h, True) for h in (500, 600, 700)])}
    assert excluded(price(d, spot, ctx(mini_catalog, terms=terms, spot_lifetimes=lives)))[1].endswith(
        "h from now on spot (observed lifetimes)")
    # the expected losses push a spot run past a deadline its on-demand twin meets
    lossy = replace(spot, spot_rate=0.1)  # 0.1 x 10 h = 1 interruption, each losing 0.5 + 0.5 h
    d = replace(d, deadline=11.5 * HOUR)
    assert price(d, lossy, ctx(mini_catalog, terms=terms)).cost.interruption == int(1.0 * 40_000_000)
    assert excluded(price(replace(d, deadline=11.5 * HOUR - 1), lossy, ctx(mini_catalog, terms=terms)))[1] == \
        "finishes after the deadline: needs 11.5 h from now"


# -- spot --------------------------------------------------------------------------------------


def test_an_offerings_own_spot_rate_replaces_the_clouds_and_zero_is_a_rate(mini_catalog):
    d = h100(interruptible=True, checkpoint_minutes=30)
    spot = p5(mini_catalog, Market.SPOT)
    rework_h = 0.25 + 180 / HOUR
    assert price(d, replace(spot, spot_rate=0.0), ctx(mini_catalog)).cost.interruption == 0
    assert price(d, replace(spot, spot_rate=0.2), ctx(mini_catalog)).cost.interruption == \
        int(0.2 * 10 * rework_h * 40_000_000)
    assert price(d, replace(spot, spot_rate=-1.0), ctx(mini_catalog)).cost.interruption == \
        int(0.05 * 10 * rework_h * 40_000_000)


# -- shapes ------------------------------------------------------------------------------------


def test_shape_sentences_in_full(mini_catalog):
    g5 = mini_catalog.find("aws", "us-east-1", "g5.xlarge", Market.ON_DEMAND)
    a2 = mini_catalog.find("gcp", "us-central1", "a2-highgpu-1g", Market.ON_DEMAND)
    c = ctx(mini_catalog)
    assert excluded(price(h100(gpu_model="A100"), p5(mini_catalog), c)) == (K.SHAPE, "GPU is H100, not A100")
    mem = Demand(gpus=1, hours=1, min_gpu_memory_gb=48).validate()
    assert excluded(price(mem, g5, c)) == (K.SHAPE, "too little GPU memory: 24 GB per GPU, demand needs 48 GB")
    assert isinstance(price(replace(mem, min_gpu_memory_gb=24), g5, c), PricedOffer)  # exactly enough
    assert excluded(price(h100(gpus=16, nodes=4), p5(mini_catalog), c)) == (
        K.SHAPE, "8 GPUs per node cannot make 4 nodes of 4 GPUs")
    two = Demand(gpus=2, nodes=2, hours=1, gpu_model="A100").validate()
    assert excluded(price(two, a2, c)) == (K.SHAPE, "no interconnect for a 2-node job: ethernet at 24 Gbps "
                                                    "(needs >= 100)")
    edge = replace(a2, instance=replace(a2.instance, interconnect_gbps=100))
    assert isinstance(price(two, edge, c), PricedOffer)  # exactly the minimum
    assert excluded(price(two, replace(a2, instance=replace(a2.instance, interconnect_gbps=99)), c))[0] is K.SHAPE
    assert isinstance(price(Demand(gpus=1, hours=1, gpu_model="A100").validate(), a2, c), PricedOffer)


def test_a_named_node_count_must_match_the_shape_exactly(mini_catalog):
    c = ctx(mini_catalog)
    p = price(h100(gpus=16, nodes=2), p5(mini_catalog), c)
    assert isinstance(p, PricedOffer) and p.nodes == 2
    assert price(h100(gpus=8, nodes=1), p5(mini_catalog), c).nodes == 1
    assert price(h100(gpus=9), p5(mini_catalog), c).nodes == 2  # the fewest nodes that hold 9 GPUs
    assert excluded(price(h100(gpus=8, nodes=2), p5(mini_catalog), c))[1] == \
        "8 GPUs per node cannot make 2 nodes of 4 GPUs"


def test_runtime_stretches_only_for_memory_matched_demands_and_weak_interconnect(mini_catalog):
    perf = {"A100": 1.0, "H100": 2.0, "A10G": 0.4}
    g5 = mini_catalog.find("aws", "us-east-1", "g5.xlarge", Market.ON_DEMAND)
    named = Demand(gpus=1, hours=10, gpu_model="A10G").validate()
    assert runtime_hours(named, g5.instance, 1, perf) == 10  # a named model is asked for its own hours
    matched = Demand(gpus=1, hours=10, min_gpu_memory_gb=20).validate()
    assert runtime_hours(matched, g5.instance, 1, perf) == pytest.approx(25.0)
    assert runtime_hours(matched, g5.instance, 1, {"A100": 1.0}) == 10  # a GPU of unknown speed runs as the reference
    assert runtime_hours(matched, g5.instance, 1, {"A10G": 0.5}) == 20  # no reference figure: 1.0
    # per GPU at or over 400 Gbps is full speed; under it the stretch grows to 30 % at zero
    a3 = mini_catalog.find("gcp", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    d = h100(gpus=16)
    fast = replace(a3, instance=replace(a3.instance, interconnect_gbps=4000))
    assert runtime_hours(d, fast.instance, 2, perf) == 10
    half = replace(a3, instance=replace(a3.instance, interconnect_gbps=1600))
    assert runtime_hours(d, half.instance, 2, perf) == pytest.approx(10 * 1.15)
    assert runtime_hours(d, half.instance, 1, perf) == 10


# -- where and how --------------------------------------------------------------------------


def test_place_and_market_sentences_in_full(mini_catalog):
    c = ctx(mini_catalog)
    o = p5(mini_catalog)
    assert excluded(price(h100(providers=("gcp", "azure")), o, c)) == (K.PROVIDER, "provider aws not allowed")
    assert isinstance(price(h100(providers=("aws",)), o, c), PricedOffer)
    assert excluded(price(h100(regions=("eu-west-1",)), o, c)) == (
        K.REGION, "region us-east-1 not in allowed regions")
    assert isinstance(price(h100(regions=("us-east-1",)), o, c), PricedOffer)
    assert excluded(price(h100(), p5(mini_catalog, Market.SPOT), c)) == (
        K.MARKET, "spot capacity needs an interruptible (checkpointing) job")


def test_residency_by_geography_or_region_name_and_its_list_is_cut_after_four(mini_catalog):
    c = ctx(mini_catalog)
    o = p5(mini_catalog)
    assert excluded(price(h100(residency=("eu",)), o, c)) == (
        K.RESIDENCY, "region us-east-1 (us) outside data residency eu")
    assert isinstance(price(h100(residency=("eu", "us")), o, c), PricedOffer)
    assert isinstance(price(h100(residency=("us-east-1",)), o, c), PricedOffer)  # a region by name
    unknown = replace(o, region="us-east-9")
    assert excluded(price(h100(residency=("eu",)), unknown, c))[1] == \
        "region us-east-9 (?) outside data residency eu"
    four = ("eu", "asia", "au", "sa")
    assert excluded(price(h100(residency=four), o, c))[1].endswith("outside data residency eu,asia,au,sa")
    six = four + ("me", "af")
    assert excluded(price(h100(residency=six), o, c))[1].endswith("outside data residency eu,asia,au,sa (+2 more)")


def test_a_reservation_counts_the_nodes_live_leases_hold(mini_catalog):
    o = replace(p5(mini_catalog), market=Market.RESERVED, reservation="cr-1", reserved_nodes=3)
    d = h100(gpus=16)
    assert isinstance(price(d, o, ctx(mini_catalog, held={"cr-1": 1})), PricedOffer)  # 2 free, 2 needed
    assert excluded(price(d, o, ctx(mini_catalog, held={"cr-1": 2}))) == (
        K.RESERVATION, "reservation cr-1 has 1 of 3 nodes free (2 held by live leases), demand needs 2")
    assert excluded(price(d, o, ctx(mini_catalog, held={"cr-1": 5})))[1] == \
        "reservation cr-1 has 0 of 3 nodes free (5 held by live leases), demand needs 2"
    two = replace(o, reserved_nodes=2)
    assert isinstance(price(d, two, ctx(mini_catalog, held={"cr-9": 3})), PricedOffer)  # another reservation
    # a reserved price with no reservation named (a commitment's rate): nothing to count
    assert isinstance(price(d, replace(o, reservation="", reserved_nodes=0), ctx(mini_catalog)), PricedOffer)


def test_quota_left_is_enough_exactly_at_its_edge(mini_catalog):
    o = replace(p5(mini_catalog), quota_left=16.0, quota_limit=24.0, quota_per_node=8.0, quota_label="H100 GPUs")
    c = ctx(mini_catalog)
    assert isinstance(price(h100(gpus=16), o, c), PricedOffer)
    assert excluded(price(h100(gpus=16), replace(o, quota_left=15.0), c)) == (
        K.QUOTA, "quota: 15 of 24 H100 GPUs left in us-east-1, the offer needs 16")
    assert excluded(price(h100(), replace(o, quota_left=0.0), c))[0] is K.QUOTA
    assert isinstance(price(h100(gpus=64), replace(o, quota_left=-1.0), c), PricedOffer)  # unknown


def test_the_sla_minimum_is_met_exactly_at_its_edge(mini_catalog):
    c = ctx(mini_catalog)
    assert isinstance(price(h100(min_sla_pct=99.5), p5(mini_catalog), c), PricedOffer)
    assert excluded(price(h100(min_sla_pct=99.6), p5(mini_catalog), c)) == (
        K.SLA, "SLA 99.5% is under the minimum 99.6%")
    spot = p5(mini_catalog, Market.SPOT)
    assert excluded(price(h100(min_sla_pct=90, interruptible=True), spot, c)) == (
        K.SLA, "no SLA is under the minimum 90%")


def test_a_block_names_the_widest_scope_that_holds_the_offer(mini_catalog):
    o = p5(mini_catalog)
    d = h100()
    both = {"aws": "cloud down", "aws/us-east-1": "region full"}
    assert excluded(price(d, o, ctx(mini_catalog, blocked=both))) == (K.BLOCKED, "cloud down")
    assert excluded(price(d, o, ctx(mini_catalog, blocked={"aws/us-east-1/p5.48xlarge/on_demand": "quota"}))) == (
        K.BLOCKED, "quota")
    others = {"gcp": "x", "aws/eu-west-1": "y", "aws/us-east-1/p5.48xlarge/spot": "z"}
    assert isinstance(price(d, o, ctx(mini_catalog, blocked=others)), PricedOffer)
    assert isinstance(price(d, o, ctx(mini_catalog, blocked={})), PricedOffer)


# -- data ----------------------------------------------------------------------------------------


def test_data_from_on_prem_pays_our_egress_and_the_clouds_ingress(mini_catalog):
    terms = {"aws": replace(mini_catalog.terms["aws"], ingress_micros_per_gb=3_000)}
    p = price(h100(data_in_gb=100), p5(mini_catalog), ctx(mini_catalog, terms=terms, onprem_egress_micros_per_gb=10_000))
    assert p.cost.data_transfer == 100 * (10_000 + 3_000)
    assert price(h100(data_in_gb=0), p5(mini_catalog), ctx(mini_catalog, terms=terms,
                                                             onprem_egress_micros_per_gb=10_000)).cost.data_transfer == 0


def test_data_in_another_place_pays_by_how_far_it_travels(mini_catalog):
    a3 = mini_catalog.find("gcp", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    regions = {("gcp", "us-east4"): Region("gcp", "us-east4", "us", "Virginia", ("us-east4-a",))}
    terms = {"aws": replace(mini_catalog.terms["aws"], ingress_micros_per_gb=1_000),
             "gcp": replace(mini_catalog.terms["gcp"], ingress_micros_per_gb=2_000)}
    c = ctx(mini_catalog, terms=terms, regions=regions)

    def moved(location, o=a3, gb=100):
        return price(h100(data_in_gb=gb, data_location=location), o, c).cost.data_transfer

    assert moved("gcp:us-central1") == 0
    assert moved("gcp:us-east4") == 100 * 20_000  # same geography: inter-region
    assert moved("gcp:europe-west4") == 100 * 80_000  # another continent
    assert moved("gcp:asia-east9") == 100 * 80_000  # a region the catalog does not know: the far rate
    # another cloud: its internet egress, then this cloud's ingress
    assert moved("gcp:us-central1", o=p5(mini_catalog)) == 100 * 120_000 + 100 * 1_000
    assert moved("aws:us-east-1") == 100 * 90_000 + 100 * 2_000
    assert moved("gcp:us-east4", gb=0) == 0


def test_results_out_pay_the_clouds_egress_once(mini_catalog):
    p = price(h100(data_out_gb=20_240), p5(mini_catalog), ctx(mini_catalog))
    assert p.cost.data_transfer == 10_240 * 90_000 + 10_000 * 50_000


# -- SLA risk ------------------------------------------------------------------------------------


def test_lease_down_share_at_its_edges():
    assert lease_down_share(99.0, 0) == 0.0
    assert lease_down_share(99.0, 1) == pytest.approx(0.01, abs=1e-15)
    assert lease_down_share(99.0, 2) == pytest.approx(1 - 0.99 ** 2, rel=1e-12)
    assert lease_down_share(99.9, 1000) == pytest.approx(1 - 0.999 ** 1000, rel=1e-12)
    assert lease_down_share(100.0, 50) == 0.0
    assert lease_down_share(0.0, 3) == 1.0
    assert lease_down_share(0.0, 1) == 1.0
    assert lease_down_share(150.0, 4) == 0.0 and lease_down_share(-10.0, 4) == 1.0


def test_the_sla_line_prices_the_chance_any_node_of_the_gang_is_down(mini_catalog):
    c = ctx(mini_catalog)
    p = price(h100(gpus=16), replace(p5(mini_catalog), sla_pct=99.0), c)
    assert p.cost.sla_risk == int(p.cost.compute * (1 - 0.99 ** 2))
    assert price(h100(), replace(p5(mini_catalog), sla_pct=0.0), c).cost.sla_risk == 0
    assert price(h100(), replace(p5(mini_catalog), sla_pct=100.0), c).cost.sla_risk == 0


# -- what each answer names, and what one pricer reuses -------------------------------------------


def test_every_answer_names_the_offering_it_is_about(mini_catalog):
    terms = slow_start(mini_catalog)
    c = ctx(mini_catalog, terms=terms)
    od, spot = p5(mini_catalog), p5(mini_catalog, Market.SPOT)
    priced(price(h100(), od, c), od)
    excluded(price(h100(gpu_model="A100"), od, c), od)  # the shape
    excluded(price(h100(providers=("gcp",)), od, c), od)  # the place
    never = {"aws": LifetimeDist((0.1, 0.2))}
    d = h100(interruptible=True, checkpoint_minutes=60)
    excluded(price(d, spot, ctx(mini_catalog, terms=terms, spot_lifetimes=never)), spot)  # short-lived spot
    queued = replace(p5(mini_catalog, Market.QUEUED), max_run_h=1)
    excluded(price(d, queued, c), queued)  # queued capacity
    excluded(price(h100(deadline=HOUR), od, c), od)  # the deadline


def test_a_queued_wait_counts_from_the_quotes_time(mini_catalog):
    terms = slow_start(mini_catalog)
    now = 100_000.0
    d = h100(data_in_gb=730)
    o = replace(p5(mini_catalog, Market.QUEUED), wait_s=7200)
    p = price(replace(d, deadline=now + 45_000), o, ctx(mini_catalog, now=now, terms=terms))
    assert p.cost.storage == 80_000 * 12.5  # 10 h + 0.5 h start-up + 2 h wait
    assert excluded(price(replace(d, deadline=now + 44_999), o, ctx(mini_catalog, now=now, terms=terms)))[0] \
        is K.DEADLINE
    at = replace(o, wait_s=0, starts_at=now + 3600)  # a named start an hour after the quote
    assert price(d, at, ctx(mini_catalog, now=now, terms=terms)).cost.storage == 80_000 * 11.5
    now_ = replace(o, wait_s=0)  # no wait at all
    assert price(d, now_, ctx(mini_catalog, now=now, terms=terms)).cost.storage == 80_000 * 10.5


def test_no_data_costs_no_storage_and_an_offering_without_zones_names_none(mini_catalog):
    o = p5(mini_catalog)
    p = priced(price(h100(), o, ctx(mini_catalog)), o)
    assert p.cost.storage == 0 and p.cost.data_transfer == 0
    assert p.zone == "us-east-1a"
    bare = replace(o, zones=())
    assert priced(price(h100(), bare, ctx(mini_catalog)), bare).zone == ""


def test_one_pricer_prices_each_region_by_its_own_distance_to_the_data(mini_catalog):
    from policies.cost import pricer

    d = h100(data_in_gb=100, data_location="aws:us-east-1", data_out_gb=10)
    gcp_terms = {"gcp": replace(mini_catalog.terms["gcp"], ingress_micros_per_gb=0)}
    price_one = pricer(d, ctx(mini_catalog, terms=gcp_terms))
    a3 = mini_catalog.find("gcp", "us-central1", "a3-highgpu-8g", Market.ON_DEMAND)
    here, there, other = p5(mini_catalog), p5(mini_catalog, region="eu-west-1"), a3
    assert price_one(here).cost.data_transfer == 10 * 90_000
    assert price_one(there).cost.data_transfer == 100 * 20_000 + 10 * 90_000
    assert price_one(other).cost.data_transfer == 100 * 90_000 + 10 * 120_000
    assert price_one(here).cost.data_transfer == 10 * 90_000  # the first answer again


def test_small_and_odd_data_locations_are_priced_too(mini_catalog):
    terms = {"aws": replace(mini_catalog.terms["aws"], ingress_micros_per_gb=3_000)}
    c = ctx(mini_catalog, terms=terms, onprem_egress_micros_per_gb=10_000)
    o = p5(mini_catalog)
    assert price(h100(data_in_gb=1), o, c).cost.data_transfer == 13_000
    assert price(h100(data_in_gb=0.5), o, c).cost.data_transfer == 6_500
    # a cloud the catalog has no terms for: nothing to price it by
    far = Demand(gpus=8, hours=10, gpu_model="H100", data_in_gb=100, data_location="ibm:us-south").validate()
    assert price(far, o, c).cost.data_transfer == 0
    # PROVIDER:REGION:ZONE is the region's data
    assert price(h100(data_in_gb=100, data_location="aws:us-east-1:us-east-1b"), o, c).cost.data_transfer == 0
    assert price(h100(data_in_gb=100, data_location="aws:eu-west-1:eu-west-1a"), o, c).cost.data_transfer == \
        100 * 20_000


def test_the_reference_gpu_sets_the_scale_of_a_memory_matched_demand(mini_catalog):
    g5 = mini_catalog.find("aws", "us-east-1", "g5.xlarge", Market.ON_DEMAND)
    matched = Demand(gpus=1, hours=10, min_gpu_memory_gb=20).validate()
    assert runtime_hours(matched, g5.instance, 1, {"A100": 2.0, "A10G": 0.4}) == pytest.approx(50.0)


def test_the_interconnect_is_shared_by_the_gpus_of_a_node_even_a_single_one(mini_catalog):
    a2 = mini_catalog.find("gcp", "us-central1", "a2-highgpu-1g", Market.ON_DEMAND)
    one = replace(a2, instance=replace(a2.instance, interconnect_gbps=200))  # 200 Gbps for its one GPU
    d = Demand(gpus=2, hours=10, gpu_model="A100").validate()
    assert runtime_hours(d, one.instance, 2, {"A100": 1.0}) == pytest.approx(10 * (1 + 0.3 * (1 - 200 / 400)))
