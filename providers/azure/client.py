"""The ARM plumbing every Azure operation goes through: one ``ComputeManagementClient`` (endpoint,
credential, timeouts, retries), ARM ids, waiting for long-running operations, listing the VMs."""
from __future__ import annotations

import re
import time
from typing import Any

import structlog
from azure.mgmt.compute import ComputeManagementClient

from providers.azure.auth import ANONYMOUS, _auth_policy
from providers.azure.errors import _OperationTimeout, check_answer
from providers.base import InvalidRequestError
from providers.azure.settings import ARM_URL, AzureSettings
from providers.settings import is_loopback_url

log = structlog.get_logger("providers.azure")


def _norm_region(r: str) -> str:
    return r.replace(" ", "").lower()


def _zone(z: str) -> str:
    """Azure's zone number from ``"1"`` or ``"eastus-1"`` (``""`` = regional)."""
    if not z:
        return ""
    m = re.search(r"(\d+)$", z)
    if not m:
        raise InvalidRequestError(f"zone {z!r} is not an Azure availability zone (1, 2, 3)",
                                  provider="azure", code="InvalidZone", zone=z)
    return m.group(1)


def _ppg_name(lease_id: str) -> str:
    return ("broker-" + re.sub(r"[^A-Za-z0-9_.-]", "-", lease_id))[:80].rstrip(".")


def _tag(vm: Any, key: str) -> str:
    return (vm.tags or {}).get(key, "")


class ArmClient:
    """The ARM client of one subscription, resource group and broker owner, and its helpers."""

    name = "azure"

    def __init__(self, settings: AzureSettings, credential: Any, owner: str) -> None:
        if not owner:
            raise ValueError("the broker's owner id (broker:owner tag) must not be empty")
        if credential is ANONYMOUS and not is_loopback_url(settings.base_url):
            raise ValueError("providers.azure.credentials = \"anonymous\" is only accepted with "
                             "providers.azure.base_url on a loopback address")
        self.settings = settings
        self.owner = owner
        self.resource_group = settings.resource_group
        self.regions = settings.regions
        self._log = log.bind(provider="azure")
        scopes = [f"{ARM_URL}/.default"]
        if settings.base_url != ARM_URL and not is_loopback_url(settings.base_url):
            scopes = [f"{settings.base_url}/.default"]  # sovereign / private clouds
        kwargs: dict[str, Any] = dict(
            base_url=settings.base_url,
            credential_scopes=scopes,
            polling_interval=settings.poll_interval_s,
            retry_total=settings.retries,
            connection_timeout=settings.timeout_s,
            read_timeout=settings.timeout_s,
            raw_response_hook=check_answer,  # a 2xx that is no ARM answer: a retryable error
        )
        policy = _auth_policy(credential, settings.base_url, scopes)
        if policy is not None:
            kwargs["authentication_policy"] = policy
        self._client = ComputeManagementClient(credential, settings.subscription_id, **kwargs)
        self._vms = self._client.virtual_machines

    def close(self) -> None:
        self._client.close()

    def _arm_id(self, kind: str, name: str) -> str:
        if name.startswith("/subscriptions/"):
            return name
        return (f"/subscriptions/{self.settings.subscription_id}/resourceGroups/"
                f"{self.resource_group}/providers/Microsoft.Compute/{kind}/{name}")

    def _wait(self, poller: Any, deadline: float) -> Any:
        poller.wait(timeout=max(0.0, deadline - time.monotonic()))
        if not poller.done():
            raise _OperationTimeout(f"operation not finished after "
                                    f"{self.settings.operation_timeout_s:g} s")
        return poller.result()

    # ------------------------------------------------------------------------------ read
    def _list(self) -> list[Any]:
        """Every VM in the resource group (the SDK follows ``nextLink``)."""
        return list(self._vms.list(self.resource_group))
