"""Queued capacity paid up front (AWS Capacity Blocks for ML): bought at launch, then waited for.

A launch whose offer is a Capacity Block offering (a queued target naming the offering,
``cb-...``), with ``[market] buy_capacity_blocks`` on:

1. charges the block's whole up-front fee (the quoted fee x nodes) to the lease, in the one write
   that checks the tenant's month budget covers it (:meth:`broker.store.Store.charge_lease`,
   under the tenant's lock: two purchases at once never overshoot a cap). A budget that does not
   cover it rules the offer out, saying so, with nothing bought: the launch fails over;
2. buys the block (:class:`providers.base.BlockBuyer`, idempotent on the lease). A refusal
   (no such offering, no capacity) gives the fee back and fails over like any launch error;
3. the lease now holds a capacity reservation (market ``reserved``, ``reservation`` its id,
   ``starts_at`` its start) and, until the block is active, waits in ``requested`` saying
   "waiting for capacity block ..." with a ``capacity_block`` event; the reconciler launches it
   into the reservation once the block is active (a launch's time limit counts from the start).

The block is not refundable: released before its start, its fee stays spent (an event says so).
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import structlog

from broker.attempts import attempt_at, attempt_record
from broker.errors import OverBudget
from broker.lease import LAUNCHING, EventKind, Lease, LeaseState
from broker.quote import usd
from broker.records import Attempt, Target
from policies.cost import utc
from providers.base import BlockBuyer, BlockOrder, BoughtBlock, BlockState, Market, ProviderError

if TYPE_CHECKING:
    from broker.lifecycle import Lifecycle

log = structlog.get_logger("broker.blocks")

NOT_REFUNDABLE = "a capacity block is not refundable: released before its start, its fee stays spent"


class Outcome(enum.Enum):
    LAUNCH = "launch"  # the block is active: launch into it now
    WAIT = "wait"  # bought, not started: the lease waits
    SKIP = "skip"  # this offer is out (budget, refusal, block over): fail over


def is_block_offer(t: Target) -> bool:
    """A Capacity Block offering still to buy."""
    return t.market is Market.QUEUED and t.reservation.startswith("cb-")


def bought(lease: Lease) -> bool:
    """A lease holding a Capacity Block bought for it that it has not run on yet."""
    return bool(lease.starts_at) and lease.market is Market.RESERVED and lease.state in LAUNCHING \
        and not lease.started_at


def launch_clock(lease: Lease) -> float:
    """Since when a launch of ``lease`` is timed: its creation, or its block's start."""
    return max(lease.created_at, lease.starts_at)


def _reservation_target(t: Target, block: BoughtBlock) -> Target:
    return Target(t.provider, t.region, block.zone or t.zone, t.instance_type, Market.RESERVED, t.nodes, 0,
                  block.reservation_id)


def buy(lc: "Lifecycle", lease: Lease, t: Target, attempts: list[Attempt]) -> tuple[Lease, Target, Outcome]:
    """Buy the Capacity Block ``t`` names for ``lease`` (steps 1-3 of the module's docstring)."""
    def skip(code: str, kind: str, why: str) -> tuple[Lease, Target, Outcome]:
        attempts.append(attempt_at(t, code, "", kind, why[:300]))
        log.info("capacity_block.skipped", lease=lease.lease_id, offering=t.reservation, code=code)
        return lease, t, Outcome.SKIP

    provider = lc.providers.get(t.provider)
    if not lc.engine.buy_capacity_blocks:
        return skip("CapacityBlockNotBought", "invalid", "[market] buy_capacity_blocks is off")
    if not isinstance(provider, BlockBuyer):
        return skip("CapacityBlockNotSold", "invalid", f"{t.provider} does not sell capacity blocks")
    offering = next((o for o in lc.engine.catalog.offerings
                     if o.market is Market.QUEUED and o.offer_id == t.reservation), None)
    if offering is None or not offering.upfront_micros:
        return skip("InvalidCapacityBlockOfferingId.NotFound", "invalid",
                    f"capacity block offering {t.reservation} is no longer quoted")
    fee = offering.upfront_micros * t.nodes
    order = BlockOrder(t.reservation, t.region, t.zone or (offering.zones[0] if offering.zones else ""),
                       t.instance_type, t.nodes, offering.starts_at, offering.max_run_h, fee)
    now = lc.clock()
    if not lease.accrued_micros:  # not charged yet (a resumed purchase was)
        admit, since = (lc.budgets.purchase_admission(lease.tenant, fee, now) if lc.budgets is not None
                        else (None, 0.0))
        try:
            lease = lc.store.charge_lease(
                lease, now=now, admit=admit, counted_since=since, state=LeaseState.PROVISIONING,
                message=f"buying capacity block {t.reservation} ({t.nodes} x {t.instance_type} in {order.zone}, "
                        f"starts at {utc(order.starts_at)}) for ${usd(fee):,.2f} up front",
                provider=t.provider, region=t.region, zone=order.zone, instance_type=t.instance_type,
                market=Market.QUEUED.value, nodes=t.nodes, hourly_micros=0, reservation=t.reservation,
                accrued_micros=fee, accrued_at=now, attempts=attempts)
        except OverBudget as e:
            return skip("OverBudget", "budget", str(e))
    elif lease.state is not LeaseState.PROVISIONING:
        lease = lc._write(lease, state=LeaseState.PROVISIONING, message=f"buying capacity block {t.reservation}")
    try:
        block = _buy_with_retries(lc, provider, order, lease.lease_id)
    except ProviderError as e:
        attempts.append(attempt_record(t, e))
        lc._block_for(e, t)
        # Nothing was bought: the fee is given back.
        lease = lc._write(lease, accrued_micros=0, accrued_at=0.0, hourly_micros=t.hourly_micros,
                          attempts=attempts, retry_stale=True)
        log.warning("capacity_block.refused", lease=lease.lease_id, offering=t.reservation, code=e.code)
        return lease, t, Outcome.SKIP
    paid = block.fee_micros or fee
    if paid != lease.accrued_micros:
        lease = lc._write(lease, accrued_micros=paid, retry_stale=True)
    target = _reservation_target(t, block)
    note = (f"bought capacity block {block.reservation_id} (offering {t.reservation}) for ${usd(paid):,.2f} up "
            f"front; it runs {utc(block.starts_at)} to {utc(block.ends_at)}; {NOT_REFUNDABLE}")
    data = {"reservation": block.reservation_id, "offering": t.reservation, "fee_usd": float(usd(paid)),
            "starts_at": block.starts_at, "ends_at": block.ends_at, "state": str(block.state)}
    fields = dict(market=Market.RESERVED.value, reservation=block.reservation_id, zone=target.zone,
                  starts_at=block.starts_at, hourly_micros=0)
    if block.state is BlockState.ACTIVE:
        lease = lc._write(lease, message=note, event_kind=EventKind.CAPACITY_BLOCK, event_data=data, **fields)
        return lease, target, Outcome.LAUNCH
    lease = lc._write(lease, state=LeaseState.REQUESTED, message=_waiting(block),
                      events=((EventKind.CAPACITY_BLOCK, note, data),), **fields)
    return lease, target, Outcome.WAIT


def _buy_with_retries(lc: "Lifecycle", provider: BlockBuyer, order: BlockOrder, lease_id: str) -> BoughtBlock:
    """Throttling and 5xx retry with backoff (safe: a purchase is idempotent on the lease)."""
    delay, tries = lc.settings.backoff_s, max(1, lc.settings.retries)
    for i in range(tries):
        try:
            return provider.buy_capacity_block(order, lease_id)
        except ProviderError as e:
            if not e.retryable or i == tries - 1:
                raise
            lc.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def _waiting(block: BoughtBlock) -> str:
    return f"waiting for capacity block {block.reservation_id} ({block.state}) to start at {utc(block.starts_at)}"


def check(lc: "Lifecycle", lease: Lease, t: Target, attempts: list[Attempt]) -> tuple[Lease, Outcome]:
    """A bought block's lease: launch now (its block is active), wait, or give the block up (over)."""
    if lc.clock() < lease.starts_at:
        return lease, Outcome.WAIT  # not started: no need to ask the cloud
    provider = lc.providers.get(t.provider)
    if not isinstance(provider, BlockBuyer):
        attempts.append(attempt_at(t, "CapacityBlockNotSold", "", "invalid", f"{t.provider} does not sell capacity blocks"))
        return lease, Outcome.SKIP
    try:
        block = provider.capacity_block(t.region, t.reservation)
    except ProviderError as e:
        if e.retryable:
            return lease, Outcome.WAIT  # asked again on the next pass
        attempts.append(attempt_record(t, e))
        return lease, Outcome.SKIP
    if block.state is BlockState.ACTIVE:
        return lease, Outcome.LAUNCH
    if block.state.over:
        attempts.append(attempt_at(t, f"CapacityBlock.{block.state.value}", "", "capacity",
                                   f"capacity block {block.reservation_id} is {block.state}"))
        return lease, Outcome.SKIP
    if lease.state_reason != _waiting(block):  # e.g. payment-pending -> scheduled
        lease = lc._write(lease, state_reason=_waiting(block), retry_stale=True)
    return lease, Outcome.WAIT


def released_unstarted(lease: Lease) -> tuple[EventKind, str, dict] | None:
    """The event a lease released before its block started gets: the fee stays spent."""
    if not bought(lease):
        return None
    return (EventKind.CAPACITY_BLOCK,
            f"released before capacity block {lease.reservation} starts at {utc(lease.starts_at)}: "
            f"{NOT_REFUNDABLE} (${usd(lease.accrued_micros):,.2f})",
            {"reservation": lease.reservation, "fee_usd": float(usd(lease.accrued_micros)), "refunded": False})
