"""Buying AWS Capacity Blocks for ML (``PurchaseCapacityBlock``) and watching one until it starts.

A block is bought for one lease, tagged with the lease and the broker's owner, so buying is
idempotent on the lease: a purchase repeated after a crash finds the block by its tags
(``DescribeCapacityReservations``) instead of paying twice. A quoted offering is for one node; a
gang of N nodes buys the offering of N nodes that starts at the same time in the same zone for
the same length (``DescribeCapacityBlockOfferings``), never one dearer than N times the quoted fee.

A bought block is a ``capacity-block`` capacity reservation: ``payment-pending`` while the
up-front payment is processed, ``scheduled`` until its start date, ``active`` until its end
date. It is not refundable: released before it starts, its fee stays spent.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any, Mapping

from providers.aws.client import Ec2Client, _log
from providers.aws.errors import PROVIDER
from providers.base import (
    TAG_LEASE,
    TAG_OWNER,
    MICROS,
    BlockOrder,
    BlockState,
    BoughtBlock,
    CapacityError,
    InvalidRequestError,
)

PLATFORM = "Linux/UNIX"  # the broker's images are Linux


def _epoch(value: Any) -> float:
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return 0.0


def bought_block(raw: Mapping[str, Any], fee_micros: int = 0) -> BoughtBlock:
    """EC2's ``CapacityReservation`` structure of a Capacity Block as a :class:`BoughtBlock`."""
    try:
        state = BlockState(raw.get("State", ""))
    except ValueError:
        state = BlockState.OTHER
    return BoughtBlock(reservation_id=raw["CapacityReservationId"], zone=raw.get("AvailabilityZone", ""),
                       state=state, starts_at=_epoch(raw.get("StartDate")), ends_at=_epoch(raw.get("EndDate")),
                       fee_micros=fee_micros)


class CapacityBlocks(Ec2Client):
    """:class:`providers.base.BlockBuyer` for EC2."""

    def buy_capacity_block(self, order: BlockOrder, lease_id: str) -> BoughtBlock:
        """Buy ``order`` for ``lease_id`` (or return the block bought for it before)."""
        region, zone = order.region, order.zone
        log = _log.bind(provider=PROVIDER, lease_id=lease_id, region=region, zone=zone)
        mine = self._call(region, zone, "describe_capacity_reservations", Filters=[
            {"Name": f"tag:{TAG_LEASE}", "Values": [lease_id]},
            {"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]},
            {"Name": "reservation-type", "Values": ["capacity-block"]},
        ]).get("CapacityReservations", [])
        if mine:
            log.info("aws.capacity_block.found", reservation_id=mine[0]["CapacityReservationId"])
            return bought_block(mine[0])
        offering_id, fee = self._offering_for(order)
        tags = [{"Key": TAG_LEASE, "Value": lease_id}, {"Key": TAG_OWNER, "Value": self.owner}]
        log.info("aws.capacity_block.buy", offering_id=offering_id, fee_micros=fee, count=order.count)
        raw = self._call(region, zone, "purchase_capacity_block", CapacityBlockOfferingId=offering_id,
                         InstancePlatform=PLATFORM,
                         TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": tags}])
        block = bought_block(raw["CapacityReservation"], fee)
        log.info("aws.capacity_block.bought", reservation_id=block.reservation_id, state=str(block.state))
        return block

    def capacity_block(self, region: str, reservation_id: str) -> BoughtBlock:
        """The block's reservation as EC2 reports it now."""
        found = self._call(region, "", "describe_capacity_reservations",
                           CapacityReservationIds=[reservation_id]).get("CapacityReservations", [])
        if not found:
            raise InvalidRequestError(f"capacity block {reservation_id} does not exist", provider=PROVIDER,
                                      code="InvalidCapacityReservationId.NotFound", region=region)
        return bought_block(found[0])

    def _offering_for(self, order: BlockOrder) -> tuple[str, int]:
        """The offering to buy and its fee: the quoted one for one node (its fee as quoted), else
        the offering of ``order.count`` nodes at the same start, zone and length."""
        if order.count == 1:
            return order.offering_id, order.max_fee_micros
        hours = int(round(order.duration_h))
        start = dt.datetime.fromtimestamp(order.starts_at, dt.timezone.utc)
        answer = self._call(order.region, order.zone, "describe_capacity_block_offerings",
                            InstanceType=order.instance_type, InstanceCount=order.count,
                            CapacityDurationHours=hours, StartDateRange=start,
                            EndDateRange=start + dt.timedelta(hours=hours))
        for o in answer.get("CapacityBlockOfferings", []):
            if o.get("AvailabilityZone") == order.zone and _epoch(o.get("StartDate")) == order.starts_at:
                fee = int(Decimal(str(o["UpfrontFee"])) * MICROS)
                if fee > order.max_fee_micros:
                    raise CapacityError(
                        f"the capacity block of {order.count} nodes costs ${Decimal(fee) / MICROS:,.2f}, more than the "
                        f"${Decimal(order.max_fee_micros) / MICROS:,.2f} quoted", provider=PROVIDER,
                        code="CapacityBlockPriceChanged", region=order.region, zone=order.zone)
                return o["CapacityBlockOfferingId"], fee
        raise CapacityError(f"no capacity block of {order.count} x {order.instance_type} starts at the quoted time "
                            f"in {order.zone}", provider=PROVIDER, code="InsufficientCapacity",
                            region=order.region, zone=order.zone)
