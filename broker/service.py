"""The composition root: config in, a wired service out (catalog, quote engine, store,
providers, lifecycle, reconciler, autoscaler). The gRPC server and the CLI are thin layers on it."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import structlog

from broker.config import Config
from broker import market, market_store, paging
from broker.market import Refresher
from broker.errors import ConfigError, FailedPrecondition, InvalidArgument, NotFound
from broker.quote import LAUNCHABLE_OFFERS, DerivedCache, Quote, StoredQuote
from broker.records import Job, LaunchOrder
from broker.watchers.registry import build_watchers, stop_watchers
from providers.registry import build_enabled, node_name_problem
from policies.demand import Demand, DemandError
from providers.base import Fabric, ProviderError
from providers.registry import LazyProvider

log = structlog.get_logger("broker.service")


class WatchedEvent(NamedTuple):
    """A lease event and the lease it is about (None for events of no, or of a vanished, lease)."""

    event: Any  # broker.store.LeaseEventRecord
    lease: Any


class Service:
    """Everything `broker serve` runs, wired from one Config."""

    def __init__(self, config: Config, *, providers: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        from broker.budget import Budgets
        from broker.lifecycle import Lifecycle
        from broker.reconciler import Reconciler
        from broker.engine import pool_size_for
        from broker.store import Store
        from broker.auth import Auth
        from broker.limits import Limits

        self.config = config
        self.clock = clock
        self.auth = Auth(config.auth_tokens)  # the config file's tokens checked before the store opens
        self.limits = Limits.from_settings(config.limits, config.workers)
        self.store = Store(config.db_url, connect_timeout_s=config.store.connect_timeout_s,
                           pool_size=pool_size_for(config.workers, config.store.pool_size),
                           max_overflow=config.store.max_overflow)
        if config.auth is not None and config.auth.honours_store:
            from broker.tokens import IssuedTokens, TokenStore

            issued = IssuedTokens(TokenStore(self.store.engine, clock), config.auth.store_cache_s, clock)
            self.auth = Auth(config.auth_tokens, issued=issued)
        self.market_seen = market_store.version(self.store.engine)  # what self.engine was built from
        self.engine = market.quote_engine(config, self.store.engine)
        self._check_autoscaler_demand(config)
        try:
            # Lazily: the clouds' SDKs cost ~3 s of start-up with all three enabled; they are
            # built behind the service once it answers (start_background).
            self.providers = (dict(providers) if providers is not None
                              else build_enabled(config.providers, config.owner, lazy=True))
        except ValueError as e:  # the providers' settings or the credentials they name
            raise ConfigError(f"config: {e}") from None
        self.budgets = Budgets(self.store, config.budgets, config.budget_policy.on_exhausted)
        from broker.jobs import LeaseCredentials

        self.credentials = LeaseCredentials(self.store, clock)  # the nodes' job-report credentials
        self.auth.lease_credential = self.credentials.lease_of
        self.lifecycle = Lifecycle(
            self.store, self.providers, self.engine, owner=config.owner,
            settings=config.lifecycle, budgets=self.budgets,
            boot=self._boot_script if config.bootstrap.configured else None, clock=clock,
        )
        if set(self.providers) & set(config.providers.enabled()):
            self.lifecycle.on_quota_error = self._quota_error
        self.reconciler = Reconciler(self.lifecycle, orphan_grace_s=config.reconciler.orphan_grace_s,
                                     clock=clock, on_error=self._reconcile_error)
        from broker.notices import Notices
        from broker.telemetry import Metrics

        self.leadership = None  # set by start_background: replicas elect one leader

        self.metrics = Metrics(self.store, self.engine.catalog, self.budgets, clock)
        self.schedulers = build_watchers(config)  # source -> watcher, of each enabled scheduler kind
        self.notices = Notices(self.reconciler, schedulers=lambda: self.schedulers.values(),
                               count=lambda *labels: self.metrics.notices.labels(*labels).inc(), clock=clock)
        # launch targets and top-N slices of cached quote results
        self._derived = DerivedCache(config.limits.quote_cache_entries, config.limits.derived_cache_bytes)
        self._stop = threading.Event()
        self.callback_address = ""  # host:port the callback endpoint was bound to (broker.callback)
        self._threads: list[threading.Thread] = []
        self.dead_loops: list[str] = []  # background loops that ended without being stopped
        self._on_loop_death: list[Callable[[str], None]] = []
        self.autoscaler = None
        try:
            from broker.autoscaler import autoscaler_for

            self.autoscaler = autoscaler_for(self)  # None unless [autoscaler] enabled = true
        except Exception:
            self.stop()
            raise

    # -- quoting ---------------------------------------------------------------------------------
    def quote(self, demand: Demand, top: int = 0) -> Quote:
        """Validate, price, persist (with its launchable offers) and return a quote."""
        now = self.clock()
        try:
            demand = self.engine.validate(demand, now)
        except DemandError as e:
            raise InvalidArgument(f"demand.{e.field}: {e}", field=f"demand.{e.field}") from None
        engine = self.engine
        held = market_store.held(self.store.engine, engine.reservation_since) if engine.reservation_since else None
        q = engine.quote(demand, now=now, blocked=self.store.active_blocks(now), held=held)
        limit = max(top, LAUNCHABLE_OFFERS)
        targets = self._derived.get((q.offers,), lambda: q.targets(limit), extra=("targets", limit))
        self.store.save_quote(StoredQuote(q.quote_id, q.created_at, q.valid_until, demand, targets))
        if top and top < len(q.offers):
            # The same slice object for the same result, so the layers above can cache by it.
            sliced = self._derived.get((q.offers,), lambda: q.offers[:top], extra=("top", top))
            q = Quote(q.quote_id, q.created_at, q.valid_until, q.catalog_as_of, q.demand, sliced, q.excluded,
                      q.spot_model, q.prices_only)
        return q

    def quote_tenant(self, quote_id: str) -> str:
        """The tenant a stored quote was made for (NotFound when there is no such quote)."""
        q = self.store.get_quote(quote_id)
        if q is None:
            raise NotFound(f"quote {quote_id[:64]} does not exist.")
        return q.demand.tenant or "default"

    # -- leases ----------------------------------------------------------------------------------
    def launch(self, order: LaunchOrder):
        """Persist and launch a lease for a quote's offer (failing over to the quote's next offers)
        or for explicitly named capacity; a repeated idempotency key returns the same lease."""
        lc = self.lifecycle
        demand, alternatives = None, []
        if order.offer is not None:
            o = order.offer
            target = lc.target_explicit(o.provider, o.region, o.zone, o.instance_type, o.market, o.count)
        elif order.quote_id:
            target, demand, alternatives = lc.target_from_quote(order.quote_id, order.rank)
        else:
            raise InvalidArgument("launch needs quote_offer or offering.", field="target")
        self.boot_template(order.bootstrap)
        job = order.job
        if order.node_names:
            names = list(order.node_names)
            if len(names) != target.nodes or len(set(names)) != len(names):
                raise InvalidArgument(f"node_names must name {target.nodes} distinct nodes, got {len(names)}.",
                                      field="node_names")
            for i, name in enumerate(names):
                problem = node_name_problem(target.provider, name)
                if problem:
                    raise InvalidArgument(f"node_names[{i}] {problem}.", field=f"node_names[{i}]")
            job = job.with_(node_names=tuple(names))
        if order.max_restarts is not None:
            if not 0 <= order.max_restarts <= 1000:
                raise InvalidArgument(f"max_restarts must be from 0 to 1000, got {order.max_restarts}.",
                                      field="max_restarts")
            job = job.with_(max_restarts=order.max_restarts)
        if order.max_lifetime_s < 0:
            raise InvalidArgument(f"max_lifetime_s must be zero or more, got {order.max_lifetime_s}.",
                                  field="max_lifetime_s")
        return lc.launch(
            idempotency_key=order.idempotency_key, target=target, tenant=order.tenant, demand=demand,
            alternatives=alternatives, quote_id=order.quote_id, offer_rank=order.rank, job=job,
            bootstrap=order.bootstrap, max_lifetime_s=order.max_lifetime_s,
        )

    def lease(self, lease_id: str):
        """The lease, or NotFound."""
        return self.lifecycle.get(lease_id)

    def leases(self, states: Sequence[str] = (), tenant: str = "", limit: int = 0,
               page_token: str = "") -> tuple[list, str]:
        """One page of leases, newest first, and the token of the next page ("" after the last):
        at most ``limit`` (0 = the default page size), after the page ``page_token`` ended
        (broker.paging); ``tenant`` "" means every tenant's."""
        size = paging.page_size(limit)
        found = self.store.list_leases(states=states, tenant=tenant, limit=size + 1, before=paging.decode(page_token))
        page = found[:size]
        return page, (paging.encode(page[-1].created_at, page[-1].lease_id) if len(found) > size else "")

    def release(self, lease_id: str, reason: str = ""):
        return self.lifecycle.release(lease_id, reason or "released by request")

    def handoff(self, lease_id: str, job: Job):
        return self.lifecycle.handoff(lease_id, job)

    def watch(self, lease_id: str = "", after: int | None = None,
              active: Callable[[], bool] = lambda: True) -> Iterator[WatchedEvent]:
        """Lease events as they are written, while ``active()``: after event id ``after`` (0
        replays from the first event), or from now when ``after`` is None. Checks its arguments
        at once (an unknown lease is NotFound), before the first event."""
        if after is not None and after < 0:
            raise InvalidArgument(f"after_event_id must be zero or more, got {after}.", field="after_event_id")
        if lease_id and self.store.get_lease(lease_id) is None:
            raise NotFound(f"lease {lease_id} does not exist.", field="lease_id")
        return self._events(lease_id, self.store.last_event_id() if after is None else after, active)

    def _events(self, lease_id: str, after: int, active: Callable[[], bool]) -> Iterator[WatchedEvent]:
        store = self.store
        while active():
            for ev in store.events_after(after, lease_id):
                after = ev.id
                yield WatchedEvent(ev, store.get_lease(ev.lease_id) if ev.lease_id else None)
            store.wait_for_change(1.0)

    # -- queues and decisions --------------------------------------------------------------------
    def report_queue(self, snap):
        """Take a scheduler's snapshot: (its diagnosis, the autoscaler's decision or None).

        Every replica accepts a report; only the leader decides. A replica that does not lead
        stores it for the leader, which decides on it from the store ("deferred")."""
        from broker.watchers.snapshot_json import encode
        from policies.diagnose import diagnose
        from policies.triggers import Decision

        if self.autoscaler is not None and self.is_leader():
            from broker.leader import NotLeader

            try:
                return self.autoscaler.on_snapshot(snap)
            except NotLeader:  # leadership lapsed under the decision: the new leader takes it up
                pass
        self.store.save_snapshot(snap.source or "default", snap.taken_at, encode(snap))
        if self.autoscaler is None:
            return diagnose(snap, now=self.clock()), None
        return self.autoscaler.diagnose(snap), Decision("deferred", reason=(
            "accepted by a replica that does not lead; the leader decides on it within "
            f"{self.autoscaler.interval_s:g} s (see ListDecisions)"))

    def diagnose(self, snap=None):
        """Diagnose ``snap``, or the latest reported snapshot."""
        from broker.watchers.snapshot_json import snapshot_from_dict
        from policies.diagnose import diagnose

        if snap is None:
            doc = self.store.latest_snapshot()
            if doc is None:
                raise FailedPrecondition("no snapshot to diagnose: send one, or report one with ReportQueue first.")
            snap = snapshot_from_dict(doc)
        if self.autoscaler is not None:
            return self.autoscaler.diagnose(snap)
        return diagnose(snap, now=self.clock())

    def decisions(self, limit: int = 0, since: float = 0.0) -> list:
        """The autoscaler's decisions, newest first: at most ``limit`` (0 = the default page size,
        as a lease listing's page: broker.paging)."""
        return self.store.list_decisions(limit=paging.page_size(limit), since=since or 0.0)

    # -- boot scripts ----------------------------------------------------------------------------
    def boot_template(self, name: str) -> str:
        """``name`` if a client may ask for it (empty, a built-in, or an operator-configured
        template); InvalidArgument naming ``bootstrap`` otherwise. Paths live in the config only."""
        from providers.bootstrap import BootstrapError, resolve

        if name:
            try:
                resolve(name, self.config.bootstrap.templates)
            except BootstrapError as e:
                raise InvalidArgument(f"bootstrap: {e}.", field="bootstrap") from None
        return name

    def _boot_script(self, lease, node_names) -> str:
        """One script for every node of the lease (each node finds its own name at boot)."""
        from providers.bootstrap import BootContext, render, resolve

        job = lease.job
        settings = self._callback_settings(lease, self.config.bootstrap.template_settings())
        templates = self.config.bootstrap.templates
        ctx = BootContext(
            lease_id=lease.lease_id, node_name=node_names[0], node_names=tuple(node_names),
            provider=lease.provider, region=lease.region,
            job_id=job.job_id, checkpoint_uri=job.checkpoint_uri,
            dataset_uri=job.dataset_uri, env=job.env, settings=settings,
            fabric=self._fabric(lease, len(node_names)),
        )
        return render(resolve(lease.bootstrap, templates), ctx)

    def _fabric(self, lease, nodes: int) -> Fabric:
        """The fabric the launch wires for ``lease`` (the catalog row's, for a multi-node gang)."""
        it = self.engine.catalog.instance(lease.provider, lease.instance_type)
        return it.fabric_for(nodes) if it is not None else Fabric.ETHERNET

    def _callback_settings(self, lease, settings: dict) -> dict:
        """``settings`` with this lease's callback: its URL on the broker's endpoint and a credential
        minted now (only its digest is stored; each rendered script gets its own)."""
        nested = settings.get("container") if isinstance(settings.get("container"), dict) else {}
        listen = self.callback_address or self.config.server.callback_listen
        base = (nested.get("callback_url") or settings.get("callback_url") or self.config.server.callback_url
                or (f"http://{listen}" if listen else ""))
        if not base:
            return settings
        from urllib.parse import quote

        url = f"{base.rstrip('/')}/v1/leases/{quote(lease.lease_id, safe='')}/job"
        token = self.credentials.mint(lease.lease_id)
        out = {**settings, "callback_url": url, "callback_token": token}
        if nested:
            out["container"] = {**nested, "callback_url": url, "callback_token": token}
        return out

    def provision_soon(self, lease) -> None:
        """Launch a requested lease (a replacement made at a notice) on a thread of its own: the
        caller answers at once; the reconciler takes it up if this process dies meanwhile."""
        def run() -> None:
            try:
                self.lifecycle.provision(lease)
            except Exception as e:  # noqa: BLE001 - the lease records its own failure
                log.warning("replacement_launch_failed", lease=lease.lease_id, error=str(e)[:300])

        threading.Thread(target=run, name=f"provision-{lease.lease_id}", daemon=True).start()

    # -- job reports -----------------------------------------------------------------------------
    def report_job(self, report):
        """Record a node's report about its lease's job (``broker.jobs.JobReport``, checked here;
        the caller has checked who may report on the lease). Returns (lease, what the node does next)."""
        from broker.jobs import apply_report

        report = report.checked()
        return apply_report(self.store, self.lifecycle.get(report.lease_id), report, self.clock())

    # -- start-up --------------------------------------------------------------------------------
    #: A common demand the warm-up quotes (no quote is stored): the quote path's first call pays
    #: its imports and first-use costs (~0.4 s), which clients arriving at once would wait for.
    WARM_DEMAND = Demand(gpus=8, hours=1, gpu_model="H100")

    def _check_autoscaler_demand(self, config: Config) -> None:
        """``[autoscaler] default_gpu_model`` and ``data_location`` name what the catalog has: every
        burst's demand carries them, and one the quote refuses would fail every burst, silently."""
        s = config.autoscaler
        model = s.default_gpu_model.upper()
        probe = Demand(gpus=1, hours=1.0, gpu_model=model, min_gpu_memory_gb=0 if model else s.default_min_gpu_memory_gb,
                       data_location=s.data_location)
        try:
            self.engine.validate(probe, self.clock())
        except DemandError as e:
            key = {"gpu_model": "default_gpu_model"}.get(e.field, e.field)
            raise ConfigError(f"config: autoscaler.{key}: {str(e).rstrip('.')}", field=f"autoscaler.{key}") from None

    def warm_up(self, within_s: float, stop: threading.Event | None = None) -> list[str]:
        """What `broker serve` does before it says SERVING, so its first calls cost what later ones
        do: build the enabled clouds' providers (their SDK imports hold the GIL for seconds, which
        every call made meanwhile would wait for), open the store's pooled connections and price
        one quote. Waits at most ``within_s`` for the providers (a build left then goes on behind,
        as without the warm-up), or until ``stop`` is set; returns the names of those not built yet."""
        deadline = time.monotonic() + within_s
        built = threading.Event()
        self._build_providers(then=built.set)
        self.store.open_connections()
        past = self.store.connections_past_server(self.config.server.processes)
        if past:
            log.warning("store.pool_past_max_connections", detail=past)
        engine = self.engine
        try:
            q = engine.quote(engine.validate(self.WARM_DEMAND, self.clock()), now=self.clock(),
                             blocked=self.store.active_blocks(self.clock()))
            q.targets(LAUNCHABLE_OFFERS)
        except DemandError:  # a catalog without the GPU: the modules are loaded all the same
            pass
        while not built.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if (stop is not None and stop.is_set()) or time.monotonic() >= deadline:
                break
        return sorted(n for n, p in self.providers.items() if isinstance(p, LazyProvider) and not p.built)

    # -- background loops ------------------------------------------------------------------------
    def start_background(self, lead: bool = True, after_first_market_poll: Callable[[], Any] | None = None) -> None:
        """Run the reconciler (and the autoscaler) on the leader replica only. ``lead=False``:
        a serving process beside the host's leading one (``broker serve --processes N``): it
        never contends for leadership and runs no leader loop, only re-pricing when the stored
        market changes. ``after_first_market_poll`` runs once, in the market loop, after its
        first poll (a refresh, if due, and the engine it installed)."""
        from broker.leader import Leadership

        self.leadership = Leadership(self.store, ttl_s=self.config.leader.ttl_s, renew_s=self.config.leader.renew_s,
                                     on_change=self.metrics.set_leader, contend=lead).start()
        self.metrics.leader.leading = self.leadership.is_leader  # read at scrape time
        self.reconciler.fence = self.fence  # checked before each of its side-effecting steps
        loops = []
        if lead:
            interval = self.config.reconciler.interval_s
            loops.append(self._loop("reconciler", interval, self._leading(self.reconciler.run_pass)))
            if self.autoscaler is not None:
                loops.append(self._loop("autoscaler", self.autoscaler.interval_s,
                                        self._leading(self.autoscaler.tick)))
        # The leader refreshes the live market; every replica re-prices when it changes.
        refresher = Refresher(self.config, self.store.engine, self.leadership.is_leader, self.install_engine,
                              clock=self.clock, seen=self.market_seen, on_source_error=lambda provider, source:
                              self.metrics.market_source_errors.labels(provider, source).inc())
        first: list[Callable[[], Any]] = [after_first_market_poll] if after_first_market_poll else []

        def market_poll() -> None:
            refresher.tick()
            while first:
                first.pop()()
        loops.append(self._loop("market", refresher.poll_s, market_poll))
        self._threads.extend(loops)
        log.info("background_started", loops=[t.name for t in loops], contends=lead)
        # The interruption notices need the built providers: their loops start once they are.
        self._build_providers(then=self._start_notice_loops if lead else None)

    def _start_notice_loops(self) -> None:
        if not self._stop.is_set():
            loops = self._notice_loops()
            self._threads.extend(loops)
            if loops:
                log.info("background_started", loops=[t.name for t in loops], contends=True)

    def _build_providers(self, then: Callable[[], None] | None = None) -> None:
        """Build the lazily made providers in a background thread, one after the other (their SDK
        imports hold the GIL: in parallel they would not finish sooner), then call ``then``; a
        call that needs one meanwhile waits for it. One that cannot be built is logged; every
        use of it says why."""
        lazy = [p for p in self.providers.values() if isinstance(p, LazyProvider) and not p.built]
        if not lazy:
            if then is not None:
                then()
            return

        def run() -> None:
            for p in lazy:
                if self._stop.is_set():
                    return
                t = time.monotonic()
                try:
                    p.build()
                    log.info("provider.built", provider=p.name, seconds=round(time.monotonic() - t, 3))
                except ProviderError as e:
                    log.error("provider.unusable", provider=p.name, error=str(e))
            if then is not None:
                then()

        threading.Thread(target=run, name="providers-build", daemon=True).start()

    def _notice_loops(self) -> list[threading.Thread]:
        """One loop per interruption-notice source (the leader's: an SQS queue is long-polled, GCP's
        preemption operations listed every ``preemption_poll_s``)."""
        from broker.notices import notice_sources

        loops = []
        for src in notice_sources(self.providers):
            poll = (lambda s: lambda: self.notices.poll(s))(src)
            loops.append(self._loop(f"notices-{src.provider}", getattr(src, "poll_s", 1.0), self._leading(poll)))
        return loops

    def _quota_error(self, provider: str, region: str) -> None:
        """A launch met a quota error: re-read that region's quota in the background and
        re-price with it (failover goes on meanwhile; only the offering that met it is blocked)."""
        def run() -> None:
            try:
                market.refresh_quotas(self.config, self.store.engine, provider, region, self.clock())
                self.install_engine(market.quote_engine(self.config, self.store.engine, self.clock()))
            except Exception as e:  # noqa: BLE001 - the refresh is advisory; the launch carries on
                log.warning("market.quota_refresh_failed", provider=provider, region=region, error=str(e))

        threading.Thread(target=run, name=f"quota-{provider}-{region}", daemon=True).start()

    #: How long a new market's engine may spend pricing the demands callers asked for lately
    #: before it is installed (:meth:`broker.quote.QuoteEngine.warm_from`).
    WARM_ENGINE_S = 2.0

    def install_engine(self, engine) -> None:
        """Quote with ``engine`` from now on (a new live market), here and in failover; the
        demands the current engine has cached are priced on it first, in this (background)
        thread."""
        engine.warm_from(self.engine, self.WARM_ENGINE_S, self.clock())
        self.engine = engine
        self.lifecycle.engine = engine

    def is_leader(self) -> bool:
        """Whether this replica decides (reconciles, scales). A service that runs no background
        loops (in-process use, one-shot commands) has no peers and decides for itself."""
        return self.leadership is None or self.leadership.is_leader()

    def fence(self) -> None:
        """Raise :class:`broker.leader.NotLeader` unless this replica still leads in its term;
        the reconciler and the autoscaler call it before every side-effecting step."""
        if self.leadership is not None:
            self.leadership.fence()

    def _leading(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        from broker.leader import NotLeader

        def run():
            if not self.is_leader():
                return None
            try:
                self.fence()
                return fn()
            except NotLeader as e:  # lost leadership during the pass: the new leader carries on
                log.warning("pass_abandoned", reason=str(e))
                return None
        return run

    def _reconcile_error(self, phase: str, provider: str) -> None:
        self.metrics.reconcile_errors.labels(phase, provider).inc()

    def on_loop_death(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(loop name)`` if a background loop ever ends without being stopped (the
        server turns its health NOT_SERVING: a replica that no longer reconciles is not well)."""
        self._on_loop_death.append(fn)
        for name in self.dead_loops:
            fn(name)

    def _loop(self, name: str, interval: float, fn: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            self.metrics.loop_alive.labels(name).set(1)
            try:
                passes()
            except Exception:
                log.exception("loop_died", loop=name)
            finally:
                if not self._stop.is_set():
                    self.metrics.loop_alive.labels(name).set(0)
                    self.dead_loops.append(name)
                    for cb in list(self._on_loop_death):
                        cb(name)

        def passes() -> None:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    result = fn()
                    self.metrics.loop.labels(name).observe(time.monotonic() - started)
                    if result is not None and any(getattr(result, "__dict__", {}).values()):
                        log.info(f"{name}_pass", **{k: v for k, v in vars(result).items() if v})
                except Exception:  # a failed pass must not kill the loop; it is logged and retried
                    log.exception(f"{name}_pass_failed")
                self._stop.wait(max(0.0, interval - (time.monotonic() - started)))

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        return t

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        stop_watchers(getattr(self, "schedulers", {}))  # watchers with threads of their own
        for t in self._threads:
            t.join(timeout)
        if getattr(self, "leadership", None) is not None:
            self.leadership.release()
        self.metrics.stop()
        self.store.close()

