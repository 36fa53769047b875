"""Bulk pricing (policies.bulk) says exactly what the scalar cost model says, offer by offer."""
from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.quote import _rank_key
from policies.bulk import Table
from policies.cost import Context, Exclusion, ExclusionKind, pricer
from policies.demand import Demand
from providers.base import Market
from providers.catalog import bundled

NOW = 1_796_000_000.0


def scalar(groups, d, ctx):
    price_one = pricer(d, ctx)
    ok, out = [], []
    for _, offerings in groups:
        for o in offerings:
            r = price_one(o)
            (out if type(r) is Exclusion else ok).append(r)
    return ok, out


def varied_catalog():
    """The bundled catalog with live-looking extras: per-offering spot rates, quotas that some
    demands exceed, and reservations (one partly held)."""
    cat = bundled()
    offs = []
    for i, o in enumerate(cat.offerings):
        extra = {}
        if o.market is Market.SPOT and i % 3:  # the others keep the cloud's catalog rate
            extra["spot_rate"] = 0.01 * (i % 7)
        if i % 41 == 0:
            extra["sla_pct"] = 0.5  # a published SLA under 1 %
        if i % 5 == 0:
            extra.update(quota_left=float(i % 24), quota_limit=24.0, quota_per_node=float(o.instance.gpus),
                         quota_label=f"{o.instance.gpu} GPUs")
        offs.append(dataclasses.replace(o, **extra))
        if i % 37 == 0 and o.market is Market.ON_DEMAND:
            # priced above on-demand: a reservation goes first all the same
            offs.append(dataclasses.replace(o, market=Market.RESERVED, hourly_micros=3 * o.hourly_micros,
                                            reservation=f"r-{i}", reserved_nodes=1 + i % 3))
    return dataclasses.replace(cat, offerings=tuple(offs))


DEMANDS = [
    Demand(gpus=8, hours=24, gpu_model="H100", data_in_gb=500, data_out_gb=50),
    Demand(gpus=8, hours=24, min_gpu_memory_gb=1, data_in_gb=500, interruptible=True, checkpoint_minutes=30),
    Demand(gpus=16, nodes=2, hours=12, gpu_model="A100", interruptible=True, checkpoint_minutes=20,
           residency=("eu",)),
    Demand(gpus=4, hours=6, min_gpu_memory_gb=40, providers=("gcp", "azure"), min_sla_pct=99.5),
    Demand(gpus=1, hours=3, gpu_model="L4", regions=("us-central1", "us-east-1"), data_location="aws:us-east-1",
           data_in_gb=100),
    Demand(gpus=8, hours=48, gpu_model="H100", interruptible=True, deadline=NOW + 50 * 3600),
]


def lifetimes(clouds=("aws", "gcp")):
    """Observed spot lifetimes: short on AWS (some gangs never reach a checkpoint), long on GCP
    and Azure; a cloud not named is priced by its rate."""
    from policies.spot import LifetimeDist

    dists = {"aws": LifetimeDist.from_observations([(s, False) for s in (600, 1800, 3600, 7200, 14400)]),
             "gcp": LifetimeDist.from_observations([(3600 * h, h > 30) for h in (2, 8, 20, 40, 80)]),
             "azure": LifetimeDist.from_observations([(3600 * h, h > 20) for h in (1, 5, 10, 30)])}
    return {c: dists[c] for c in clouds}


@pytest.mark.parametrize("d", DEMANDS, ids=lambda d: f"{d.gpu_model or 'any'}x{d.gpus}")
@pytest.mark.parametrize("blocked", [None, {"aws/us-east-1": "capacity", "gcp": "auth",
                                            "azure/eastus/Standard_NC24ads_A100_v4/on_demand": "x"}])
@pytest.mark.parametrize("lives", [(), ("aws", "gcp"), ("gcp",)], ids=["rates", "lifetimes", "gcp-lifetimes"])
def test_bulk_equals_scalar(d, blocked, lives):
    from broker.quote import QuoteEngine

    cat = varied_catalog()
    engine = QuoteEngine(cat)
    d = engine.validate(d, NOW)
    groups = engine.shapes(d)
    held = {"r-0": 1, "r-37": 2}
    ctx = Context(cat.terms, cat.regions, cat.gpu_perf, NOW, 20_000, blocked, held,
                  lifetimes(lives) if lives else None)
    ok_b, out_b = Table(groups, cat.terms).price(d, ctx)
    ok_s, out_s = scalar(groups, d, ctx)
    ok_s.sort(key=_rank_key)
    assert ok_b == ok_s
    assert Table(groups, cat.terms).price(d, ctx, top=3)[0] == ok_s[:3]
    assert [(e.offering, e.reason, e.kind) for e in out_b] == [(e.offering, e.reason, e.kind) for e in out_s]
    assert ok_b or out_b


@pytest.mark.parametrize("d", DEMANDS, ids=lambda d: f"{d.gpu_model or 'any'}x{d.gpus}")
def test_an_engine_without_bulk_pricing_quotes_the_same(d):
    """`broker quote` quotes once per process and prices with the scalar model (no numpy)."""
    from broker.quote import QuoteEngine

    cat = varied_catalog()
    bulk, scalar = QuoteEngine(cat), QuoteEngine(cat, bulk=False)
    d = bulk.validate(d, NOW)
    blocked = {"aws/us-east-1": "capacity"}
    for top in (0, 3):
        a = bulk.quote(d, now=NOW, top=top, blocked=blocked, held={"r-0": 1})
        b = scalar.quote(d, now=NOW, top=top, blocked=blocked, held={"r-0": 1})
        assert a.offers == b.offers and a.excluded == b.excluded
    assert not scalar._tables  # no columns were built


def test_a_table_is_reused_and_stays_right_across_demands():
    from broker.quote import QuoteEngine

    engine = QuoteEngine(varied_catalog(), cache_entries=0)  # every quote priced, none from the cache
    a = engine.validate(Demand(gpus=8, hours=24, min_gpu_memory_gb=1, interruptible=True))
    b = engine.validate(Demand(gpus=16, nodes=2, hours=24, min_gpu_memory_gb=1))
    qa1 = engine.quote(a, now=time.time())
    engine.quote(b, now=time.time())
    qa2 = engine.quote(a, now=time.time())
    assert engine.table(a) is engine.table(b)
    assert [r.priced for r in qa1.offers] == [r.priced for r in qa2.offers]


def test_lifetimes_change_the_spot_lines_and_rule_out_short_lived_spot_in_both_paths():
    """The lifetimes case above is not vacuous: spot is priced by them and a gang that dies
    before its first checkpoint is excluded, by the same sentence in both paths."""
    from broker.quote import QuoteEngine
    from policies.cost import SHORT_LIVED

    cat = varied_catalog()
    engine = QuoteEngine(cat)
    d = engine.validate(Demand(gpus=16, nodes=2, hours=12, gpu_model="A100", interruptible=True,
                               checkpoint_minutes=300), NOW)
    groups = engine.shapes(d)
    by_rate = Context(cat.terms, cat.regions, cat.gpu_perf, NOW)
    by_life = dataclasses.replace(by_rate, spot_lifetimes=lifetimes())
    for price in (lambda c: Table(groups, cat.terms).price(d, c), lambda c: scalar(groups, d, c)):
        ok_r, _ = price(by_rate)
        ok_l, out_l = price(by_life)
        short = [e for e in out_l if e.reason == SHORT_LIVED]
        assert short and {e.offering.instance.provider for e in short} == {"aws"}
        assert {e.kind for e in short} == {ExclusionKind.MARKET}
        gcp = {p.offering: p.cost.interruption for p in ok_l
               if p.offering.market is Market.SPOT and p.offering.instance.provider == "gcp"}
        assert gcp and any(p.cost.interruption != gcp[p.offering] for p in ok_r if p.offering in gcp)


# -- any demand, any context: the two paths agree to the micro-dollar and the word ---------------

_ENGINE: list = []


def _engine():
    """One engine over the varied catalog for every example (building it costs ~0.1 s)."""
    if not _ENGINE:
        from broker.quote import QuoteEngine

        _ENGINE.append(QuoteEngine(varied_catalog()))
    return _ENGINE[0]


def rarely(names, most):
    """No filter three times in four; else up to ``most`` of ``names``."""
    some = st.lists(st.sampled_from(names), min_size=1, max_size=most, unique=True).map(tuple)
    return st.one_of(st.just(()), st.just(()), st.just(()), some)


@st.composite
def demands(draw):
    gpus = draw(st.sampled_from([1, 2, 4, 8, 9, 16, 24, 32, 64]))
    nodes = draw(st.sampled_from([0, 0, 1, 2, 4, 8]))
    if nodes and gpus % nodes:
        nodes = 0
    model = draw(st.sampled_from(["", "H100", "A100", "L4", "H200", "A10G", "T4", "L40S"]))
    interruptible = draw(st.booleans())
    return Demand(
        gpus=gpus, nodes=nodes, hours=draw(st.sampled_from([0.25, 1.0, 3.5, 12.0, 48.0, 400.0])),
        gpu_model=model, min_gpu_memory_gb=draw(st.sampled_from([1, 16, 24, 40, 80])) if not model else 0,
        data_in_gb=draw(st.sampled_from([0.0, 0.0, 50.0, 5_000.0, 60_000.0])),
        data_out_gb=draw(st.sampled_from([0.0, 10.0, 12_000.0, 200_000.0])),
        data_location=draw(st.sampled_from(["onprem", "aws:us-east-1", "aws:eu-west-1", "gcp:us-central1",
                                            "gcp:europe-west4", "azure:eastus", "lambda:us-east-1"])),
        interruptible=interruptible,
        checkpoint_minutes=draw(st.sampled_from([0, 10, 60, 300])) if interruptible else 0,
        # each filter is off three times in four, so that most demands meet every cloud and market
        providers=draw(rarely(["aws", "gcp", "azure", "lambda"], 3)),
        regions=draw(rarely(["us-east-1", "us-central1", "eastus", "eu-west-1", "europe-west4", "westeurope"], 3)),
        residency=draw(rarely(["us", "eu", "asia", "ca", "us-east-1"], 2)),
        min_sla_pct=draw(st.sampled_from([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 99.0, 99.5, 99.9, 99.95])),
        deadline=draw(st.sampled_from([None, None, 2.0, 13.0, 50.0, 500.0])),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=demands(), top=st.sampled_from([0, 0, 1, 3, 7]), onprem=st.sampled_from([0, 20_000]),
       lives=st.lists(st.sampled_from(["aws", "gcp", "azure"]), unique=True),
       known=st.sampled_from(["all", "all", "none", "half"]), data=st.data())
def test_bulk_equals_scalar_for_any_demand_and_context(d, top, onprem, lives, known, data):
    engine = _engine()
    cat = engine.catalog
    if d.deadline is not None:
        d = dataclasses.replace(d, deadline=NOW + d.deadline * 3600)
    d = engine.validate(d, NOW)
    groups = engine.shapes(d)
    offs = [o for _, g in groups for o in g]
    if not offs:
        return
    picks = data.draw(st.lists(st.sampled_from(offs), max_size=4))
    scopes = [k for o in picks for k in (o.instance.provider, f"{o.instance.provider}/{o.region}",
                                         f"{o.instance.provider}/{o.region}/{o.instance.name}/{o.market.value}")]
    blocked = {k: f"blocked {k}" for k in data.draw(st.lists(st.sampled_from(scopes), max_size=2))} if scopes else None
    held = {f"r-{i}": data.draw(st.integers(0, 4)) for i in (0, 37, 74, 111)}
    # regions the context may not know (their geography then reads "?")
    regions = {"all": cat.regions, "none": {},
               "half": {k: r for i, (k, r) in enumerate(sorted(cat.regions.items())) if i % 2}}[known]
    ctx = Context(cat.terms, regions, cat.gpu_perf, NOW, onprem, blocked, held, lifetimes(lives) if lives else None)
    ok_b, out_b = Table(groups, cat.terms).price(d, ctx, top=top)
    ok_s, out_s = scalar(groups, d, ctx)
    ok_s.sort(key=_rank_key)
    assert ok_b == (ok_s[:top] if top else ok_s)
    assert [(e.offering, e.reason, e.kind) for e in out_b] == [(e.offering, e.reason, e.kind) for e in out_s]


def test_a_deadline_met_to_the_second_is_met_in_both_paths():
    """An offer that finishes exactly on the deadline serves; a second earlier it does not."""
    from broker.quote import QuoteEngine

    cat = varied_catalog()
    engine = QuoteEngine(cat)
    base = engine.validate(Demand(gpus=8, hours=10, gpu_model="H100"), NOW)
    groups = engine.shapes(base)
    ctx = Context(cat.terms, cat.regions, cat.gpu_perf, NOW)
    for p in scalar(groups, base, ctx)[0][:40]:
        wall_s = (p.runtime_hours + cat.terms[p.offering.instance.provider].startup_s / 3600.0) * 3600.0
        for deadline, serves in ((NOW + wall_s, True), (NOW + wall_s - 1, False)):
            d = dataclasses.replace(base, deadline=deadline)
            ok_b, _ = Table(groups, cat.terms).price(d, ctx)
            ok_s, _ = scalar(groups, d, ctx)
            assert (p.offering in {q.offering for q in ok_b}) is serves
            assert (p.offering in {q.offering for q in ok_s}) is serves


def test_an_empty_candidate_set_prices_to_nothing():
    cat = varied_catalog()
    d = Demand(gpus=8, hours=10, gpu_model="H100").validate()
    assert Table([], cat.terms).price(d, Context(cat.terms, cat.regions, cat.gpu_perf, NOW)) == ([], [])
