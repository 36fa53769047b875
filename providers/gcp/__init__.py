"""Google Compute Engine: GPU VMs for a lease through ``google-cloud-compute`` (REST transport).

How the pieces of the protocol map onto Compute:

* **launch** is all-or-nothing in one zone: one ``instances.insert`` per node, each with a
  ``requestId`` that is a UUIDv5 of (client token, zone, node index, generation), so a retried
  call is de-duplicated by Compute itself; before inserting, the lease's instances are looked up
  by label, so a retry after a crash adopts what exists and creates only what is missing (and
  deletes the lease's instances elsewhere: leftovers of an earlier attempt). If any node fails,
  every instance of the lease is deleted and the mapped error raised.
  The *generation* covers Compute's requestId cache: a retry with the same token after a failed
  attempt gets the old operation back (DONE at once, with its error, or with its instance since
  deleted by the cleanup); such a replay moves on to the next generation's requestId.
* Operations are awaited with ``zoneOperations.wait`` through our own ``ZoneOperationsClient``
  (built with the same endpoint and credentials; the SDK's ``operation.result()`` would poll a
  client built without our ``api_endpoint``). Transient errors while waiting are retried until
  ``operation_timeout_s``.
* Spot: ``provisioningModel: SPOT``, ``instanceTerminationAction: DELETE``; GCP has no spot bid,
  so ``LaunchSpec.max_price_micros`` is not sent. On-demand and spot VMs say
  ``reservationAffinity: NO_RESERVATION`` so they never eat a reservation the broker accounts
  for; reserved ones consume exactly ``spec.reservation``.
* Labels ``broker-lease``/``broker-owner`` (sanitised to GCP's label rules) find the VMs; the
  exact lease id, owner and catalog instance type ride in metadata, which has no such rules.
* **Interruption**: a spot VM that is TERMINATED is reported INTERRUPTED, with the matching
  ``compute.instances.preempted`` zone operation as ``stop_detail`` when there is one. Because
  ``instanceTerminationAction: DELETE`` makes a preempted VM vanish, the provider remembers the
  instances it has seen per lease (name, zone, id) and, when one is gone, looks for a preempted
  operation targeting that instance id to still report it INTERRUPTED. That memory is per
  process: a VM preempted *and* deleted before this process ever saw it is reported as simply
  gone. ``terminate`` clears it.
* Compact placement (``compact_placement``, on by default): a multi-node lease (not a reserved
  one: a reservation serves only VMs naming its own policy) gets a regional
  ``resourcePolicies`` entry ``broker-<lease>`` with ``groupPlacementPolicy.collocation:
  COLLOCATED`` (idempotent by name), named in every node's ``resourcePolicies``; it is deleted
  when the launch is rolled back and when ``terminate`` leaves it unused.
* GPUDirect (``fabric``): a multi-node A3 gang gets gVNIC and its GPU NICs (see ``fabric``).

Modules: ``errors`` (Compute errors -> typed errors), ``names`` (labels, request ids),
``credentials``, ``client`` (REST clients, operations, listing), ``inventory`` (instances as
:class:`Instance`, preemptions, deletion), ``launch`` (:class:`GcpProvider`: inserts and rollback).
"""
from __future__ import annotations

import importlib
from typing import Any

from providers.gcp.boot import BOOT
from providers.gcp.names import label_key, label_value, node_name_problem, placement_name, request_id
from providers.gcp.settings import GcpSettings
from providers.registration import CloudRegistration

REGISTRATION = CloudRegistration(
    name="gcp", title="Google Cloud", provider="providers.gcp.launch:GcpProvider", settings=GcpSettings,
    market="providers.market.gcp:MARKET", node_name_problem=node_name_problem,
    sdk_modules=("google.cloud", "google.api_core", "google.auth", "google.oauth2"),
    sandbox="broker_sandbox.gcp:sandbox_cloud", boot=BOOT)

# The SDK-bound names, imported on first use so that reading the registration loads no SDK.
_LAZY = {"ComputeClient": "client", "SCOPES": "credentials", "load_credentials": "credentials",
         "NAME": "errors", "classify": "errors", "map_error": "errors", "operation_error": "errors",
         "ComputeInventory": "inventory", "GcpProvider": "launch"}

__all__ = ["REGISTRATION", "label_key", "label_value", "placement_name", "request_id", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
