"""The quote engine: a Demand in, a ranked Quote out, with every excluded offer and its reason.

The catalog is indexed by GPU model at load, so a quote prices only the offerings of the GPU it
asks for (or, for a memory-matched demand, the models with enough memory). Pricing itself is the
pure :func:`policies.cost.price`; this module adds ranking, reservations, ids and validity.

The hand-off to a launch is typed end to end: a :class:`Quote` gives its launchable offers as
:class:`Target` s (:meth:`Quote.targets`), the service stores them as a :class:`StoredQuote`
(its JSON made and read back by :mod:`broker.records`' one codec, never by hand), and a Launch reads that back and picks
one offer with :meth:`StoredQuote.pick`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Hashable, Iterable, Mapping, NamedTuple

from broker.errors import ConfigError, InvalidArgument
from broker.lru import SizedLRU, rough_bytes
from broker.targets import Target
from policies.cost import Context, Exclusion, ExclusionKind, PricedOffer, pricer, utc
from policies.demand import Demand, DemandError
from policies.spot_choice import SpotModel, late_on_spot
from providers.base import MICROS, InstanceType, Market, Offering
from providers.catalog import Catalog, bundled
from broker.times import iso

if TYPE_CHECKING:
    from policies.bulk import Table

QUOTE_TTL_S = 15 * 60
LAUNCHABLE_OFFERS = 20  # offers of a quote kept for Launch and failover


def _registered() -> tuple[str, ...]:
    """The registered clouds (the registry loads every cloud's settings schema: only on demand)."""
    from providers.registry import names

    return names()


def usd(micros: int) -> Decimal:
    """Micro-dollars as a Decimal rounded to the cent's hundredth (4 places)."""
    return (Decimal(micros) / MICROS).quantize(Decimal("0.0001"))


def new_id(prefix: str) -> str:
    """A sortable, unique id: ``q-<ms since epoch, base36>-<random>``."""
    ms = int(time.time() * 1000)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while ms:
        ms, r = divmod(ms, 36)
        out = digits[r] + out
    # os.urandom is what secrets.token_hex reads; importing secrets (hmac, hashlib, random) costs
    # ~5 ms of every `broker quote`.
    return f"{prefix}-{out}-{os.urandom(4).hex()}"


class RankedOffer(NamedTuple):
    rank: int
    priced: PricedOffer

    @property
    def offering(self) -> Offering:
        return self.priced.offering


@dataclass(frozen=True, slots=True)
class Quote:
    quote_id: str
    created_at: float
    valid_until: float
    catalog_as_of: str
    demand: Demand
    offers: tuple[RankedOffer, ...]
    excluded: tuple[Exclusion, ...]
    spot_model: str = ""  # what spot was judged by: observed lifetimes (and whose), or rates
    prices_only: bool = False  # no provider is enabled: nothing here can be launched

    def targets(self, limit: int = LAUNCHABLE_OFFERS) -> tuple[Target, ...]:
        """The first ``limit`` offers, in rank order, as what a launch of them asks for."""
        return tuple(Target.of(r) for r in self.offers[:limit])

    def stored(self, limit: int = LAUNCHABLE_OFFERS) -> "StoredQuote":
        """What a later Launch of this quote needs: its demand and launchable offers."""
        return StoredQuote(self.quote_id, self.created_at, self.valid_until, self.demand, self.targets(limit))


@dataclass(frozen=True, slots=True)
class StoredQuote:
    """A quote as the store keeps it for Launch: the demand (for failover and replacements) and
    the launchable offers, rank 1 first."""

    quote_id: str
    created_at: float
    valid_until: float
    demand: Demand
    targets: tuple[Target, ...]

    def pick(self, rank: int, now: float) -> tuple[Target, list[Target]]:
        """Offer ``rank`` (1-based) and the others in rank order, its failover alternatives."""
        if self.valid_until < now:
            raise InvalidArgument(f"quote {self.quote_id} expired at {iso(self.valid_until)}; ask for a new quote.",
                                  field="quote_offer.quote_id")
        if not 1 <= rank <= len(self.targets):
            raise InvalidArgument(f"quote {self.quote_id} has offers 1..{len(self.targets)}, not {rank}.",
                                  field="quote_offer.rank")
        rest = [t for i, t in enumerate(self.targets) if i != rank - 1]
        return self.targets[rank - 1], rest

    def to_json(self) -> bytes:
        """The store's JSON of this quote (:mod:`broker.records`' codec, as a lease's demand)."""
        from broker import records  # the store's codec: a quote in a CLI process stores nothing

        return records.encode(self).encode()

    @staticmethod
    def from_json(body: str | bytes) -> "StoredQuote":
        from broker import records

        return records.decode_stored_quote(body, StoredQuote)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity the organisation already holds: offered first, at its marginal cost."""

    provider: str
    region: str
    instance_type: str
    nodes: int
    reservation_id: str
    hourly_usd: Decimal = Decimal(0)  # marginal cost (already paid for: usually 0)
    zone: str = ""


def _rank_key(p: PricedOffer) -> tuple:
    o = p.offering
    return (o.market is not Market.RESERVED, p.cost.total, o.hourly_micros, o.instance.provider, o.region, o.instance.name)


class QuoteEngine:
    """Quotes demands against a catalog (plus configured reservations)."""

    CACHE_SIZE = 1024              # results kept for repeated demands ([limits] quote_cache_entries)...
    CACHE_BYTES = 64 * 1024 * 1024  # ...and at most this much of them ([limits] quote_cache_bytes)

    def __init__(
        self,
        catalog: Catalog,
        reservations: Iterable[Reservation] = (),
        onprem_egress_usd_per_gb: float | Decimal = 0,
        enabled_providers: Iterable[str] | None = None,
        ttl_s: int = QUOTE_TTL_S,
        regions: Mapping[str, Iterable[str]] | None = None,
        bulk: bool = True,
        cache_entries: int | None = None,
        cache_bytes: int | None = None,
        spot: SpotModel | None = None,
        max_nodes: int = 1024,
        buy_capacity_blocks: bool = False,
    ) -> None:
        """``enabled_providers``: the clouds this broker launches on (None: quote every cloud, as
        the in-process ``broker quote`` does). ``regions``: per provider, the regions it is
        configured for (none listed: any); an offer elsewhere is excluded as not launchable.
        ``bulk``: price in numpy columns (:mod:`policies.bulk`), which pays from the second quote
        on; false prices each offering with the scalar model (:func:`policies.cost.pricer`, the
        same figures to the micro-dollar), for a process that quotes once and would spend more
        importing numpy (~0.1 s) than the arrays save.
        ``cache_entries``/``cache_bytes``: the result cache's bounds (0 entries: no cache).
        ``spot``: what spot offers are priced and chosen by (:mod:`policies.spot_choice`): observed
        lifetimes where it has them, else each offer's interruption rate.
        ``max_nodes``: the most nodes one demand may take (``[limits] max_nodes``): with the
        catalog's largest node, it bounds the GPUs a demand may ask for.
        ``buy_capacity_blocks``: whether a launch may buy a queued offering paid up front (an AWS
        Capacity Block, :mod:`broker.blocks`); off, such offers are quoted and excluded as not
        launchable."""
        self.buy_capacity_blocks = buy_capacity_blocks
        self.bulk, self.max_nodes = bulk, max_nodes
        self.spot = spot or SpotModel()
        extra = []
        live = {o.reservation for o in catalog.offerings if o.market is Market.RESERVED}
        for r in reservations:
            if r.reservation_id in live:  # the cloud's own account of it (refreshed) wins
                continue
            it = catalog.instance(r.provider, r.instance_type)
            reg = catalog.region(r.provider, r.region)
            if it is None or reg is None:
                raise ValueError(f"reservation {r.reservation_id} names unknown "
                                 f"{r.provider} instance type {r.instance_type} or region {r.region}")
            extra.append(Offering(
                instance=it, region=r.region, zones=(r.zone,) if r.zone else reg.zones,
                market=Market.RESERVED, hourly_micros=int(Decimal(r.hourly_usd) * MICROS),
                sla_pct=catalog.terms[r.provider].sla_pct, as_of=catalog.as_of,
                source="configured reservation", reservation=r.reservation_id, reserved_nodes=r.nodes,
            ))
        self.catalog = catalog.with_offerings(tuple(extra)) if extra else catalog
        self.enabled = tuple(enabled_providers) if enabled_providers is not None else None
        self.regions = {p: frozenset(r.lower().replace(" ", "") for r in rs)
                        for p, rs in (regions or {}).items() if rs}
        self.onprem_egress_micros = int(Decimal(str(onprem_egress_usd_per_gb)) * MICROS)
        self.ttl_s = ttl_s
        self._all = self.catalog.offerings
        if self.enabled is not None:
            self._all = tuple(o for o in self._all if o.instance.provider in self.enabled)
        self._cache = SizedLRU(self.CACHE_SIZE if cache_entries is None else cache_entries,
                               self.CACHE_BYTES if cache_bytes is None else cache_bytes, _result_bytes)
        self._shape_groups: dict[str, list] = {}
        self._tables: dict[str, Table] = {}
        # Reservation id -> since when live leases count against its free nodes: configured ones
        # always, refreshed ones from the refresh on (earlier leases are in the cloud's count).
        from providers.market.overlay import epoch

        self.reservation_since = {o.reservation: 0.0 if o.source == "configured reservation" else epoch(o.as_of)
                                  for o in self.catalog.offerings if o.market is Market.RESERVED}
        self._by_gpu = self.catalog.by_gpu  # the catalog's index, narrowed to enabled providers
        if self.enabled is not None:
            narrowed = {g: tuple(o for o in offs if o.instance.provider in self.enabled)
                        for g, offs in self._by_gpu.items()}
            self._by_gpu = {g: offs for g, offs in narrowed.items() if offs}

    @property
    def gpu_models(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_gpu))

    def shapes(self, d: Demand) -> list[tuple[InstanceType, list[Offering]]]:
        """The candidate offerings grouped by instance shape (built on first use per GPU model or
        memory floor, then reused)."""
        key = d.gpu_model or f">={d.min_gpu_memory_gb}"
        groups = self._shape_groups.get(key)
        if groups is None:
            by: dict[int, tuple[InstanceType, list[Offering]]] = {}
            for o in self.candidates(d):
                by.setdefault(id(o.instance), (o.instance, []))[1].append(o)
            groups = self._shape_groups[key] = list(by.values())
        return groups

    def table(self, d: Demand) -> Table:
        """The candidate offerings of ``d`` as columns for bulk pricing (built once per GPU
        model or memory floor)."""
        key = d.gpu_model or f">={d.min_gpu_memory_gb}"
        table = self._tables.get(key)
        if table is None:
            from policies.bulk import Table

            # Queued capacity is priced one by one (its start and fee; see _price_all).
            shapes = [(it, [o for o in offs if o.market is not Market.QUEUED]) for it, offs in self.shapes(d)]
            table = self._tables[key] = Table([(it, offs) for it, offs in shapes if offs], self.catalog.terms)
        return table

    def _price(self, d: Demand, ctx: Context, top: int) -> tuple[list[PricedOffer], list[Exclusion]]:
        """The candidates of ``d`` priced, in rank order (see :func:`_rank_key`; the first ``top``,
        0 = all), and the excluded ones in candidate order; with observed spot lifetimes, a spot
        offer the job would not finish on in time is excluded (:func:`policies.spot_choice.late_on_spot`)."""
        if self.spot.observed and d.interruptible:
            ok, out = self._price_all(d, ctx, 0)
            deadline_h = (d.deadline - ctx.now) / 3600.0 if d.deadline is not None else None
            startup = {p: t.startup_s / 3600.0 for p, t in self.catalog.terms.items()}
            ok, late = late_on_spot(ok, self.spot, startup, d.checkpoint_hours, deadline_h)
            return (ok[:top] if top else ok), out + late
        return self._price_all(d, ctx, top)

    def _price_all(self, d: Demand, ctx: Context, top: int) -> tuple[list[PricedOffer], list[Exclusion]]:
        if self.bulk:
            queued = [o for _, offs in self.shapes(d) for o in offs if o.market is Market.QUEUED]
            if not queued:
                return self.table(d).price(d, ctx, top)
            ok, out = self.table(d).price(d, ctx, 0)
            price_one = pricer(d, ctx)
            for r in map(price_one, queued):
                (out if type(r) is Exclusion else ok).append(r)
            ok.sort(key=_rank_key)  # stable: the table's order among the rest stands
            return (ok[:top] if top else ok), out
        price_one, ok, out = pricer(d, ctx), [], []
        for _, offerings in self.shapes(d):
            for o in offerings:
                r = price_one(o)
                (out if type(r) is Exclusion else ok).append(r)
        ok.sort(key=_rank_key)
        return (ok[:top] if top else ok), out

    def candidates(self, d: Demand) -> tuple[Offering, ...] | list[Offering]:
        if d.gpu_model:
            return self._by_gpu.get(d.gpu_model, ())
        return [o for o in self._all if o.instance.gpu_memory_gb >= d.min_gpu_memory_gb]

    def validate(self, d: Demand, now: float | None = None) -> Demand:
        """``d`` normalised and checked against this catalog: known regions, residency
        geographies, data location and a deadline still ahead (DemandError naming the field)."""
        # The registered clouds check what names one (a filter, a cloud's data location); the
        # registry loads every cloud's settings schema, which a plain quote does without.
        named = d.providers or d.data_location != "onprem"
        d = d.validate(self.gpu_models, _registered() if named else None)
        self._check_size(d)
        regions = self.catalog.regions
        names = sorted({name for _, name in regions})
        geos = sorted({r.geo for r in regions.values()})
        for r in d.regions:
            if r not in names:
                raise DemandError("regions", f"unknown region {r[:64]!r}: no offering of the catalog is there.")
        for r in d.residency:
            if r not in geos and r not in names:
                raise DemandError("residency", f"residency {r[:64]!r} is neither a geography "
                                               f"({', '.join(geos)}) nor a region of the catalog.")
        if d.data_location != "onprem":
            provider, _, region = d.data_location.partition(":")
            if (provider, region) not in regions:
                raise DemandError("data_location", f"data_location {d.data_location[:64]!r} is not a region of "
                                                   f"{provider} in the catalog.")
        if d.deadline is not None and d.deadline <= (time.time() if now is None else now):
            raise DemandError("deadline", "deadline is in the past.")
        return d

    def _check_size(self, d: Demand) -> None:
        """More GPUs than the largest node of the model times ``max_nodes`` is a typo, not a
        demand: no launch could serve it, and its risk lines would price fiction."""
        offers = self._by_gpu.get(d.gpu_model, ()) if d.gpu_model else self._all
        per_node = max((o.instance.gpus for o in offers), default=0)
        if per_node and d.gpus > per_node * self.max_nodes:
            raise DemandError("gpus", f"{d.gpus:,} GPUs is more than the catalog's largest "
                                      f"{d.gpu_model or 'GPU'} node ({per_node} GPUs) x {self.max_nodes:,} nodes "
                                      f"([limits] max_nodes) = {per_node * self.max_nodes:,}.")

    def quote(self, d: Demand, now: float | None = None, top: int = 0,
              blocked: dict[str, str] | None = None, held: dict[str, int] | None = None) -> Quote:
        """Price ``d`` (validated) over every matching offering and market. ``held``: reservation
        nodes live leases hold (see :attr:`reservation_since`)."""
        now = time.time() if now is None else now
        # Prices do not move between catalog loads, so a demand without a deadline (the only
        # input that depends on the clock) prices the same every time: serve repeats from cache.
        key = (d, top, tuple(sorted(blocked.items())) if blocked else (),
               tuple(sorted(held.items())) if held else ()) if d.deadline is None and self.CACHE_SIZE else None
        hit = self._cache_get(key) if key is not None else None
        if hit is not None:
            offers, excluded = hit
        else:
            ctx = Context(self.catalog.terms, self.catalog.regions, self.catalog.gpu_perf, now,
                          self.onprem_egress_micros, blocked, held, dict(self.spot.lifetimes) or None)
            if self.regions:  # rank every offer, set aside what cannot launch here, then cut
                ok, out = self._price(d, ctx, 0)  # in rank order (see _rank_key)
                ok = self._launchable(ok, out)
                ok = ok[:top] if top else ok
            else:
                ok, out = self._price(d, ctx, top)  # in rank order (see _rank_key)
            # tuple.__new__ over zip: the NamedTuple's own __new__ is a Python call per offer.
            offers = tuple(map(tuple.__new__, repeat(RankedOffer), zip(range(1, len(ok) + 1), ok)))
            excluded = tuple(out)
            if key is not None:
                self._cache_put(key, (offers, excluded))
        return Quote(
            quote_id=new_id("q"), created_at=now, valid_until=now + self.ttl_s,
            catalog_as_of=self.catalog.as_of, demand=d, offers=offers, excluded=excluded,
            spot_model=self.spot.source,
            prices_only=self.enabled is None,
        )

    def _launchable(self, priced: list[PricedOffer], excluded: list[Exclusion]) -> list[PricedOffer]:
        """The offers this broker can launch; the others join ``excluded``, saying why, so a
        quote never hands a launch (or its failover) an offer that cannot work here."""
        keep = []
        for p in priced:
            o = p.offering
            allowed = self.regions.get(o.instance.provider)
            if allowed is None or o.region.lower() in allowed:
                keep.append(p)
            else:
                excluded.append(Exclusion(
                    o, f"not launchable here: {o.instance.provider} region {o.region} is not in "
                       f"providers.{o.instance.provider}.regions ({', '.join(sorted(allowed))})",
                    ExclusionKind.NOT_LAUNCHABLE))
        return self._unbought(keep, excluded)

    def _unbought(self, priced: list[PricedOffer], excluded: list[Exclusion]) -> list[PricedOffer]:
        """Capacity Block offerings stay quoted (start and fee) but out of launch unless
        ``[market] buy_capacity_blocks`` is on: a launch of one buys it (within the tenant's
        budget, :mod:`broker.blocks`) and waits for its start."""
        if self.buy_capacity_blocks:
            return priced
        keep = []
        for p in priced:
            o = p.offering
            if o.market is Market.QUEUED and o.upfront_micros:
                excluded.append(Exclusion(
                    o, f"not launchable here: capacity block {o.offer_id} starts at {utc(o.starts_at)} for "
                       f"${usd(o.upfront_micros * p.nodes):,.2f} up front (not refundable), and "
                       f"[market] buy_capacity_blocks is off", ExclusionKind.NOT_LAUNCHABLE))
            else:
                keep.append(p)
        return keep

    def warm_from(self, old: "QuoteEngine", budget_s: float, now: float | None = None) -> int:
        """Price what ``old`` has cached (most recently asked first) into this engine's cache,
        for at most ``budget_s`` seconds; returns how many. Done before a new market is
        installed, so callers keep meeting a warm cache: otherwise every demand is priced again
        by its first callers, several at once, while the server is under load. A demand the new
        catalog refuses (its GPU gone) is left out."""
        deadline = time.monotonic() + budget_s
        n = 0
        for d, top, blocked, held in old._cache.keys():
            if time.monotonic() >= deadline:
                break
            try:
                self.quote(d, now, top, dict(blocked) or None, dict(held) or None)
            except DemandError:
                continue
            n += 1
        return n

    def _cache_get(self, key):
        return self._cache.get(key)

    def _cache_put(self, key, value) -> None:
        self._cache.put(key, value)


def _result_bytes(result) -> int:
    """An over-estimate of what one cached (offers, excluded) result holds."""
    offers, excluded = result
    return 512 + 1024 * len(offers) + 160 * len(excluded) + sum(map(len, map(_REASON, excluded)))


_REASON = itemgetter(1)  # Exclusion.reason


class DerivedCache:
    """Values derived from a shared quote result, keyed by that result's identity.

    The engine hands out the same ``offers`` tuple for a repeated demand; what the layers above
    derive from it (a protobuf, the stored launch details, a top-N slice) is then made once.
    Bounded, oldest out first; safe to use from every RPC thread.
    """

    def __init__(self, size: int = 1024, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._items = SizedLRU(size, max_bytes, lambda entry: rough_bytes(entry[1]))

    def get(self, sources: tuple, make, extra: Hashable = ()):
        """``make()``'s value for these ``sources`` (compared by identity) and ``extra``."""
        key = (tuple(id(s) for s in sources), extra)
        hit = self._items.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], sources)):
            return hit[1]
        value = make()
        self._items.put(key, (sources, value))
        return value


def engine_for(config, catalog: Catalog | None = None, *, bulk: bool = True,
               spot: SpotModel | None = None) -> QuoteEngine:
    """The quote engine a :class:`broker.config.Config` describes (catalog, reservations, providers);
    ``catalog`` overrides the bundled one (the live market over it, :mod:`broker.market`);
    ``bulk`` as for :class:`QuoteEngine`."""
    catalog = catalog or bundled(config.catalog.path or None)
    reservations = [
        Reservation(provider=r.provider, region=r.region, instance_type=r.instance_type, nodes=r.nodes,
                    reservation_id=r.reservation_id, hourly_usd=Decimal(str(r.hourly_usd)), zone=r.zone)
        for r in config.reservations
    ]
    enabled = list(config.providers.enabled()) or None
    regions = {n: tuple(t.regions) for n, t in config.providers.enabled().items()}
    catalog = _with_flex_start(catalog, config.providers.enabled().get("gcp"))
    try:
        return QuoteEngine(catalog, reservations, Decimal(str(config.quote.onprem_egress_usd_per_gb)), enabled,
                           config.quote.ttl_s, regions=regions, bulk=bulk,
                           cache_entries=config.limits.quote_cache_entries,
                           cache_bytes=config.limits.quote_cache_bytes, spot=spot,
                           max_nodes=config.limits.max_nodes,
                           buy_capacity_blocks=config.market.buy_capacity_blocks)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None


def _with_flex_start(catalog: Catalog, gcp) -> Catalog:
    """``catalog`` plus GCP's flex-start offerings when ``[providers.gcp] flex_start`` is on."""
    if gcp is None or not getattr(gcp, "flex_start", False):
        return catalog
    from providers.gcp.flex import flex_start_offerings

    extra = flex_start_offerings(catalog.offerings, gcp)
    return Catalog(catalog.instances, catalog.regions, catalog.terms, catalog.gpu_perf,
                   tuple(catalog.offerings) + tuple(extra), catalog.committed_micros, catalog.as_of)

