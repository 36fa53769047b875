"""Lambda Cloud's market: prices and regions with capacity from ``GET /api/v1/instance-types``
against the fake, laid over the catalog so a quote follows them."""
from __future__ import annotations

import time

import pytest

from broker import market
from broker.config import load
from broker.store import Store
from policies.cost import ExclusionKind
from policies.demand import Demand
from providers.base import AuthError
from providers.catalog import bundled
from providers.market import fetch
from tests.clouds.lambda_cloud import API_KEY, fake_lambda  # noqa: F401  (fixture)

NOW = time.time()
H100X8 = "gpu_8x_h100_sxm5"
REGIONS = ["us-east-1", "us-west-1"]


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_API_KEY", API_KEY)


@pytest.fixture
def config(tmp_path, fake_lambda):  # noqa: F811
    return load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'b.db'}",
        "providers": {"lambda": fake_lambda.provider_settings(REGIONS)}})


def test_prices_per_region_and_no_zones_where_there_is_no_capacity(fake_lambda):  # noqa: F811
    fake_lambda.set_capacity(H100X8, "us-west-1", 0)
    snap = fetch("lambda", fake_lambda.provider_settings(REGIONS), bundled(), NOW)
    prices = {(p.region, p.instance_type): p for p in snap.prices}
    assert prices[("us-east-1", H100X8)].hourly_micros == 31_920_000
    assert {p.market for p in snap.prices} == {"on_demand"} and {p.source for p in snap.prices} == {
        "lambda:instance_types"}
    assert {r for r, _ in prices} == set(REGIONS)
    assert [(z.region, z.instance_type, z.zones) for z in snap.zones if z.instance_type == H100X8] == [
        ("us-west-1", H100X8, ())]
    assert not snap.errors and set(snap.sources) == {"price_list", "zones"}


def test_a_refused_key_is_the_typed_error(fake_lambda):  # noqa: F811
    fake_lambda.inject("auth", times=3)
    with pytest.raises(AuthError):
        fetch("lambda", fake_lambda.provider_settings(REGIONS), bundled(), NOW)


def test_a_quote_follows_the_live_price_and_skips_a_region_without_capacity(config, fake_lambda):  # noqa: F811
    fake_lambda.types[H100X8]["price_cents_per_hour"] = 2992
    fake_lambda.set_capacity(H100X8, "us-west-1", 0)
    store = Store(config.db_url)
    (outcome,) = market.refresh(config, store.engine, now=NOW)
    assert outcome.ok, outcome.sentence()
    q = market.quote_engine(config, store.engine, NOW).quote(
        Demand(gpus=8, hours=1, gpu_model="H100", providers=("lambda",), regions=tuple(REGIONS)), now=NOW)
    h100 = [r.offering for r in q.offers if r.offering.instance.name == H100X8]
    assert [(o.region, o.hourly_micros, o.price_source) for o in h100] == [
        ("us-east-1", 29_920_000, "lambda:instance_types")]
    ex = [e for e in q.excluded if e.offering.instance.name == H100X8 and e.offering.region == "us-west-1"]
    assert [e.kind for e in ex] == [ExclusionKind.QUOTA]


def test_a_quota_error_refreshes_nothing_and_asks_no_other_cloud(config, fake_lambda):  # noqa: F811
    store = Store(config.db_url)
    assert market.refresh_quotas(config, store.engine, "lambda", "us-east-1", now=NOW) == []
    assert fake_lambda.calls == []
