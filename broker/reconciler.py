"""The reconciler: store ⟷ every provider's tagged instances. Adopt, requeue or terminate.

Each pass has two phases (DESIGN.md):

* sync — passive transitions that only reflect what the clouds report: a lease that was
  mid-launch when the broker died and whose instances are all up is adopted; a lease whose
  instances were interrupted or vanished is marked; a draining lease with nothing left is released.
* step — active transitions whose side effects reach the clouds: terminate orphans (tagged
  instances with no live lease, after a grace period) and interrupted leftovers, finish
  interrupted teardowns, resume or fail over launches stuck in requested/provisioning, release
  leases that expired, sat idle or ran out of budget, and launch replacements for interrupted
  leases whose demand still stands.

A provider whose listing fails is skipped for the pass (nothing is concluded from silence).
It is safe to run after a ``kill -9`` at any point of launch or release.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import structlog

from broker.lifecycle import Lifecycle, LeaseError, alive, instance_dict, offering_key
from broker.store import LIVE_STATES, LeaseRecord, StaleLease
from providers.base import Instance, InstanceState, Market, ProviderError, StopReason

log = structlog.get_logger("broker.reconciler")


@dataclass
class PassReport:
    adopted: int = 0
    released: int = 0
    interrupted: int = 0
    replaced: int = 0
    orphans_terminated: int = 0
    resumed: int = 0
    failed: int = 0
    expired: int = 0
    skipped_providers: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(self, lifecycle: Lifecycle, *, orphan_grace_s: float = 120.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.lc = lifecycle
        self.store = lifecycle.store
        self.orphan_grace_s = orphan_grace_s
        self.clock = clock
        self._first_seen: dict[str, float] = {}  # orphan instance id -> first time seen

    # -----------------------------------------------------------------------------------------
    def run_pass(self) -> PassReport:
        report = PassReport()
        now = self.clock()
        listings: dict[str, list[Instance]] = {}
        for name, provider in self.lc.providers.items():
            try:
                listings[name] = provider.list_managed()
            except ProviderError as e:
                report.skipped_providers.append(name)
                log.warning("list_failed", provider=name, code=e.code, error=str(e))
        by_lease: dict[str, list[Instance]] = {}
        for insts in listings.values():
            for i in insts:
                by_lease.setdefault(i.lease_id, []).append(i)
        live = {l.lease_id: l for l in self.store.list_leases(states=LIVE_STATES)}

        # sync -----------------------------------------------------------------------------
        for lease in list(live.values()):
            if lease.provider not in listings:
                continue
            try:
                live[lease.lease_id] = self._sync(lease, by_lease.get(lease.lease_id, []), report)
            except StaleLease:
                continue

        # step -----------------------------------------------------------------------------
        self._terminate_orphans(listings, live, report, now)
        over_budget = self._over_budget(live.values(), now)
        for lease in list(live.values()):
            if lease.state not in LIVE_STATES:
                continue
            try:
                self._step(lease, report, now, listed=lease.provider in listings,
                           budget_reason=over_budget.get(lease.tenant))
            except (StaleLease, ProviderError, LeaseError) as e:
                log.warning("step_failed", lease=lease.lease_id, provider=lease.provider, error=str(e))
        self.store.prune_quotes(now - 86400)
        return report

    # -- sync: reflect what the clouds say ----------------------------------------------------
    def _sync(self, lease: LeaseRecord, insts: list[Instance], report: PassReport) -> LeaseRecord:
        up = [i for i in insts if alive(i)]
        if lease.state in ("requested", "provisioning"):
            mine = [i for i in up if _attempt_of(i, lease)]
            if len(mine) == lease.nodes and lease.state == "provisioning":
                report.adopted += 1
                log.info("adopted", lease=lease.lease_id, provider=lease.provider, nodes=len(mine))
                return self.lc.adopt(lease, mine)
            return lease
        if lease.state == "running":
            known = {i["instance_id"] for i in json.loads(lease.instances)}
            ours = [i for i in insts if i.instance_id in known]
            gone = known - {i.instance_id for i in ours if alive(i)}
            if not gone:
                return lease
            interrupted = [i for i in ours if i.stop_reason is StopReason.INTERRUPTED]
            vanished_spot = lease.market == Market.SPOT.value and len(ours) < len(known)
            if interrupted or vanished_spot:
                return self._interrupted(lease, interrupted, report)
            detail = ", ".join(f"{i.instance_id}: {i.stop_reason or i.state} {i.stop_detail}".strip()
                               for i in ours if not alive(i)) or "instances vanished"
            report.failed += 1
            lease = self.lc.accrue(lease)
            return self.lc._set(lease, state="draining", message=f"instances lost: {detail}")
        if lease.state == "draining" and not up:
            lease = self.lc.accrue(lease)
            report.released += 1
            return self.lc._set(lease, state="released", message=lease.state_reason or "released",
                                ended_at=self.clock(), instances=json.dumps(
                                    [{**i, "state": "terminated"} for i in json.loads(lease.instances)]))
        return lease

    def _interrupted(self, lease: LeaseRecord, interrupted: list[Instance], report: PassReport) -> LeaseRecord:
        report.interrupted += 1
        now = self.clock()
        job = json.loads(lease.job)
        detail = interrupted[0].stop_detail if interrupted else "spot instance vanished"
        key = offering_key(lease.provider, lease.region, lease.instance_type, lease.market)
        self.store.block(key, now + self.lc.settings.interruption_block_s, f"spot interruption on {key}")
        lease = self.lc.accrue(lease)
        lease = self.lc._set(lease, state="draining", message=f"spot interruption: {detail}",
                             event_kind="interrupted", event_data={"detail": detail, "blocked": key})
        if job.get("job_id"):
            self.store.add_event(lease.lease_id, "requeue",
                                 f"job {job['job_id']} requeued from checkpoint {job.get('checkpoint_uri') or '(none)'}",
                                 now, data={"job": job})
        log.warning("interrupted", lease=lease.lease_id, provider=lease.provider, detail=detail)
        self._replace(lease, report)
        return lease

    def _replace(self, lease: LeaseRecord, report: PassReport) -> None:
        """Quote and launch replacement capacity when the interrupted lease's demand still stands."""
        from broker.lifecycle import Target
        from broker.views import demand_from_dict

        d = json.loads(lease.demand)
        if not d or not d.get("gpus"):
            return
        demand = demand_from_dict(d)
        now = self.clock()
        q = self.lc.engine.quote(demand, now=now, blocked=self._blocked_offerings(now))
        if not q.offers:
            self.store.add_event(lease.lease_id, "requeue", "no replacement offer: every offer excluded", now)
            return
        targets = [Target(r.offering.provider, r.offering.region, r.priced.zone, r.offering.instance.name,
                          r.offering.market, r.priced.nodes, r.offering.hourly_micros, r.offering.reservation)
                   for r in q.offers[: self.lc.settings.max_failover]]
        try:
            new, _ = self.lc.create(
                idempotency_key=f"replace-{lease.lease_id}", target=targets[0], tenant=lease.tenant,
                demand=demand, alternatives=targets[1:], job=json.loads(lease.job), bootstrap=lease.bootstrap,
                max_lifetime_s=lease.max_lifetime_s, replaces=lease.lease_id,
            )
        except LeaseError as e:
            self.store.add_event(lease.lease_id, "requeue", f"no replacement: {e}", now)
            return
        report.replaced += 1
        self.store.add_event(lease.lease_id, "requeue", f"replacement lease {new.lease_id} requested", now,
                             data={"replacement": new.lease_id})

    def _blocked_offerings(self, now: float) -> dict[str, str]:
        return self.store.active_blocks(now)

    # -- step: act on the clouds ----------------------------------------------------------------
    def _terminate_orphans(self, listings: Mapping[str, list[Instance]], live: Mapping[str, LeaseRecord],
                           report: PassReport, now: float) -> None:
        seen = set()
        for name, insts in listings.items():
            orphans = []
            for i in insts:
                if not alive(i):
                    continue
                lease = live.get(i.lease_id)
                if lease is not None and (lease.state != "running" or _attempt_of(i, lease)
                                          or i.instance_id in lease.instances):
                    continue
                seen.add(i.instance_id)
                first = self._first_seen.setdefault(i.instance_id, now)
                age = max(now - first, now - i.launched_at if i.launched_at else 0.0)
                if age >= self.orphan_grace_s:
                    orphans.append(i)
            if orphans:
                try:
                    self.lc.providers[name].terminate(orphans)
                    report.orphans_terminated += len(orphans)
                    for i in orphans:
                        self._first_seen.pop(i.instance_id, None)
                        log.warning("orphan_terminated", provider=name, instance=i.instance_id, lease=i.lease_id)
                except ProviderError as e:
                    log.warning("orphan_terminate_failed", provider=name, error=str(e))
        for k in [k for k in self._first_seen if k not in seen]:
            del self._first_seen[k]

    def _over_budget(self, leases, now: float) -> dict[str, str]:
        """Tenants over a cap right now (usage computed once per pass, not per lease)."""
        budgets = self.lc.budgets
        if budgets is None or not budgets.budgets:
            return {}
        out = {}
        for tenant in {l.tenant for l in leases if l.state == "running"}:
            why = budgets.exhausted(tenant, now)
            if why:
                out[tenant] = why
        return out

    def _step(self, lease: LeaseRecord, report: PassReport, now: float, listed: bool,
              budget_reason: str | None = None) -> None:
        s = self.lc.settings
        age = now - lease.state_since
        if lease.state == "requested":
            # Created but the launch never started (crash between the two writes): start it.
            if lease.lease_id not in self.lc.inflight and age >= min(5.0, s.resume_after_s):
                report.resumed += 1
                try:
                    self.lc.provision(lease)
                except LeaseError:
                    report.failed += 1
            return
        if lease.state == "provisioning":
            if not listed:
                return
            if age >= s.provision_timeout_s:
                report.failed += 1
                lease = self.lc._set(lease, state="draining",
                                     message=f"launch did not finish within {s.provision_timeout_s:.0f} s")
                self.lc.finish_drain(lease)
                return
            if lease.lease_id not in self.lc.inflight and age >= s.resume_after_s:
                # The launching process died mid-call: retry with the SAME client token (idempotent),
                # which returns what the first call made or completes it.
                report.resumed += 1
                lease = self.lc._set(lease, state="requested", message="resuming launch after restart",
                                     attempt=lease.attempt - 1)
                try:
                    self.lc.provision(lease)
                except LeaseError:
                    report.failed += 1
            return
        if lease.state == "draining":
            self.lc.finish_drain(lease)
            report.released += 1
            return
        if lease.state == "running":
            reason = None
            if lease.max_lifetime_s and now - (lease.started_at or lease.created_at) >= lease.max_lifetime_s:
                reason = f"maximum lifetime of {lease.max_lifetime_s} s reached"
            elif s.idle_timeout_s and lease.idle_since and now - lease.idle_since >= s.idle_timeout_s:
                reason = f"idle for {s.idle_timeout_s:.0f} s with no job"
            elif budget_reason:
                reason = budget_reason
                self.store.add_event(lease.lease_id, "budget", budget_reason, now)
            if reason:
                report.expired += 1
                self.lc.release(lease.lease_id, reason)


def _attempt_of(i: Instance, lease: LeaseRecord) -> bool:
    """Is ``i`` from the lease's current shape (not a leftover of an earlier failover attempt)?"""
    return i.instance_type == lease.instance_type and i.region == lease.region
