"""Interruption notices read from the clouds, acted on before the loss.

The leader reads each cloud's notices (:mod:`providers.notices`: AWS's EventBridge events in an
SQS queue, GCP's ``compute.instances.preempted`` operations), finds the running lease that holds
each instance, and acts once per lease:

* preemption, scheduled maintenance, an instance stopping: the notice every source takes
  (:func:`broker.interruption.on_notice`, as a node's own report through the callback does) —
  an ``interruption_notice`` event, the job asked to checkpoint and requeued onto a replacement
  quoted for the work left, the offering blocked for a spot preemption — and the replacement is
  launched at once, while the old node keeps running until the cloud takes it (the reconciler
  then drains the lease and finds the replacement already made: one replacement, one requeue);
* a lease of a scheduler's own nodes (a scheduler resumed them, e.g. Slurm's power saving)
  holds that scheduler's jobs: the watcher that knows the nodes drains them and requeues the
  jobs running on them (:class:`broker.watchers.base.DrainNodes`; Slurm: ``scontrol requeue``),
  and the scheduler resumes other cloud nodes for them;
* a rebalance recommendation is advice: the event is recorded, nothing else (as Karpenter).

A repeated notice for a lease changes nothing. Messages are deleted once handled; one that cannot
be read is counted, logged and deleted; one whose handling failed stays in the queue to be
delivered again.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import structlog

from broker.lease import Lease, LeaseState
from broker.leader import NotLeader
from broker.watchers.base import DrainNodes, UnknownNodes, capability
from providers.base import Market, ProviderError, offering_key
from providers.notices import Notice, NoticeKind

log = structlog.get_logger("broker.notices")

EVENT = "interruption_notice"
NOTICE_COLUMNS = ("lease_id", "provider", "instances")


@dataclass
class Outcome:
    """What a notice did to one lease."""

    lease_id: str
    acted: bool
    replacement: str = ""
    blocked: str = ""
    requeued: list[str] = field(default_factory=list)
    scheduler: str = ""  # the source of the scheduler that requeued them
    note: str = ""  # why nothing was done, or why there is no replacement


@dataclass
class PollReport:
    received: int = 0
    acted: int = 0
    ignored: int = 0  # events that ask nothing, or about no lease of this broker
    malformed: int = 0
    errors: int = 0


class Notices:
    """Acts on notices for the leader (``reconciler`` supplies the replacement and the fence)."""

    def __init__(self, reconciler: Any, *, schedulers: Callable[[], Iterable[Any]] = tuple,
                 count: Callable[[str, str, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.reconciler = reconciler
        self.lc = reconciler.lc
        self.store = reconciler.store
        self.schedulers = schedulers  # () -> the watched schedulers (broker.watchers.registry)
        self.count = count or (lambda provider, kind, outcome: None)
        self.clock = clock
        self._launching: list[threading.Thread] = []

    # -- reading a source ----------------------------------------------------------------------
    def poll(self, source: Any) -> PollReport:
        """One receive from ``source`` (SQS: a long poll), every message handled, then deleted."""
        report, done = PollReport(), []
        got = source.receive()
        report.received = len(got)
        for r in got:
            if r.notice is None:
                if r.error:
                    report.malformed += 1
                    self.count(source.provider, "unknown", "malformed")
                    log.warning("notice_malformed", source=source.name, message=r.message_id, error=r.error)
                else:
                    report.ignored += 1
                done.append(r)
                continue
            try:
                outcomes = self.handle(r.notice)
            except NotLeader:
                raise
            except Exception as e:  # left in the queue: delivered again after its visibility timeout
                report.errors += 1
                self.count(r.notice.provider, r.notice.kind.value, "error")
                log.exception("notice_failed", source=source.name, message=r.message_id, error=repr(e)[:300])
                continue
            report.acted += sum(1 for o in outcomes if o.acted)
            report.ignored += not outcomes
            done.append(r)
        if done:
            source.delete(done)
        return report

    # -- acting --------------------------------------------------------------------------------
    def handle(self, notice: Notice) -> list[Outcome]:
        """Act on ``notice`` for every running lease holding one of its instances."""
        out = []
        for lease_id in self._leases_of(notice.provider, notice.instance_ids):
            lease = self.store.get_lease(lease_id)
            if lease is not None:
                out.append(self.on_lease(lease, notice))
        if not out:
            self.count(notice.provider, notice.kind.value, "no_lease")
            log.info("notice_unmatched", provider=notice.provider, kind=notice.kind.value,
                     instances=list(notice.instance_ids[:5]), source=notice.source)
        return out

    def on_lease(self, lease: Lease, notice: Notice) -> Outcome:
        """Block, checkpoint, replace, record: see the module's description. The job's side is
        the one every notice takes (:func:`broker.interruption.on_notice`, as the node's own
        report through the callback); the jobs on a scheduler's own nodes are its to requeue."""
        from broker.interruption import Notice as LeaseNotice, on_notice

        if lease.state is not LeaseState.RUNNING:
            return Outcome(lease.lease_id, False, note=f"lease is {lease.state}")
        drainers = [d for w in self.schedulers() if (d := capability(w, DrainNodes)) is not None]
        handed = bool(drainers) and bool(lease.job.get("node_names")) and not lease.job.get("job_id")
        if lease.job.get("notice_at") or self._noted(lease, notice):
            self.count(notice.provider, notice.kind.value, "repeated")
            return Outcome(lease.lease_id, notice.kind.acts, lease.job.get("replaced_by", ""),
                           note="notice already acted on")
        self.reconciler.fence()
        now = self.clock()
        out = Outcome(lease.lease_id, notice.kind.acts)
        preempted = notice.kind is NoticeKind.PREEMPTION or (
            notice.kind is NoticeKind.STOPPING and lease.market == Market.SPOT.value)
        if not notice.kind.acts or handed:
            if handed and notice.kind.acts:
                if preempted:
                    out.blocked = offering_key(lease.provider, lease.region, lease.instance_type, lease.market)
                    self.store.block(out.blocked, now + self.lc.settings.interruption_block_s,
                                     f"spot interruption on {out.blocked}")
                out.requeued, out.scheduler, out.note = self._drain(drainers, lease, notice)
            else:
                out.note = "advice only"
            self.store.add_event(lease.lease_id, EVENT, _sentence(lease, notice, out), now, {
                "kind": notice.kind.value, "source": notice.source, "instances": list(notice.instance_ids),
                "not_before": notice.not_before, "detail": notice.detail, "blocked": out.blocked,
                "requeued": out.requeued})
        else:
            nodes = {i.get("instance_id"): i.get("node_name", "") for i in lease.instances}
            node = next((nodes[i] for i in notice.instance_ids if i in nodes), "")
            kind = "preemption" if preempted else "maintenance"
            _, replacement = on_notice(self.lc, lease, LeaseNotice(lease.lease_id, kind, node,
                                                                   notice.source[:256], notice.not_before), now)
            out.blocked = offering_key(lease.provider, lease.region, lease.instance_type, lease.market) \
                if preempted else ""
            out.replacement = replacement.lease_id if replacement is not None else ""
            if replacement is not None and replacement.state is LeaseState.REQUESTED:
                self._launch(replacement)
        self.count(notice.provider, notice.kind.value, "acted" if out.acted else "recorded")
        log.warning("interruption_notice", lease=lease.lease_id, provider=lease.provider, kind=notice.kind.value,
                    source=notice.source, replacement=out.replacement, requeued=out.requeued)
        return out

    def _noted(self, lease: Lease, notice: Notice) -> bool:
        """Whether a notice of this kind was recorded for the lease already (advice, a scheduler's nodes)."""
        return any(e.kind == EVENT and json.loads(e.data or "{}").get("kind") == notice.kind.value
                   for e in self.store.events_of(lease.lease_id))

    def _drain(self, drainers: list[DrainNodes], lease: Lease, notice: Notice) -> tuple[list[str], str, str]:
        """The first scheduler that knows the lease's nodes drains them and requeues their jobs."""
        nodes = list(lease.job["node_names"])
        for d in drainers:
            try:
                jobs = d.drain_and_requeue(nodes, f"broker: {notice.kind.value} notice")
            except UnknownNodes:
                continue
            name = str(getattr(d, "source", "the scheduler"))
            return jobs, name, f"{name} requeued the jobs; it resumes other cloud nodes for them"
        return [], "", f"no watched scheduler knows nodes {', '.join(nodes)}"

    def _launch(self, lease: Lease) -> None:
        """Launch a replacement now, beside this loop (a launch may fail over for a while)."""
        def run() -> None:
            try:
                self.lc.provision(lease)
            except Exception as e:  # the reconciler resumes a replacement left requested
                log.warning("replacement_launch_failed", lease=lease.lease_id, error=str(e)[:300])

        t = threading.Thread(target=run, name=f"replace-{lease.lease_id}", daemon=True)
        self._launching = [x for x in self._launching if x.is_alive()] + [t]
        t.start()

    def wait_launches(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in list(self._launching):
            t.join(max(0.0, deadline - time.monotonic()))

    def _leases_of(self, provider: str, instance_ids: Iterable[str]) -> list[str]:
        """Running leases of ``provider`` that list any of ``instance_ids``."""
        from broker.reconciler import _listed_ids

        wanted = set(instance_ids)
        return [r.lease_id for r in self.store.lease_rows(NOTICE_COLUMNS, states=(LeaseState.RUNNING,))
                if r.provider == provider and wanted & _listed_ids(r.instances)]


def _sentence(lease: Lease, notice: Notice, out: Outcome) -> str:
    what = {NoticeKind.PREEMPTION: "spot interruption notice", NoticeKind.MAINTENANCE: "scheduled maintenance notice",
            NoticeKind.STOPPING: "instance stopping", NoticeKind.REBALANCE: "rebalance recommendation"}[notice.kind]
    parts = [f"{what} ({notice.source}) for {', '.join(notice.instance_ids[:3])}"]
    if notice.not_before:
        from broker.views import iso

        parts.append(f"expected at {iso(notice.not_before)}")
    job = lease.job.get("job_id")
    if out.requeued:
        parts.append(f"{out.scheduler} jobs {', '.join(out.requeued)} requeued")
    elif job and out.acted:
        parts.append(f"job {job} told to checkpoint")
    if out.replacement:
        parts.append(f"replacement lease {out.replacement} launched")
    elif out.note:
        parts.append(out.note)
    if out.blocked:
        parts.append(f"{out.blocked} blocked")
    return "; ".join(parts)


def notice_sources(providers: dict[str, Any]) -> list[Any]:
    """Every enabled provider's notice source (those that have one configured)."""
    out = []
    for name, p in sorted(providers.items()):
        try:
            make = getattr(p, "notice_source", None)  # a lazily built provider is built here
            if make is None:
                continue
            src = make()
        except (ProviderError, ValueError) as e:
            log.warning("notice_source_unavailable", provider=name, error=str(e)[:300])
            continue
        if src is not None:
            out.append(src)
    return out


