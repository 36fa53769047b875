"""An interruption notice: a lease's node will be taken (a spot preemption, scheduled
maintenance) but still runs. The job is told to checkpoint and a replacement is launched now,
before the node dies, through the one path every loss takes (:mod:`broker.requeue`).

Whoever hears of the notice calls :func:`on_notice`: the HTTP callback
(``POST /v1/leases/{lease_id}/notice``, :mod:`broker.callback`), or a watcher of the clouds'
own notices. The lease keeps running until its node is gone; the reconciler then drains it and
finds the replacement already made (its idempotency key is the lease's), so nothing is launched
twice and the job is requeued once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from broker.errors import FailedPrecondition, InvalidArgument
from broker.lease import EventKind, Lease, LeaseState

KINDS = ("preemption", "maintenance")


@dataclass(frozen=True)
class Notice:
    """``kind`` preemption | maintenance; ``source`` who said so (e.g. "aws:eventbridge",
    "gcp:metadata", "azure:scheduled-events"); ``not_before`` when the node may go (epoch s, 0 =
    unknown)."""

    lease_id: str
    kind: str
    node_name: str = ""
    source: str = ""
    not_before: float = 0.0


def notice_from(lease_id: str, body: Mapping[str, Any]) -> Notice:
    """A notice from a callback's JSON body, or InvalidArgument naming the bad field."""
    kind = body.get("kind")
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be {' or '.join(KINDS)}, got {str(kind)[:32]!r}.", field="kind")
    text = {}
    for name in ("node_name", "source"):
        v = body.get(name, "")
        if not isinstance(v, str) or len(v) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise InvalidArgument(f"{name} must be one line of at most 256 characters.", field=name)
        text[name] = v
    nb = body.get("not_before", 0) or 0
    if isinstance(nb, bool) or not isinstance(nb, (int, float)) or not math.isfinite(nb) or nb < 0:
        raise InvalidArgument("not_before must be a time in seconds since the epoch (0 = unknown).", field="not_before")
    return Notice(lease_id, kind, text["node_name"], text["source"], float(nb))


def on_notice(lc, lease: Lease, notice: Notice, now: float) -> tuple[Lease, Lease | None]:
    """Record the notice (an ``interruption_notice`` event), ask the job to checkpoint, and
    requeue it onto a replacement (state requested; the caller may provision it at once) while
    the node still runs. A repeated notice for the lease changes nothing more."""
    from broker.requeue import Loss, handle_loss

    if lease.state is not LeaseState.RUNNING:
        raise FailedPrecondition(f"lease {lease.lease_id} is {lease.state.value}, not running: "
                                 "nothing to be interrupted.")
    if lease.job.notice_at:
        return lease, lc.store.lease_by_key(lease.tenant, f"replace-{lease.lease_id}")
    when = f" not before {notice.not_before:.0f}" if notice.not_before else ""
    message = (f"{notice.kind} notice for {notice.node_name or 'a node'} from {notice.source or 'the node'}"
               f"{when}: the job is asked to checkpoint and a replacement is launched now")
    job = lease.job.with_(notice_at=now, checkpoint_requested=True)
    lease = lc.store.update_lease(lease, now=now, message=message, event_kind=EventKind.INTERRUPTION_NOTICE,
                                  event_data={"node_name": notice.node_name, "kind": notice.kind,
                                              "source": notice.source, "not_before": notice.not_before},
                                  job=job)
    loss = Loss(f"{notice.kind} notice", notice.source, block=notice.kind == "preemption")
    return handle_loss(lc, lease, loss, now, drain=False)
