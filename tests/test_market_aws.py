"""AWS market fetcher: real boto3 (pricing, ec2, service-quotas) against the mocked cloud on loopback."""
from __future__ import annotations

import pytest

from providers.base import ProviderError
from providers.market import fetch
from tests.clouds.aws import AwsCloud, aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)

NOW = 1_796_000_000.0


def seed(cloud: AwsCloud) -> None:
    m = cloud.market
    m.add_on_demand("us-east-1", "p5.48xlarge", "55.04")
    m.add_on_demand("eu-west-1", "p5.48xlarge", "58.50")
    m.add_on_demand("us-east-1", "p5.48xlarge", "120.00", operatingSystem="Windows")  # filtered out
    m.add_on_demand("us-east-1", "g5.xlarge", "1.006")
    m.add_spot("us-east-1a", "p5.48xlarge", "31.20")
    m.add_spot("us-east-1b", "p5.48xlarge", "29.75")
    m.set_quota("us-east-1", "L-417A185B", 384)
    m.set_quota("us-east-1", "L-7212CCBC", 192)
    m.set_score("us-east-1", "p5.48xlarge", 9)


def test_prices_zones_quotas_reservations_and_scores(aws_cloud, mini_catalog):
    seed(aws_cloud)
    cr = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1a", 2)
    settings = aws_cloud.provider_settings(["us-east-1", "eu-west-1"])
    snap = fetch("aws", settings, mini_catalog, NOW)

    od = {(p.region, p.instance_type): p for p in snap.prices if p.market == "on_demand"}
    assert od[("us-east-1", "p5.48xlarge")].hourly_micros == 55_040_000
    assert od[("us-east-1", "p5.48xlarge")].source == "aws:pricing"
    assert od[("eu-west-1", "p5.48xlarge")].hourly_micros == 58_500_000
    assert od[("us-east-1", "g5.xlarge")].hourly_micros == 1_006_000
    spot = {(p.zone, p.instance_type): p.hourly_micros for p in snap.prices
            if p.market == "spot" and p.region == "us-east-1"}
    assert spot == {("us-east-1a", "p5.48xlarge"): 31_200_000, ("us-east-1b", "p5.48xlarge"): 29_750_000}
    # eu-west-1 was not seeded: moto answers its placeholder 0.00001 (refused later, by the overlay)
    assert {p.hourly_micros for p in snap.prices if p.market == "spot" and p.region == "eu-west-1"} == {10}

    zones = {(z.region, z.instance_type): z.zones for z in snap.zones}
    assert "us-east-1a" in zones[("us-east-1", "p5.48xlarge")]
    assert len(zones[("us-east-1", "p5.48xlarge")]) > 1

    quotas = {(q.region, q.key): q for q in snap.quotas}
    assert quotas[("us-east-1", "L-417A185B")].limit == 384
    assert quotas[("us-east-1", "L-417A185B")].used == 0
    assert ("eu-west-1", "L-417A185B") not in quotas  # NoSuchResourceException: no such quota there
    needs = {(n.instance_type, n.market): n for n in snap.needs}
    assert needs[("p5.48xlarge", "spot")].key == "L-7212CCBC" and needs[("p5.48xlarge", "spot")].per_node == 192

    (res,) = snap.reservations
    assert (res.reservation_id, res.zone, res.total, res.used) == (cr, "us-east-1a", 2, 0)
    scores = {(s.region, s.instance_type): s.score for s in snap.spot}
    assert scores[("us-east-1", "p5.48xlarge")] == 9
    assert not snap.failed, snap.errors


def test_running_instances_count_against_the_quota(aws_cloud, mini_catalog):
    seed(aws_cloud)
    ec2 = aws_cloud.client("us-east-1")
    ami = aws_cloud.register_image("us-east-1")
    ec2.run_instances(ImageId=ami, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1)
    snap = fetch("aws", aws_cloud.provider_settings(["us-east-1"]), mini_catalog, NOW)
    quotas = {q.key: q for q in snap.quotas}
    assert quotas["L-417A185B"].used == 192 and quotas["L-417A185B"].left == 192


def test_a_failing_api_is_recorded_and_the_rest_still_answers(aws_cloud, mini_catalog):
    seed(aws_cloud)
    aws_cloud.inject("auth", times=0, match="ServiceQuotas")
    snap = fetch("aws", aws_cloud.provider_settings(["us-east-1"]), mini_catalog, NOW)
    assert ("quotas", "us-east-1") in snap.failed
    assert any("AccessDenied" in e for e in snap.errors)
    assert any(p.source == "aws:pricing" for p in snap.prices)


def test_every_call_failing_raises_a_typed_error(aws_cloud, mini_catalog):
    settings = aws_cloud.provider_settings(["us-east-1"])
    aws_cloud.inject("5xx", times=0)
    with pytest.raises(ProviderError) as e:
        fetch("aws", settings, mini_catalog, NOW)
    assert e.value.provider == "aws"


def test_per_service_endpoint_setting_wins(aws_cloud, mini_catalog, monkeypatch):
    """AWS_ENDPOINT_URL_PRICING is honoured like boto3 does, next to [providers.aws] endpoint_url."""
    seed(aws_cloud)
    settings = aws_cloud.provider_settings(["us-east-1"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", "http://127.0.0.1:9")  # nothing listens there
    snap = fetch("aws", settings, mini_catalog, NOW)
    assert ("prices", "") in snap.failed
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", aws_cloud.url)
    settings["endpoint_url"] = aws_cloud.url
    snap = fetch("aws", settings, mini_catalog, NOW)
    assert any(p.source == "aws:pricing" for p in snap.prices)
