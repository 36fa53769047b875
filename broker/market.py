"""The live market for quotes: refresh it from the clouds, keep it in the store, lay it over the
bundled catalog.

``[catalog]`` settings: ``refresh_interval_s`` (default 14400: every 4 hours; 0 turns the
background refresh of ``broker serve`` off) and ``max_age_h`` (default 48: a price older than
this is marked stale in quotes; 0 never marks one).

A refresh asks every enabled provider's market APIs (:mod:`providers.market`); a provider whose
refresh fails keeps its last good data (and the store says when it last tried and why it failed),
a part that fails (one API, one region) keeps that part's last good data. Implausible prices are
refused when the data is laid over the catalog (:mod:`providers.market.overlay`), with a warning.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from broker.errors import ConfigError
from providers.base import ProviderError
from broker.times import iso



def _log():
    """The module's logger (structlog is imported on first use: an in-process `broker quote`
    logs nothing and does not pay its import)."""
    import structlog

    return structlog.get_logger("broker.market")


@dataclass
class Outcome:
    """What one provider's refresh did."""

    provider: str
    ok: bool
    prices: int = 0
    zones: int = 0
    quotas: int = 0
    reservations: int = 0
    errors: list[str] = field(default_factory=list)
    kept_from: float = 0.0  # fetched_at of the data kept after a failure (0: none)
    #: source -> why it failed this time (it keeps its last good data; the others are fresh)
    failed_sources: dict[str, str] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        """One line per source that failed while the others refreshed."""
        return [f"{self.provider} {source} not refreshed (its last good data stays): {why}"
                for source, why in sorted(self.failed_sources.items())]

    def headline(self) -> str:
        """What the refresh did, in one line; the sources that failed are :meth:`warnings`."""
        if self.ok and self.failed_sources:
            return (f"{self.provider}: {self.prices} prices, {self.zones} zone lists, {self.quotas} quotas, "
                    f"{self.reservations} reservations; {len(self.failed_sources)} of its sources failed "
                    "and keep their last good data")
        return self.sentence()

    def sentence(self) -> str:
        if self.ok and not self.errors:
            return (f"{self.provider}: {self.prices} prices, {self.zones} zone lists, {self.quotas} quotas, "
                    f"{self.reservations} reservations")
        if self.ok:
            return (f"{self.provider}: {self.prices} prices, {self.zones} zone lists, {self.quotas} quotas, "
                    f"{self.reservations} reservations; kept the last good data where these failed: "
                    + "; ".join(self.errors))
        kept = f"kept the data of {iso(self.kept_from)}" if self.kept_from else "no earlier data: the bundled catalog stays"
        return f"{self.provider}: refresh failed ({'; '.join(self.errors)}); {kept}"


def enabled_providers(config: Any) -> list[str]:
    return list(config.providers.enabled())


def refresh(config: Any, db: Any, providers: Iterable[str] | None = None, *, now: float | None = None,
            fetcher: Callable[..., Any] | None = None,
            on_source_error: Callable[[str, str], None] | None = None) -> list[Outcome]:
    """Refresh the market of ``providers`` (default: every enabled one) into the store ``db``
    (an SQLAlchemy engine). Each source of a provider (price list, spot history, placement
    scores, quotas, reservations, zones) refreshes on its own: one that fails keeps its last good
    data and is named in the outcome (and told to ``on_source_error(provider, source)``)."""
    from broker import market_store
    from providers.catalog import bundled
    from providers.market import fetch
    from providers.registry import configured, names as registered_clouds

    fetcher = fetcher or fetch
    now = time.time() if now is None else now
    names = list(providers) if providers else enabled_providers(config)
    for name in names:
        if name not in registered_clouds() or not configured(config.providers, name):
            raise ConfigError(f"provider {name} is not configured: add [providers.{name}] to the config",
                              field="provider")
    catalog = bundled(config.catalog.path or None)
    stored = market_store.load(db)
    out = []
    for name in names:
        old = stored.get(name)
        try:
            snap = fetcher(name, getattr(config.providers, name), catalog, now)
        except (ProviderError, ValueError) as e:
            market_store.record_failure(db, name, now, str(e))
            kept = old.snapshot.fetched_at if old is not None else 0.0
            _log().warning("market.refresh_failed", provider=name, error=str(e), kept_from=kept)
            out.append(Outcome(name, False, errors=[str(e)], kept_from=kept))
            if on_source_error is not None:
                on_source_error(name, "all")
            continue
        merged = snap.merged_over(old.snapshot if old is not None and old.snapshot.fetched_at else None)
        market_store.save(db, merged, now, "; ".join(snap.errors))
        failed = {k: v.error for k, v in snap.sources.items() if v.error}
        _log().info("market.refreshed", provider=name, prices=len(snap.prices), failed=len(snap.failed))
        for source, why in sorted(failed.items()):
            _log().warning("market.source_failed", provider=name, source=source, error=why)
            if on_source_error is not None:
                on_source_error(name, source)
        out.append(Outcome(name, True, len(snap.prices), len(snap.zones), len(snap.quotas),
                           len(snap.reservations), list(snap.errors), failed_sources=failed))
    return out


def live_catalog(config: Any, db: Any, now: float | None = None) -> tuple[Any, list[str]]:
    """The bundled catalog with the stored market laid over it, and the overlay's warnings."""
    from broker import market_store
    from providers.catalog import bundled
    from providers.market.overlay import overlay

    now = time.time() if now is None else now
    settings = config.catalog
    rows = market_store.load(db) if db is not None else {}
    snaps = {p: r.snapshot for p, r in rows.items() if r.snapshot.fetched_at > 0}
    observed = market_store.observed_spot(db, now) if db is not None else {}
    return overlay(bundled(config.catalog.path or None), snaps, now=now, max_age_h=settings.max_age_h,
                   observed=observed)


def quote_engine(config: Any, db: Any, now: float | None = None, *, log_refused: bool = True,
                 bulk: bool = True) -> Any:
    """The quote engine for ``config`` over the live catalog (refused prices are logged unless
    ``log_refused`` is false: `broker catalog refresh` and `show` report them; ``bulk`` as for
    :class:`broker.quote.QuoteEngine`)."""
    from broker.quote import engine_for

    catalog, warnings = live_catalog(config, db, now)
    for w in warnings if log_refused else ():
        _log().warning("market.price_refused", detail=w)
    return engine_for(config, catalog=catalog, bulk=bulk,
                      spot=spot_model(config, db, time.time() if now is None else now))


MIN_OWN_PREEMPTIONS = 5
_LIFETIMES: dict[tuple[str, float], Any] = {}  # (path, mtime) -> policies.lifetimes.Lifetimes


def read_lifetimes(path: str) -> Any:
    """The ``[market] spot_lifetimes`` file, parsed once per version of it (ConfigError naming
    the setting when it cannot be read)."""
    import csv
    import os

    from policies.lifetimes import LifetimesError, lifetimes_from_rows
    from providers.files import lines

    p = os.path.expanduser(path)
    try:
        key = (p, os.stat(p).st_mtime)
        hit = _LIFETIMES.get(key)
        if hit is not None:
            return hit
        with open(p, newline="", encoding="utf-8-sig") as f:
            r = csv.DictReader(lines(f))
            lives = lifetimes_from_rows(r, r.fieldnames, os.path.basename(p))
    except OSError as e:
        raise ConfigError(f"config: market.spot_lifetimes {path!r} cannot be read: {e.strerror or e}",
                          field="market.spot_lifetimes") from None
    except (LifetimesError, csv.Error, UnicodeDecodeError) as e:
        raise ConfigError(f"config: market.spot_lifetimes: {e}", field="market.spot_lifetimes") from None
    _LIFETIMES.clear()
    _LIFETIMES[key] = lives
    return lives


def spot_model(config: Any, db: Any, now: float) -> Any:
    """What quotes judge spot by (:class:`policies.spot_choice.SpotModel`): the lifetimes of
    ``[market] spot_lifetimes`` and of this broker's own spot leases (a cloud needs at least
    one preemption seen to have a distribution), else each offer's interruption rate (observed
    by this broker, or the catalog's). A cloud the file does not cover is judged by its own
    leases' lifetimes once it has seen :data:`MIN_OWN_PREEMPTIONS` preemptions."""
    from broker import market_store
    from policies.lifetimes import Lifetimes
    from policies.spot_choice import SpotModel

    m = config.market
    lives = read_lifetimes(m.spot_lifetimes) if m.spot_lifetimes else Lifetimes({})
    own = market_store.spot_lives(db, now) if db is not None else {}
    # A cloud the file does not cover needs a few preemptions of its own before they stand for it.
    own = {c: obs for c, obs in own.items()
           if c in lives.by_cloud or sum(1 for _, censored in obs if not censored) >= MIN_OWN_PREEMPTIONS}
    dists = lives.with_observations(own).distributions()
    parts = []
    for cloud, dist in dists.items():
        mine = sum(1 for _, c in own.get(cloud, ()) if not c)
        parts.append(f"{cloud} {len(dist.hours):,}" + (f" ({mine} preemptions seen here)" if mine else ""))
    from providers.catalog import bundled

    # Only clouds that sell spot capacity have spot judged at all (Lambda Cloud sells none); with
    # none enabled, every one the catalog sells spot of (its clouds are registered ones).
    spot_clouds = {o.provider for o in bundled(config.catalog.path or None).offerings if o.market.value == "spot"}
    enabled = sorted(config.providers.enabled()) or sorted(spot_clouds)
    rest = [p for p in enabled if p not in dists and p in spot_clouds]
    source = ""
    if parts:
        source = "observed lifetimes: " + ", ".join(parts)
        if m.spot_lifetimes:
            import os

            source += f" ({os.path.basename(m.spot_lifetimes)})"
    if rest:
        source += ("; " if source else "") + "interruption rates: " + ", ".join(rest)
    return SpotModel(dists, m.spot_confidence, m.spot_deadline_slack, source)


class Refresher:
    """The background side of ``broker serve``: the leader refreshes every ``refresh_interval_s``;
    every replica rebuilds its quote engine when the stored market changes."""

    def __init__(self, config: Any, db: Any, is_leader: Callable[[], bool], install: Callable[[Any], None],
                 clock: Callable[[], float] = time.time, poll_s: float = 30.0, seen: float = -1.0,
                 on_source_error: Callable[[str, str], None] | None = None) -> None:
        """``seen``: the stored market's version (:func:`broker.market_store.version`) the current engine was
        built from; the first poll rebuilds it only when the store has moved on since."""
        self.config, self.db, self.is_leader, self.install, self.clock = config, db, is_leader, install, clock
        self.on_source_error = on_source_error
        self.settings = config.catalog
        self.poll_s = max(0.05, min(poll_s, self.settings.refresh_interval_s or poll_s))
        self._seen = seen

    def due(self) -> bool:
        from broker import market_store

        if not self.settings.refresh_interval_s or not enabled_providers(self.config):
            return False
        rows = market_store.load(self.db)
        last = min((r.attempted_at for r in rows.values()), default=0.0) if len(rows) >= len(
            enabled_providers(self.config)) else 0.0
        return self.clock() - last >= self.settings.refresh_interval_s

    def tick(self) -> None:
        from broker import market_store

        if self.is_leader() and self.due():
            for o in refresh(self.config, self.db, now=self.clock(), on_source_error=self.on_source_error):
                (_log().info if o.ok else _log().warning)("market.refresh", summary=o.sentence())
        v = market_store.version(self.db)
        if v != self._seen:
            self._seen = v
            self.install(quote_engine(self.config, self.db, self.clock()))


def refresh_quotas(config: Any, db: Any, provider: str, region: str, now: float | None = None) -> list[Any]:
    """Ask ``provider`` for ``region``'s quotas only (a launch there met a quota error) and store
    them over the last snapshot; returns them. Quotes made after this see what is really left."""
    from broker import market_store
    from providers.catalog import bundled
    from providers.market import Snapshot
    from providers.registry import market_source

    source = market_source(provider)  # an unknown cloud is an error (providers.registry.UnknownCloud)
    now = time.time() if now is None else now
    catalog = bundled(config.catalog.path or None)
    stored = market_store.load(db).get(provider)
    known = stored.snapshot if stored is not None else None
    quotas = source.quotas(getattr(config.providers, provider), catalog, region, known)
    snap = known if known is not None else Snapshot(provider, now)
    snap.quotas = [q for q in snap.quotas if q.region != region] + list(quotas)
    if not snap.needs:
        snap.needs = source.needs(catalog, known)
    market_store.save(db, snap, now, stored.last_error if stored is not None else "")
    _log().info("market.quotas_refreshed", provider=provider, region=region,
             left={q.key: q.left for q in quotas})
    return list(quotas)


def zone_targets(engine: Any, target: Any) -> list[Any]:
    """``target`` in each other zone of its region where the live catalog says its instance
    type is sold (spot: cheapest first): the zone-to-zone step of failover."""
    from dataclasses import replace

    for o in engine.catalog.offerings:
        if (o.provider, o.region, o.instance.name, o.market) == (target.provider, target.region,
                                                                 target.instance_type, target.market):
            return [replace(target, zone=z) for z in o.zones if z != target.zone]
    return []
