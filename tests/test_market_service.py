"""The live market inside the service: quotas exclude, reservations fill up while leases hold
them, a failed refresh keeps the last good data, and the background refresher installs it."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from broker import market, market_store
from broker.config import load
from broker.service import Service
from broker.lease import Lease
from broker.store import Store
from policies.cost import ExclusionKind
from policies.demand import Demand
from providers.base import AuthError
from providers.market import LivePrice, Quota, QuotaNeed, Reservation, Snapshot

NOW = time.time()


@pytest.fixture
def config(tmp_path, mini_catalog_dir):
    return load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'b.db'}", "catalog.path": str(mini_catalog_dir),
        "providers.aws": {"enabled": True, "regions": ["us-east-1", "eu-west-1"],
                          "image_id": "ami-0abc12345def67890"}})


def snapshot(**kw) -> Snapshot:
    snap = Snapshot("aws", NOW)
    for k, v in kw.items():
        setattr(snap, k, v)
    return snap


def fake_fetch(snap):
    def fetch(provider, settings, catalog, now):
        if isinstance(snap, Exception):
            raise snap
        return snap
    return fetch


def lease(lid: str, reservation: str, nodes: int, created_at: float, state: str = "running") -> Lease:
    return Lease(lease_id=lid, tenant="default", idempotency_key=lid, state=state, provider="aws",
                       region="us-east-1", instance_type="p5.48xlarge", market="reserved", nodes=nodes,
                       hourly_micros=0, reservation=reservation, client_token=lid, created_at=created_at,
                       updated_at=created_at, state_since=created_at)


H100_8 = Demand(gpus=8, hours=10, gpu_model="H100").validate()


def test_quota_below_the_demand_excludes_with_kind_quota(config):
    store = Store(config.db_url)
    snap = snapshot(quotas=[Quota("us-east-1", "L-417A185B", "P on-demand vCPUs", 96, 0)],
                    needs=[QuotaNeed("p5.48xlarge", "on_demand", "L-417A185B", 192)])
    market.refresh(config, store.engine, fetcher=fake_fetch(snap), now=NOW)
    q = market.quote_engine(config, store.engine, NOW).quote(H100_8, now=NOW)
    ex = [e for e in q.excluded if e.offering.provider == "aws" and e.offering.region == "us-east-1"
          and e.offering.market.value == "on_demand"]
    assert [e.kind for e in ex] == [ExclusionKind.QUOTA]
    assert ex[0].reason == "quota: 96 of 96 P on-demand vCPUs left in us-east-1, the offer needs 192"
    # other regions (no quota known) still quote
    assert any(r.offering.region == "eu-west-1" for r in q.offers)


def test_a_gpu_quota_reads_as_the_issue_says(config):
    store = Store(config.db_url)
    snap = snapshot(quotas=[Quota("us-east-1", "NVIDIA_H100_GPUS", "H100 GPUs", 8, 8)],
                    needs=[QuotaNeed("p5.48xlarge", "on_demand", "NVIDIA_H100_GPUS", 8)])
    market.refresh(config, store.engine, fetcher=fake_fetch(snap), now=NOW)
    q = market.quote_engine(config, store.engine, NOW).quote(H100_8, now=NOW)
    assert any(e.reason.startswith("quota: 0 of 8 H100 GPUs left in us-east-1") for e in q.excluded)


def test_a_refreshed_reservation_is_first_and_fills_up_while_leases_hold_it(config):
    svc = Service(config, providers={})
    snap = snapshot(reservations=[Reservation("us-east-1", "us-east-1a", "p5.48xlarge", "cr-0a1b2c3d4e5f60718", 2, 1)])
    market.refresh(config, svc.store.engine, fetcher=fake_fetch(snap), now=NOW)
    svc.install_engine(market.quote_engine(config, svc.store.engine, NOW))
    q = svc.quote(H100_8)
    first = q.offers[0].offering
    assert (first.market.value, first.reservation, first.reserved_nodes, first.hourly_micros) == \
        ("reserved", "cr-0a1b2c3d4e5f60718", 1, 0)
    # a lease from before the refresh is already in the cloud's count; one after takes the last node
    svc.store.create_lease(lease("l-old", "cr-0a1b2c3d4e5f60718", 1, NOW - 3600))
    assert svc.quote(H100_8).offers[0].offering.market.value == "reserved"
    svc.store.create_lease(lease("l-new", "cr-0a1b2c3d4e5f60718", 1, NOW + 1))
    q = svc.quote(H100_8)
    assert q.offers[0].offering.market.value != "reserved"
    (ex,) = [e for e in q.excluded if e.offering.reservation == "cr-0a1b2c3d4e5f60718"]
    assert ex.kind is ExclusionKind.RESERVATION
    assert ex.reason == ("reservation cr-0a1b2c3d4e5f60718 has 0 of 1 nodes free (1 held by live leases), "
                         "demand needs 1")
    svc.stop()


def test_a_configured_reservation_in_use_is_not_quoted_at_zero_again(tmp_path, mini_catalog_dir):
    config = load(None, environ={}, overrides={
        "store.url": f"sqlite:///{tmp_path / 'c.db'}", "catalog.path": str(mini_catalog_dir),
        "reservations": [{"provider": "aws", "region": "us-east-1", "instance_type": "p5.48xlarge", "nodes": 1,
                          "reservation_id": "cr-cfg"}]})
    svc = Service(config, providers={})
    assert svc.quote(H100_8).offers[0].offering.reservation == "cr-cfg"
    svc.store.create_lease(lease("l-1", "cr-cfg", 1, NOW - 86400))
    svc.store.create_lease(lease("l-2", "cr-other", 1, NOW))  # another reservation's lease
    q = svc.quote(H100_8)
    assert q.offers[0].offering.market.value == "on_demand"
    assert any(e.kind is ExclusionKind.RESERVATION and "0 of 1 nodes free" in e.reason for e in q.excluded)
    with svc.store.engine.begin() as conn:  # the lease ends: the reservation is free again
        conn.execute(text("UPDATE leases SET state = 'released' WHERE lease_id = 'l-1'"))
    assert svc.quote(H100_8).offers[0].offering.reservation == "cr-cfg"
    svc.stop()


def test_a_failed_refresh_keeps_the_last_good_data_and_says_so(config):
    store = Store(config.db_url)
    good = snapshot(prices=[LivePrice("us-east-1", "p5.48xlarge", "on_demand", 55_040_000, "aws:pricing", "x")])
    market.refresh(config, store.engine, fetcher=fake_fetch(good), now=NOW)
    (o,) = market.refresh(config, store.engine, now=NOW + 60,
                          fetcher=fake_fetch(AuthError("denied", provider="aws", code="AccessDenied")))
    assert not o.ok and "kept the data of" in o.sentence() and "AccessDenied" in o.sentence()
    rows = market_store.load(store.engine)
    assert rows["aws"].snapshot.fetched_at == NOW and rows["aws"].attempted_at == NOW + 60
    assert "AccessDenied" in rows["aws"].last_error
    q = market.quote_engine(config, store.engine, NOW + 60).quote(H100_8, now=NOW + 60)
    od = [r for r in q.offers if r.offering.region == "us-east-1" and r.offering.market.value == "on_demand"]
    assert od[0].offering.hourly_micros == 55_040_000 and od[0].offering.price_source == "aws:pricing"


def test_a_part_that_fails_keeps_that_parts_last_good_data(config):
    store = Store(config.db_url)
    first = snapshot(quotas=[Quota("us-east-1", "L-417A185B", "P on-demand vCPUs", 384, 0)],
                     prices=[LivePrice("us-east-1", "p5.48xlarge", "on_demand", 55_040_000, "aws:pricing", "x")])
    market.refresh(config, store.engine, fetcher=fake_fetch(first), now=NOW)
    second = snapshot(prices=[LivePrice("us-east-1", "p5.48xlarge", "on_demand", 60_000_000, "aws:pricing", "y")])
    second.fail("quotas", "us-east-1", RuntimeError("throttled"))
    (o,) = market.refresh(config, store.engine, fetcher=fake_fetch(second), now=NOW + 60)
    assert o.ok and "throttled" in o.sentence()
    snap = market_store.load(store.engine)["aws"].snapshot
    assert [q.limit for q in snap.quotas] == [384]
    assert [p.hourly_micros for p in snap.prices] == [60_000_000]


def test_the_background_refresher_refreshes_when_due_and_installs_the_engine(config, monkeypatch):
    store = Store(config.db_url)
    installed = []
    snap = snapshot(prices=[LivePrice("us-east-1", "p5.48xlarge", "on_demand", 50_000_000, "aws:pricing", "x")])
    calls = []

    def fetch(*a):
        calls.append(a)
        return snap

    original = market.refresh
    monkeypatch.setattr(market, "refresh", lambda *a, **k: original(*a, fetcher=fetch, **k))
    r = market.Refresher(config, store.engine, lambda: True, installed.append, clock=lambda: NOW)
    r.tick()
    r.tick()  # not due again: no second fetch; nothing new: no second install
    assert len(calls) == 1 and len(installed) == 1
    assert any(o.price_source == "aws:pricing" for o in installed[0].catalog.offerings)
    follower = market.Refresher(config, store.engine, lambda: False, installed.append, clock=lambda: NOW)
    follower.tick()  # a replica that does not lead installs what the leader stored
    assert len(installed) == 2 and len(calls) == 1


def test_catalog_settings_are_checked(tmp_path):
    from broker.errors import ConfigError

    with pytest.raises(ConfigError, match=r"catalog\.max_age_h must be a number"):
        load(None, environ={}, overrides={"catalog.max_age_h": "soon"})


def test_a_refresher_started_on_the_market_its_engine_was_built_from_does_not_rebuild_it(config):
    """`broker serve` builds its engine from the stored market, then starts the refresher: its
    first poll must not build the same engine again (and drop every cached quote) unless the
    store moved on since."""
    store = Store(config.db_url)
    market.refresh(config, store.engine, fetcher=fake_fetch(snapshot(prices=[])), now=NOW - 60)
    built_from = market_store.version(store.engine)
    installed: list = []
    r = market.Refresher(config, store.engine, lambda: False, installed.append, clock=lambda: NOW,
                         seen=built_from)
    r.tick()
    assert installed == []
    market.refresh(config, store.engine, fetcher=fake_fetch(snapshot(prices=[])), now=NOW)  # another replica's
    assert market_store.version(store.engine) != built_from
    r.tick()
    assert len(installed) == 1


def test_a_new_market_is_installed_with_the_demands_callers_asked_for_already_priced(config):
    """The quotes cached on the old engine are priced on the new one before it serves, so the
    first callers after a market change meet a warm cache; a demand the new catalog cannot
    price is left out, not an error."""
    service = Service(config)
    try:
        for d in (H100_8, Demand(gpus=16, hours=3, gpu_model="H100").validate()):
            service.engine.quote(d, NOW, top=5)
        new = market.quote_engine(config, service.store.engine, NOW)
        priced: list = []
        real = new._price
        new._price = lambda *a, **k: priced.append(a[0]) or real(*a, **k)
        service.install_engine(new)
        assert sorted(d.gpus for d in priced) == [8, 16]  # both, most recently asked first
        assert [d.gpus for d in priced] == [16, 8]
        n = len(priced)
        q = service.engine.quote(H100_8, NOW, top=5)  # served from the warm cache: no pricing
        assert len(priced) == n and q.offers
        assert new.warm_from(new, 0.0) == 0  # no time: nothing priced
    finally:
        service.stop()
