"""Interruption notices: a cloud saying a node will go, before it goes.

A :class:`Notice` names the provider, the cloud's ids of the instances it is about, what is
coming (:class:`NoticeKind`), who said so and, when known, when. The sources are the clouds' own
channels, read by the broker's leader (:mod:`broker.notices` acts on them):

* AWS: EventBridge events routed into an SQS queue (``[providers.aws] interruption_queue_url``;
  :mod:`providers.aws.interruptions`), as Karpenter reads them — "EC2 Spot Instance Interruption
  Warning", "EC2 Instance Rebalance Recommendation", "EC2 Instance State-change Notification" and
  AWS Health scheduled changes. :func:`from_eventbridge` reads one.
* GCP: ``compute.instances.preempted`` zone operations (:mod:`providers.gcp.preemptions`).
* The node itself (GCP's metadata server ``instance/preempted``, Azure Scheduled Events
  ``Preempt``), reported by its boot script through the lease's callback.
"""
from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

MAX_BODY = 256 * 1024  # SQS's own message limit
MAX_INSTANCES = 100  # ids one notice may name (a Health event can list many)


class NoticeKind(str, enum.Enum):
    PREEMPTION = "preemption"  # spot capacity reclaimed: the node goes in ~2 minutes (AWS), ~30 s (GCP)
    MAINTENANCE = "maintenance"  # a scheduled stop, retirement or reboot of the host
    STOPPING = "stopping"  # the instance is stopping or terminating now
    REBALANCE = "rebalance"  # elevated risk of a spot interruption: advice only

    def __str__(self) -> str:
        return self.value

    @property
    def acts(self) -> bool:
        """Whether the node is going (a replacement is wanted), or this is advice only (as
        Karpenter, which records a rebalance recommendation and does nothing else)."""
        return self is not NoticeKind.REBALANCE


class MalformedNotice(ValueError):
    """A message that is not a notice this broker can read; the sentence says why."""


@dataclass(frozen=True, slots=True)
class Notice:
    provider: str
    kind: NoticeKind
    instance_ids: tuple[str, ...]
    source: str  # e.g. "aws.ec2: EC2 Spot Instance Interruption Warning"
    not_before: float = 0.0  # epoch seconds the loss is expected at (0: not said)
    detail: str = ""


_EC2_KINDS = {
    "EC2 Spot Instance Interruption Warning": NoticeKind.PREEMPTION,
    "EC2 Instance Rebalance Recommendation": NoticeKind.REBALANCE,
    "EC2 Instance State-change Notification": NoticeKind.STOPPING,
}
# States of a State-change Notification that mean the node is going (the others are ignored).
_GOING = ("stopping", "stopped", "shutting-down", "terminated")


def from_eventbridge(body: str | bytes) -> Notice | None:
    """The notice an EventBridge event (an SQS message body) carries; None for an event of a
    known shape that asks nothing (a state change to ``running``, a Health event that is not an
    EC2 scheduled change); :class:`MalformedNotice` for anything else."""
    if len(body) > MAX_BODY:
        raise MalformedNotice(f"message of {len(body)} bytes is larger than any EventBridge event")
    try:
        ev = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise MalformedNotice(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(ev, dict):
        raise MalformedNotice("not a JSON object")
    source, kind_text, detail = ev.get("source"), ev.get("detail-type"), ev.get("detail")
    if not isinstance(source, str) or not isinstance(kind_text, str) or not isinstance(detail, dict):
        raise MalformedNotice("not an EventBridge event (source, detail-type and detail are required)")
    where = f"{source[:40]}: {kind_text[:80]}"
    at = _time(ev.get("time"))
    if source == "aws.ec2" and kind_text in _EC2_KINDS:
        iid = detail.get("instance-id")
        if not _instance_id(iid):
            raise MalformedNotice(f"{where} without a valid detail.instance-id")
        kind = _EC2_KINDS[kind_text]
        if kind is NoticeKind.STOPPING:
            state = str(detail.get("state", ""))[:40]
            if state not in _GOING:
                return None
            return Notice("aws", kind, (iid,), where, at, f"instance state {state}")
        if kind is NoticeKind.PREEMPTION:
            action = str(detail.get("instance-action", "terminate"))[:40]
            return Notice("aws", kind, (iid,), where, at + 120.0 if at else 0.0, f"spot instance-action {action}")
        return Notice("aws", kind, (iid,), where, 0.0, "rebalance recommendation")
    if source == "aws.health" and kind_text == "AWS Health Event":
        if detail.get("service") != "EC2" or detail.get("eventTypeCategory") != "scheduledChange":
            return None
        entities = detail.get("affectedEntities")
        if not isinstance(entities, list):
            raise MalformedNotice(f"{where} without detail.affectedEntities")
        ids = tuple(e.get("entityValue") for e in entities[:MAX_INSTANCES] if isinstance(e, dict))
        ids = tuple(i for i in ids if _instance_id(i))
        if not ids:  # a scheduled change of volumes or hosts, not of an instance: nothing to do
            return None
        code = str(detail.get("eventTypeCode", ""))[:80]
        return Notice("aws", NoticeKind.MAINTENANCE, ids, where, _time(detail.get("startTime")),
                      f"scheduled change {code}".strip())
    raise MalformedNotice(f"{where} is not an event this broker reads")


def _instance_id(v: Any) -> bool:
    return isinstance(v, str) and v.startswith("i-") and 3 <= len(v) <= 40 and v[2:].isascii() and v[2:].isalnum()


def _time(v: Any) -> float:
    """Epoch seconds of an event's ISO 8601 ``time`` or a Health event's RFC 1123 ``startTime``
    (0 when absent or unreadable: a notice is acted on all the same)."""
    if not isinstance(v, str) or not v or len(v) > 64:
        return 0.0
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            t = parsedate_to_datetime(v).timestamp()
        except (TypeError, ValueError, IndexError):
            return 0.0
    return t if math.isfinite(t) else 0.0
