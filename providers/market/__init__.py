"""The live market: prices, zones, quotas, reservations and spot signals from the clouds' own APIs.

One :class:`MarketSource` per cloud (:mod:`providers.market.aws`, ``.gcp``, ``.azure``; a cloud's
registration names it) asks its cloud for the offerings the bundled catalog knows and returns a
:class:`Snapshot` of plain values. The broker
stores it (dated) and overlays it on the catalog; nothing here decides whether a value is used
(the plausibility check against the list price lives with the overlay, in
:mod:`providers.catalog`). Errors are the typed :mod:`providers.base` errors, scoped to the cloud
or region whose API failed, so one broken region never hides another's data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from providers.base import ProviderError


@dataclass(frozen=True, slots=True)
class LivePrice:
    """A price the cloud quotes now for one (region, instance type, market), per node-hour."""

    region: str
    instance_type: str
    market: str  # "on_demand" | "spot"
    hourly_micros: int
    source: str  # "aws:pricing", "aws:spot_price_history", "gcp:billing_catalog", "azure:retail_prices"
    as_of: str  # RFC 3339 of the cloud's own effective time, or the fetch time
    zone: str = ""  # set when the price is one zone's (AWS spot); "" = the whole region


@dataclass(frozen=True, slots=True)
class Zones:
    """Where an instance type is offered in a region (and, when the cloud says, where not)."""

    region: str
    instance_type: str
    zones: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Quota:
    """What the account may still run in a region, in the quota's own unit.

    ``key`` names the quota as the cloud does (AWS quota code, GCP metric, Azure usage name).
    """

    region: str
    key: str
    label: str  # "H100 GPUs", "P on-demand vCPUs", "NDSH100v5 family vCPUs"
    limit: float
    used: float

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used)


@dataclass(frozen=True, slots=True)
class QuotaNeed:
    """Which quota an instance type draws on in a market, and how much per node."""

    instance_type: str
    market: str
    key: str
    per_node: float


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity the account holds: ``total`` nodes, ``used`` of them running (as the cloud says)."""

    region: str
    zone: str
    instance_type: str
    reservation_id: str
    total: int
    used: int


@dataclass(frozen=True, slots=True)
class SpotSignal:
    """The cloud's own view of spot risk: AWS placement score 1-10 (10 = most likely to hold)."""

    region: str
    instance_type: str
    score: float
    source: str


@dataclass(frozen=True, slots=True)
class CapacityBlock:
    """Queued capacity the cloud offers for sale (an AWS Capacity Block for ML offering):
    ``count`` nodes of ``instance_type`` in ``zone`` from ``start`` to ``end`` (RFC 3339) for
    ``upfront_micros`` paid up front (in ``currency``)."""

    region: str
    zone: str
    instance_type: str
    offering_id: str
    count: int
    start: str
    end: str
    duration_h: float
    upfront_micros: int
    currency: str = "USD"


#: The market's sources, each refreshed on its own: a part of a fetch (its ``kind``) feeds one.
SOURCES = ("price_list", "spot_history", "placement_scores", "quotas", "reservations", "zones",
           "capacity_blocks")
SOURCE_OF = {"prices": "price_list", "spot_prices": "spot_history", "spot": "placement_scores",
             "quotas": "quotas", "reservations": "reservations", "zones": "zones",
             "blocks": "capacity_blocks"}


@dataclass
class SourceState:
    """One source of one provider's market: when it last answered in full (``ok_at``, 0: never
    or not this time) and what went wrong the last time it was asked ("" when nothing did)."""

    ok_at: float = 0.0
    error: str = ""


@dataclass
class Snapshot:
    """Everything one refresh of one provider learnt; ``errors`` says what it could not learn,
    ``sources`` how each source fared (a failed one keeps its last good data and its age)."""

    provider: str
    fetched_at: float
    prices: list[LivePrice] = field(default_factory=list)
    zones: list[Zones] = field(default_factory=list)
    quotas: list[Quota] = field(default_factory=list)
    needs: list[QuotaNeed] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    spot: list[SpotSignal] = field(default_factory=list)
    blocks: list[CapacityBlock] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # (kind, region) parts that failed this time ("" = every region of that kind).
    failed: list[tuple[str, str]] = field(default_factory=list)
    sources: dict[str, SourceState] = field(default_factory=dict)

    KINDS = ("prices", "zones", "quotas", "needs", "reservations", "spot", "blocks")

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out: dict[str, Any] = {"provider": self.provider, "fetched_at": self.fetched_at,
                               "errors": list(self.errors), "failed": [list(f) for f in self.failed],
                               "sources": {k: asdict(v) for k, v in self.sources.items()}}
        for kind in self.KINDS:
            out[kind] = [asdict(x) for x in getattr(self, kind)]
        return out

    @classmethod
    def from_json(cls, body: str | bytes) -> "Snapshot":
        """A snapshot from the JSON of :meth:`to_dict`, decoded straight into the dataclasses by
        msgspec (a full market of one cloud is thousands of rows: ~6× faster than json and
        :meth:`from_dict`); a body msgspec cannot type (an older shape) goes through
        :meth:`from_dict`, which is lenient."""
        import json

        import msgspec

        global _DECODER
        if _DECODER is None:
            _DECODER = msgspec.json.Decoder(cls)
        try:
            return _DECODER.decode(body)
        except msgspec.ValidationError:
            return cls.from_dict(json.loads(body))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Snapshot":
        types = {"prices": LivePrice, "zones": Zones, "quotas": Quota, "needs": QuotaNeed,
                 "reservations": Reservation, "spot": SpotSignal, "blocks": CapacityBlock}
        snap = cls(str(d["provider"]), float(d["fetched_at"]), errors=list(d.get("errors") or ()),
                   failed=[(str(k), str(r)) for k, r in d.get("failed") or ()],
                   sources={str(k): SourceState(float(v.get("ok_at") or 0), str(v.get("error") or ""))
                            for k, v in (d.get("sources") or {}).items()})
        for kind, t in types.items():
            rows = []
            for r in d.get(kind) or ():
                if "zones" in r and isinstance(r["zones"], list):
                    r = {**r, "zones": tuple(r["zones"])}
                rows.append(t(**r))
            setattr(snap, kind, rows)
        return snap


    def asked(self, kind: str) -> None:
        """A part of ``kind`` is being asked for: its source answered now unless a part fails."""
        self.sources.setdefault(SOURCE_OF.get(kind, kind), SourceState(self.fetched_at))

    def fail(self, kind: str, region: str, err: BaseException) -> None:
        """Record that ``kind`` could not be learnt for ``region`` ("" = anywhere), and why."""
        self.failed.append((kind, region))
        text = f"{kind}{' in ' + region if region else ''}: {err}"
        self.errors.append(text)
        state = self.sources.setdefault(SOURCE_OF.get(kind, kind), SourceState())
        state.ok_at = 0.0
        state.error = text if not state.error else (state.error + "; " + text)[:2000]

    def part(self, kind: str, region: str, fn: Callable[..., Any], mapper: Callable[..., ProviderError],
             *args: Any) -> Any:
        """``fn(*args)``, or ``[]`` with the failure recorded: whatever a source's call raises (a
        denial, a 5xx, an answer the SDK cannot parse, a bug) stays that source's failure, and
        ``mapper(error, region=...)`` says it as the provider's typed error."""
        self.asked(kind)
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - one source never stops the others
            try:
                err = e if isinstance(e, ProviderError) else mapper(e, region=region)
            except Exception:  # noqa: BLE001 - an error its SDK has no type for
                from providers.base import TransientError

                err = TransientError(f"its answer could not be read ({type(e).__name__}: {str(e)[:200]})",
                                     provider=self.provider, code="UnreadableAnswer", region=region)
            self.fail(kind, region, err)
            return []

    def all_failed(self) -> bool:
        """Every source asked failed: nothing of this refresh is worth storing."""
        return bool(self.sources) and all(s.error for s in self.sources.values())

    def merged_over(self, old: "Snapshot | None") -> "Snapshot":
        """This snapshot, with ``old``'s rows kept wherever this one failed: a failed refresh
        keeps the last good data of exactly the parts that failed."""
        if old is None or not self.failed:
            return self
        sources = {k: SourceState(v.ok_at or (old.sources[k].ok_at if k in old.sources else old.fetched_at), v.error)
                   for k, v in self.sources.items()}
        out = Snapshot(self.provider, self.fetched_at, errors=list(self.errors), failed=list(self.failed),
                       sources=sources)
        for kind in self.KINDS:
            lost = {r for k, r in self.failed if k == kind}
            rows = list(getattr(self, kind))
            if lost:
                keep = [x for x in getattr(old, kind)
                        if "" in lost or getattr(x, "region", "") in lost]
                have = {repr(x) for x in rows}
                rows += [x for x in keep if repr(x) not in have]
            setattr(out, kind, rows)
        return out


_DECODER = None  # msgspec's decoder for Snapshot, built on first use


class MarketError(ProviderError):
    """A market API (pricing, quotas, reservations) failed for a whole provider."""


Fetcher = Callable[..., Snapshot]


@runtime_checkable
class MarketSource(Protocol):
    """One cloud's market: what a registration's ``market`` names (an object, not a module).

    ``sources`` says which of :data:`SOURCES` the cloud has (a cloud without a quota API leaves
    out ``"quotas"``); ``"price_list"`` is required of every cloud. Settings arrive as the raw
    ``[providers.NAME]`` table or its typed schema; errors are :mod:`providers.base` errors
    scoped to the cloud or region whose API failed."""

    sources: tuple[str, ...]

    def fetch(self, settings: Any, catalog: Any, now: float) -> Snapshot:
        """Everything the cloud says about ``catalog``'s offerings in its configured regions: a
        failing part is recorded in the snapshot (:meth:`Snapshot.part`); a failure that leaves
        nothing raises :class:`ProviderError`."""
        ...

    def quotas(self, settings: Any, catalog: Any, region: str, known: Snapshot | None) -> list[Quota]:
        """``region``'s quotas alone (after a launch met a quota error); ``known`` is the last
        stored snapshot ([] when the cloud has no quota API)."""
        ...

    def needs(self, catalog: Any, known: Snapshot | None) -> list[QuotaNeed]:
        """Which quota each instance type draws on, when ``known`` holds none."""
        ...


def fetch(provider: str, settings: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    """Ask ``provider``'s APIs about every offering of ``catalog`` in its configured regions.

    A failing part (one API, one region) is recorded in :attr:`Snapshot.errors` and the rest is
    still returned; an error that leaves nothing to return raises :class:`ProviderError`; a cloud
    no registration carries raises :class:`providers.registry.UnknownCloud` (a ValueError).
    """
    from providers.registry import market_source

    return market_source(provider).fetch(settings, catalog, now)


def rfc3339(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def instance_types(catalog: Any, provider: str) -> dict[str, Any]:
    """The catalog's instance types of ``provider``, by name."""
    return {name: it for (p, name), it in catalog.instances.items() if p == provider}
