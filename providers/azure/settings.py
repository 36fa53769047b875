"""``[providers.azure]``: the Azure settings schema (checked before any SDK is imported)."""
from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal, Union

import msgspec

from providers.settings import Seconds, Table, _check_anonymous, bad, is_loopback_url

ARM_URL = "https://management.azure.com"
AZURE_RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
AZURE_DEFAULT_IMAGE = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
_SUBNET_ID = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
                        r"virtualNetworks/[^/]+/subnets/[^/]+$", re.I)
_RG_NAME = re.compile(r"^[-\w._()]{1,90}$")
_RESERVED_USERS = {"administrator", "admin", "user", "user1", "test", "user2", "test1", "user3",
                   "admin1", "1", "123", "a", "actuser", "adm", "admin2", "aspnet", "backup",
                   "console", "david", "guest", "john", "owner", "root", "server", "sql",
                   "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5"}
_DISK_TYPES = ("Premium_LRS", "StandardSSD_LRS", "Standard_LRS", "Premium_ZRS", "StandardSSD_ZRS",
               "PremiumV2_LRS")


class AzureSettings(Table):
    """``[providers.azure]``: subscription, resource group, subnet(s), image and SSH key."""

    enabled: bool = False
    subscription_id: str = ""
    resource_group: str = ""
    regions: tuple[str, ...] = ()
    base_url: str = ARM_URL
    credentials: Literal["default", "cli", "managed_identity", "environment", "anonymous"] = "default"
    subnet_ids: Union[str, dict[str, str]] = msgspec.field(default="", name="subnet_id")
    image: Union[str, dict[str, str]] = msgspec.field(default_factory=lambda: dict(AZURE_DEFAULT_IMAGE))
    admin_username: str = "azureuser"
    ssh_public_key: str = ""
    os_disk_gb: Annotated[int, msgspec.Meta(ge=30, le=65536)] = 256
    os_disk_type: Literal[_DISK_TYPES] = "Premium_LRS"  # type: ignore[valid-type]
    timeout_s: Seconds = 60.0
    operation_timeout_s: Seconds = 1800.0
    poll_interval_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 5.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 3
    accelerated_networking: bool = True
    retail_prices_url: str = AZURE_RETAIL_PRICES_URL  # the Retail Prices API (live prices)

    def __post_init__(self) -> None:
        self.base_url = (self.base_url or ARM_URL).rstrip("/")
        url = self.retail_prices_url = self.retail_prices_url or AZURE_RETAIL_PRICES_URL
        if not re.match(r"https?://[^/\s]+/\S*$", url) or (url.startswith("http://") and not is_loopback_url(url)):
            raise bad("retail_prices_url", "must be an https URL (plain http on loopback only)")
        self.regions = tuple(r.replace(" ", "").lower() for r in self.regions)
        self.ssh_public_key = self.ssh_public_key.strip()
        if not all(self.regions):
            raise bad("regions", "must be a list of location names")
        if self.subscription_id:
            try:
                uuid.UUID(self.subscription_id)
            except ValueError:
                raise bad("subscription_id", f"must be a subscription GUID, got {self.subscription_id!r}") from None
        if self.resource_group and (not _RG_NAME.match(self.resource_group) or self.resource_group.endswith(".")):
            raise bad("resource_group", f"is not a valid resource group name: {self.resource_group!r}")
        if not re.match(r"^https?://[^/\s]+$", self.base_url):
            raise bad("base_url", f"must be an http(s) URL with no path, got {self.base_url!r}")
        if self.base_url.lower().startswith("http://") and not is_loopback_url(self.base_url):
            raise bad("base_url", "may use plain http only on a loopback address")
        _check_anonymous(self.credentials, self.base_url, "providers.azure.base_url")
        subnets = self.subnet_ids
        for region, sid in (subnets.items() if isinstance(subnets, dict) else [("", subnets)]):
            if sid and not _SUBNET_ID.match(sid) or isinstance(subnets, dict) and not sid:
                raise bad("subnet_id" + (f".{region}" if region else ""),
                          "must be a subnet id /subscriptions/…/resourceGroups/…/providers/"
                          f"Microsoft.Network/virtualNetworks/…/subnets/…, got {sid!r}")
        if isinstance(subnets, dict):
            self.subnet_ids = {r.replace(" ", "").lower(): s for r, s in subnets.items()}
        self._check_image()
        if not re.match(r"^[a-z_][a-z0-9_-]{0,63}$", self.admin_username) or self.admin_username in _RESERVED_USERS:
            raise bad("admin_username", f"is not an allowed Linux admin name: {self.admin_username!r}")
        if self.ssh_public_key and not re.match(r"^(ssh-(rsa|ed25519)|ecdsa-sha2-\S+) \S+", self.ssh_public_key):
            raise bad("ssh_public_key", "must be an OpenSSH public key (ssh-rsa / ssh-ed25519 / ecdsa-sha2-… AAAA…)")
        if self.enabled:
            for key in ("subscription_id", "resource_group"):
                if not getattr(self, key):
                    raise bad(key, "is required")
            if not self.subnet_ids:
                raise bad("subnet_id", "is required: the ARM id of the subnet the VMs join, or a table "
                          "region = subnet id")
            if not self.ssh_public_key:
                raise bad("ssh_public_key", "is required: an OpenSSH public key "
                          "(ssh-rsa / ssh-ed25519 / ecdsa-sha2-… AAAA…)")

    def _check_image(self) -> None:
        v = self.image
        if isinstance(v, dict):
            missing = [f for f in ("publisher", "offer", "sku") if not v.get(f)]
            unknown = sorted(set(v) - {"publisher", "offer", "sku", "version"})
            if missing or unknown:
                raise bad("image", f"needs publisher, offer and sku{' (missing ' + ', '.join(missing) + ')' if missing else ''}"
                          f"{' and no other key (' + ', '.join(unknown) + ')' if unknown else ''}, "
                          "or is an image id, or a URN publisher:offer:sku:version")
        elif not (v.startswith("/") or (len(v.split(":")) == 4 and all(v.split(":")))):
            raise bad("image", "must be a table {publisher, offer, sku, version}, a URN "
                      f"publisher:offer:sku:version or an image id, got {v!r}")
