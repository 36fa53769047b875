"""GCP market fetcher: google-cloud-billing and google-cloud-compute (REST) against loopback fakes."""
from __future__ import annotations

import pytest

from providers.market import fetch
from providers.market.gcp import sku_key
from tests.clouds.gcp import fake_gcp  # noqa: F401  (fixture)
from tests.clouds.gcp_billing import fake_billing, fake_billing_server  # noqa: F401  (fixtures)

NOW = 1_796_000_000.0


def settings(gcp, billing, **extra) -> dict:
    return {"enabled": True, "project": "test-project", "regions": ["us-central1", "europe-west4"],
            "api_endpoint": gcp.url, "billing_api_endpoint": billing.url, "credentials": "anonymous",
            "timeout_s": 5, **extra}


def seed_billing(billing) -> None:
    billing.add_machine("A3", "Nvidia H100 80GB GPU", ["us-central1"], gpu="2.50", core="0.03", ram="0.004",
                        spot_gpu="1.10", spot_core="0.01", spot_ram="0.0015")
    billing.add_machine("A2", "Nvidia Tesla A100 GPU", ["us-central1", "europe-west4"], gpu="2.93",
                        core="0.031611", ram="0.004237")
    billing.add_sku("Network Inter Zone Egress", "InterzoneEgress", "0.01", ["us-central1"])  # not compute


def test_sku_descriptions_normalise_to_parts():
    assert sku_key("Spot Preemptible Nvidia Tesla T4 GPU running in Americas") == ("nvidia t4 gpu", True)
    assert sku_key("A3 Instance Core running in Americas") == ("a3 instance core", False)


def test_prices_are_the_sum_of_the_machine_parts(fake_gcp, fake_billing, mini_catalog):
    seed_billing(fake_billing)
    fake_billing.page_size = 2  # several pages
    snap = fetch("gcp", settings(fake_gcp, fake_billing), mini_catalog, NOW)
    prices = {(p.region, p.instance_type, p.market): p for p in snap.prices}
    a3 = prices[("us-central1", "a3-highgpu-8g", "on_demand")]
    assert a3.hourly_micros == round((8 * 2.50 + 208 * 0.03 + 1872 * 0.004) * 1e6)
    assert a3.source == "gcp:billing_catalog" and a3.as_of.startswith("2026-11-20")
    assert prices[("us-central1", "a3-highgpu-8g", "spot")].hourly_micros == round(
        (8 * 1.10 + 208 * 0.01 + 1872 * 0.0015) * 1e6)
    assert prices[("europe-west4", "a2-highgpu-1g", "on_demand")].hourly_micros == round(
        (2.93 + 12 * 0.031611 + 85 * 0.004237) * 1e6)
    # no A3 SKUs in europe-west4, no spot A2: no live price (the bundled one stays)
    assert ("europe-west4", "a3-highgpu-8g", "on_demand") not in prices
    assert ("us-central1", "a2-highgpu-1g", "spot") not in prices
    assert len([c for c in fake_billing.calls if c.endswith("/skus")]) >= 3
    assert not snap.failed, snap.errors


def test_zones_quotas_and_reservations(fake_gcp, fake_billing, mini_catalog):
    seed_billing(fake_billing)
    fake_gcp.offer_only("a3-highgpu-8g", ["us-central1-a", "us-central1-c"])
    fake_gcp.set_quota("us-central1", "NVIDIA_H100_GPUS", 16, 8)
    fake_gcp.set_quota("us-central1", "PREEMPTIBLE_NVIDIA_H100_GPUS", 0)
    fake_gcp.add_reservation("us-central1-a", "h100-res", "a3-highgpu-8g", 2)
    snap = fetch("gcp", settings(fake_gcp, fake_billing), mini_catalog, NOW)
    zones = {(z.region, z.instance_type): z.zones for z in snap.zones}
    assert zones[("us-central1", "a3-highgpu-8g")] == ("us-central1-a", "us-central1-c")
    assert ("europe-west4", "a3-highgpu-8g") not in zones
    assert "us-central1-b" in zones[("us-central1", "a2-highgpu-1g")]
    quotas = {(q.region, q.key): q for q in snap.quotas}
    h100 = quotas[("us-central1", "NVIDIA_H100_GPUS")]
    assert (h100.limit, h100.used, h100.left, h100.label) == (16, 8, 8, "H100 GPUs")
    assert quotas[("us-central1", "PREEMPTIBLE_NVIDIA_H100_GPUS")].left == 0
    needs = {(n.instance_type, n.market): n for n in snap.needs}
    assert needs[("a3-highgpu-8g", "spot")].key == "PREEMPTIBLE_NVIDIA_H100_GPUS"
    (res,) = snap.reservations
    assert (res.region, res.zone, res.instance_type, res.reservation_id, res.total, res.used) == \
        ("us-central1", "us-central1-a", "a3-highgpu-8g", "h100-res", 2, 0)


def test_a_billing_outage_is_recorded_and_compute_still_answers(fake_gcp, fake_billing, mini_catalog):
    fake_billing.inject("auth", times=5)
    snap = fetch("gcp", settings(fake_gcp, fake_billing), mini_catalog, NOW)
    assert ("prices", "") in snap.failed
    assert "permission" in " ".join(snap.errors).lower()
    assert snap.zones


def test_anonymous_billing_only_on_loopback(fake_gcp, mini_catalog):
    with pytest.raises(ValueError, match="billing_api_endpoint"):
        fetch("gcp", {"project": "p", "regions": ["us-central1"], "api_endpoint": fake_gcp.url,
                      "credentials": "anonymous"}, mini_catalog, NOW)
