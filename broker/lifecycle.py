"""Leases: launch (persisted before the cloud call), fail over, hand off, release.

The states and the transitions between them are :mod:`broker.lease`'s; this module makes them
happen, through named transitions (:meth:`Lifecycle.adopt`, :meth:`Lifecycle.drain`,
:meth:`Lifecycle.resume`, :meth:`Lifecycle.mark_released`, ...) that the reconciler calls too.

Every transition is written to the store (with its time and reason) BEFORE the cloud call it
leads to. Each launch call is an attempt of its own, persisted first with its client token
(``<lease>-<attempt>``) and node names (``<lease>-<attempt>-<i>``): a broker killed at any point
is restarted, and the reconciler repeats the interrupted attempt exactly (idempotent: the cloud
returns what that call made) or adopts what it made — it never launches twice. A failed attempt
is rolled back (the providers do it; :meth:`Lifecycle._discard_attempt` checks), throttling and
5xx retry the same offer with backoff as fresh attempts, capacity and quota errors block their
scope and fail over to the next offer, across clouds.
"""
from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Callable, Mapping, Sequence

import structlog

from broker import blocks
from broker.attempts import (  # noqa: F401  (re-exported)
    FLEET_MARKETS, ProviderFault, alive, attempt_at, attempt_record, attempts_summary, launch_failure, launch_tries)
from broker.config import LifecycleSettings
from broker.errors import BrokerError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from broker.jobs import JobState, job_state_of
from broker.lease import BILLED, ENDED, LAUNCHING, EventKind, Lease, LeaseState, cost_so_far
from broker import records
from broker.quote import QuoteEngine, Target, new_id, usd
from broker.records import Attempt, Job
from broker.store import StaleLease, Store
from policies.demand import Demand
from providers.base import (
    TAG_LEASE, TAG_OWNER, AuthError, CapacityError, Instance, InstanceState, InvalidRequestError,
    LaunchSpec, Market, Provider, ProviderError, QuotaError, Scope, TransientError, offering_key, scope_keys,
)
from broker.market import zone_targets
from broker.shapes import ShapeAttempts

log = structlog.get_logger("broker.lifecycle")


#: The markets a several-shape request mixes offers of (reserved and queued capacity is launched alone).

#: What lease operations raise: the service's one error family (broker.errors).
LeaseError = BrokerError


Settings = LifecycleSettings  # the typed [lifecycle] table, defined once in the schema


class BootScriptError(FailedPrecondition):
    """The lease's boot script cannot be rendered: the lease fails at once (no offer would do
    better), instead of staying in provisioning to be resumed forever."""


def lease_view(lease: Lease, now: float) -> dict[str, Any]:
    """A lease as the API and the CLI show it, with cost so far."""
    return {
        "lease_id": lease.lease_id, "state": lease.state.value, "state_reason": lease.state_reason,
        "provider": lease.provider, "region": lease.region, "zone": lease.zone,
        "instance_type": lease.instance_type, "market": lease.market.value, "nodes": lease.nodes,
        "hourly_usd": usd(lease.rate_micros), "cost_so_far_usd": usd(cost_so_far(lease, now)),
        "instances": records.to_builtins(lease.instances), "idempotency_key": lease.idempotency_key,
        "tenant": lease.tenant, "quote_id": lease.quote_id, "job": records.to_builtins(lease.job),
        "created_at": lease.created_at, "updated_at": lease.updated_at, "replaces": lease.replaces,
        "attempts": records.to_builtins(lease.attempts),
    }


def instance_record(i: Instance) -> records.Instance:
    """A cloud's instance as the lease records it."""
    return records.Instance(instance_id=i.instance_id, node_name=i.node_name, zone=i.zone,
                            private_ip=i.private_ip, state=i.state, region=i.region)


class Lifecycle(ShapeAttempts):
    """Creates, launches, hands off and releases leases against the configured providers."""

    def __init__(self, store: Store, providers: Mapping[str, Provider], engine: QuoteEngine, *,
                 owner: str, settings: Settings | None = None, budgets: Any = None,
                 boot: Callable[[Lease, str], str] | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.providers = dict(providers)
        self.engine = engine
        # Called with (provider, region) when a launch meets a quota error (see _block_for).
        self.on_quota_error: Callable[[str, str], None] | None = None
        self.owner = owner
        self.settings = settings or Settings()
        self.budgets = budgets  # broker.budget.Budgets or None
        self.boot = boot
        self.clock = clock
        self.sleep = sleep
        self.inflight: set[str] = set()  # leases this process is launching right now
        self._inflight_lock = threading.Lock()

    # -- creation --------------------------------------------------------------------------------
    def target_from_quote(self, quote_id: str, rank: int) -> tuple[Target, Demand | None, list[Target]]:
        q = self.store.get_quote(quote_id)
        if q is None:
            raise NotFound(f"quote {quote_id} does not exist.", field="quote_offer.quote_id")
        chosen, rest = q.pick(rank, self.clock())
        return chosen, q.demand, rest

    def target_explicit(self, provider: str, region: str, zone: str, instance_type: str,
                        market: str, count: int) -> Target:
        """The capacity a launch names outright (``offering``), checked against the enabled
        providers and the catalog: INVALID_ARGUMENT naming the offering's field, before any lease."""
        cat = self.engine.catalog

        def bad(name: str, sentence: str) -> InvalidArgument:
            return InvalidArgument(f"offering.{name}: {sentence}", field=f"offering.{name}")

        if provider not in self.providers:
            known = ", ".join(sorted(self.providers)) or "none"
            raise bad("provider", f"provider {provider[:64]!r} is not enabled (enabled: {known}).")
        try:
            m = Market(market)
        except ValueError:
            raise bad("market", f"market must be on_demand, spot or reserved, got {market!r}.") from None
        if count <= 0:
            raise bad("count", f"count must be at least 1, got {count}.")
        if cat.instance(provider, instance_type) is None:
            raise bad("instance_type", f"instance_type {instance_type[:64]!r} is not a known {provider} GPU type.")
        if cat.region(provider, region) is None:
            raise bad("region", f"region {region[:64]!r} is not a known {provider} region.")
        reservation = ""
        if m is Market.RESERVED:
            res = [o for o in self.engine.catalog.offerings if o.market is Market.RESERVED
                   and o.provider == provider and o.region == region and o.instance.name == instance_type]
            if not res:
                raise bad("market", f"no configured reservation for {provider} {region} {instance_type}.")
            offering = res[0]
            reservation = offering.reservation
        else:
            offering = cat.find(provider, region, instance_type, m)
            if offering is None:
                raise bad("instance_type", f"{provider} sells no {market} {instance_type} in {region}.")
        if zone and offering.zones and zone not in offering.zones:
            raise bad("zone", f"zone {zone[:64]!r} is not a zone of {region} ({', '.join(offering.zones)}).")
        return Target(provider, region, zone or (offering.zones[0] if offering.zones else ""), instance_type,
                      m, count, offering.hourly_micros, reservation)

    def create(self, *, idempotency_key: str, target: Target, tenant: str = "default",
               demand: Demand | None = None, alternatives: Sequence[Target] = (), quote_id: str = "",
               offer_rank: int = 0, job: Job | None = None, bootstrap: str = "",
               max_lifetime_s: int = 0, replaces: str = "") -> tuple[Lease, bool]:
        """Persist a new lease (state requested), or return the one that already has this key."""
        if not idempotency_key:
            raise InvalidArgument("idempotency_key is required.")
        now = self.clock()
        existing = self.store.lease_by_key(tenant, idempotency_key)
        if existing is not None:
            return existing, False
        admit, counted_since = (self.budgets.admission(tenant, target.hourly_micros * target.nodes, now)
                                if self.budgets is not None else (None, 0.0))
        lease_id = new_id("l")
        record = Lease(
            lease_id=lease_id, tenant=tenant, idempotency_key=idempotency_key, state=LeaseState.REQUESTED,
            provider=target.provider, region=target.region, zone=target.zone,
            instance_type=target.instance_type, market=target.market, nodes=target.nodes,
            hourly_micros=target.hourly_micros, reservation=target.reservation,
            client_token=f"{lease_id}-1", attempt=0, quote_id=quote_id, offer_rank=offer_rank,
            bootstrap=bootstrap, job=job or Job(), demand=demand,
            alternatives=tuple(alternatives),
            created_at=now, updated_at=now, state_since=now,
            max_lifetime_s=int(max_lifetime_s or self.settings.max_lifetime_s), replaces=replaces,
            job_state=job_state_of(job or Job()),
        )
        return self.store.create_lease(record, admit=admit, counted_since=counted_since)

    # -- provisioning ----------------------------------------------------------------------------
    def provision(self, lease: Lease) -> Lease:
        """Launch the lease's instances, failing over across offers on capacity/quota errors."""
        with self._inflight_lock:
            if lease.lease_id in self.inflight:
                return lease  # this process is launching it already
            self.inflight.add(lease.lease_id)
        try:
            return self._provision(lease)
        except StaleLease:
            # Someone else moved the lease (a release, another replica's launch): theirs stands.
            log.info("provision_superseded", lease=lease.lease_id, provider=lease.provider)
            return self.get(lease.lease_id)
        finally:
            self.inflight.discard(lease.lease_id)

    def _provision(self, lease: Lease) -> Lease:
        attempts = list(lease.attempts)
        tried: set[tuple] = set()  # offers (zones aside) tried; at most max_failover of them
        refused: dict[str, str] = {}  # provider -> why none of its offers is tried (auth errors)
        order = self.failover_order(lease.target, self._alternatives(lease))
        taken: set[Target] = set()  # targets already asked for in a several-shape request
        requests = 0  # several-shape requests made: each counts as one offer tried
        for n, target in enumerate(order):
            if target in taken:
                continue
            offer = (target.provider, target.region, target.instance_type, target.market)
            if offer not in tried and len(tried) + requests >= self.settings.max_failover:
                continue
            blocked = self._blocked_reason(target)
            if blocked or target.provider in refused:
                scope, why = blocked or (target.provider, refused[target.provider])
                attempts.append(attempt_at(target, "blocked", scope, "blocked", why))
                continue
            if blocks.is_block_offer(target):  # a Capacity Block: bought first, then waited for
                tried.add(offer)
                lease, target, outcome = blocks.buy(self, lease, target, attempts)
            elif blocks.bought(lease) and target == lease.target:
                tried.add(offer)
                lease, outcome = blocks.check(self, lease, target, attempts)
            else:
                outcome = blocks.Outcome.LAUNCH
            if outcome is blocks.Outcome.WAIT:
                return lease
            if outcome is blocks.Outcome.SKIP:
                continue
            shapes = self._shapes(target, order[n + 1:], taken)
            try:
                if len(shapes) > 1:
                    requests += 1
                    taken.update(shapes)
                    lease, instances, error = self._try_shapes(lease, shapes, attempts)
                else:
                    tried.add(offer)
                    lease, instances, error = self._try_offer(lease, target, attempts)
            except BootScriptError as e:  # the lease's own fault: no other offer does better
                attempts.append(attempt_at(target, "BootScript", "", "invalid", str(e)[:300]))
                return self._fail(self.get(lease.lease_id), attempts)
            if instances is None:
                if isinstance(error, (AuthError, ProviderFault)):  # the same cloud's next offer fares no better
                    refused[target.provider] = f"{error.code or 'auth error'} earlier in this launch"
                continue
            try:
                return self._mark_running(lease, instances, attempts)
            except StaleLease:
                return self._launched_too_late(lease, instances)
        return self._fail(lease, attempts)

    def _fail(self, lease: Lease, attempts: Sequence[Attempt]) -> Lease:
        """→ failed, with every attempt in the reason; raises FailedPrecondition (see launch_failure)."""
        lease = self._write(lease, state=LeaseState.FAILED,
                            message=f"every offer failed: {attempts_summary(attempts)}"[:2000],
                            attempts=attempts, ended_at=self.clock())
        raise launch_failure(lease)

    def _try_offer(self, lease: Lease, t: Target,
                   attempts: list) -> tuple[Lease, list[Instance] | None, ProviderError | None]:
        """Launch on one offer: (lease, instances, None), or (lease, None, the last error).

        Throttling and 5xx retry the same offer with backoff. Every call is an attempt of its
        own — persisted first, with its own client token and node names — so a rollback of a
        failed call still in flight cannot reach the nodes of the next one, while a launch
        resumed after a crash repeats its attempt exactly (idempotent)."""
        tries = launch_tries(self.settings.retries, self.settings.backoff_s, self.sleep,
                             lease=lease.lease_id, provider=t.provider)
        try:
            for call in tries:
                with call:
                    lease = self._begin_attempt(lease, t, attempts)
                    try:
                        instances = self._launch(lease, t)
                    except ProviderError as e:
                        attempts.append(attempt_record(t, e))
                        log.warning("launch_failed", lease=lease.lease_id, provider=t.provider, region=t.region,
                                    code=e.code, scope=str(e.scope))
                        raise
        except ProviderError as e:
            self._refused(lease, t, e, attempts)
            return lease, None, e
        if call.retry_state.attempt_number > 1:  # what a timed-out earlier call made after all is not part of the lease
            self._discard_attempt(lease, t, keep=instances)
        return lease, instances, None

    def _refused(self, lease: Lease, t: Target, e: ProviderError, attempts: list) -> None:
        """After the last call on ``t`` failed with ``e`` (its attempt recorded): block what the
        error covers, naming it in that attempt, and roll back what the call may have made."""
        self._block_named(e, t, attempts)
        self._discard_attempt(lease, t)

    def _block_named(self, e: ProviderError, t: Target, attempts: list) -> None:
        """Block what ``e`` on ``t`` covers; the last attempt (``e``'s) names what it blocked."""
        blocked = self._block_for(e, t)
        if blocked:
            attempts[-1] = records.replace(attempts[-1], scope=blocked)

    def failover_order(self, first: Target, alternatives: Sequence[Target]) -> list[Target]:
        """Where a launch tries, in order: the chosen offer in its zone, then in every other zone
        of its region where the type is offered, then the other offers of the same cloud (other
        regions, other markets) in rank order, each zone by zone, then the next cloud's, and so
        on. Blocks (a zone, a region, a cloud out of capacity or quota) skip what they cover."""
        offers = [first, *alternatives]
        clouds = list(dict.fromkeys(t.provider for t in offers))
        out: list[Target] = []
        seen: set[Target] = set()
        for cloud in clouds:
            for t in (t for t in offers if t.provider == cloud):
                for z in self._zones(t):
                    if z not in seen:
                        seen.add(z)
                        out.append(z)
        return out

    def _zones(self, t: Target) -> list[Target]:
        """``t`` in its own zone first, then in each other zone of its region that offers the type
        (a reservation lives in one zone; a target with no zone lets the cloud choose)."""
        if t.reservation or not t.zone:
            return [t]
        return [t, *zone_targets(self.engine, t)]

    def _alternatives(self, lease: Lease) -> list[Target]:
        return list(lease.alternatives)

    def _blocked_reason(self, t: Target) -> tuple[str, str] | None:
        """(blocked scope, why) when an earlier failure or interruption rules ``t`` out for now."""
        blocks = self.store.active_blocks(self.clock())
        for key in scope_keys(t.provider, t.region, t.instance_type, t.market.value, t.zone):
            if key in blocks:
                return key, f"blocked: {blocks[key]}"
        return None

    def _block_for(self, e: ProviderError, t: Target) -> str:
        """Capacity and quota errors block their scope for ``block_s``: later launches skip it.
        With ``on_quota_error`` set, a quota error refreshes the region's quota instead (quotes
        then exclude what no longer fits) and blocks only the offering that met it."""
        if not isinstance(e, (CapacityError, QuotaError)):
            return ""
        if isinstance(e, QuotaError) and self.on_quota_error is not None:
            self.on_quota_error(t.provider, t.region)
            key = offering_key(t.provider, t.region, t.instance_type, t.market.value)
        elif e.scope is Scope.OFFER:
            key = offering_key(t.provider, t.region, t.instance_type, t.market.value)
        elif e.region:
            key = e.scope_key
        elif e.scope is Scope.ZONE and t.zone:
            key = f"{t.provider}/{t.region}/{t.zone}"
        else:
            key = f"{t.provider}/{t.region}"
        self.store.block(key, self.clock() + self.settings.block_s, f"{e.code or type(e).__name__} on {key}")
        return key

    def _discard_attempt(self, lease: Lease, t: Target, keep: Sequence[Instance] = ()) -> None:
        """Terminate whatever failed attempts left in ``t``'s region (the providers roll a failed
        gang launch back themselves; this covers a rollback that failed or a call that timed out
        but went through). Best effort: what survives is an orphan to the reconciler."""
        provider = self.providers.get(t.provider)
        if provider is None:
            return
        kept = {i.instance_id for i in keep}
        try:
            left = [i for i in provider.describe(lease.lease_id, t.region) if i.instance_id not in kept]
            if left:
                log.warning("attempt_leftovers", lease=lease.lease_id, provider=t.provider, region=t.region,
                            instances=[i.instance_id for i in left])
                provider.terminate(left)
        except Exception as e:  # noqa: BLE001 - whatever is left carries the lease's tag: an orphan then
            log.warning("attempt_cleanup_failed", lease=lease.lease_id, provider=t.provider,
                        code=getattr(e, "code", type(e).__name__), error=str(e)[:500])

    def _launched_too_late(self, lease: Lease, instances: Sequence[Instance]) -> Lease:
        """The launch finished but the lease moved on meanwhile (adopted by the reconciler,
        or released): keep it if it is running on these instances, else give them back."""
        fresh = self.get(lease.lease_id)
        ids = {i.instance_id for i in instances}
        if fresh.state is LeaseState.RUNNING and ids <= fresh.instance_ids:
            return fresh
        log.warning("launched_after_release", lease=lease.lease_id, provider=lease.provider, state=fresh.state)
        provider = self.providers[lease.provider]
        try:
            provider.terminate(list(instances))
        except ProviderError as e:  # the reconciler terminates them as orphans
            log.warning("terminate_failed", lease=lease.lease_id, provider=lease.provider, error=str(e))
        return fresh

    def _begin_attempt(self, lease: Lease, t: Target, attempts: list, shapes: int = 1) -> Lease:
        attempt = lease.attempt + 1
        more = f" or the best of {shapes - 1} other shapes" if shapes > 1 else ""
        return self._write(
            lease, state=LeaseState.PROVISIONING, message=f"launching {t.nodes} x {t.instance_type} ({t.market.value}) "
            f"in {t.provider}/{t.zone or t.region}{more}, attempt {attempt}",
            provider=t.provider, region=t.region, zone=t.zone, instance_type=t.instance_type,
            market=t.market.value, nodes=t.nodes, hourly_micros=t.hourly_micros, reservation=t.reservation,
            attempt=attempt, client_token=f"{lease.lease_id}-{attempt}", attempts=attempts,
            # a bought Capacity Block's start stays only while the launch goes into that block
            starts_at=lease.starts_at if t.reservation == lease.reservation else 0.0,
        )

    def spec_for(self, lease: Lease) -> LaunchSpec:
        it = self.engine.catalog.instance(lease.provider, lease.instance_type)
        if it is None:
            raise InvalidRequestError(f"unknown instance type {lease.instance_type}", provider=lease.provider,
                                      code="UnknownInstanceType", region=lease.region)
        names = node_names(lease)
        try:
            script = self.boot(lease, names) if (self.boot and lease.bootstrap) else ""
        except Exception as e:  # a template removed from the config since, a setting it lacks
            raise BootScriptError(f"boot template {lease.bootstrap!r} cannot be rendered: {e}") from e
        return LaunchSpec(
            lease_id=lease.lease_id, provider=lease.provider, region=lease.region, zone=lease.zone,
            instance=it, market=lease.market, count=lease.nodes, client_token=lease.client_token,
            node_names=names, boot_script=script, tags={TAG_LEASE: lease.lease_id, TAG_OWNER: self.owner},
            reservation=lease.reservation, max_run_h=self._max_run_h(lease),
        )

    def _max_run_h(self, lease: Lease) -> float:
        """A queued lease's longest run, from its offering (GCP flex-start's maxRunDuration)."""
        if lease.market != Market.QUEUED.value:
            return 0.0
        return next((o.max_run_h for o in self.engine.catalog.offerings
                     if o.market is Market.QUEUED and o.provider == lease.provider and o.region == lease.region
                     and o.instance.name == lease.instance_type), 0.0)

    def _launch(self, lease: Lease, t: Target) -> list[Instance]:
        provider = self.providers.get(t.provider)
        if provider is None:
            raise InvalidRequestError(f"provider {t.provider} is not enabled", provider=t.provider,
                                      code="ProviderDisabled", scope=Scope.CLOUD)
        spec = self.spec_for(lease)
        try:
            return self._checked(provider, spec, t)
        except (ProviderError, BrokerError, StaleLease):
            raise
        except Exception as e:  # a provider's bug: this offer failed, said in one line
            said = (str(e).strip().splitlines() or [""])[0][:200]
            frame = traceback.extract_tb(e.__traceback__)[-1]  # where, without the frames' values (secrets)
            log.error("launch_crashed", lease=lease.lease_id, provider=t.provider, region=t.region,
                      error=f"{type(e).__name__}: {said}", at=f"{frame.filename}:{frame.lineno} in {frame.name}")
            raise ProviderFault(f"{t.provider} raised {type(e).__name__}{': ' + said if said else ''}",
                                provider=t.provider, code=type(e).__name__, region=t.region, zone=t.zone) from e

    def _checked(self, provider: Provider, spec: LaunchSpec, t: Target) -> list[Instance]:
        """``provider.launch``, holding it to its contract: ``spec.count`` live nodes of the
        asked type and market, or nothing (a gang is all-or-nothing)."""
        instances = provider.launch(spec)
        up = [x for x in instances if alive(x)]
        wrong = [x for x in up if x.instance_type != t.instance_type or x.market is not t.market]
        if len(up) == spec.count and not wrong:
            return up
        try:
            provider.terminate(instances)
        except ProviderError as e:  # _discard_attempt and the reconciler try again
            log.warning("terminate_failed", lease=spec.lease_id, provider=t.provider, error=str(e))
        if wrong:
            raise TransientError(f"the launch returned {len(wrong)} node(s) of another shape "
                                 f"({wrong[0].instance_type}, {wrong[0].market}); terminated them",
                                 provider=t.provider, code="ShapeMismatch", region=t.region, zone=t.zone)
        raise CapacityError(f"only {len(up)} of {spec.count} nodes came up", provider=t.provider,
                            code="PartialLaunch", region=t.region, zone=t.zone)

    def _mark_running(self, lease: Lease, instances: Sequence[Instance], attempts: list) -> Lease:
        now = self.clock()
        zone = instances[0].zone if instances else lease.zone
        return self._write(lease, state=LeaseState.RUNNING,
                           message=f"{len(instances)} nodes running in {lease.provider}/{zone or lease.region}",
                           instances=[instance_record(i) for i in instances], zone=zone,
                           started_at=lease.started_at or now, accrued_at=now,
                           idle_since=0.0 if has_work(lease) else now, attempts=attempts)

    # -- named transitions (also the reconciler's) -------------------------------------------------
    def adopt(self, lease: Lease, instances: Sequence[Instance]) -> Lease:
        """provisioning → running: a launch that finished in the cloud while the broker was down."""
        return self._mark_running(lease, instances, list(lease.attempts))

    def resume(self, lease: Lease, message: str = "resuming launch after restart") -> Lease:
        """provisioning → requested: a launch whose process died mid-call, to be repeated with the
        SAME client token (the attempt counter steps back, so the retry reuses it)."""
        return self._write(lease, state=LeaseState.REQUESTED, message=message, attempt=lease.attempt - 1)

    def drain(self, lease: Lease, reason: str, *, event_kind: EventKind | None = None, event_data: dict | None = None,
              events: Sequence[tuple[str, str, dict]] = (), **fields: Any) -> Lease:
        """→ draining: accrue what it cost so far, then record why it is being torn down (and, in the
        same write, ``event_kind``/``events`` and ``fields``: an interruption, the requeue of its job)."""
        lease = self._accrue(lease)
        unstarted = blocks.released_unstarted(lease)  # a bought block's fee is not refunded: said so
        return self._write(lease, state=LeaseState.DRAINING, message=reason, event_kind=event_kind,
                           event_data=event_data, events=(*events, *([unstarted] if unstarted else [])), **fields)

    def mark_released(self, lease: Lease) -> Lease:
        """draining → released: nothing of it is left in the cloud."""
        lease = self._accrue(lease)
        return self._write(lease, state=LeaseState.RELEASED, message=lease.state_reason or LeaseState.RELEASED.value,
                           ended_at=self.clock(),
                           instances=[records.replace(i, state=InstanceState.TERMINATED) for i in lease.instances])

    # -- launch end to end -----------------------------------------------------------------------
    def launch(self, **kwargs: Any) -> Lease:
        """Create and provision; a repeated key gets the same lease (after this process's launch of it)."""
        lease, _ = self.create(**kwargs)
        if lease.state is LeaseState.REQUESTED:
            lease = self.provision(lease)
        deadline = time.monotonic() + self.settings.provision_timeout_s
        launching_here = lease.lease_id in self.inflight  # another thread of this process launches it
        while launching_here and lease.state in LAUNCHING and time.monotonic() < deadline:
            self.store.wait_for_change(0.5)
            launching_here = lease.lease_id in self.inflight  # before the read: a launch that has
            lease = self.get(lease.lease_id)  # ended wrote its lease first, so this read is its last
        if lease.state is LeaseState.FAILED:  # a retry of a launch that failed for good: the same answer
            raise launch_failure(lease)
        return lease

    # -- hand-off and release --------------------------------------------------------------------
    def handoff(self, lease_id: str, job: Job) -> Lease:
        lease = self.get(lease_id)
        if lease.state is not LeaseState.RUNNING:
            raise FailedPrecondition(f"lease {lease_id} is {lease.state}, not running: nothing to hand off to.")
        if not job.job_id:
            raise InvalidArgument("job.job_id is required.")
        given = {k: v for k, v in records.to_builtins(job).items() if v}  # what the hand-off names
        merged = records.convert({**records.to_builtins(lease.job), **given}, Job)
        if merged.job_id != lease.job.job_id:  # a new job: its own record starts now
            merged = merged.with_(attached_at=self.clock(), state=JobState.RUNNING.value)
        return self._write(lease, message=f"job {job.job_id} handed off", event_kind=EventKind.HANDOFF,
                           job=merged, job_state=job_state_of(merged), idle_since=0.0, retry_stale=True)

    def release(self, lease_id: str, reason: str = "released by request",
                event_kind: EventKind | None = None) -> Lease:
        """Drain and terminate. Safe to repeat and to race with the reconciler or a launch: a
        launch that finishes after this is given back (see :meth:`_launched_too_late`)."""
        for _ in range(3):
            lease = self.get(lease_id)
            if lease.state in ENDED:
                return lease
            try:
                if lease.state is not LeaseState.DRAINING:
                    lease = self.drain(lease, reason, event_kind=event_kind)
                return self.finish_drain(lease)
            except StaleLease:
                continue  # someone else moved it: look again
            except ProviderError as e:
                raise Unavailable(f"lease {lease_id} is draining but {e}; the reconciler "
                                 "keeps terminating it, or retry the release.") from e
        raise Unavailable(f"lease {lease_id} keeps changing; retry the release.")

    def finish_drain(self, lease: Lease) -> Lease:
        """Terminate everything of a draining lease (also what a crashed launch may have made).

        Stopped instances are terminated too: a preempted GCP VM kept TERMINATED still holds its
        disk, and terminating is what makes a provider forget a lease's remembered nodes."""
        provider = self.providers.get(lease.provider)
        if provider is not None:
            found = provider.describe(lease.lease_id, lease.region)
            if found:
                provider.terminate(found)
        return self.mark_released(lease)

    # -- helpers ---------------------------------------------------------------------------------
    def get(self, lease_id: str) -> Lease:
        lease = self.store.get_lease(lease_id)
        if lease is None:
            raise NotFound(f"lease {lease_id} does not exist.")
        return lease

    def _accrue(self, lease: Lease) -> Lease:
        if lease.state not in BILLED or not lease.accrued_at:
            return lease
        now = self.clock()
        return self._write(lease, accrued_micros=cost_so_far(lease, now), accrued_at=now, retry_stale=True)

    def _write(self, lease: Lease, *, state: LeaseState | None = None, message: str = "",
             event_kind: EventKind | None = None, event_data: dict | None = None,
             events: Sequence[tuple[EventKind, str, dict]] = (),
             retry_stale: bool = False, **fields: Any) -> Lease:
        """Write a change at the version we read. Only bookkeeping (``retry_stale``) is re-applied
        on a fresh row; a state change that lost the race raises :class:`StaleLease`."""
        for _ in range(3 if retry_stale else 1):
            try:
                out = self.store.update_lease(lease, now=self.clock(), state=state, message=message,
                                              event_kind=event_kind, event_data=event_data, events=events,
                                              **fields)
                if state and state != lease.state:
                    log.info("lease_state", lease=lease.lease_id, provider=lease.provider,
                             from_state=lease.state, to_state=state, reason=message)
                return out
            except StaleLease:
                fresh = self.store.get_lease(lease.lease_id)
                if not retry_stale or fresh is None or fresh.state != lease.state:
                    raise
                lease = fresh  # only bookkeeping changed under us: re-apply on the fresh row
        raise StaleLease(f"lease {lease.lease_id} keeps changing under us")


def has_work(lease: Lease) -> bool:
    """Does the lease have a job? A job attached (at launch or by a hand-off), or nodes that a
    scheduler runs jobs on (Slurm cloud nodes, named by the job; Slurm powers them down itself).
    A running lease without either is idle."""
    return bool(lease.job.job_id or lease.job.node_names)


def node_names(lease: Lease) -> tuple[str, ...]:
    """The nodes' names: the job's (a Slurm hand-off names its cloud nodes), else one set per
    launch attempt (``<lease>-<attempt>-<i>``)."""
    return lease.job.node_names or tuple(f"{lease.lease_id}-{lease.attempt}-{i}"
                                                       for i in range(lease.nodes))


