"""Reading and tearing down: EC2 instances as the broker's :class:`Instance` (with why a stopped
one stopped), the lease's and the owner's instances, and termination with its placement groups."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import tenacity

from providers.aws.client import Ec2Client, _log
from providers.aws.errors import PROVIDER, UNREADABLE
from providers.base import (
    TAG_LEASE,
    Instance,
    InstanceState,
    InvalidRequestError,
    Market,
    ProviderError,
    StopReason,
    TransientError,
)

PLACEMENT_GROUP_PREFIX = "broker-"
_NOT_TERMINATED = ("pending", "running", "shutting-down", "stopping", "stopped")

_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}

# EC2 state-reason codes (``StateReason.Code``) -> why the instance stopped.
_STOP_REASONS = {
    "Server.SpotInstanceTermination": StopReason.INTERRUPTED,
    "Server.SpotInstanceShutdown": StopReason.INTERRUPTED,
    "Server.InsufficientInstanceCapacity": StopReason.CAPACITY,
    "Client.UserInitiatedShutdown": StopReason.USER,
    "Client.InstanceInitiatedShutdown": StopReason.USER,
    "Client.UserInitiatedHibernate": StopReason.USER,
    "Server.ScheduledStop": StopReason.ERROR,
    "Server.InternalError": StopReason.ERROR,
    "Client.InternalError": StopReason.ERROR,
    "Client.VolumeLimitExceeded": StopReason.ERROR,
    "Client.InvalidSnapshot.NotFound": StopReason.ERROR,
}


def placement_group_name(lease_id: str) -> str:
    return f"{PLACEMENT_GROUP_PREFIX}{lease_id}"[:255]


class Ec2Inventory(Ec2Client):
    """What this broker has on EC2, and taking it down."""

    # -- reading ------------------------------------------------------------------------------

    def to_instance(self, region: str, raw: Mapping[str, Any]) -> Instance:
        """An EC2 ``Instance`` structure as the broker's :class:`Instance`."""
        tags = {str(t.get("Key", "")): str(t.get("Value", "")) for t in raw.get("Tags") or []}
        problem = _unreadable_tags(region, raw.get("InstanceId", ""), tags)
        state_name = (raw.get("State") or {}).get("Name", "pending")
        state = _STATES.get(state_name, InstanceState.PENDING)
        reason = StopReason.NONE
        detail = ""
        if state in (InstanceState.STOPPING, InstanceState.TERMINATED):
            detail = (raw.get("StateReason") or {}).get("Code") or ""
            reason = _STOP_REASONS.get(detail, StopReason.ERROR if detail else StopReason.USER)
        if raw.get("CapacityReservationId"):
            market = Market.RESERVED
        elif raw.get("InstanceLifecycle") == "spot":
            market = Market.SPOT
        else:
            market = Market.ON_DEMAND
        launched = raw.get("LaunchTime")
        return Instance(
            provider=PROVIDER,
            instance_id=raw["InstanceId"],
            region=region,
            zone=(raw.get("Placement") or {}).get("AvailabilityZone", ""),
            instance_type=raw.get("InstanceType", ""),
            market=market,
            state=state,
            lease_id="" if UNREADABLE in tags.get(TAG_LEASE, "") else tags.get(TAG_LEASE, ""),
            node_name=tags.get("Name", ""),
            private_ip=raw.get("PrivateIpAddress") or "",
            stop_reason=reason,
            stop_detail=detail,
            launched_at=launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
            problem=problem,
        )

    def describe(self, lease_id: str, region: str) -> list[Instance]:
        """The lease's instances in ``region``, terminated ones included while EC2 lists them."""
        raw = sorted(self._describe(region, self._mine(lease_id)), key=_launch_order)
        return [self.to_instance(region, r) for r in raw]

    def list_managed(self, regions: Sequence[str] | None = None) -> list[Instance]:
        """Every not-yet-terminated instance carrying this broker's owner tag."""
        out: list[Instance] = []
        for region in regions or self.settings.regions:
            filters = self._mine() + [{"Name": "instance-state-name", "Values": list(_NOT_TERMINATED)}]
            out.extend(self.to_instance(region, r) for r in self._describe(region, filters))
        return out

    def _delete_placement_group(self, region: str, name: str) -> None:
        """Best effort: an unknown or still-used group is left alone."""
        try:
            self._call(region, "", "delete_placement_group", GroupName=name)
        except ProviderError as e:
            _log.info("aws.placement_group.kept", provider=PROVIDER, region=region, group=name, code=e.code)

    # -- terminating --------------------------------------------------------------------------

    def terminate(self, instances: Sequence[Instance]) -> None:
        """Terminate ``instances`` and wait (bounded) until EC2 reports them terminated."""
        by_region: dict[str, list[str]] = {}
        for inst in instances:
            by_region.setdefault(inst.region, []).append(inst.instance_id)
        for region, ids in by_region.items():
            self._terminate_region(region, list(dict.fromkeys(ids)))

    def _terminate_region(self, region: str, ids: list[str]) -> None:
        groups: set[str] = set()
        leases: set[str] = set()
        for chunk in _chunks(ids, 200):
            current = list(self._describe(region, [{"Name": "instance-id", "Values": chunk}]))
            for r in current:
                group = (r.get("Placement") or {}).get("GroupName") or ""
                if group.startswith(PLACEMENT_GROUP_PREFIX):
                    groups.add(group)
                tags = {t["Key"]: t["Value"] for t in r.get("Tags") or []}
                if tags.get(TAG_LEASE):
                    leases.add(tags[TAG_LEASE])
            alive = [r["InstanceId"] for r in current if r["State"]["Name"] not in ("shutting-down", "terminated")]
            if alive:
                try:
                    self._call(region, "", "terminate_instances", InstanceIds=alive)
                except InvalidRequestError as e:
                    if not e.code.startswith("InvalidInstanceID.NotFound"):
                        raise
        _log.info("aws.terminate", provider=PROVIDER, region=region, instance_ids=ids,
                  lease_ids=sorted(leases))
        self._wait_terminated(region, ids)
        for group in sorted(groups):
            self._delete_placement_group(region, group)

    def _wait_terminated(self, region: str, ids: list[str]) -> None:
        def remaining() -> list[str]:
            left: list[str] = []
            for chunk in _chunks(ids, 200):
                left += [r["InstanceId"] for r in self._describe(region, [{"Name": "instance-id", "Values": chunk}])
                         if r["State"]["Name"] != "terminated"]
            return left

        try:
            tenacity.Retrying(
                stop=tenacity.stop_after_delay(self.settings.terminate_timeout_s),
                wait=tenacity.wait_fixed(self.poll_s),
                retry=tenacity.retry_if_result(bool),
                reraise=True,
            )(remaining)
        except tenacity.RetryError as e:
            left = e.last_attempt.result()
            raise TransientError(
                f"{len(left)} instance(s) not terminated after {self.settings.terminate_timeout_s:.0f}s: "
                f"{', '.join(left[:10])}", provider=PROVIDER, code="TerminateTimeout", region=region) from None


def _unreadable_tags(region: str, instance_id: str, tags: Mapping[str, str]) -> str:
    """Why the tags of an instance cannot be read ("" when they can): a character AWS's answer
    cannot carry (see ``providers.aws.errors.readable``). Logged and counted as a provider error
    (``UnreadableTag``); a lease tag that cannot be read names no lease."""
    bad = sorted(k for k, v in tags.items() if UNREADABLE in k or UNREADABLE in v)
    if not bad:
        return ""
    why = (f"tag {', '.join(bad)} of {instance_id} holds characters an AWS answer cannot carry "
           "(written outside the broker)")
    TransientError(why, provider=PROVIDER, code="UnreadableTag", region=region)  # counted
    _log.warning("aws.instance.unreadable", provider=PROVIDER, region=region, instance_id=instance_id,
                 tags=bad)
    return why


def _launch_order(raw: Mapping[str, Any]) -> tuple:
    launched = raw.get("LaunchTime")
    return (launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
            raw.get("AmiLaunchIndex", 0), raw.get("InstanceId", ""))


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])
