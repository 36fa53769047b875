"""A refresh per source: when AWS answers GetSpotPlacementScores and DescribeCapacityReservations
with a load balancer's 5xx HTML page, `broker catalog refresh` still refreshes every AWS price
(exit 0, one warning line per failed source) and `broker catalog show` names the failing sources;
before, the page's parser error escaped the refresh: exit 1, the raw page printed, no price kept."""
from __future__ import annotations

import json

from broker import market_store
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.clouds.azure import fake_arm, fake_arm_server  # noqa: F401
from tests.clouds.azure_market import fake_retail, fake_retail_server  # noqa: F401
from tests.clouds.gcp import fake_gcp  # noqa: F401
from tests.clouds.gcp_billing import fake_billing, fake_billing_server  # noqa: F401
from tests.test_market_quote import cli, market  # noqa: F401


def _stored(config_path) -> dict:
    import tomllib

    cfg = tomllib.loads(config_path.read_text())
    db = market_store.reader(cfg["store"]["url"])
    return market_store.load(db)


def test_a_5xx_page_from_two_sources_leaves_the_others_fresh_and_names_them(market, aws_cloud):  # noqa: F811
    aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1b", 2)
    first = cli("catalog", "refresh", "--config", str(market), "--provider", "aws")
    assert first.returncode == 0, first.stdout + first.stderr
    before = _stored(market)["aws"]
    assert before.snapshot.reservations and before.snapshot.spot

    aws_cloud.market.add_on_demand("us-east-1", "p5.48xlarge", "51.00")  # the price list moved
    aws_cloud.inject("html", times=0, match="GetSpotPlacementScores")
    aws_cloud.inject("html", times=0, match="DescribeCapacityReservations")
    r = cli("catalog", "refresh", "--config", str(market), "--provider", "aws")
    out = r.stdout + r.stderr
    print(r.stdout)  # the README shows this output
    assert r.returncode == 0, out
    assert "Traceback" not in out and "<html" not in out.lower() and "<!doctype" not in out.lower()
    warnings = [line for line in r.stdout.splitlines() if line.startswith("warning: aws ")]
    assert len(warnings) == 2, r.stdout
    assert any(w.startswith("warning: aws placement_scores not refreshed") and "HTTP 502" in w for w in warnings)
    assert any(w.startswith("warning: aws reservations not refreshed") and "HTTP 502" in w for w in warnings)

    after = _stored(market)["aws"]
    prices = {(p.region, p.instance_type, p.market): p.hourly_micros for p in after.snapshot.prices}
    assert prices[("us-east-1", "p5.48xlarge", "on_demand")] == 51_000_000  # fresh
    assert after.snapshot.reservations == before.snapshot.reservations  # kept, with their age
    assert after.snapshot.spot == before.snapshot.spot
    states = after.sources()
    assert states["price_list"].ok_at == after.snapshot.fetched_at and not states["price_list"].error
    assert states["placement_scores"].error and states["placement_scores"].ok_at == before.snapshot.fetched_at
    assert states["reservations"].error and not states["spot_history"].error and not states["quotas"].error

    show = cli("catalog", "show", "--config", str(market), "--provider", "aws", "--format", "json")
    assert show.returncode == 0, show.stderr
    (refresh,) = json.loads(show.stdout)["refreshes"]
    failing = {k for k, v in refresh["sources"].items() if v["error"]}
    assert failing == {"placement_scores", "reservations"}
    table = cli("catalog", "show", "--config", str(market), "--provider", "aws")
    assert table.returncode == 0, table.stderr
    assert "2 of 7 sources failing" in table.stdout
    assert "warning: aws placement_scores failing" in table.stdout
    assert "warning: aws reservations failing" in table.stdout
