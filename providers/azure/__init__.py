"""Azure: GPU virtual machines through ``azure-mgmt-compute`` (``ComputeManagementClient``).

Configuration, the ``[providers.azure]`` table (:meth:`AzureProvider.from_config`):

=====================  ===========================================================================
``subscription_id``    required, the subscription's GUID
``resource_group``     required; every VM, NIC, disk and proximity placement group goes there
``regions``            list of locations the broker may use (empty: any); ``list_managed()`` with no
                       argument looks at every location
``base_url``           ARM endpoint, default ``https://management.azure.com``; plain ``http://`` is
                       accepted on loopback only (a fake ARM in tests)
``credentials``        ``default`` (``DefaultAzureCredential``), ``cli``, ``managed_identity``,
                       ``environment``, or ``anonymous`` (loopback ``base_url`` only)
``subnet_id``          the full ARM id of the subnet the NICs join, or a table region → subnet id
``image``              ``{publisher, offer, sku, version}``, a URN ``publisher:offer:sku:version``
                       or an image / gallery image id; default the Azure HPC Ubuntu 22.04 image
``admin_username``     default ``azureuser``
``ssh_public_key``     required, the OpenSSH public key text (password login is disabled)
``os_disk_gb``         default 256; ``os_disk_type`` default ``Premium_LRS``
``timeout_s``          per HTTP request (connect and read), default 60
``operation_timeout_s``  the longest one launch/terminate waits for its operations, default 1800
``poll_interval_s``    how often an operation is polled when ARM sends no ``Retry-After``, default 5
``retries``            the SDK's retries of one HTTP request (429, 5xx, resets), default 3
``accelerated_networking``  default true
=====================  ===========================================================================

How the broker's lease maps onto Azure:

* one VM per node, named ``spec.node_names[i]``: a ``PUT`` to the same name is idempotent, and a
  retried launch first lists the lease's VMs (tag ``broker:lease``) and only creates what is
  missing, re-``PUT``\\s what is still creating or failed, and adopts what succeeded;
* Spot: ``priority=Spot``, ``evictionPolicy=Delete``, ``billingProfile.maxPrice`` (-1 = up to the
  on-demand price); reserved: ``capacityReservation.capacityReservationGroup.id``;
* networking through VM-level ``networkProfile.networkInterfaceConfigurations``
  (``networkApiVersion`` 2020-11-01): Azure creates the NIC and deletes it with the VM, as it does
  the OS disk (``deleteOption=Delete``); no Network SDK is needed. The private IP is read from the
  NIC through the same authenticated pipeline;
* a lease of more than one node gets a proximity placement group ``broker-<lease>``, removed by
  :meth:`terminate` once it holds no VM. A group that outlived its VMs (its deletion failed during a
  launch's cleanup or a terminate) is listed by :meth:`list_managed` as a terminated entry of its
  lease whose id is the group's ARM id, so the reconciler removes it like any other leftover;
* the boot script goes in ``userData`` (base64) and is never logged.

Interruption: a Spot VM evicted with policy Delete is deleted by Azure; ARM then simply no longer
has it, and :meth:`describe` / :meth:`list_managed` return nothing for it. ARM has no field that
says "evicted", so the lease lifecycle treats a vanished Spot instance of a live lease as
interrupted. A Spot VM seen deallocated (policy Deallocate, never set by the broker, which never
deallocates) is reported ``TERMINATED`` / ``INTERRUPTED``. A VM whose creation failed stays in ARM
in provisioning state ``Failed`` with status ``ProvisioningState/failed/<code>``: reported
``TERMINATED`` with ``CAPACITY`` (allocation codes) or ``ERROR``.

Zones are Azure's own ``"1"``, ``"2"``, ``"3"``; a spec zone written ``eastus-1`` is accepted.

Plain HTTP to a loopback ``base_url`` (tests against a fake ARM) is the only thing that differs from
production, and it lives in the authentication policy chosen from the configuration
(:func:`_auth_policy`): ``anonymous`` sends no ``Authorization`` header at all, and a real
credential on a loopback ``base_url`` gets a bearer policy that allows non-TLS for loopback URLs
only. Every other setting sends bearer tokens over TLS as the SDK does by default.

Modules: ``auth`` (credentials and the loopback policies), ``errors`` (ARM codes -> typed errors),
``client`` (the ARM client, ids, waiting), ``inventory`` (VMs as :class:`Instance`, deletion),
``launch`` (:class:`AzureProvider`: VM bodies, placement groups, rollback).
"""
from __future__ import annotations

import importlib
from typing import Any

from providers.azure.boot import BOOT
from providers.azure.names import node_name_problem
from providers.azure.settings import ARM_URL, AzureSettings  # noqa: F401  (the price fetcher shares the ARM endpoint)
from providers.registration import CloudRegistration

REGISTRATION = CloudRegistration(
    name="azure", title="Azure", provider="providers.azure.launch:AzureProvider", settings=AzureSettings,
    market="providers.market.azure:MARKET", node_name_problem=node_name_problem,
    sdk_modules=("azure",), sandbox="broker_sandbox.azure:sandbox_cloud", boot=BOOT)

# The SDK-bound names, imported on first use so that reading the registration loads no SDK.
_LAZY = {"ANONYMOUS": "auth", "_auth_policy": "auth", "_LoopbackBearerPolicy": "auth", "_make_credential": "auth",
         "_NoAuthPolicy": "auth", "ArmClient": "client", "map_error": "errors", "ArmInventory": "inventory",
         "AzureProvider": "launch", "image_reference": "launch"}

__all__ = ["REGISTRATION", "AzureProvider", "ANONYMOUS", "map_error"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
