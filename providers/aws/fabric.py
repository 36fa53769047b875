"""EFA for a multi-node gang on EC2: one EFA per network card the instance type has (the catalog's
``fabric_nics``), in a security group that lets the gang's nodes reach each other on every port.

The first interface (network card 0, device 0) is an ``efa`` interface (EFA with ENA: it carries
the node's IP address); every further network card gets one ``efa-only`` interface at device 0.
EFA's OS bypass needs a security group allowing all traffic to and from itself; the broker keeps
one such group per VPC, named for its owner and tagged with it, and adds the configured groups."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from providers.base import TAG_OWNER, InvalidRequestError

FABRIC_GROUP_PREFIX = "broker-fabric-"


def efa_interfaces(cards: int, subnet: str, groups: Sequence[str]) -> list[dict[str, Any]]:
    """RunInstances ``NetworkInterfaces`` for ``cards`` EFA network cards."""
    out = []
    for card in range(max(1, cards)):
        nic: dict[str, Any] = {"DeviceIndex": 0, "NetworkCardIndex": card,
                               "InterfaceType": "efa" if card == 0 else "efa-only",
                               "Groups": list(groups), "DeleteOnTermination": True}
        if subnet:
            nic["SubnetId"] = subnet
        out.append(nic)
    return out


def fabric_group_name(owner: str) -> str:
    return (FABRIC_GROUP_PREFIX + owner)[:255]


def ensure_fabric_group(call: Callable[..., dict[str, Any]], owner: str, vpc_id: str) -> str:
    """The id of the owner's self-referencing security group in ``vpc_id`` (created once)."""
    name = fabric_group_name(owner)
    filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
    found = call("describe_security_groups", Filters=filters).get("SecurityGroups", [])
    if found:
        return str(found[0]["GroupId"])
    try:
        gid = str(call("create_security_group", GroupName=name, VpcId=vpc_id,
                       Description="EFA: all traffic between the broker's gang nodes",
                       TagSpecifications=[{"ResourceType": "security-group",
                                           "Tags": [{"Key": TAG_OWNER, "Value": owner}]}])["GroupId"])
    except InvalidRequestError as e:
        if e.code != "InvalidGroup.Duplicate":
            raise
        return str(call("describe_security_groups", Filters=filters)["SecurityGroups"][0]["GroupId"])
    rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}]
    call("authorize_security_group_ingress", GroupId=gid, IpPermissions=rule)
    try:
        call("authorize_security_group_egress", GroupId=gid, IpPermissions=rule)
    except InvalidRequestError as e:
        if e.code != "InvalidPermission.Duplicate":
            raise
    return gid


def vpc_of(call: Callable[..., dict[str, Any]], subnet: str) -> str:
    """The VPC of ``subnet``, or the region's default VPC when no subnet is configured."""
    if subnet:
        subnets = call("describe_subnets", SubnetIds=[subnet]).get("Subnets", [])
        if subnets:
            return str(subnets[0]["VpcId"])
    vpcs = call("describe_vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}]).get("Vpcs", [])
    if not vpcs:
        raise InvalidRequestError("an EFA launch needs a subnet: none is configured and the region has "
                                  "no default VPC", provider="aws", code="NoSubnetForFabric")
    return str(vpcs[0]["VpcId"])
