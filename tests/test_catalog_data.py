"""Validate the bundled price-catalog data files under providers/data/.

Stdlib only (csv, tomllib): these checks must not depend on the broker package, so a broken
data file is reported as such and not as an import error somewhere else.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from providers.registry import names

DATA = Path(__file__).resolve().parent.parent / "providers" / "data"

PROVIDERS = set(names())  # every registered cloud has its rows and terms here
GPU_MODELS = {"H200", "H100", "A100", "A10G", "A10", "L4", "L40S", "T4", "V100"}
INTERCONNECTS = {"efa", "tcpx", "tcpxo", "infiniband", "ethernet"}
GEOS = {"us", "eu", "asia", "ca", "sa", "au", "me"}

INSTANCES_HEADER = [
    "provider", "instance_type", "machine_type", "accelerator_type", "gpu", "gpus",
    "gpu_memory_gb", "vcpus", "ram_gb", "interconnect", "interconnect_gbps", "fabric_nics",
    "source",
]
REGIONS_HEADER = ["provider", "region", "geo", "location", "zones"]
PRICES_HEADER = [
    "provider", "region", "instance_type", "on_demand_usd", "spot_usd", "committed_1y_usd",
    "as_of", "source", "note",
]

REQUIRED = {
    "aws": [
        "p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p4de.24xlarge",
        "g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge",
        "g5.xlarge", "g5.12xlarge", "g5.48xlarge",
        "g4dn.xlarge", "g4dn.12xlarge",
    ],
    "gcp": [
        "a3-highgpu-8g", "a3-megagpu-8g", "a2-highgpu-1g", "a2-highgpu-8g", "a2-ultragpu-8g",
        "g2-standard-8", "g2-standard-48",
        "n1-standard-8+t4x1", "n1-standard-32+t4x4",
        "n1-standard-8+v100x1", "n1-standard-64+v100x8",
    ],
    "azure": [
        "Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4", "Standard_ND96asr_v4",
        "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4", "Standard_NC96ads_A100_v4",
        "Standard_NC4as_T4_v3", "Standard_NC64as_T4_v3",
        "Standard_NV36ads_A10_v5", "Standard_NV72ads_A10_v5",
    ],
}

# Shapes sold in many regions (g5/g4dn/T4/L4/A100/L40S/A10 families): at least 6 priced regions.
# Everything else required (H100/H200 and 8x A100-80GB/IB shapes, N1+V100) needs at least 3.
BROADLY_AVAILABLE = {
    ("aws", "g4dn.xlarge"), ("aws", "g4dn.12xlarge"),
    ("aws", "g5.xlarge"), ("aws", "g5.12xlarge"), ("aws", "g5.48xlarge"),
    ("aws", "g6e.xlarge"), ("aws", "g6e.12xlarge"), ("aws", "g6e.48xlarge"),
    ("aws", "p4d.24xlarge"),
    ("gcp", "a2-highgpu-1g"), ("gcp", "a2-highgpu-8g"),
    ("gcp", "g2-standard-8"), ("gcp", "g2-standard-48"),
    ("gcp", "n1-standard-8+t4x1"), ("gcp", "n1-standard-32+t4x4"),
    ("azure", "Standard_NC4as_T4_v3"), ("azure", "Standard_NC64as_T4_v3"),
    ("azure", "Standard_NC24ads_A100_v4"), ("azure", "Standard_NC48ads_A100_v4"),
    ("azure", "Standard_NC96ads_A100_v4"),
    ("azure", "Standard_NV36ads_A10_v5"), ("azure", "Standard_NV72ads_A10_v5"),
}

DECIMAL = re.compile(r"^\d+(\.\d{1,6})?$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _read(name: str, header: list[str]) -> list[dict[str, str]]:
    path = DATA / name
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == header, f"{name}: header {reader.fieldnames} != {header}"
        rows = list(reader)
    assert rows, f"{name} is empty"
    for i, row in enumerate(rows, start=2):
        assert None not in row, f"{name}:{i}: too many fields"
        assert all(v is not None for v in row.values()), f"{name}:{i}: too few fields"
    return rows


@pytest.fixture(scope="module")
def instances() -> list[dict[str, str]]:
    return _read("instances.csv", INSTANCES_HEADER)


@pytest.fixture(scope="module")
def regions() -> list[dict[str, str]]:
    return _read("regions.csv", REGIONS_HEADER)


@pytest.fixture(scope="module")
def prices() -> list[dict[str, str]]:
    return _read("prices.csv", PRICES_HEADER)


@pytest.fixture(scope="module")
def network() -> dict:
    with (DATA / "network.toml").open("rb") as f:
        return tomllib.load(f)


# ---------------------------------------------------------------- instances.csv


def test_required_instance_types_present(instances):
    have = {(r["provider"], r["instance_type"]) for r in instances}
    missing = [(p, t) for p, types in REQUIRED.items() for t in types if (p, t) not in have]
    assert not missing, f"missing instance types: {missing}"


def test_instance_rows_are_well_formed(instances):
    seen = set()
    for r in instances:
        key = (r["provider"], r["instance_type"])
        assert key not in seen, f"duplicate instance {key}"
        seen.add(key)
        assert r["provider"] in PROVIDERS, key
        assert r["gpu"] in GPU_MODELS, (key, r["gpu"])
        assert r["interconnect"] in INTERCONNECTS, (key, r["interconnect"])
        for col in ("gpus", "gpu_memory_gb", "vcpus", "ram_gb", "interconnect_gbps"):
            assert float(r[col]) > 0, (key, col)
        assert float(r["gpus"]).is_integer(), key
        # A fabric is built from network cards at launch: a fabric type says how many it has,
        # plain Ethernet none.
        assert (int(r["fabric_nics"]) > 0) == (r["interconnect"] != "ethernet"), (key, r["fabric_nics"])
        assert r["source"].strip(), f"{key}: no source"
        if r["provider"] == "azure":
            assert r["instance_type"].startswith("Standard_"), key


def test_machine_and_accelerator_type_only_on_gcp_n1_rows(instances):
    for r in instances:
        key = (r["provider"], r["instance_type"])
        if r["provider"] == "gcp" and r["instance_type"].startswith("n1-"):
            vm, _, accel = r["instance_type"].partition("+")
            assert r["machine_type"] == vm, key
            assert r["accelerator_type"].startswith("nvidia-tesla-"), key
            m = re.fullmatch(r"(t4|v100)x(\d+)", accel)
            assert m, key
            assert int(m.group(2)) == int(r["gpus"]), key
            assert r["accelerator_type"] == f"nvidia-tesla-{m.group(1)}", key
        else:
            assert r["machine_type"] == "" and r["accelerator_type"] == "", key


def test_a100_variants_distinguished_by_memory(instances):
    mem = {r["instance_type"]: int(r["gpu_memory_gb"]) for r in instances if r["gpu"] == "A100"}
    assert mem["p4d.24xlarge"] == 40 and mem["p4de.24xlarge"] == 80
    assert mem["a2-highgpu-8g"] == 40 and mem["a2-ultragpu-8g"] == 80
    assert mem["Standard_ND96asr_v4"] == 40 and mem["Standard_ND96amsr_A100_v4"] == 80


# ---------------------------------------------------------------- regions.csv


def test_regions_well_formed_and_spread(regions):
    seen = set()
    geos = defaultdict(set)
    for r in regions:
        key = (r["provider"], r["region"])
        assert key not in seen, f"duplicate region {key}"
        seen.add(key)
        assert r["provider"] in PROVIDERS, key
        assert r["geo"] in GEOS, key
        assert r["location"].strip(), key
        for zone in r["zones"].split():
            if r["provider"] == "azure":
                assert zone in {"1", "2", "3"}, (key, zone)
            else:
                assert zone.startswith(r["region"]), (key, zone)
        geos[r["provider"]].add(r["geo"])
    for p in PROVIDERS:
        n = sum(1 for prov, _ in seen if prov == p)
        assert n >= 6, f"{p}: only {n} regions"
        assert {"us", "eu", "asia"} <= geos[p], f"{p}: geos {geos[p]}"


# ---------------------------------------------------------------- prices.csv


def test_prices_reference_known_instances_and_regions(prices, instances, regions):
    known_i = {(r["provider"], r["instance_type"]) for r in instances}
    known_r = {(r["provider"], r["region"]) for r in regions}
    seen = set()
    for r in prices:
        key = (r["provider"], r["region"], r["instance_type"])
        assert key not in seen, f"duplicate price row {key}"
        seen.add(key)
        assert (r["provider"], r["instance_type"]) in known_i, f"unknown instance in {key}"
        assert (r["provider"], r["region"]) in known_r, f"unknown region in {key}"


def test_prices_have_provenance(prices):
    today = dt.date.today()
    for r in prices:
        key = (r["provider"], r["region"], r["instance_type"])
        assert r["source"].strip(), f"{key}: no source"
        assert DATE.match(r["as_of"]), f"{key}: bad as_of {r['as_of']!r}"
        as_of = dt.date.fromisoformat(r["as_of"])
        assert dt.date(2015, 1, 1) <= as_of <= today, f"{key}: implausible as_of {as_of}"


def test_price_values(prices):
    for r in prices:
        key = (r["provider"], r["region"], r["instance_type"])
        for col in ("on_demand_usd", "spot_usd", "committed_1y_usd"):
            if r[col] != "":
                assert DECIMAL.match(r[col]), f"{key}: {col}={r[col]!r} is not a decimal (<= 6 dp)"
        od = float(r["on_demand_usd"])
        assert od > 0, key
        if r["spot_usd"]:
            assert 0 < float(r["spot_usd"]) < od, f"{key}: spot {r['spot_usd']} !< on-demand {od}"
        if r["committed_1y_usd"]:
            c = float(r["committed_1y_usd"])
            assert 0 < c < od, f"{key}: committed {c} !< on-demand {od}"


def test_approximations_are_labelled(prices):
    """A derived or estimated number must say how it was obtained."""
    for r in prices:
        note = r["note"].lower()
        if "approximation" in note:
            assert "approximation:" in note, (r["provider"], r["region"], r["instance_type"])


def test_required_types_priced_in_enough_regions(prices):
    regions_of = defaultdict(set)
    for r in prices:
        regions_of[(r["provider"], r["instance_type"])].add(r["region"])
    short = []
    for p, types in REQUIRED.items():
        for t in types:
            need = 6 if (p, t) in BROADLY_AVAILABLE else 3
            have = len(regions_of[(p, t)])
            if have < need:
                short.append((p, t, have, need))
    assert not short, f"priced in too few regions (provider, type, have, need): {short}"


def test_n1_attachment_price_is_machine_plus_gpus(prices):
    """N1 rows are priced as VM + GPU attachments; the VM share must be positive and the GPU
    share must scale with the GPU count (per-GPU price is the same within a region)."""
    by_region = defaultdict(dict)
    for r in prices:
        if r["provider"] == "gcp" and r["instance_type"].startswith("n1-"):
            by_region[r["region"]][r["instance_type"]] = float(r["on_demand_usd"])
    checked = 0
    for region, rows in by_region.items():
        if {"n1-standard-8+v100x1", "n1-standard-16+v100x2"} <= rows.keys():
            one, two = rows["n1-standard-8+v100x1"], rows["n1-standard-16+v100x2"]
            assert two == pytest.approx(2 * one, rel=1e-6), region
            checked += 1
    assert checked >= 3


# ---------------------------------------------------------------- network.toml

NETWORK_KEYS = {
    "sla_pct", "startup_s", "spot_interruptions_per_hour", "storage_usd_per_gb_month",
    "inter_zone_usd_per_gb", "inter_region_usd_per_gb", "inter_continent_usd_per_gb",
    "ingress_usd_per_gb", "source", "as_of", "note",
}


def test_network_tables(network):
    for p in PROVIDERS:
        t = network[p]
        missing = NETWORK_KEYS - t.keys()
        assert not missing, f"{p}: missing {missing}"
        assert t["source"].strip() and t["note"].strip(), p
        assert DATE.match(t["as_of"]), p
        dt.date.fromisoformat(t["as_of"])
        assert 90 < t["sla_pct"] < 100, p
        assert t["startup_s"] > 0, p
        assert 0 <= t["spot_interruptions_per_hour"] < 10, p
        for k in NETWORK_KEYS - {"sla_pct", "startup_s", "source", "as_of", "note"}:
            assert t[k] >= 0, (p, k)
        assert t["inter_region_usd_per_gb"] <= t["inter_continent_usd_per_gb"], p


def test_egress_tiers_ascending(network):
    for p in PROVIDERS:
        tiers = network[p]["egress"]
        assert len(tiers) >= 2, p
        bounds = [t["up_to_gb"] for t in tiers]
        assert bounds[-1] == 0, f"{p}: last tier must be unlimited (0)"
        finite = bounds[:-1]
        assert all(b > 0 for b in finite), p
        assert finite == sorted(finite) and len(set(finite)) == len(finite), f"{p}: {bounds}"
        assert all(t["usd_per_gb"] >= 0 for t in tiers), p
        paid = [t["usd_per_gb"] for t in tiers if t["usd_per_gb"] > 0]
        assert paid == sorted(paid, reverse=True), f"{p}: volume tiers should not get dearer"


def test_gpu_throughput_table(network):
    g = network["gpus"]
    assert GPU_MODELS <= g.keys()
    assert g["A100"] == 1.0
    assert g["source"].strip() and "approximation" in g["note"].lower()
    assert g["H200"] >= g["H100"] > g["A100"] > g["V100"] > g["T4"] > 0
