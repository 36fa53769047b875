"""The reconciler: store ⟷ every provider's tagged instances. Adopt, requeue or terminate.

Each pass has two phases (DESIGN.md):

* sync — passive transitions that only reflect what the clouds report: a lease that was
  mid-launch when the broker died and whose instances are all up is adopted; a lease whose
  instances were interrupted, terminated from outside, failed or vanished is drained, its running
  job requeued from its last checkpoint onto a replacement quoted for the work left (or failed
  past max_restarts; broker.requeue), a spot interruption's offering blocked; a draining lease
  with nothing left in the cloud is released.
* step — active transitions whose side effects reach the clouds: terminate orphans (tagged
  instances of no live lease, or of a running lease that does not list them, after a grace
  period), finish teardowns, launch replacements, resume or fail over launches stuck in
  requested/provisioning, release leases whose job ended, that sat idle, expired or ran out of
  budget — a running job is warned before its lease's lifetime ends and then requeued (or the
  lifetime extended), and follows ``[budgets] on_exhausted``, never killed without a requeue.

A provider whose listing fails is skipped for the pass (nothing is concluded from silence), and
a running lease missing instances in a listing is confirmed with ``describe`` before anything is
concluded (listings lag). It is safe to run after a ``kill -9`` at any point of launch or release.

No one lease, tenant or provider can stop a pass for the others: each is handled on its own, and
whatever it raises (a cloud error, a bug, a value a cloud SDK refuses) is logged, counted in
``PassReport.errors`` and reported to ``on_error`` (the ``broker_reconcile_errors`` metric), and
the pass goes on. A launch that has not finished ``provision_timeout_s`` after the lease was
created is given up, however often it was resumed: a lease enters the launching states once.
"""
from __future__ import annotations

import contextlib
import time
from itertools import compress
from operator import attrgetter, itemgetter
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Callable, Iterator, Mapping

import msgspec
import structlog

from broker.blocks import bought, launch_clock
from broker.lease import LAUNCHING, LIVE, EventKind, Lease, LeaseState
from broker.leader import NotLeader
from broker.jobs import ENDED_JOB, JobState, running
from broker.lifecycle import LeaseError, Lifecycle, alive, node_names
from broker.requeue import Loss, handle_loss
from broker.records import Job
from broker.store import StaleLease
from providers.base import Instance, Market, ProviderError, StopReason

log = structlog.get_logger("broker.reconciler")

#: What a pass reads of every live lease: enough to tell a steady lease (the many) from one to act
#: on (read in full). See :meth:`broker.store.Store.lease_rows`.
PASS_COLUMNS = ("lease_id", "state", "provider", "tenant", "instances", "created_at", "started_at",
                "max_lifetime_s", "idle_since", "job_state")


@dataclass
class PassReport:
    adopted: int = 0
    released: int = 0
    interrupted: int = 0
    lost: int = 0  # leases with a running job lost otherwise than to a spot interruption (requeued)
    replaced: int = 0
    orphans_terminated: int = 0
    resumed: int = 0
    failed: int = 0
    expired: int = 0
    skipped_providers: list[str] = field(default_factory=list)
    errors: int = 0  # leases, tenants or providers whose handling raised (each logged)


class Reconciler:
    def __init__(self, lifecycle: Lifecycle, *, orphan_grace_s: float,
                 clock: Callable[[], float] = time.time,
                 on_error: Callable[[str, str], None] | None = None) -> None:
        self.lc = lifecycle
        self.store = lifecycle.store
        self.orphan_grace_s = orphan_grace_s  # [reconciler] orphan_grace_s: no default of its own
        self.clock = clock
        self.on_error = on_error  # (phase, provider): a unit of the pass failed
        self._first_seen: dict[str, float] = {}  # orphan instance id -> first time seen
        self._told_unreadable: set[str] = set()  # instances whose unreadable record was logged
        # Called before every side-effecting step; raises (broker.leader.NotLeader) when this
        # replica no longer leads, which ends the pass. The service sets it; alone, it leads.
        self.fence: Callable[[], object] = lambda: None

    @contextlib.contextmanager
    def _isolated(self, report: PassReport, phase: str, provider: str = "", **where: Any) -> Iterator[None]:
        """Run one unit of the pass (a lease, a tenant, a provider): whatever it raises is logged
        and counted, and the pass goes on. Losing leadership still ends the whole pass."""
        try:
            yield
        except NotLeader:
            raise
        except StaleLease:  # someone (a Release, a Launch) moved it meanwhile: next pass
            log.info(f"{phase}_superseded", provider=provider, **where)
        except Exception as e:
            report.errors += 1
            if isinstance(e, (ProviderError, LeaseError)):
                log.warning(f"{phase}_failed", provider=provider, error=str(e), **where)
            else:
                log.exception(f"{phase}_failed", provider=provider, error=repr(e)[:500], **where)
            if self.on_error is not None:
                self.on_error(phase, provider)

    # -----------------------------------------------------------------------------------------
    def run_pass(self) -> PassReport:
        report = PassReport()
        now = self.clock()
        listings: dict[str, list[Instance]] = {}
        for name, provider in self.lc.providers.items():
            with self._isolated(report, "list", name):
                listings[name] = provider.list_managed()
            if name not in listings:
                report.skipped_providers.append(name)
        every = [i for insts in listings.values() for i in insts]
        # Read after listing: a lease created meanwhile has nothing listed yet, which is harmless;
        # the other order could take a just-launched lease's instances for orphans. Plain rows of
        # the few columns a steady lease is judged by; a lease that needs more is read in full.
        rows = self.store.lease_rows(PASS_COLUMNS, states=LIVE)
        live: dict[str, Any] = dict(zip(map(_LEASE_ID, rows), rows))
        by_state: dict[str, list[Any]] = {}
        for r in rows:
            by_state.setdefault(r.state, []).append(r)
        known = self._known(steady_rows := by_state.get(LeaseState.RUNNING, []), live, report)
        extra: dict[str, list[Instance]] = {}  # instances a running lease lists whose tag is unreadable
        claimed = self._unreadable(listings, live, known, extra, report, now)

        # sync -----------------------------------------------------------------------------
        # Set arithmetic over every lease at once finds the few whose sync could change anything:
        # a running lease with a listed instance no longer listed alive, every provisioning lease,
        # a draining lease with nothing listed.
        listed_pairs = {name: set(map(_PAIR, insts)) for name, insts in listings.items()}
        if all(map(alive, every)):
            up = set().union(*listed_pairs.values())
        else:
            up = set(map(_PAIR, filter(alive, every)))
        up.update(owner + _SEP + i.instance_id for owner, insts in extra.items() for i in insts if alive(i))
        due = {pair.partition(_SEP)[0] for pair in known.pairs - up}
        due.update(r.lease_id for r in by_state.get(LeaseState.PROVISIONING, ()))
        if LeaseState.DRAINING in by_state:
            listed = set(map(_LEASE_OF, every)) | extra.keys()
            due.update(r.lease_id for r in by_state[LeaseState.DRAINING] if r.lease_id not in listed)
        by_lease: dict[str, list[Instance]] = {}
        for i in compress(every, map(due.__contains__, map(_LEASE_OF, every))):
            by_lease.setdefault(i.lease_id, []).append(i)
        for owner, insts in extra.items():
            by_lease.setdefault(owner, []).extend(insts)
        quiet = self._quiet(steady_rows, now)  # running rows that need no step (unless over budget)
        for row in list(compress(rows, map(due.__contains__, map(_LEASE_ID, rows)))):
            lease_id = row.lease_id
            if row.provider not in listings:
                continue
            insts = by_lease.get(lease_id, [])
            if not self._sync_due(row, insts, known):
                continue
            self.fence()
            quiet.discard(lease_id)
            with self._isolated(report, "sync", row.provider, lease=lease_id):
                lease = self._full(lease_id)
                if lease is None:
                    continue
                live[lease_id], replacement = lease, None  # the fresher read stands even if sync fails
                live[lease_id], replacement = self._sync(lease, insts, report)
                known.set(lease_id, live[lease_id].instance_ids)
                if replacement is not None:
                    live[replacement.lease_id] = replacement

        # step -----------------------------------------------------------------------------
        self._terminate_orphans(listings, live, known, report, now, claimed, listed_pairs)
        budget_reasons = self._over_budget(live.values(), now, report)
        for lease_id, entry in [(k, v) for k, v in live.items() if k not in quiet or k in budget_reasons]:
            if entry.state not in LIVE:
                continue
            reason = budget_reasons.get(lease_id)
            if entry.state == LeaseState.RUNNING and self._expiry(entry, now, reason) is None:
                continue  # steady: nothing to do
            self.fence()
            with self._isolated(report, "step", entry.provider, lease=lease_id):
                lease = entry if isinstance(entry, Lease) else self._full(lease_id)
                if lease is not None and lease.state in LIVE:
                    self._step(lease, report, now, listed=lease.provider in listings, budget_reason=reason)
        self.fence()
        with self._isolated(report, "prune"):
            self.store.prune_quotes(now - 86400)
        return report

    def _quiet(self, rows: list[Any], now: float) -> set[str]:
        """The ids of the running ``rows`` for which :meth:`_expiry` is surely None when their
        tenant is within budget: its every condition but the job's warned mark (a row has no job)
        and the budget, on plain values. Those left out are judged by :meth:`_expiry` itself."""
        s = self.lc.settings
        warning_s, idle_s = s.lifetime_warning_s, s.idle_timeout_s
        ended, job_running = ENDED_JOB, JobState.RUNNING.value
        quiet = set()
        for lease_id, job_state, life, started_at, created_at, idle_since in map(_STEADY_COLUMNS, rows):
            if job_state in ended:
                continue
            if life:
                age = now - (started_at or created_at)
                if age >= life or (job_state == job_running and age >= life - warning_s):
                    continue
            if idle_s and idle_since and now - idle_since >= idle_s:
                continue
            quiet.add(lease_id)
        return quiet

    def _full(self, lease_id: str) -> Lease | None:
        return self.store.get_lease(lease_id)

    def _unreadable(self, listings: Mapping[str, list[Instance]], live: Mapping[str, Any],
                    known: "_Known", extra: dict[str, list[Instance]],
                    report: PassReport, now: float) -> set[str]:
        """Instances part of whose record a cloud's answer could not carry (``Instance.problem``,
        e.g. a tag written outside the broker with a control character): each counts as an error
        of its provider's listing on every pass (the ``broker_reconcile_errors`` metric), is
        logged once, and gives the lease it belongs to (by its tag, else the running lease that
        lists it) one event; every other instance of the provider is reconciled as usual. Returns
        the ids of those whose lease is known only from the lease's own list (not orphans), and
        adds each of them to ``extra`` under that lease."""
        bad = [(name, i) for name, insts in listings.items() for i in insts if i.problem]
        self._told_unreadable &= {i.instance_id for _, i in bad}
        if not bad:
            return set()
        listed_by = known.owners()
        claimed: set[str] = set()
        for name, i in bad:
            report.errors += 1
            if self.on_error is not None:
                self.on_error("list", name)
            owner = i.lease_id if i.lease_id in live else listed_by.get(i.instance_id, "")
            if owner and owner != i.lease_id:
                claimed.add(i.instance_id)
                extra.setdefault(owner, []).append(i)
            if i.instance_id in self._told_unreadable:
                continue
            with self._isolated(report, "list", name, instance=i.instance_id):
                log.warning("instance_unreadable", provider=name, instance=i.instance_id, lease=owner,
                            problem=i.problem)
                if owner:
                    self.store.add_event(owner, "instance_unreadable", i.problem[:500], now,
                                         {"instance_id": i.instance_id})
                self._told_unreadable.add(i.instance_id)
        return claimed

    def _known(self, rows: list[Any], live: Mapping[str, Any], report: PassReport) -> "_Known":
        """What the running leases ``rows`` list; a lease whose list cannot be read is its own error."""
        known = _Known(rows)
        for lease_id in sorted(known.unreadable):
            with self._isolated(report, "sync", live[lease_id].provider, lease=lease_id):
                raise LeaseError(f"lease {lease_id}: its stored instance list cannot be read")
        return known

    def _sync_due(self, row: Any, insts: list[Instance], known: "_Known") -> bool:
        """Whether :meth:`_sync` could change anything for this lease (a quick look at its row)."""
        if row.state == LeaseState.RUNNING:  # every node it knows still listed alive: in sync
            return not known.ids(row.lease_id) <= {i.instance_id for i in insts if alive(i)}
        if row.state == LeaseState.PROVISIONING:
            return row.lease_id not in self.lc.inflight
        return row.state == LeaseState.DRAINING and not insts

    # -- sync: reflect what the clouds say ----------------------------------------------------
    def _sync(self, lease: Lease, insts: list[Instance],
              report: PassReport) -> tuple[Lease, Lease | None]:
        up = [i for i in insts if alive(i)]
        if lease.state is LeaseState.PROVISIONING:
            if lease.lease_id in self.lc.inflight:
                return lease, None  # this process is launching it: the launch records the result
            mine = [i for i in up if _attempt_of(i, lease)]
            if len(mine) == lease.nodes:
                report.adopted += 1
                log.info("adopted", lease=lease.lease_id, provider=lease.provider, nodes=len(mine))
                return self.lc.adopt(lease, mine), None
            return lease, None
        if lease.state is LeaseState.RUNNING:
            return self._sync_running(lease, insts, report)
        if lease.state is LeaseState.DRAINING and not insts:
            report.released += 1
            return self.lc.mark_released(lease), None
        return lease, None

    def _sync_running(self, lease: Lease, insts: list[Instance],
                      report: PassReport) -> tuple[Lease, Lease | None]:
        known = lease.instance_ids
        if known <= {i.instance_id for i in insts if alive(i)}:
            return lease, None
        # Something is missing from the listing. Listings lag (EC2's are eventually consistent):
        # ask about this lease directly before concluding anything.
        seen = {i.instance_id: i for i in self.lc.providers[lease.provider].describe(lease.lease_id, lease.region)}
        gone = {k for k in known if k not in seen or not alive(seen[k])}
        if not gone:
            return lease, None
        stopped = [seen[k] for k in sorted(gone) if k in seen]
        interrupted = [i for i in stopped if i.stop_reason is StopReason.INTERRUPTED]
        vanished = len(stopped) < len(gone)
        if interrupted or (vanished and lease.market == Market.SPOT):
            # A reclaimed spot VM with termination action "delete" simply vanishes (GCP, Azure).
            report.interrupted += 1
            detail = interrupted[0].stop_detail if interrupted else "spot instance vanished"
            return self._lost(lease, Loss("spot interruption", detail, block=True), report)
        detail = ", ".join(f"{i.instance_id}: {i.stop_reason or i.state} {i.stop_detail}".strip()
                           for i in stopped) or "instances vanished"
        if running(lease):  # a job the broker keeps alive: requeued, whatever took its nodes
            report.lost += 1
            return self._lost(lease, Loss(loss_cause(stopped), detail), report)
        report.failed += 1
        return self.lc.drain(lease, f"instances lost: {detail}"), None

    def _lost(self, lease: Lease, loss: Loss, report: PassReport) -> tuple[Lease, Lease | None]:
        """Requeue the job (or fail it past max_restarts), record a replacement, then — in one
        write — move the lease to draining with its events (broker.requeue). A crash anywhere in
        between repeats the whole step on the next pass (the replacement's key makes it idempotent)."""
        lease, replacement = handle_loss(self.lc, lease, loss, self.clock())
        if replacement is not None:
            report.replaced += 1
        return lease, replacement

    # -- step: act on the clouds ----------------------------------------------------------------
    def _terminate_orphans(self, listings: Mapping[str, list[Instance]], live: Mapping[str, Any],
                           known: "_Known", report: PassReport, now: float,
                           claimed: AbstractSet[str], listed_pairs: Mapping[str, AbstractSet[str]]) -> None:
        """Tagged instances that no live lease accounts for: of a lease that ended (or never
        existed), or of a running lease that does not list them (a launch attempt it moved on
        from, a duplicate). Those of leases still launching or draining are theirs to settle.

        Whatever their state: a listing holds what still exists (a stopped GCP VM, an Azure VM
        whose creation failed, a deallocated one all keep their disks), and terminating what is
        already on its way out is harmless. ``listed_pairs``: each listing's instances as
        :data:`_PAIR` keys."""
        seen = set()
        for name, insts in listings.items():
            orphans = []
            # An instance its running lease lists is no orphan: set arithmetic leaves the few to look at.
            rest = listed_pairs[name] - known.pairs
            for i in (compress(insts, map(rest.__contains__, map(_PAIR, insts))) if rest else ()):
                lease = live.get(i.lease_id)
                if i.instance_id in claimed:
                    continue  # its lease tag is unreadable, but a running lease lists it
                if lease is not None and (lease.state != LeaseState.RUNNING or i.lease_id in known.unreadable):
                    continue
                seen.add(i.instance_id)
                first = self._first_seen.setdefault(i.instance_id, now)
                if now - first >= self.orphan_grace_s:
                    orphans.append(i)
            if orphans:
                self.fence()
                with self._isolated(report, "orphans", name, instances=[i.instance_id for i in orphans]):
                    self.lc.providers[name].terminate(orphans)
                    report.orphans_terminated += len(orphans)
                    for i in orphans:
                        self._first_seen.pop(i.instance_id, None)
                        log.warning("orphan_terminated", provider=name, instance=i.instance_id, lease=i.lease_id)
        for k in [k for k in self._first_seen if k not in seen]:
            del self._first_seen[k]

    def _over_budget(self, leases, now: float, report: PassReport) -> dict[str, str]:
        """Running leases to release for budget, by lease id, with the sentence naming the cap."""
        budgets = self.lc.budgets
        if budgets is None or not budgets.budgets:
            return {}
        out: dict[str, str] = {}
        for tenant in sorted({l.tenant for l in leases if l.state == LeaseState.RUNNING}):
            with self._isolated(report, "budget", tenant=tenant):
                out.update(budgets.releases(tenant, now))
        return out

    def _step(self, lease: Lease, report: PassReport, now: float, listed: bool,
              budget_reason: str | None = None) -> None:
        s = self.lc.settings
        age = now - lease.state_since
        if lease.state in LAUNCHING and listed and now - launch_clock(lease) >= s.provision_timeout_s:
            # Timed from the lease's creation (or the start of the Capacity Block bought for it):
            # resuming a launch (provisioning → requested → provisioning) restarts state_since,
            # never this clock.
            report.failed += 1
            lease = self.lc.drain(lease, f"launch did not finish within {s.provision_timeout_s:.0f} s")
            self.lc.finish_drain(lease)
            return
        if lease.state is LeaseState.REQUESTED and bought(lease) and now < lease.starts_at:
            return  # waiting for its Capacity Block to start
        if lease.state is LeaseState.REQUESTED:
            # A replacement is launched at once; any other request this old was abandoned by a
            # crash between its creation and its launch.
            if lease.lease_id not in self.lc.inflight and (lease.replaces or age >= min(5.0, s.resume_after_s)):
                report.resumed += 1
                try:
                    self.lc.provision(lease)
                except LeaseError:
                    report.failed += 1
            return
        if lease.state is LeaseState.PROVISIONING:
            if not listed:
                return
            if lease.lease_id not in self.lc.inflight and age >= s.resume_after_s:
                # The launching process died mid-call: retry with the SAME client token (idempotent),
                # which returns what the first call made or completes it.
                report.resumed += 1
                lease = self.lc.resume(lease)
                try:
                    self.lc.provision(lease)
                except LeaseError:
                    report.failed += 1
            return
        if lease.state is LeaseState.DRAINING:
            self.lc.finish_drain(lease)
            report.released += 1
            return
        if lease.state is LeaseState.RUNNING:
            self._step_running(lease, report, now, budget_reason)

    def _step_running(self, lease: Lease, report: PassReport, now: float, budget_reason: str | None) -> None:
        """Release a running lease that expired; a running job is never killed without a requeue:
        warned before its lease's lifetime ends, then requeued (or the lifetime extended)."""
        expiry = self._expiry(lease, now, budget_reason)
        if expiry is None:
            return
        why, kind = expiry
        if kind == "lifetime_warning":
            job = lease.job.with_(lifetime_warned=True, checkpoint_requested=True)
            self.store.update_lease(lease, now=now, message=why, event_kind=EventKind.LIFETIME_WARNING,
                                    event_data={"job_id": job.job_id}, job=job)
            return
        if kind == "lifetime" and self.lc.settings.lifetime_with_job == "extend":
            more = int(self.lc.settings.max_lifetime_s or lease.max_lifetime_s)
            job = lease.job.with_(lifetime_warned=False, checkpoint_requested=False)
            self.store.update_lease(lease, now=now, event_kind=EventKind.LIFETIME_EXTENDED,
                                    message=f"{why}: extended by {more} s", job=job,
                                    max_lifetime_s=lease.max_lifetime_s + more)
            return
        report.expired += 1
        if kind in ("lifetime", "budget") and running(lease):
            loss = (Loss("maximum lifetime", why) if kind == "lifetime"
                    else Loss("budget exhausted", why, replace=False))
            lease, _ = self._lost(lease, loss, report)
            self.lc.finish_drain(lease)
            return
        self.lc.release(lease.lease_id, why, event_kind=EventKind.BUDGET if kind == "budget" else None)

    def _expiry(self, lease: Any, now: float, budget_reason: str | None) -> tuple[str, str] | None:
        """(why, kind) when a running lease needs action now: its job ended ("job"), it reached
        its maximum lifetime ("lifetime" with a running job, else "") or nears it with one
        ("lifetime_warning"), it sat idle too long (""), or its tenant is over budget ("budget").
        ``lease`` may be a pass row (which has no ``job``: the full lease is read to act)."""
        s = self.lc.settings
        job = lease.job if isinstance(lease, Lease) else Job()  # a row has none (and a miss on one is dear)
        if lease.job_state in ENDED_JOB:
            code = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
            return f"job {job.job_id} {lease.job_state}{code}", "job"
        life, age = lease.max_lifetime_s, now - (lease.started_at or lease.created_at)
        if life and age >= life:
            if running(lease):
                return f"maximum lifetime of {life} s reached with job {job.job_id} running", "lifetime"
            return f"maximum lifetime of {life} s reached", ""
        if life and running(lease) and age >= life - s.lifetime_warning_s and not job.lifetime_warned:
            return (f"job {job.job_id}: the lease reaches its maximum lifetime of {life} s in "
                    f"{max(0, life - age):.0f} s; checkpoint now", "lifetime_warning")
        if s.idle_timeout_s and lease.idle_since and now - lease.idle_since >= s.idle_timeout_s:
            return f"idle for {s.idle_timeout_s:.0f} s with no job", ""
        if budget_reason:
            return budget_reason, "budget"
        return None


def loss_cause(stopped: list[Instance]) -> str:
    """A lost lease's cause in a few words, from why the cloud says its instances stopped."""
    reasons = {i.stop_reason for i in stopped}
    if StopReason.USER in reasons:
        return "outside termination"  # e.g. EC2 Client.UserInitiatedShutdown, a console delete
    if reasons & {StopReason.ERROR, StopReason.CAPACITY}:
        return "host failure"
    return "lost instance"


def _attempt_of(i: Instance, lease: Lease) -> bool:
    """Is ``i`` from the lease's current attempt (not a leftover of an earlier one)? Its node
    name says so (a node not yet named — EC2 names a gang after launching it — is judged by
    its shape alone)."""
    return (i.instance_type == lease.instance_type and i.region == lease.region and i.market == lease.market
            and (not i.node_name or i.node_name in node_names(lease)))


class _InstanceId(msgspec.Struct, gc=False):
    instance_id: str


# msgspec decodes only the one field a pass needs (the rest of each instance is skipped unparsed):
# at 100,000 leases this is several times faster than json.loads.
_decode_ids = msgspec.json.Decoder(list[_InstanceId]).decode


def _listed_ids(instances_json: str) -> set[str]:
    """The instance ids in a lease row's ``instances`` column."""
    return {i.instance_id for i in _decode_ids(instances_json)}


def _decode_or_none(instances_json: str) -> list[_InstanceId] | None:
    try:
        return _decode_ids(instances_json)
    except (msgspec.DecodeError, TypeError):
        return None


_decode_lists = msgspec.json.Decoder(list[list[_InstanceId]]).decode
_LEASE_ID = itemgetter(PASS_COLUMNS.index("lease_id"))
_STEADY_COLUMNS = itemgetter(*(PASS_COLUMNS.index(c) for c in (
    "lease_id", "job_state", "max_lifetime_s", "started_at", "created_at", "idle_since")))
_SEP = "\x00"  # between a lease id and an instance id in a pair's key (a string: no garbage to collect)
_PAIR = "{0.lease_id}\x00{0.instance_id}".format  # an Instance's (lease id, instance id) key
_LEASE_OF = attrgetter("lease_id")


class _Known:
    """The instance ids each running lease lists (its ``instances`` column), per lease and as
    (lease id, instance id) keys (:data:`_PAIR`'s), for set arithmetic over every lease at once."""

    def __init__(self, rows: list[Any]) -> None:
        lease_ids = [r.lease_id for r in rows]
        # one decode for every lease: their columns joined into one JSON array
        try:
            lists: list[Any] = _decode_lists("[" + ",".join([r.instances for r in rows]) + "]") if rows else []
        except msgspec.DecodeError:
            lists = []
        if len(lists) != len(rows):  # a malformed column (or one spilled into its neighbour): one by one
            lists = [_decode_or_none(r.instances) for r in rows]
        #: Running leases whose instance list cannot be read: no instance is judged by them (none
        #: synced, none taken for an orphan) until the row is mended; each pass counts them as errors.
        self.unreadable = {k for k, listed in zip(lease_ids, lists) if listed is None}
        lists = [listed or [] for listed in lists]
        self._of: dict[str, Any] = dict(zip(lease_ids, lists))  # lease id -> [_InstanceId] or {id}
        self.pairs = {k + _SEP + i.instance_id for k, listed in zip(lease_ids, lists) for i in listed}

    def ids(self, lease_id: str) -> set[str]:
        listed = self._of.get(lease_id, ())
        return listed if isinstance(listed, set) else {i.instance_id for i in listed}

    def set(self, lease_id: str, ids: set[str]) -> None:
        """The lease now lists ``ids`` (read anew)."""
        self.pairs.difference_update(lease_id + _SEP + k for k in self.ids(lease_id))
        self.pairs.update(lease_id + _SEP + k for k in ids)
        self._of[lease_id] = set(ids)

    def owners(self) -> dict[str, str]:
        """instance id -> the lease that lists it (the last one read, should two)."""
        return {k: lease_id for lease_id in list(self._of) for k in self.ids(lease_id)}
