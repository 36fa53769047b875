"""The composition root: config in, a wired service out (catalog, quote engine, store,
providers, lifecycle, reconciler, autoscaler). The gRPC server and the CLI are thin layers on it."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

import structlog

from broker.config import Config
from broker import market_store
from broker.errors import ConfigError
from broker.quote import LAUNCHABLE_OFFERS, DerivedCache, Quote, StoredQuote
from policies.demand import Demand

log = structlog.get_logger("broker.service")


class Service:
    """Everything `broker serve` runs, wired from one Config."""

    def __init__(self, config: Config, *, providers: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        from broker.budget import Budgets
        from broker.lifecycle import Lifecycle
        from broker.reconciler import Reconciler
        from broker.store import Store
        from providers.registry import build_enabled

        from broker.auth import Auth
        from broker.limits import Limits

        self.config = config
        self.clock = clock
        self.auth = Auth(config.auth_tokens)
        self.limits = Limits.from_settings(config.limits, config.workers)
        from broker import market

        self.store = Store(config.db_url)
        self.engine = market.quote_engine(config, self.store.engine)
        try:
            self.providers = dict(providers) if providers is not None else build_enabled(config.providers, config.owner)
        except ValueError as e:  # the providers' settings or the credentials they name
            raise ConfigError(f"config: {e}") from None
        self.budgets = Budgets(self.store, config.budgets)
        self.lifecycle = Lifecycle(
            self.store, self.providers, self.engine, owner=config.owner,
            settings=config.lifecycle, budgets=self.budgets,
            boot=self._boot_script if config.bootstrap.configured else None, clock=clock,
        )
        if set(self.providers) & set(config.providers.enabled()):
            self.lifecycle.on_quota_error = self._quota_error
        self.reconciler = Reconciler(self.lifecycle, orphan_grace_s=config.reconciler.orphan_grace_s,
                                     clock=clock)
        self.autoscaler = None  # set by broker.autoscaler when [autoscaler] enabled
        from broker.telemetry import Metrics

        self.leadership = None  # set by start_background: replicas elect one leader

        self.metrics = Metrics(self.store, self.engine.catalog)
        self._derived = DerivedCache()  # launch targets and top-N slices of cached quote results
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- quoting ---------------------------------------------------------------------------------
    def quote(self, demand: Demand, top: int = 0) -> Quote:
        """Validate, price, persist (with its launchable offers) and return a quote."""
        demand = self.engine.validate(demand)
        now = self.clock()
        engine = self.engine
        held = market_store.held(self.store.engine, engine.reservation_since) if engine.reservation_since else None
        q = engine.quote(demand, now=now, blocked=self.store.active_blocks(now), held=held)
        limit = max(top, LAUNCHABLE_OFFERS)
        targets = self._derived.get((q.offers,), lambda: q.targets(limit), extra=("targets", limit))
        self.store.save_quote(StoredQuote(q.quote_id, q.created_at, q.valid_until, demand, targets))
        if top and top < len(q.offers):
            # The same slice object for the same result, so the layers above can cache by it.
            sliced = self._derived.get((q.offers,), lambda: q.offers[:top], extra=("top", top))
            q = Quote(q.quote_id, q.created_at, q.valid_until, q.catalog_as_of, q.demand, sliced, q.excluded)
        return q

    def quote_tenant(self, quote_id: str) -> str:
        """The tenant a stored quote was made for (NotFound when there is no such quote)."""
        from broker.errors import NotFound

        q = self.store.get_quote(quote_id)
        if q is None:
            raise NotFound(f"quote {quote_id[:64]} does not exist.")
        return q.demand.tenant or "default"

    # -- boot scripts ----------------------------------------------------------------------------
    def boot_template(self, name: str) -> str:
        """``name`` if a client may ask for it (empty, a built-in, or an operator-configured
        template); InvalidArgument naming ``bootstrap`` otherwise. Paths live in the config only."""
        from broker.errors import InvalidArgument
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
        settings = self.config.bootstrap.template_settings()
        templates = self.config.bootstrap.templates
        ctx = BootContext(
            lease_id=lease.lease_id, node_name=node_names[0], node_names=tuple(node_names),
            provider=lease.provider, region=lease.region,
            job_id=job.get("job_id", ""), checkpoint_uri=job.get("checkpoint_uri", ""),
            dataset_uri=job.get("dataset_uri", ""), env=job.get("env", {}), settings=settings,
        )
        return render(resolve(lease.bootstrap, templates), ctx)

    # -- background loops ------------------------------------------------------------------------
    def start_background(self) -> None:
        """Run the reconciler (and the autoscaler) on the leader replica only."""
        from broker.leader import Leadership

        self.leadership = Leadership(self.store, ttl_s=self.config.leader.ttl_s, renew_s=self.config.leader.renew_s,
                                     on_change=self.metrics.set_leader).start()
        interval = self.config.reconciler.interval_s
        self._threads.append(self._loop("reconciler", interval, self._leading(self.reconciler.run_pass)))
        if self.autoscaler is not None:
            self._threads.append(self._loop("autoscaler", self.autoscaler.interval_s,
                                            self._leading(self.autoscaler.tick)))
        from broker.market import Refresher

        # The leader refreshes the live market; every replica re-prices when it changes.
        refresher = Refresher(self.config, self.store.engine, self.leadership.is_leader, self.install_engine,
                              clock=self.clock)
        self._threads.append(self._loop("market", refresher.poll_s, refresher.tick))

    def _quota_error(self, provider: str, region: str) -> None:
        """A launch met a quota error: re-read that region's quota in the background and
        re-price with it (failover goes on meanwhile; only the offering that met it is blocked)."""
        from broker import market

        def run() -> None:
            try:
                market.refresh_quotas(self.config, self.store.engine, provider, region, self.clock())
                self.install_engine(market.quote_engine(self.config, self.store.engine, self.clock()))
            except Exception as e:  # noqa: BLE001 - the refresh is advisory; the launch carries on
                log.warning("market.quota_refresh_failed", provider=provider, region=region, error=str(e))

        threading.Thread(target=run, name=f"quota-{provider}-{region}", daemon=True).start()

    def install_engine(self, engine) -> None:
        """Quote with ``engine`` from now on (a new live market), here and in failover."""
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

    def _loop(self, name: str, interval: float, fn: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
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
        for t in self._threads:
            t.join(timeout)
        if getattr(self, "leadership", None) is not None:
            self.leadership.release()
        self.metrics.stop()
        self.store.close()

