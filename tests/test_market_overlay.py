"""The live market laid over the bundled catalog (providers.market.overlay), offering by offering:
live rows replace list prices (spot per zone, cheapest zone first), rows nothing refreshed keep
the list price marked stale, data a failed refresh kept goes stale with age, and an implausible
price (under 5 % or over 300 % of the list price) is refused with a warning, never used."""
from __future__ import annotations

import pytest
import structlog

from broker import market
from broker.config import load
from broker.store import Store
from providers.base import AuthError, Market
from providers.market import LivePrice, Snapshot
from providers.market.overlay import epoch, overlay

NOW = epoch("2026-11-02T12:00:00Z")  # the mini catalog's list prices are of 2026-11-01
P5 = "p5.48xlarge"


def at(catalog, provider: str, region: str, name: str, market_: str):
    (o,) = [o for o in catalog.offerings if (o.provider, o.region, o.instance.name, o.market.value)
            == (provider, region, name, market_)]
    return o


def aws(*prices: LivePrice, fetched_at: float = NOW) -> dict[str, Snapshot]:
    return {"aws": Snapshot("aws", fetched_at, prices=list(prices))}


def od(region: str, usd: float, name: str = P5) -> LivePrice:
    return LivePrice(region, name, "on_demand", int(usd * 1e6), "aws:pricing", "2026-10-01T00:00:00Z")


def spot(zone: str, usd: float, name: str = P5, as_of: str = "2026-11-02T11:00:00Z") -> LivePrice:
    return LivePrice(zone[:-1], name, "spot", int(usd * 1e6), "aws:spot_price_history", as_of, zone=zone)


def test_live_rows_replace_the_bundled_price_per_offering_and_zone(mini_catalog):
    live, warnings = overlay(mini_catalog, aws(od("us-east-1", 55.04), spot("us-east-1a", 31.20),
                                               spot("us-east-1b", 29.75)), now=NOW, max_age_h=24)
    assert warnings == []
    o = at(live, "aws", "us-east-1", P5, "on_demand")
    assert (o.hourly_micros, o.price_source, o.as_of, o.stale) == (55_040_000, "aws:pricing",
                                                                    "2026-11-02T12:00:00Z", False)
    s = at(live, "aws", "us-east-1", P5, "spot")
    assert (s.hourly_micros, s.price_source, s.stale) == (29_750_000, "aws:spot_price_history", False)
    assert s.zones[:2] == ("us-east-1b", "us-east-1a")  # cheapest zone first: where a launch goes
    # each offering takes only its own rows: the other region, market and instance type keep theirs
    assert at(live, "aws", "eu-west-1", P5, "on_demand").hourly_micros == 100_000_000
    assert at(live, "aws", "us-east-1", "g5.xlarge", "on_demand").hourly_micros == 1_006_000
    assert len(live.offerings) == len(mini_catalog.offerings)


def test_a_zones_newest_price_wins(mini_catalog):
    live, _ = overlay(mini_catalog, aws(spot("us-east-1a", 20.0, as_of="2026-11-01T00:00:00Z"),
                                        spot("us-east-1a", 33.0, as_of="2026-11-02T10:00:00Z")),
                      now=NOW, max_age_h=24)
    assert at(live, "aws", "us-east-1", P5, "spot").hourly_micros == 33_000_000


def test_rows_nothing_refreshed_keep_the_bundled_price_marked_stale(mini_catalog):
    live, _ = overlay(mini_catalog, aws(od("us-east-1", 55.04)), now=NOW, max_age_h=24)
    for key in (("aws", "eu-west-1", P5, "on_demand"), ("gcp", "us-central1", "a3-highgpu-8g", "on_demand"),
                ("azure", "eastus", "Standard_ND96isr_H100_v5", "on_demand")):
        o = at(live, *key)
        b = at(mini_catalog, *key)
        assert (o.hourly_micros, o.price_source, o.as_of, o.stale) == (b.hourly_micros, "bundled:2026-11-01",
                                                                        "2026-11-01", True), key
    # within max_age_h the list price is not stale; max_age_h 0 never marks one
    fresh, _ = overlay(mini_catalog, {}, now=epoch("2026-11-01T20:00:00Z"), max_age_h=24)
    never, _ = overlay(mini_catalog, {}, now=NOW + 365 * 86400, max_age_h=0)
    assert not any(o.stale for o in fresh.offerings) and not any(o.stale for o in never.offerings)
    assert all(o.price_source == "bundled:2026-11-01" for o in never.offerings)


@pytest.mark.parametrize("usd,refused", [
    (98.32 * 0.049, "under 5% of the list price $98.32/h"),
    (98.32 * 0.051, ""),
    (98.32 * 2.99, ""),
    (98.32 * 3.01, "over 300% of the list price $98.32/h"),
])
def test_an_implausible_price_is_refused_with_a_warning(mini_catalog, usd, refused):
    live, warnings = overlay(mini_catalog, aws(od("us-east-1", usd)), now=NOW, max_age_h=24)
    o = at(live, "aws", "us-east-1", P5, "on_demand")
    if refused:
        assert len(warnings) == 1
        assert warnings[0].startswith(f"refused aws:pricing price ${int(usd * 1e6) / 1e6:,.5f}/h for aws "
                                      f"us-east-1 {P5} on_demand: ")
        assert warnings[0].endswith(refused)
        # never used: the offering keeps its list price, and says so
        assert (o.hourly_micros, o.price_source, o.stale) == (98_320_000, "bundled:2026-11-01", True)
    else:
        assert warnings == [] and (o.hourly_micros, o.price_source) == (int(usd * 1e6), "aws:pricing")


def test_a_refused_zone_does_not_hide_the_plausible_ones(mini_catalog):
    # spot is judged against the bundled spot price ($40.00): $0.00001 is a placeholder answer
    live, warnings = overlay(mini_catalog, aws(spot("us-east-1a", 0.00001), spot("us-east-1b", 35.0)),
                             now=NOW, max_age_h=24)
    s = at(live, "aws", "us-east-1", P5, "spot")
    assert s.hourly_micros == 35_000_000 and s.zones[0] == "us-east-1b"
    assert warnings == ["refused aws:spot_price_history price $0.00001/h for aws us-east-1 us-east-1a "
                        f"{P5} spot: under 5% of the list price $40.00/h"]


@pytest.fixture
def config(tmp_path, mini_catalog_dir):
    return load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'b.db'}", "catalog.path": str(mini_catalog_dir),
        "catalog.max_age_h": 24,
        "providers.aws": {"enabled": True, "regions": ["us-east-1", "eu-west-1"],
                          "image_id": "ami-0abc12345def67890"}})


def fetcher(result):
    def fetch(provider, settings, catalog, now):
        if isinstance(result, Exception):
            raise result
        return result
    return fetch


def test_a_failed_refresh_keeps_the_last_good_data_which_goes_stale_with_age(config):
    store = Store(config.db_url)
    (ok,) = market.refresh(config, store.engine, now=NOW, fetcher=fetcher(aws(od("us-east-1", 55.04))["aws"]))
    assert ok.ok
    later = NOW + 30 * 3600  # past max_age_h since the good refresh
    with structlog.testing.capture_logs() as logs:
        (failed,) = market.refresh(config, store.engine, now=later,
                                   fetcher=fetcher(AuthError("denied", provider="aws", code="AccessDenied")))
    assert not failed.ok
    assert failed.sentence().startswith("aws: refresh failed (") and "AccessDenied" in failed.sentence()
    assert failed.sentence().endswith("kept the data of 2026-11-02T12:00:00Z")
    assert [e["event"] for e in logs] == ["market.refresh_failed"] and logs[0]["log_level"] == "warning"

    engine = market.quote_engine(config, store.engine, later)
    o = at(engine.catalog, "aws", "us-east-1", P5, "on_demand")
    # still the last good price, with its date, now marked stale: never the list price again
    assert (o.hourly_micros, o.price_source, o.as_of, o.stale) == (55_040_000, "aws:pricing",
                                                                    "2026-11-02T12:00:00Z", True)
    fresh = market.quote_engine(config, store.engine, NOW + 3600)
    assert not at(fresh.catalog, "aws", "us-east-1", P5, "on_demand").stale


def test_the_service_logs_each_refused_price(config):
    store = Store(config.db_url)
    market.refresh(config, store.engine, now=NOW, fetcher=fetcher(aws(od("us-east-1", 0.01))["aws"]))
    with structlog.testing.capture_logs() as logs:
        engine = market.quote_engine(config, store.engine, NOW)
    assert [(e["event"], e["log_level"]) for e in logs] == [("market.price_refused", "warning")]
    assert "refused aws:pricing price $0.01000/h for aws us-east-1 p5.48xlarge on_demand" in logs[0]["detail"]
    assert at(engine.catalog, "aws", "us-east-1", P5, "on_demand").hourly_micros == 98_320_000
    with structlog.testing.capture_logs() as quiet:  # the in-process CLI reports them itself
        market.quote_engine(config, store.engine, NOW, log_refused=False)
    assert quiet == []
    assert Market.ON_DEMAND.value == "on_demand"


def test_a_stored_snapshot_reads_back_whole_and_an_older_shape_still_reads():
    import json

    from providers.market import Quota, QuotaNeed, Reservation, SpotSignal, Zones

    snap = Snapshot("aws", NOW, prices=[od("us-east-1", 55.04), spot("us-east-1b", 29.75)],
                    zones=[Zones("us-east-1", P5, ("us-east-1a", "us-east-1b"))],
                    quotas=[Quota("us-east-1", "L-417A185B", "P on-demand vCPUs", 384, 96)],
                    needs=[QuotaNeed(P5, "on_demand", "L-417A185B", 192)],
                    reservations=[Reservation("us-east-1", "us-east-1b", P5, "cr-1", 2, 1)],
                    spot=[SpotSignal("us-east-1", P5, 9, "aws:spot_placement_score")],
                    errors=["quotas in eu-west-1: throttled"], failed=[("quotas", "eu-west-1")])
    body = json.dumps(snap.to_dict())
    assert Snapshot.from_json(body) == snap and Snapshot.from_json(body.encode()) == snap
    old = {**snap.to_dict(), "prices": None}  # a body of an older shape: null and missing kinds
    del old["spot"], old["failed"]
    back = Snapshot.from_json(json.dumps(old))
    assert back.prices == [] and back.spot == [] and back.failed == [] and back.zones == snap.zones
