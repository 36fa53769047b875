"""The live market end to end: `broker catalog refresh` against the mocked clouds changes what a
quote shows; quotas exclude, reservations come first and fill up, bad prices are refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import tomli_w

from tests.clouds.aws import aws_cloud, aws_cloud_server  # noqa: F401  (fixtures)
from tests.clouds.azure import fake_arm, fake_arm_server  # noqa: F401
from tests.clouds.azure_market import fake_retail, fake_retail_server  # noqa: F401
from tests.clouds.gcp import fake_gcp  # noqa: F401
from tests.clouds.gcp_billing import fake_billing, fake_billing_server  # noqa: F401
from tests.clouds.three import AZ_SUB, AZ_SUBNET, SSH_KEY
from tests.conftest import ROOT

ND = "Standard_ND96isr_H100_v5"


@pytest.fixture
def market(aws_cloud, fake_gcp, fake_billing, fake_arm, fake_retail, mini_catalog_dir, tmp_path):
    """Three seeded clouds and a config (mini catalog, SQLite store) that points at them."""
    m = aws_cloud.market
    m.add_on_demand("us-east-1", "p5.48xlarge", "55.04")
    m.add_spot("us-east-1a", "p5.48xlarge", "31.20")
    m.add_spot("us-east-1b", "p5.48xlarge", "29.75")
    m.add_spot("us-east-1a", "g5.xlarge", "0.00001")  # a placeholder answer: must be refused
    m.set_score("us-east-1", "p5.48xlarge", 9)
    fake_billing.add_machine("A3", "Nvidia H100 80GB GPU", ["us-central1"], gpu="2.50", core="0.03",
                             ram="0.004")
    fake_retail.add_price("eastus", ND, "88.00")
    fake_arm.set_family(ND, "standardNDSH100v5Family", 96)
    fake_arm.set_limit("eastus", "standardNDSH100v5Family", 192)
    cfg = {
        "owner": "broker-test", "store": {"url": f"sqlite:///{tmp_path / 'broker.db'}"},
        "catalog": {"path": str(mini_catalog_dir), "max_age_h": 24},
        "providers": {
            # eu-west-1 is configured (launchable) but nothing live prices it: it keeps the bundled price
            "aws": aws_cloud.provider_settings(["us-east-1", "eu-west-1"], credentials="anonymous"),
            "gcp": {"enabled": True, "project": "test-project", "regions": ["us-central1"],
                    "api_endpoint": fake_gcp.url, "billing_api_endpoint": fake_billing.url,
                    "credentials": "anonymous", "timeout_s": 5},
            "azure": {"enabled": True, "subscription_id": AZ_SUB, "resource_group": "broker-rg",
                      "regions": ["eastus"], "base_url": fake_arm.url, "credentials": "anonymous",
                      "subnet_id": AZ_SUBNET, "ssh_public_key": SSH_KEY, "retries": 0, "timeout_s": 5,
                      "retail_prices_url": fake_retail.url},
        },
    }
    path = tmp_path / "broker.toml"
    path.write_bytes(tomli_w.dumps(cfg).encode())
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKER_")}
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def offers(doc: dict) -> dict:
    return {(o["provider"], o["region"], o["instance_type"], o["market"]): o for o in doc["offers"]}


def test_refresh_changes_the_prices_a_quote_shows(market, aws_cloud):
    res = aws_cloud.add_capacity_reservation("us-east-1", "p5.48xlarge", "us-east-1b", 2)
    quote = ["quote", "--config", str(market), "--gpu", "H100:8", "--hours", "10", "--interruptible",
             "--checkpoint-minutes", "30", "--top", "0", "--format", "json"]
    before = cli(*quote)
    assert before.returncode == 0, before.stderr
    old = offers(json.loads(before.stdout))[("aws", "us-east-1", "p5.48xlarge", "on_demand")]
    assert (old["hourly_usd"], old["price_source"], old["stale"]) == (98.32, "bundled:2026-11-01", True)

    r = cli("catalog", "refresh", "--config", str(market))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "aws: " in r.stdout and "gcp: " in r.stdout and "azure: " in r.stdout
    assert "refused aws:spot_price_history price $0.00001/h for aws us-east-1 us-east-1a g5.xlarge spot" in r.stdout

    after = cli(*quote)
    assert after.returncode == 0, after.stderr
    doc = json.loads(after.stdout)
    got = offers(doc)
    od = got[("aws", "us-east-1", "p5.48xlarge", "on_demand")]
    assert (od["hourly_usd"], od["price_source"], od["stale"]) == (55.04, "aws:pricing", False)
    assert od["price_as_of"].endswith("Z") and od["price_as_of"][:4] == time.strftime("%Y", time.gmtime())
    assert len(od["zones"]) > 1 and od["zone"] == od["zones"][0]
    spot = got[("aws", "us-east-1", "p5.48xlarge", "spot")]
    assert spot["hourly_usd"] == 29.75 and spot["price_source"] == "aws:spot_price_history"
    assert spot["zones"][:2] == ["us-east-1b", "us-east-1a"]  # cheapest zone first
    assert spot["interruption_source"] == "aws:spot_placement_score"
    assert spot["interruptions_per_hour"] < 0.05  # score 9 of 10: below the catalog's 0.05
    assert got[("gcp", "us-central1", "a3-highgpu-8g", "on_demand")]["price_source"] == "gcp:billing_catalog"
    assert got[("azure", "eastus", ND, "on_demand")]["hourly_usd"] == 88.0
    # the rows nothing live priced keep the bundled price, marked stale
    assert got[("aws", "eu-west-1", "p5.48xlarge", "on_demand")]["price_source"] == "bundled:2026-11-01"
    # the capacity reservation: first, at its marginal cost
    first = doc["offers"][0]
    assert (first["market"], first["hourly_usd"], first["zone"]) == ("reserved", 0.0, "us-east-1b")
    assert first["price_source"] == "aws:reservation"

    table = cli("quote", "--config", str(market), "--gpu", "H100:8", "--hours", "10", "--top", "0")
    assert table.returncode == 0, table.stderr
    assert "oldest price 2026-11-01 (bundled)" in table.stdout and "100.00*" in table.stdout and "55.04 " in table.stdout
    assert "* stale" in table.stdout

    show = cli("catalog", "show", "--config", str(market), "--gpu", "H100", "--provider", "aws", "--format", "json")
    assert show.returncode == 0, show.stderr
    shown = json.loads(show.stdout)
    assert {r["provider"] for r in shown["offerings"]} == {"aws"}
    assert any(r["reservation"] == res and r["free_nodes"] == 2 for r in shown["offerings"])
    assert [r["provider"] for r in shown["refreshes"]] == ["aws"] and not shown["refreshes"][0]["last_error"]


def test_bad_input_to_catalog_commands_exits_2(market):
    r = cli("catalog", "refresh", "--config", str(market), "--provider", "ibm")
    assert r.returncode == 2 and "--provider" in r.stderr and "Traceback" not in r.stderr
    r = cli("catalog", "show", "--config", str(market), "--gpu", "Z9")
    assert r.returncode == 2 and "--gpu" in r.stderr
