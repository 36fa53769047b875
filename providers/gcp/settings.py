"""``[providers.gcp]``: the Google Cloud settings schema (checked before any SDK is imported)."""
from __future__ import annotations

import re
from typing import Annotated

import msgspec

from providers.settings import NUMBER_LIMIT, Seconds, Table, _check_anonymous, bad

GCP_DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"


class GcpSettings(Table):
    """``[providers.gcp]``: project, regions (zones optional) and the VM template."""

    enabled: bool = False
    project: str = ""
    regions: tuple[str, ...] = ()
    zones: dict[str, tuple[str, ...]] = {}
    api_endpoint: str = ""
    credentials: str = ""  # "" / "default" / "adc", a service-account key file, or "anonymous"
    network: str = "global/networks/default"
    subnetworks: dict[str, str] = msgspec.field(default_factory=dict, name="subnetwork")
    image: str = GCP_DEFAULT_IMAGE
    boot_disk_gb: Annotated[int, msgspec.Meta(ge=10, le=65536)] = 100
    boot_disk_type: str = "pd-balanced"
    service_account: str = ""
    external_ip: bool = False
    compact_placement: bool = True
    # Extra GPU NICs of A3 gangs: network/subnetwork "<prefix>-<i>" (see providers/gcp/fabric.py).
    gpu_network_prefix: str = "broker-gpu"
    timeout_s: Seconds = 60.0
    operation_timeout_s: Seconds = 900.0
    billing_api_endpoint: str = ""  # Cloud Billing Catalog (live prices); empty = Google's
    # How often the leader lists compute.instances.preempted operations (0 = never).
    preemption_poll_s: Annotated[float, msgspec.Meta(ge=0, le=NUMBER_LIMIT)] = 10.0
    # Flex-start (Dynamic Workload Scheduler) as queued capacity: Google names no start ahead, so
    # the quote assumes this wait; a flex-start VM runs at most flex_start_max_run_h (<= 7 days).
    flex_start: bool = False
    flex_start_wait_h: Annotated[float, msgspec.Meta(ge=0, le=168)] = 2.0
    flex_start_max_run_h: Annotated[float, msgspec.Meta(gt=0, le=168)] = 168.0

    def __post_init__(self) -> None:
        self.project, self.api_endpoint = self.project.strip(), self.api_endpoint.strip()
        if self.billing_api_endpoint and not re.match(r"https?://[^/\s]+/?$", self.billing_api_endpoint):
            raise bad("billing_api_endpoint", "must be an http(s) URL with no path")
        self.credentials = self.credentials.strip()
        self.image = self.image.strip() or GCP_DEFAULT_IMAGE
        self.network = self.network.strip() or "global/networks/default"
        self.boot_disk_type = self.boot_disk_type.strip() or "pd-balanced"
        self.gpu_network_prefix = self.gpu_network_prefix.strip() or "broker-gpu"
        if not re.match(r"[a-z]([-a-z0-9]{0,55}[a-z0-9])?\Z", self.gpu_network_prefix):
            raise bad("gpu_network_prefix", "must be a lowercase network name prefix (letters, digits, '-')")
        self.regions = tuple(r.strip() for r in self.regions)
        if not all(self.regions):
            raise bad("regions", "must list region names")
        for region, zs in self.zones.items():
            if not zs or not all(z.startswith(f"{region}-") for z in zs):
                raise bad(f"zones.{region}", f"must be a non-empty list of zones of {region}")
        if self.api_endpoint and not self.api_endpoint.startswith(("http://", "https://")):
            raise bad("api_endpoint", "must be an http(s) URL")
        _check_anonymous(self.credentials, self.api_endpoint, "providers.gcp.api_endpoint")
        if self.enabled:
            if not self.project:
                raise bad("project", "is required (the Google Cloud project id)")
            if not self.regions:
                raise bad("regions", "is required: a non-empty list of region names")
