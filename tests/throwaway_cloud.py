"""Zed, a cloud that exists only for ``tests/test_registry.py``: every part a registration
carries, each as small as it can be, so the test can add it to the registry with one line and see
the broker pick it up everywhere. It talks to no network: its provider keeps its instances in
memory and its market answers from constants."""
from __future__ import annotations

from typing import Any, Sequence

from providers.base import Instance, InstanceState, LaunchSpec
from providers.market import LivePrice, Quota, QuotaNeed, Snapshot, rfc3339
from providers.registration import BootHooks, CloudRegistration
from providers.settings import Table, bad

INSTANCE_TYPE = "z1.h100x8"
REGION = "zed-1"


class ZedSettings(Table):
    """``[providers.zed]``."""

    enabled: bool = False
    regions: tuple[str, ...] = ()
    token: str = ""

    def __post_init__(self) -> None:
        if self.enabled and not self.token:
            raise bad("token", "is required")


class ZedProvider:
    name = "zed"

    def __init__(self, settings: ZedSettings, owner: str) -> None:
        self.settings, self.owner = settings, owner
        self.instances: list[Instance] = []

    @classmethod
    def from_config(cls, settings: ZedSettings, owner: str) -> "ZedProvider":
        return cls(settings, owner)

    def launch(self, spec: LaunchSpec) -> list[Instance]:
        made = [Instance("zed", f"z-{spec.lease_id}-{i}", spec.region, spec.zone, spec.instance.name,
                         spec.market, InstanceState.RUNNING, spec.lease_id, spec.node_names[i])
                for i in range(spec.count)]
        self.instances += made
        return made

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        return [i for i in self.instances if i.lease_id == lease_id]

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        return list(self.instances)

    def terminate(self, instances: Sequence[Instance]) -> None:
        gone = {i.instance_id for i in instances}
        self.instances = [i for i in self.instances if i.instance_id not in gone]


class ZedMarket:
    sources = ("price_list", "quotas")

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        snap = Snapshot("zed", now)
        snap.asked("prices")
        snap.prices.append(LivePrice(REGION, INSTANCE_TYPE, "on_demand", 9_000_000, "zed:price_list", rfc3339(now)))
        return snap

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        return [Quota(region, "gpus", "Zed GPUs", 64.0, 8.0)]

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        return [QuotaNeed(INSTANCE_TYPE, "on_demand", "gpus", 8.0)]


MARKET = ZedMarket()


def node_name_problem(name: str) -> str:
    return "" if name.startswith("zed-") else "does not start with zed-"


def sandbox_cloud(market: bool = False) -> Any:
    from broker_sandbox import SandboxCloud

    return SandboxCloud(fakes={}, table=lambda: {"enabled": True, "regions": [REGION], "token": "t"},
                        alive=lambda: [])


REGISTRATION = CloudRegistration(
    name="zed", title="Zed", provider="tests.throwaway_cloud:ZedProvider", settings=ZedSettings,
    market="tests.throwaway_cloud:MARKET", node_name_problem=node_name_problem, sdk_modules=(),
    sandbox="tests.throwaway_cloud:sandbox_cloud", boot=BootHooks(whoami="BROKER_NODE_NAME=$(hostname)"))

# Its catalog data: what providers/data/ would hold for it.
NETWORK = """
[zed]
sla_pct = 99.0
startup_s = 60
spot_interruptions_per_hour = 0.0
storage_usd_per_gb_month = 0.05
inter_zone_usd_per_gb = 0.0
inter_region_usd_per_gb = 0.0
inter_continent_usd_per_gb = 0.0
egress = [ { up_to_gb = 0, usd_per_gb = 0.0 } ]
"""
INSTANCES = "zed,z1.h100x8,,,H100,8,80,208,1800,infiniband,3200,8,test\n"
REGIONS = "zed,zed-1,us,Texas,\n"
PRICES = "zed,zed-1,z1.h100x8,23.92,,,2026-06-01,test,\n"
