"""AWS: GPU instances on EC2 through boto3.

One ``launch`` is one ``RunInstances`` call with ``MinCount = MaxCount = count``: EC2 starts all
of the lease's nodes or none. ``ClientToken`` carries ``spec.client_token`` (hashed when longer
than EC2's 64 characters), and before launching the provider looks the lease up by its
``broker:lease`` tag, so a retry after a crash or a timeout returns what the first call made.
Multi-node leases go into a cluster placement group named ``broker-<lease id>``, created on
demand and deleted once its instances are terminated. Spot uses ``InstanceMarketOptions``
(one-time, terminate on interruption, ``MaxPrice`` when ``spec.max_price_micros`` is set);
reserved capacity targets ``spec.reservation`` (a ``cr-`` Capacity Reservation id, including
Capacity Blocks for ML, or a reservation resource group ARN). The boot script is the instance's
user data. Nodes carry the tags ``broker:lease``, ``broker:owner``, ``Name`` and ``spec.tags``;
their root volumes carry the lease and owner tags too.

Interruptions: EC2 reports a reclaimed spot instance as ``shutting-down`` / ``terminated`` with
the state reason ``Server.SpotInstanceTermination``, which :meth:`AwsProvider.describe` maps to
``StopReason.INTERRUPTED`` (``stop_detail`` holds the code). The two-minute interruption notice
and rebalance recommendations are only visible from inside the instance (IMDS) or through
EventBridge, not through the EC2 API, so they are not reported here. Terminated instances stay
visible for about an hour; after that a spot node simply vanishes from ``describe``, and the
lifecycle treats a vanished spot instance of a live lease as interrupted.

Errors: every botocore exception becomes exactly one ``providers.base`` error carrying EC2's own
code. The SDK makes a single attempt per call (no botocore retries): EC2 answers capacity
shortages with HTTP 500, which botocore would otherwise retry for seconds, and failover across
zones, regions and clouds is decided above, in the broker's lifecycle.

Credentials come from boto3's standard chain (environment, shared files, SSO, instance or
container role) and are never logged. ``credentials = "anonymous"`` is accepted only with an
``endpoint_url`` on loopback (an emulator): requests are then signed with a fixed placeholder
key, because emulators such as moto route a request to its region by the signature's scope.

IAM actions needed::

    ec2:RunInstances              ec2:CreateTags (on instance and volume, for RunInstances
    ec2:DescribeInstances                         and for naming the nodes afterwards)
    ec2:TerminateInstances        ec2:CreatePlacementGroup, ec2:DeletePlacementGroup
    ec2:DescribeAvailabilityZones ec2:DescribeInstanceTypeOfferings
    ec2:DescribeSubnets           (when a region's subnet is configured without its zone)
    ec2:DescribeImages            (when root_volume_gb is set)
    ec2:DescribeCapacityReservations (reserved launches)
    iam:PassRole                  (when iam_instance_profile is set)
    iam:CreateServiceLinkedRole   (once per account, for AWSServiceRoleForEC2Spot)

Settings (``[providers.aws]``): ``enabled``, ``regions`` (list, required), ``image_id`` (an AMI
id, or a table region -> AMI id; required), ``endpoint_url``, ``credentials``
(``"default"`` | ``"anonymous"``), ``subnet_ids`` (table region -> subnet id, or region ->
table zone -> subnet id), ``zones`` (table region -> list of zones to prefer),
``security_group_ids`` (list, or table region -> list), ``key_name``, ``iam_instance_profile``
(name or ARN), ``root_volume_gb``, ``connect_timeout_s`` (default 5), ``read_timeout_s``
(default 30), ``terminate_timeout_s`` (default 600).

Modules: ``errors`` (EC2 codes -> typed errors), ``client`` (session, clients, paging),
``inventory`` (instances as :class:`Instance`, listing, termination), ``launch``
(:class:`AwsProvider`: ``RunInstances`` and what it needs).
"""
from __future__ import annotations

import importlib
from typing import Any

from providers.aws.boot import BOOT
from providers.aws.names import node_name_problem
from providers.aws.settings import AwsSettings
from providers.registration import CloudRegistration

REGISTRATION = CloudRegistration(
    name="aws", title="AWS", provider="providers.aws.launch:AwsProvider", settings=AwsSettings,
    market="providers.market.aws:MARKET", node_name_problem=node_name_problem,
    sdk_modules=("boto3", "botocore"), sandbox="broker_sandbox.aws:sandbox_cloud", boot=BOOT)

# The SDK-bound names, imported on first use so that reading the registration loads no SDK.
_LAZY = {"Ec2Client": "client", "_session": "client", "PROVIDER": "errors", "map_error": "errors",
         "PLACEMENT_GROUP_PREFIX": "inventory", "Ec2Inventory": "inventory", "placement_group_name": "inventory",
         "CLIENT_TOKEN_LIMIT": "launch", "USER_DATA_LIMIT": "launch", "AwsProvider": "launch",
         "client_token": "launch"}

__all__ = ["REGISTRATION", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
