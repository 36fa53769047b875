"""The bundled price catalog: real public list prices, loaded once and indexed for quoting.

Data files live in ``providers/data/`` (see its README for sources and dates). Loading parses
every price into integer micro-dollars and groups offerings by GPU model, so a quote touches
only the offerings of the GPU it asks for and never re-parses text.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from providers import catalog_cache
from providers.base import MICROS, InstanceType, Market, Offering
from providers.files import SMALL_BYTES, lines, read_text

DATA_DIR = Path(__file__).with_name("data")


class CatalogError(ValueError):
    """A catalog file is missing a column, references an unknown row, or holds a bad number."""


def usd_to_micros(text: str | float | Decimal) -> int:
    return int((Decimal(str(text)) * MICROS).to_integral_value())


@dataclass(frozen=True, slots=True)
class Region:
    provider: str
    name: str
    geo: str  # "us", "eu", "asia", ...
    location: str
    zones: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Terms:
    """A provider's non-compute prices and published promises."""

    provider: str
    sla_pct: float
    startup_s: int
    spot_interruptions_per_hour: float
    storage_micros_per_gb_month: int
    inter_zone_micros_per_gb: int
    inter_region_micros_per_gb: int
    inter_continent_micros_per_gb: int
    ingress_micros_per_gb: int
    # Internet egress tiers: (up to this many GB in the month, price per GB); 0 = unlimited.
    egress_tiers: tuple[tuple[int, int], ...]
    as_of: str = ""
    source: str = ""

    def egress_micros(self, gb: float) -> int:
        """Internet egress for ``gb`` GB, walking the tiers from the first GB of the month."""
        left, total, floor = gb, 0, 0
        for up_to, price in self.egress_tiers:
            span = left if up_to == 0 else min(left, max(0, up_to - floor))
            total += int(span * price)
            left -= span
            floor = up_to
            if left <= 0:
                break
        return total


@dataclass(slots=True)
class Catalog:
    instances: dict[tuple[str, str], InstanceType]
    regions: dict[tuple[str, str], Region]
    terms: dict[str, Terms]
    gpu_perf: dict[str, float]
    offerings: tuple[Offering, ...]
    committed_micros: dict[tuple[str, str, str], int]
    as_of: str
    by_gpu: dict[str, tuple[Offering, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        groups: dict[str, list[Offering]] = {}
        for o in self.offerings:
            groups.setdefault(o.instance.gpu.upper(), []).append(o)
        self.by_gpu = {k: tuple(v) for k, v in groups.items()}

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted(self.by_gpu))

    def region(self, provider: str, name: str) -> Region | None:
        return self.regions.get((provider, name))

    def instance(self, provider: str, name: str) -> InstanceType | None:
        return self.instances.get((provider, name))

    def find(self, provider: str, region: str, instance_type: str, market: Market) -> Offering | None:
        for o in self.offerings:
            if (
                o.instance.provider == provider
                and o.region == region
                and o.instance.name == instance_type
                and o.market is market
            ):
                return o
        return None

    def with_offerings(self, extra: tuple[Offering, ...]) -> "Catalog":
        """A catalog that also holds ``extra`` (e.g. configured reservations)."""
        return Catalog(
            self.instances, self.regions, self.terms, self.gpu_perf,
            self.offerings + extra, self.committed_micros, self.as_of,
        )


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    import csv  # here and in load: only a parse needs them, not the compiled copy

    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(lines(f))
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise CatalogError(f"{path.name} lacks column(s) {', '.join(missing)}")
            return [{k: (v or "").strip() for k, v in row.items() if k} for row in reader]
    except FileNotFoundError:
        raise CatalogError(f"catalog file {path} is missing") from None
    except OSError as e:  # a line past providers.files.LINE_CHARS, a directory, no permission
        raise CatalogError(f"catalog file {path} cannot be read: {e.strerror or e}") from None


def _terms(provider: str, t: dict) -> Terms:
    tiers = tuple(
        (int(tier["up_to_gb"]), usd_to_micros(tier["usd_per_gb"])) for tier in t.get("egress", [])
    )
    return Terms(
        provider=provider,
        sla_pct=float(t["sla_pct"]),
        startup_s=int(t["startup_s"]),
        spot_interruptions_per_hour=float(t["spot_interruptions_per_hour"]),
        storage_micros_per_gb_month=usd_to_micros(t["storage_usd_per_gb_month"]),
        inter_zone_micros_per_gb=usd_to_micros(t["inter_zone_usd_per_gb"]),
        inter_region_micros_per_gb=usd_to_micros(t["inter_region_usd_per_gb"]),
        inter_continent_micros_per_gb=usd_to_micros(t["inter_continent_usd_per_gb"]),
        ingress_micros_per_gb=usd_to_micros(t.get("ingress_usd_per_gb", 0)),
        egress_tiers=tiers,
        as_of=str(t.get("as_of", "")),
        source=str(t.get("source", "")),
    )


def load(data_dir: Path | str | None = None) -> Catalog:
    """Parse and index the catalog in ``data_dir`` (default: the bundled one)."""
    d = Path(data_dir) if data_dir else DATA_DIR
    instances: dict[tuple[str, str], InstanceType] = {}
    for r in _rows(d / "instances.csv", ("provider", "instance_type", "gpu", "gpus", "gpu_memory_gb")):
        try:
            it = InstanceType(
                provider=r["provider"], name=r["instance_type"], gpu=r["gpu"], gpus=int(r["gpus"]),
                gpu_memory_gb=int(float(r["gpu_memory_gb"])), vcpus=int(float(r.get("vcpus") or 0)),
                ram_gb=int(float(r.get("ram_gb") or 0)), interconnect=r.get("interconnect") or "ethernet",
                interconnect_gbps=int(float(r.get("interconnect_gbps") or 0)),
                accelerator_type=r.get("accelerator_type", ""), machine_type=r.get("machine_type", ""),
                fabric_nics=int(r.get("fabric_nics") or 0),
            )
        except ValueError as e:
            raise CatalogError(f"instances.csv row {r.get('instance_type')}: {e}") from None
        instances[(it.provider, it.name)] = it
    regions: dict[tuple[str, str], Region] = {}
    for r in _rows(d / "regions.csv", ("provider", "region", "geo")):
        regions[(r["provider"], r["region"])] = Region(
            r["provider"], r["region"], r["geo"].lower(), r.get("location", ""),
            tuple((r.get("zones") or "").split()),
        )
    import tomllib

    try:
        net = tomllib.loads(read_text(d / "network.toml", SMALL_BYTES))
    except OSError as e:
        raise CatalogError(f"catalog file {d / 'network.toml'} cannot be read: {e.strerror or e}") from None
    from providers.registry import names  # a parse only: the compiled copy needs no registry

    clouds = names()
    unknown = sorted(k for k in net if k not in clouds and k != "gpus")
    if unknown:
        raise CatalogError(f"network.toml has terms for {', '.join(unknown)}, which no cloud registration "
                           f"carries (registered: {', '.join(clouds)}; see providers/registry.py)")
    terms = {p: _terms(p, net[p]) for p in clouds if p in net}
    gpu_perf = {k.upper(): float(v) for k, v in net.get("gpus", {}).items() if not isinstance(v, str)}

    offerings: list[Offering] = []
    committed: dict[tuple[str, str, str], int] = {}
    as_of = ""
    for r in _rows(d / "prices.csv", ("provider", "region", "instance_type", "on_demand_usd", "as_of")):
        key = (r["provider"], r["instance_type"])
        it = instances.get(key)
        reg = regions.get((r["provider"], r["region"]))
        if r["provider"] in clouds and r["provider"] not in terms:
            raise CatalogError(f"prices.csv row {r['provider']}/{r['region']}/{r['instance_type']}: cloud "
                               f"{r['provider']} has no network and SLA terms in network.toml")
        if it is None or reg is None or r["provider"] not in terms:
            raise CatalogError(f"prices.csv row {r['provider']}/{r['region']}/{r['instance_type']} "
                               "names an unknown instance type, region or provider")
        sla = terms[r["provider"]].sla_pct
        as_of = max(as_of, r["as_of"])
        common = dict(instance=it, region=reg.name, zones=reg.zones, sla_pct=sla, as_of=r["as_of"],
                      source=r.get("source", ""))
        offerings.append(Offering(market=Market.ON_DEMAND, hourly_micros=usd_to_micros(r["on_demand_usd"]), **common))
        if r.get("spot_usd"):
            # Spot capacity carries no SLA.
            offerings.append(Offering(market=Market.SPOT, hourly_micros=usd_to_micros(r["spot_usd"]),
                                      **{**common, "sla_pct": 0.0}))
        if r.get("committed_1y_usd"):
            committed[(r["provider"], r["region"], r["instance_type"])] = usd_to_micros(r["committed_1y_usd"])
    return Catalog(instances, regions, terms, gpu_perf, tuple(offerings), committed, as_of)


@functools.lru_cache(maxsize=4)
def bundled(data_dir: str | None = None) -> Catalog:
    """The catalog, loaded once per process: from its compiled copy when that is current
    (:mod:`providers.catalog_cache`), else parsed (and the copy written)."""
    # The registry decides which clouds' rows a parse accepts: a new version of it is new code.
    return catalog_cache.cached(Path(data_dir) if data_dir else DATA_DIR, load, (Catalog, Region, Terms),
                                (__file__, str(Path(__file__).with_name("registry.py"))))
