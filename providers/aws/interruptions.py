"""AWS interruption notices from an SQS queue, as Karpenter reads them.

EventBridge rules (``deploy/aws/interruption-queue.yaml``) route four kinds of event into one
queue: spot interruption warnings, rebalance recommendations, instance state changes and AWS
Health scheduled changes. The broker's leader long-polls the queue (``ReceiveMessage``, at most
10 messages and ``interruption_wait_s`` seconds per call), reads each message as an EventBridge
event (:func:`providers.notices.from_eventbridge`) and deletes it once handled: a message that
is not an event it can read is deleted too (and counted), so one bad message never blocks the
queue. The SQS client goes to ``AWS_ENDPOINT_URL_SQS`` when set, else ``endpoint_url``, else
the queue's own region's endpoint.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

import botocore.exceptions as bce

from providers.aws.client import Ec2Client
from providers.aws.errors import map_error
from providers.notices import MalformedNotice, Notice, from_eventbridge

MAX_MESSAGES = 10  # SQS's own bound on one ReceiveMessage
_QUEUE_REGION = re.compile(r"https?://sqs[.-]([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/")


@dataclass(frozen=True, slots=True)
class Received:
    """One message: its notice (None when it asks nothing), or why it could not be read."""

    handle: str
    message_id: str
    notice: Notice | None
    error: str = ""


class SqsNotices:
    """The interruption queue of one AWS account: receive, read, delete."""

    provider = "aws"

    def __init__(self, ec2: Ec2Client, queue_url: str, wait_s: float) -> None:
        self.queue_url = queue_url
        self.wait_s = int(max(0, min(20, wait_s)))
        m = _QUEUE_REGION.match(queue_url)
        self.region = m.group(1) if m else (ec2.settings.regions[0] if ec2.settings.regions else "us-east-1")
        endpoint = os.environ.get("AWS_ENDPOINT_URL_SQS") or ec2.settings.endpoint_url or None
        cfg = ec2._config.merge(type(ec2._config)(read_timeout=self.wait_s + ec2.settings.read_timeout_s))
        self._sqs = ec2._session.client("sqs", region_name=self.region, config=cfg, endpoint_url=endpoint)

    @property
    def name(self) -> str:
        return f"sqs {self.queue_url.rsplit('/', 1)[-1][:80]}"

    def receive(self) -> list[Received]:
        """Up to :data:`MAX_MESSAGES` messages, waiting up to ``wait_s`` for the first."""
        try:
            out = self._sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=MAX_MESSAGES,
                                            WaitTimeSeconds=self.wait_s)
        except (bce.BotoCoreError, bce.ClientError) as e:
            raise map_error(e, region=self.region) from e
        got = []
        for m in (out.get("Messages") or [])[:MAX_MESSAGES]:
            handle, mid = str(m.get("ReceiptHandle", "")), str(m.get("MessageId", ""))[:100]
            try:
                got.append(Received(handle, mid, from_eventbridge(m.get("Body") or "")))
            except MalformedNotice as e:
                got.append(Received(handle, mid, None, str(e)))
        return got

    def delete(self, done: Sequence[Received]) -> None:
        """Delete handled messages (one batch call; SQS takes at most 10 per call)."""
        entries = [{"Id": str(i), "ReceiptHandle": r.handle} for i, r in enumerate(done) if r.handle]
        for start in range(0, len(entries), MAX_MESSAGES):
            try:
                res: Any = self._sqs.delete_message_batch(QueueUrl=self.queue_url,
                                                          Entries=entries[start:start + MAX_MESSAGES])
            except (bce.BotoCoreError, bce.ClientError) as e:
                raise map_error(e, region=self.region) from e
            failed = res.get("Failed") or []
            if failed:
                raise map_error(bce.ClientError({"Error": {"Code": str(failed[0].get("Code", "DeleteFailed")),
                                                           "Message": str(failed[0].get("Message", ""))[:200]}},
                                                "DeleteMessageBatch"), region=self.region)
