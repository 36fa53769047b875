"""The autoscaler: snapshot → diagnosis → trigger → Demand per chosen job → full-cost quote →
launch (with failover) → hand-off. Teardown follows from the lease lifecycle (job done, idle,
lifetime, budget) and from the trigger's scale-in of idle cloud capacity.

Sources are the scheduler watchers the registry builds from the configuration (each kind's
``[<kind>] enabled``: :mod:`broker.watchers.registry`) and snapshots pushed by any scheduler
over the ReportQueue RPC. What the autoscaler does for a source follows from the capabilities
its watcher offers (:mod:`broker.watchers.base`): one that hands bursts over
(:class:`~broker.watchers.base.BurstHandoff`) gets the chosen jobs and launches cloud nodes
itself; for any other source, pushed ones included, the autoscaler launches the lease, attaches
the job (booting it into the scheduler's cluster when the watcher says how:
:class:`~broker.watchers.base.JoinNodes`), and the scheduler sees the nodes on WatchLeases /
GetLease. Jobs blocking training are moved first by a watcher that can offload
(:class:`~broker.watchers.base.OffloadJobs`), or named in an ``offload`` decision for a pushed
source.

Every decision, "did not burst, because …" included, is persisted and streamed as an event;
repeated identical holds are recorded once until something changes.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import structlog

from broker.config import AutoscalerSettings
from broker.lifecycle import LeaseError
from broker.quote import new_id
from broker.lease import LIVE, LeaseState
from broker.records import Job
from broker.watchers.base import (BurstHandoff, HandoffError, JoinNodes, OffloadJobs, SchedulerWatcher,
                                  capability)
from policies.demand import Demand, DemandError
from policies.diagnose import DiagnoseConfig, Diagnosis, diagnose
from policies.queue import PendingJob, QueueSnapshot
from policies.triggers import DecisionAction as A
from policies.triggers import (BURST, SCALE_IN, Decision, TriggerConfig, TriggerState,
                               candidates_from_snapshot, evaluate, signals_from_snapshot)

log = structlog.get_logger("broker.autoscaler")


@dataclass
class SourceState:
    trigger: TriggerState = field(default_factory=TriggerState)
    history: collections.deque = field(default_factory=lambda: collections.deque(maxlen=4096))
    last_hold: str = ""
    last_offload_failure: str = ""  # the last failed move recorded (recorded once while it repeats)
    last_handoff_failure: str = ""  # the last failed burst hand-off recorded (likewise)
    last_taken_at: float = 0.0  # the newest snapshot decided on
    burst_jobs: set[str] = field(default_factory=set)
    offloaded: set[str] = field(default_factory=set)  # moved off the training queue (policies.offload)


class Autoscaler:
    def __init__(self, service, settings: AutoscalerSettings, trigger: TriggerConfig,
                 diagnose_cfg: DiagnoseConfig, *, watchers: Mapping[str, SchedulerWatcher] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.svc = service
        self.settings = settings
        self.trigger_cfg = trigger
        self.diagnose_cfg = diagnose_cfg
        self.watchers = dict(watchers or {})  # source name -> SchedulerWatcher
        self.clock = clock or service.clock
        self.interval_s = settings.interval_s
        self.sources: dict[str, SourceState] = {}
        self._lock = threading.Lock()

    # -- inputs ----------------------------------------------------------------------------------
    def tick(self) -> list[Decision]:
        """One pass over every watched source, and over the snapshots any replica accepted from
        ReportQueue since the last decision on them (the leader's serve loop calls this every
        interval_s)."""
        out = []
        now = self.clock()
        for name, watcher in self.watchers.items():
            try:
                snap = watcher.snapshot(now)
            except Exception as e:  # a scheduler that cannot be read is logged, not fatal
                log.warning("snapshot_failed", source=name, error=str(e))
                continue
            out.append(self.on_snapshot(snap)[1])
        out.extend(self.on_pushed(now))
        return out

    def on_pushed(self, now: float) -> list[Decision]:
        """Decide on pushed snapshots not yet decided on. Only fresh ones count (taken within
        three intervals): a new leader does not act on a queue reported long ago."""
        from broker.watchers.snapshot_json import snapshot_from_dict

        out = []
        for source, taken_at, doc in self.svc.store.snapshots_since(now - 3 * self.interval_s):
            if source in self.watchers:
                continue
            st = self.sources.get(source)
            if st is not None and taken_at <= st.last_taken_at:
                continue
            out.append(self.on_snapshot(snapshot_from_dict(doc))[1])
        return out

    def on_snapshot(self, snap: QueueSnapshot) -> tuple[Diagnosis, Decision]:
        """Diagnose a snapshot, decide, act, and record the decision."""
        from broker.watchers.snapshot_json import encode

        now = self.clock()
        source = snap.source or "default"
        with self._lock:
            st = self.sources.setdefault(source, SourceState())
            st.last_taken_at = max(st.last_taken_at, snap.taken_at)
            self.svc.store.save_snapshot(source, snap.taken_at, encode(snap))
            diag = self.diagnose(snap, st, now)
            if snap.gpus_total:
                st.history.append((now, snap.gpus_allocated / snap.gpus_total))
            if st.burst_jobs:  # none: nothing to filter
                st.burst_jobs.intersection_update({j.job_id for j in snap.pending}
                                                  | {r.job_id for r in snap.running})
            in_flight, idle = self._cloud_state(source)
            if st.offloaded:
                st.offloaded.intersection_update({j.job_id for j in snap.pending})
            self._offload(source, snap, diag, st, now)
            snap_for_trigger = snap
            if st.burst_jobs or st.offloaded:  # jobs already sent out or moved don't count
                fresh = [j for j in snap.pending if j.job_id not in st.burst_jobs and j.job_id not in st.offloaded]
                snap_for_trigger = replace(snap, pending=tuple(fresh))
            signals = signals_from_snapshot(snap_for_trigger, in_flight, idle)
            cands = candidates_from_snapshot(snap_for_trigger, classes=self.trigger_cfg.classes)
            decision, st.trigger = evaluate(self.trigger_cfg, st.trigger, now, signals, cands, diag.verdict,
                                            capacity_jobs=diag.capacity_jobs,
                                            scheduling_causes=diag.scheduling_causes())
            self._act(source, decision, st, now)
        return diag, decision

    def diagnose(self, snap: QueueSnapshot, st: SourceState | None = None, now: float | None = None) -> Diagnosis:
        now = self.clock() if now is None else now
        st = st or self.sources.get(snap.source or "default") or SourceState()
        hist = [(t, r) for t, r in st.history if now - t <= self.settings.history_s]
        return diagnose(snap, hist, now=now, thresholds=self.diagnose_cfg)

    # -- cloud state for the trigger -------------------------------------------------------------
    def _cloud_state(self, source: str) -> tuple[int, dict[str, float]]:
        """Cloud GPUs in flight for this source, and its running leases with no job (idle since).

        Only leases burst for this source count (``job.source``, which the autoscaler alone
        writes), so a snapshot decides nothing about, and its answer tells nothing of, another
        source's or tenant's capacity. A lease without a source is no pushed source's; a watched
        source whose scheduler launches its own cloud nodes (its watcher hands bursts over) also
        counts the unsourced nodes its scheduler resumed (leases with node names) as in flight,
        never as idle capacity to scale in."""
        gpus, idle = 0, {}
        cat = self.svc.engine.catalog
        watched = capability(self.watchers.get(source), BurstHandoff) is not None
        for l in self.svc.store.list_leases(states=LIVE):
            job = l.job
            mine = job.source == source
            if not mine and not (watched and not job.source and job.node_names):
                continue
            it = cat.instance(l.provider, l.instance_type)
            gpus += l.nodes * (it.gpus if it else 0)
            # Leases of scheduler-managed nodes (resumed by the scheduler) are torn down by it.
            if mine and l.state is LeaseState.RUNNING and not job.job_id and not job.node_names \
                    and l.idle_since:
                idle[l.lease_id] = l.idle_since
        return gpus, idle

    # -- acting ----------------------------------------------------------------------------------
    def _offload(self, source: str, snap: QueueSnapshot, diag: Diagnosis, st: SourceState, now: float) -> None:
        """Move the tuning/eval/inference jobs that block training before anything bursts: a
        watched source through its watcher (OffloadJobs) into its offload queue, a pushed one by
        an ``offload`` decision naming the jobs for its scheduler to move. Either way the trigger
        stops counting them. A watched source that cannot offload, or has no offload queue, only
        has them named by the diagnosis."""
        from policies.offload import plan

        watcher = self.watchers.get(source)
        target = capability(watcher, OffloadJobs)
        partition = target.offload_queue if target is not None else ""
        if watcher is not None and not partition:
            return
        p = plan(snap, diag, partition, frozenset(st.offloaded))
        if p is None:
            return
        self.svc.fence()
        if target is None:
            st.offloaded.update(p.job_ids)
            self.svc.store.record_decision(new_id("d"), now, A.OFFLOAD, p.reason, list(p.job_ids),
                                           data={"source": source, "partition": partition})
            return
        before = frozenset(st.offloaded)
        try:
            moved = target.offload(list(p.job_ids))
            failed: frozenset[str] = frozenset()
        except Exception as e:
            # a HandoffError names the jobs it could not move: the others were moved; any other
            # error moved none. The jobs left where they were stay ordinary candidates.
            named = e.failures if isinstance(e, HandoffError) else ()
            failed = frozenset(j for j, _ in named) or frozenset(p.job_ids)
            moved = [j for j in p.job_ids if j not in failed]
            left = plan(snap, diag, partition, before | frozenset(moved)) or p
            why = f"{left.reason}; the move failed: {e}"
            if why != st.last_offload_failure:
                st.last_offload_failure = why
                self.svc.store.record_decision(new_id("d"), now, A.OFFLOAD_FAILED, why, list(left.job_ids),
                                               data={"source": source})
            if not moved:
                return
        else:
            st.last_offload_failure = ""  # a later failure is news again
        st.offloaded.update(moved)
        done = (plan(snap, diag, partition, before | failed) or p) if failed else p
        self.svc.store.record_decision(new_id("d"), now, A.OFFLOAD, done.reason.replace("offload ", "moved ", 1),
                                       list(done.job_ids), data={"source": source, "partition": partition})

    def _act(self, source: str, d: Decision, st: SourceState, now: float) -> None:
        """Carry out a decision. Only the leader acts: ``svc.fence()`` before every step raises
        NotLeader on a replica that does not (or no longer) lead."""
        store = self.svc.store
        if d.action == BURST:
            target = capability(self.watchers.get(source), BurstHandoff)
            for c in d.jobs:
                st.burst_jobs.add(c.job.job_id)
            if target is not None:
                self._hand_off(source, target, d, st, now)
            else:
                for c in d.jobs:
                    self.svc.fence()
                    self._launch_for(source, c.job, d, now)
            st.last_hold = ""
        if d.scale_in:
            for lease_id in d.scale_in:
                self.svc.fence()
                try:
                    self.svc.lifecycle.release(lease_id, "scale-in: idle cloud capacity")
                except LeaseError:
                    pass
            store.record_decision(new_id("d"), now, A.SCALE_IN, d.reason, [], data={"leases": list(d.scale_in)})
        if d.action not in (BURST, SCALE_IN) and d.reason != st.last_hold:
            st.last_hold = d.reason
            store.record_decision(new_id("d"), now, A.HOLD, d.reason, [], data={"source": source})

    def _hand_off(self, source: str, target: BurstHandoff, d: Decision, st: SourceState, now: float) -> None:
        """Hand the decision's jobs over to a scheduler that launches its own cloud nodes. A
        :class:`HandoffError` names the jobs it could not hand over: the others were, stay sent
        out and are recorded as a burst; the refused ones (all, on any other error) may burst
        again, their failure recorded once while it repeats."""
        store = self.svc.store
        ids = [c.job.job_id for c in d.jobs]
        self.svc.fence()
        refused: list[str] = []
        try:
            target.allow_burst(ids)
            st.last_handoff_failure = ""  # a later failure is news again
        except Exception as e:
            named = {j for j, _ in e.failures} if isinstance(e, HandoffError) else set()
            refused = [i for i in ids if i in named] or ids
            st.burst_jobs.difference_update(refused)
            why = f"{d.reason}; hand-off failed: {e}"
            if why != st.last_handoff_failure:  # a hand-off failing every tick is recorded once
                st.last_handoff_failure = why
                store.record_decision(new_id("d"), now, A.BURST_FAILED, why, refused, data={"source": source})
        handed = [i for i in ids if i not in refused]
        if handed:
            store.record_decision(new_id("d"), now, A.BURST, d.reason, handed,
                                  data={"source": source, "trigger": d.trigger, "handoff": "scheduler"})

    def demand_for(self, job: PendingJob) -> Demand:
        s = self.settings
        runtime_s = job.runtime_s or s.default_runtime_s
        model = job.gpu_model.upper() if job.gpu_model else ("" if job.min_gpu_memory_gb else s.default_gpu_model)
        mem = job.min_gpu_memory_gb or (0 if model else s.default_min_gpu_memory_gb)
        tenant = (job.queue or "default") if s.tenant_from_queue else "default"
        return Demand(
            gpus=job.gpus, hours=max(0.05, runtime_s * s.runtime_margin / 3600.0), gpu_model=model,
            min_gpu_memory_gb=mem, nodes=job.nodes if job.nodes and job.gpus % job.nodes == 0 else 0,
            data_in_gb=job.data_gb, data_location=s.data_location, interruptible=job.interruptible,
            checkpoint_minutes=job.checkpoint_minutes, tenant=tenant, job_id=job.job_id,
        )

    def _launch_for(self, source: str, job: PendingJob, d: Decision, now: float) -> None:
        store, lc = self.svc.store, self.svc.lifecycle
        try:
            demand = self.demand_for(job)
            q = self.svc.quote(demand)
        except (DemandError, ValueError) as e:
            store.record_decision(new_id("d"), now, A.BURST_FAILED, f"job {job.job_id}: no demand: {e}", [job.job_id],
                                  data={"source": source})
            return
        if not q.offers:
            reasons = collections.Counter(e.reason for e in q.excluded).most_common(2)
            store.record_decision(new_id("d"), now, A.BURST_FAILED,
                                  f"job {job.job_id}: every offer excluded ({'; '.join(r for r, _ in reasons)})",
                                  [job.job_id], data={"source": source, "quote_id": q.quote_id})
            return
        targets = q.targets(lc.settings.max_failover)
        jobdoc = Job(job_id=job.job_id, owner=job.user, queue=job.queue, source=source)
        joiner = capability(self.watchers.get(source), JoinNodes)
        join = joiner.join_spec(job) if joiner is not None else None
        if join is not None and join.env:
            jobdoc = jobdoc.with_(env=dict(join.env))
        try:
            lease, created = lc.create(idempotency_key=f"auto-{source}-{job.job_id}", target=targets[0],
                                       tenant=demand.tenant, demand=demand, alternatives=targets[1:],
                                       quote_id=q.quote_id, offer_rank=1, job=jobdoc,
                                       bootstrap=join.bootstrap if join is not None else "")
            store.record_decision(new_id("d"), now, A.BURST,
                                  f"{d.reason}; job {job.job_id} → {targets[0].provider}/{targets[0].region} "
                                  f"{targets[0].instance_type} ({targets[0].market.value}), quote {q.quote_id}",
                                  [job.job_id], lease.lease_id, data={"source": source, "trigger": d.trigger})
            if created or lease.state is LeaseState.REQUESTED:
                lc.provision(lease)
        except LeaseError as e:
            store.record_decision(new_id("d"), now, A.BURST_FAILED, f"job {job.job_id}: {e}", [job.job_id],
                                  data={"source": source})


def autoscaler_for(service) -> Autoscaler | None:
    """The autoscaler ``service`` runs when ``[autoscaler] enabled = true`` (else None)."""
    settings = service.config.autoscaler
    if not settings.enabled:
        return None
    trig, diag = settings.trigger_config(), settings.diagnose_config()
    return Autoscaler(service, settings, trig, diag, watchers=service.schedulers)
