"""Azure market fetcher: Retail Prices (paged REST) and azure-mgmt-compute against loopback fakes."""
from __future__ import annotations

import pytest

from providers.market import fetch
from tests.clouds.azure import fake_arm, fake_arm_server  # noqa: F401  (fixtures)
from tests.clouds.azure_market import fake_retail, fake_retail_server  # noqa: F401  (fixtures)
from tests.clouds.three import AZ_SUB, AZ_SUBNET, SSH_KEY

NOW = 1_796_000_000.0
ND = "Standard_ND96isr_H100_v5"


def settings(arm, retail, **extra) -> dict:
    return {"enabled": True, "subscription_id": AZ_SUB, "resource_group": "broker-rg", "regions": ["eastus"],
            "base_url": arm.url, "credentials": "anonymous", "subnet_id": AZ_SUBNET, "ssh_public_key": SSH_KEY,
            "retries": 0, "timeout_s": 5, "retail_prices_url": retail.url, **extra}


def seed(arm, retail) -> None:
    retail.add_price("eastus", ND, "98.32")
    retail.add_price("eastus", ND, "39.50", spot=True)
    retail.add_price("eastus", ND, "12.00", low_priority=True)  # skipped
    retail.add_price("eastus", ND, "140.00", windows=True)  # skipped
    retail.add_price("westeurope", ND, "101.00")  # not a configured region
    for i in range(7):  # other sizes' meters in between: paging must go on past them
        retail.add_price("eastus", "Standard_NC4as_T4_v3", f"0.{50 + i}")
    arm.set_family(ND, "standardNDSH100v5Family", 96)
    arm.set_limit("eastus", "standardNDSH100v5Family", 192)
    arm.set_limit("eastus", "lowPriorityCores", 0)


def test_prices_follow_next_page_link(fake_arm, fake_retail, mini_catalog):
    seed(fake_arm, fake_retail)
    fake_retail.page_size = 2
    snap = fetch("azure", settings(fake_arm, fake_retail), mini_catalog, NOW)
    prices = {(p.region, p.instance_type, p.market): p.hourly_micros for p in snap.prices}
    assert prices == {("eastus", ND, "on_demand"): 98_320_000, ("eastus", ND, "spot"): 39_500_000}
    assert len(fake_retail.calls) >= 3  # 5 ND meters, 2 a page
    assert all("armSkuName+eq" in c or "armSkuName%20eq" in c for c in fake_retail.calls)
    assert not snap.failed, snap.errors


def test_zones_restrictions_usages_and_capacity_reservations(fake_arm, fake_retail, mini_catalog):
    seed(fake_arm, fake_retail)
    fake_arm.restrict("eastus", ND, zones=("3",))
    fake_arm.add_capacity_reservation_group(AZ_SUB, "broker-rg", "h100-crg", "eastus", zones=["1"])
    fake_arm.add_capacity_reservation(AZ_SUB, "broker-rg", "h100-crg", "nd-1", ND, 2, zone="1")
    snap = fetch("azure", settings(fake_arm, fake_retail), mini_catalog, NOW)
    zones = {(z.region, z.instance_type): z.zones for z in snap.zones}
    assert zones[("eastus", ND)] == ("1", "2")
    quotas = {q.key: q for q in snap.quotas}
    assert quotas["standardNDSH100v5Family"].limit == 192 and quotas["standardNDSH100v5Family"].used == 0
    assert quotas["lowPriorityCores"].left == 0
    needs = {(n.instance_type, n.market): n.key for n in snap.needs}
    assert needs == {(ND, "on_demand"): "standardNDSH100v5Family", (ND, "spot"): "lowPriorityCores"}
    (res,) = snap.reservations
    assert (res.region, res.zone, res.instance_type, res.reservation_id, res.total, res.used) == \
        ("eastus", "1", ND, "h100-crg", 2, 0)


def test_a_size_the_subscription_cannot_use_has_no_zones(fake_arm, fake_retail, mini_catalog):
    seed(fake_arm, fake_retail)
    fake_arm.restrict("eastus", ND)
    snap = fetch("azure", settings(fake_arm, fake_retail), mini_catalog, NOW)
    assert {(z.region, z.instance_type): z.zones for z in snap.zones}[("eastus", ND)] == ()


def test_a_retail_outage_keeps_going(fake_arm, fake_retail, mini_catalog):
    seed(fake_arm, fake_retail)
    fake_retail.fail_next = 1
    snap = fetch("azure", settings(fake_arm, fake_retail), mini_catalog, NOW)
    assert ("prices", "") in snap.failed and "503" in " ".join(snap.errors)
    assert snap.zones


def test_plain_http_retail_url_only_on_loopback(fake_arm, fake_retail, mini_catalog):
    with pytest.raises(ValueError, match="retail_prices_url"):
        fetch("azure", settings(fake_arm, fake_retail, retail_prices_url="http://prices.example.com/api"),
              mini_catalog, NOW)


def test_a_page_past_the_bound_is_an_outage_not_a_read_without_end(fake_arm, fake_retail, mini_catalog, monkeypatch):
    """The body of a Retail Prices page is read up to MAX_PAGE_BYTES: a page past it (a proxy's
    error page, an endless stream) is that source failing, and the refresh goes on."""
    import providers.market.azure as azure_market

    seed(fake_arm, fake_retail)
    monkeypatch.setattr(azure_market, "MAX_PAGE_BYTES", 1000)  # a page of five prices is more
    snap = fetch("azure", settings(fake_arm, fake_retail), mini_catalog, NOW)
    assert ("prices", "") in snap.failed and "larger than" in " ".join(snap.errors), snap.errors
    assert snap.zones and not snap.prices
