"""GCP preemptions as they start: ``compute.instances.preempted`` zone operations.

When Compute Engine preempts a spot VM it records a ``compute.instances.preempted`` operation in
the VM's zone and gives the guest about 30 seconds (ACPI soft-off) before it stops it. The
broker's leader lists those operations in its regions' zones every ``preemption_poll_s``
(``zoneOperations.list`` with ``filter=operationType="compute.instances.preempted"``) and hands
each new one on as a :class:`providers.notices.Notice` (the instance is the operation's
``targetLink``), so the replacement starts while the VM is still stopping. Operations older than
``MAX_AGE_S`` are not news; the ones seen are remembered (bounded) so each is acted on once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any, Sequence

from providers.gcp.sdk import compute_v1

from providers.gcp.errors import NAME, map_error
from providers.notices import Notice, NoticeKind

OPERATION = "compute.instances.preempted"
MAX_AGE_S = 600.0  # a preemption older than this is about a VM long gone
MAX_SEEN = 10_000
MAX_PER_ZONE = 500  # operations read per zone and poll: one page


@dataclass(frozen=True, slots=True)
class Received:
    handle: str  # the operation's id
    message_id: str
    notice: Notice | None
    error: str = ""


class PreemptionOps:
    """The preemption operations of one project's configured regions."""

    provider = NAME

    def __init__(self, compute: Any, poll_s: float) -> None:
        self.compute = compute  # providers.gcp.client.ComputeClient
        self.poll_s = poll_s
        self._seen: dict[str, float] = {}  # operation id -> when first seen

    @property
    def name(self) -> str:
        return f"gcp {self.compute.project} {OPERATION} operations"

    def zones(self) -> list[str]:
        return [z for r in self.compute.settings.regions for z in self.compute.zones_for(r)]

    def receive(self) -> list[Received]:
        """New preemption operations of every zone (a zone whose listing fails is skipped this
        time and raises only when every zone failed)."""
        now, out, errors, zones = time.time(), [], [], self.zones()
        for zone in zones:
            try:
                pager = self.compute._operations.list(request=compute_v1.ListZoneOperationsRequest(
                    project=self.compute.project, zone=zone, filter=f'operationType="{OPERATION}"',
                    max_results=MAX_PER_ZONE), timeout=self.compute.settings.timeout_s, retry=None)
                ops = list(islice(pager, MAX_PER_ZONE))
            except Exception as e:  # noqa: BLE001 - mapped and counted; the other zones go on
                errors.append(map_error(e, zone=zone))
                continue
            for op in ops:
                oid = str(op.id or op.name)
                if not oid or oid in self._seen:
                    continue
                at = _epoch(op.insert_time)
                if at and now - at > MAX_AGE_S:
                    continue
                name = (op.target_link or "").rstrip("/").rsplit("/", 1)[-1]
                if not name:
                    out.append(Received(oid, op.name, None, f"{OPERATION} {op.name} names no instance"))
                    continue
                out.append(Received(oid, op.name, Notice(NAME, NoticeKind.PREEMPTION, (name,),
                                                         f"gcp: {OPERATION} in {zone}", at + 30.0 if at else 0.0,
                                                         (op.status_message or "preempted")[:200])))
        if errors and len(errors) == len(zones):
            raise errors[0]
        return out

    def delete(self, done: Sequence[Received]) -> None:
        """Remember handled operations (the listing keeps them; they are not acted on twice)."""
        now = time.time()
        for r in done:
            self._seen[r.handle] = now
        if len(self._seen) > MAX_SEEN:
            for k in sorted(self._seen, key=self._seen.__getitem__)[: len(self._seen) - MAX_SEEN]:
                del self._seen[k]


def _epoch(text: str) -> float:
    try:
        return datetime.fromisoformat((text or "").replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
