"""Queued capacity as a market: AWS Capacity Blocks for ML and GCP flex-start are quoted with their
start time and price; the wait counts against a deadline; a block is bought only when allowed."""
from __future__ import annotations

import dataclasses
import json

import botocore.exceptions
import pytest

from policies.cost import Context, Exclusion, ExclusionKind, PricedOffer, price
from policies.demand import Demand
from providers.base import Market
from providers.market import fetch
from providers.market.overlay import overlay
from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.clouds.gcp import fake_gcp  # noqa: F401  (fixture)

NOW = 1_796_000_000.0  # 2026-11-30T00:53:20Z
H = 3600.0


def _ctx(cat, now: float = NOW) -> Context:
    return Context(cat.terms, cat.regions, cat.gpu_perf, now)


def _queued(cat, **kw):
    od = next(o for o in cat.offerings if o.provider == "gcp" and o.instance.name == "a3-highgpu-8g"
              and o.region == "us-central1" and o.market is Market.ON_DEMAND)
    return dataclasses.replace(od, market=Market.QUEUED, **kw)


# -- the cost model (pure: the time is a parameter) ---------------------------------------------

def test_a_queued_start_that_meets_the_deadline_is_priced_with_its_wait(mini_catalog):
    o = _queued(mini_catalog, starts_at=NOW + 5 * H, max_run_h=24)
    d = Demand(gpus=8, hours=10, gpu_model="H100", deadline=NOW + 20 * H)
    p = price(d, o, _ctx(mini_catalog))
    assert isinstance(p, PricedOffer)
    assert p.cost.compute == int(o.hourly_micros * 10)
    # five hours later, the same deadline is missed by the wait alone
    late = price(dataclasses.replace(d, deadline=NOW + 14 * H), o, _ctx(mini_catalog))
    assert isinstance(late, Exclusion) and late.kind is ExclusionKind.DEADLINE
    assert late.reason.startswith("starts at 2026-") and "finishes after the deadline" in late.reason


def test_a_queued_start_after_the_deadline_is_excluded_saying_when_it_starts(mini_catalog):
    o = _queued(mini_catalog, starts_at=NOW + 48 * H, max_run_h=24)
    d = Demand(gpus=8, hours=1, gpu_model="H100", deadline=NOW + 24 * H)
    e = price(d, o, _ctx(mini_catalog))
    assert isinstance(e, Exclusion) and e.kind is ExclusionKind.DEADLINE
    assert e.reason == "starts at 2026-12-02T00:53Z, after the deadline 2026-12-01T00:53Z"


def test_the_expected_wait_moves_with_the_clock_and_a_run_longer_than_allowed_is_excluded(mini_catalog):
    o = _queued(mini_catalog, wait_s=2 * H, max_run_h=168)
    assert o.start_after(NOW) == NOW + 2 * H and o.start_after(NOW + H) == NOW + 3 * H
    long = price(Demand(gpus=8, hours=200, gpu_model="H100"), o, _ctx(mini_catalog))
    assert isinstance(long, Exclusion) and long.kind is ExclusionKind.MARKET
    assert long.reason == "runs 200.0 h, longer than the 168 h this queued capacity allows"


def test_a_block_paid_up_front_costs_its_fee_whatever_runs(mini_catalog):
    o = _queued(mini_catalog, starts_at=NOW + H, max_run_h=24, upfront_micros=1_000_000_000)
    p = price(Demand(gpus=16, hours=2, gpu_model="H100", nodes=2), o, _ctx(mini_catalog))
    assert isinstance(p, PricedOffer) and p.cost.compute == 2_000_000_000


# -- AWS: DescribeCapacityBlockOfferings on the mocked EC2 --------------------------------------

def test_capacity_blocks_are_read_with_start_and_fee(aws_cloud, mini_catalog):
    aws_cloud.market.add_capacity_block("us-east-1a", "p5.48xlarge", NOW + 30 * H, "31.50")
    aws_cloud.market.add_capacity_block("us-east-1b", "p5.48xlarge", NOW + 90 * 24 * H, "30")  # too far out
    snap = fetch("aws", aws_cloud.provider_settings(["us-east-1"]), mini_catalog, NOW)
    (b,) = snap.blocks
    assert (b.zone, b.instance_type, b.count, b.duration_h) == ("us-east-1a", "p5.48xlarge", 1, 24.0)
    assert b.upfront_micros == 756_000_000 and b.offering_id.startswith("cb-")
    assert b.start == "2026-12-01T06:53:20Z" and b.end == "2026-12-02T06:53:20Z"
    assert "DescribeCapacityBlockOfferings" in aws_cloud.market.calls
    cat, _ = overlay(mini_catalog, {"aws": snap}, now=NOW, max_age_h=0)
    (o,) = [o for o in cat.offerings if o.market is Market.QUEUED]
    assert (o.starts_at, o.upfront_micros, o.max_run_h, o.zones) == (NOW + 30 * H, 756_000_000, 24.0, ("us-east-1a",))
    assert o.hourly_micros == 31_500_000 and o.offer_id == b.offering_id


def test_the_mocked_ec2_refuses_a_block_length_it_does_not_sell(aws_cloud):
    ec2 = aws_cloud.client("us-east-1")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.describe_capacity_block_offerings(InstanceType="p5.48xlarge", InstanceCount=1, CapacityDurationHours=25)
    assert e.value.response["Error"]["Code"] == "InvalidParameterValue"


def _engine(cat, buy: bool):
    from broker.quote import QuoteEngine

    return QuoteEngine(cat, enabled_providers=["aws"], regions={"aws": ["us-east-1"]}, buy_capacity_blocks=buy)


@pytest.mark.parametrize("bulk", [True, False])
def test_a_block_is_quoted_with_start_and_fee_and_launchable_only_when_buying_is_on(aws_cloud, mini_catalog, bulk):
    from broker.views import quote_to_dict

    aws_cloud.market.add_capacity_block("us-east-1a", "p5.48xlarge", NOW + 30 * H, "10")
    snap = fetch("aws", aws_cloud.provider_settings(["us-east-1"]), mini_catalog, NOW)
    cat, _ = overlay(mini_catalog, {"aws": snap}, now=NOW, max_age_h=0)
    d = Demand(gpus=8, hours=10, gpu_model="H100", deadline=NOW + 60 * H)
    off = _engine(cat, buy=False)
    off.bulk = bulk
    doc = quote_to_dict(off.quote(d, now=NOW))
    assert all(o["market"] != "queued" for o in doc["offers"])
    (ex,) = [e for e in doc["excluded"] if e["market"] == "queued"]
    assert ex["kind"] == "not_launchable" and "[market] buy_capacity_blocks is off" in ex["reason"]
    assert (ex["starts_at"], ex["upfront_usd"], ex["max_run_hours"]) == ("2026-12-01T06:53:20Z", 240.0, 24.0)

    assert "(not refundable)" in ex["reason"]
    # buying on: launchable (a launch buys it within the budget and waits for its start)
    on = _engine(cat, buy=True)
    on.bulk = bulk
    doc = quote_to_dict(on.quote(d, now=NOW))
    (q,) = [o for o in doc["offers"] if o["market"] == "queued"]
    assert (q["starts_at"], q["upfront_usd"]) == ("2026-12-01T06:53:20Z", 240.0)
    assert not [e for e in doc["excluded"] if e["market"] == "queued"]
    # prices only (no cloud enabled): the block is ranked by its whole fee
    from broker.quote import QuoteEngine

    prices = QuoteEngine(cat, bulk=bulk)
    doc = quote_to_dict(prices.quote(d, now=NOW))
    (q,) = [o for o in doc["offers"] if o["market"] == "queued"]
    assert (q["starts_at"], q["upfront_usd"], q["cost_usd"]["compute"]) == ("2026-12-01T06:53:20Z", 240.0, 240.0)
    assert doc["offers"][0] == q  # $240 for the block beats $983 on demand
    # a deadline before the block starts rules it out, saying when it starts
    early = quote_to_dict(prices.quote(dataclasses.replace(d, deadline=NOW + 20 * H), now=NOW))
    (ex,) = [e for e in early["excluded"] if e["market"] == "queued"]
    assert ex["kind"] == "deadline" and ex["reason"].startswith("starts at 2026-12-01T06:53Z, after the deadline")


# -- GCP: flex-start, quoted with its expected start and launched with FLEX_START ----------------

def test_flex_start_is_quoted_with_its_start_through_the_cli(mini_catalog_dir, tmp_path):
    import subprocess
    import sys
    import time

    import tomli_w

    from broker.times import parse_iso
    from tests.conftest import ROOT

    gcp = {"enabled": True, "project": "p", "regions": ["us-central1"], "credentials": "anonymous",
           "api_endpoint": "http://127.0.0.1:9", "flex_start": True, "flex_start_wait_h": 3.0,
           "flex_start_max_run_h": 48.0}
    cfg = tmp_path / "broker.toml"
    cfg.write_bytes(tomli_w.dumps({"owner": "t", "catalog": {"path": str(mini_catalog_dir)},
                                   "providers": {"gcp": gcp}}).encode())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def quote(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "broker.cli", "quote", "--config", str(cfg), "--gpu", "H100:8",
                               "--top", "0", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)

    before = time.time()
    r = quote("--hours", "10", "-o", "json")
    assert r.returncode == 0, r.stderr
    (q,) = [o for o in json.loads(r.stdout)["offers"] if o["market"] == "queued"]
    assert (q["provider"], q["instance_type"], q["max_run_hours"], q["upfront_usd"]) == ("gcp", "a3-highgpu-8g", 48.0, 0.0)
    assert before + 3 * H - 60 <= parse_iso(q["starts_at"]) <= time.time() + 3 * H + 60
    assert q["cost_usd"]["compute"] == 882.5  # paid per hour as it runs: 88.25 x 10 h
    table = quote("--hours", "10")
    assert table.returncode == 0, table.stderr
    assert f"queued: starts at {q['starts_at'][:13]}" in table.stdout and "paid per hour, runs at most 48 h" in table.stdout
    # a job longer than the run limit is excluded, saying so
    long = quote("--hours", "60", "-o", "json")
    assert long.returncode == 0, long.stderr
    (ex,) = [e for e in json.loads(long.stdout)["excluded"] if e["market"] == "queued"]
    assert ex["reason"] == "runs 60.0 h, longer than the 48 h this queued capacity allows"


def test_flex_start_insert_carries_its_scheduling_and_the_mocked_gcp_takes_it(fake_gcp):
    from providers.gcp import GcpProvider
    from tests.test_provider_gcp import A3, OWNER, settings, spec

    gcp = GcpProvider.from_config(settings(fake_gcp.url), owner=OWNER)
    [inst] = gcp.launch(dataclasses.replace(spec("lease-flex", market=Market.QUEUED), max_run_h=10.5))
    assert inst.market is Market.QUEUED and inst.instance_type == A3.name
    sched = fake_gcp.instance("lease-flex-n0")["scheduling"]
    assert sched["provisioningModel"] == "FLEX_START" and int(sched["maxRunDuration"]["seconds"]) == 37800
    assert sched["instanceTerminationAction"] == "DELETE" and sched["automaticRestart"] is False


@pytest.mark.parametrize("sched, field", [
    ({"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE"},
     "maxRunDuration"),
    ({"provisioningModel": "FLEX_START", "instanceTerminationAction": "DELETE", "onHostMaintenance": "TERMINATE",
      "maxRunDuration": {"seconds": "604801"}}, "maxRunDuration.seconds"),
    ({"provisioningModel": "FLEX_START", "instanceTerminationAction": "STOP", "onHostMaintenance": "TERMINATE",
      "maxRunDuration": {"seconds": "3600"}}, "instanceTerminationAction"),
])
def test_the_mocked_gcp_refuses_a_flex_start_vm_the_real_api_would(fake_gcp, sched, field):
    import urllib.error
    import urllib.request

    body = {"name": "flex-bad", "machineType": "zones/us-central1-b/machineTypes/a3-highgpu-8g",
            "disks": [{"boot": True, "initializeParams": {"sourceImage": "projects/x/global/images/y"}}],
            "networkInterfaces": [{"network": "global/networks/default"}], "scheduling": sched}
    req = urllib.request.Request(f"{fake_gcp.url}/compute/v1/projects/test-project/zones/us-central1-b/instances",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    err = json.loads(e.value.read())["error"]
    assert e.value.code == 400 and field in err["message"] and err["errors"][0]["reason"] in ("invalid", "required")
    assert fake_gcp.instance("flex-bad") is None


def test_the_grpc_quote_carries_the_start_fee_and_run_limit(mini_catalog):
    from broker.convert import quote_body_pb, quote_from_pb
    from broker.quote import QuoteEngine
    from broker.v1 import broker_pb2 as pb
    from broker.views import quote_to_dict
    from providers.catalog import Catalog

    block = dataclasses.replace(_queued(mini_catalog, starts_at=NOW + 30 * H, max_run_h=24,
                                        upfront_micros=240_000_000), instance=mini_catalog.instance("aws", "p5.48xlarge"),
                                region="us-east-1", zones=("us-east-1a",), offer_id="cb-0123456789abcdef0")
    flex = _queued(mini_catalog, wait_s=2 * H, max_run_h=168)
    c = mini_catalog
    cat = Catalog(c.instances, c.regions, c.terms, c.gpu_perf, tuple(c.offerings) + (block, flex), c.committed_micros, c.as_of)
    q = QuoteEngine(cat).quote(Demand(gpus=8, hours=10, gpu_model="H100", deadline=NOW + 20 * H), now=NOW)
    m = pb.Quote(quote_id=q.quote_id)
    m.MergeFrom(quote_body_pb(q))
    (o,) = [o for o in m.offers if o.market == pb.MARKET_QUEUED]
    assert (o.provider, o.starts_at, o.upfront_usd, o.max_run_hours) == ("gcp", "2026-11-30T02:53:20Z", 0.0, 168.0)
    (e,) = [e for e in m.excluded if e.market == pb.MARKET_QUEUED]
    assert (e.provider, e.starts_at, e.upfront_usd, e.max_run_hours) == ("aws", "2026-12-01T06:53:20Z", 240.0, 24.0)
    back, local = quote_from_pb(m), quote_to_dict(q)
    assert [x for x in back["offers"] if x["market"] == "queued"][0]["starts_at"] == "2026-11-30T02:53:20Z"
    assert [x for x in back["excluded"] if x["market"] == "queued"] == \
        [x for x in local["excluded"] if x["market"] == "queued"]
