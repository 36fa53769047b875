"""The live market: prices, zones, quotas, reservations and spot signals from the clouds' own APIs.

One fetcher per cloud (:mod:`providers.market.aws`, ``.gcp``, ``.azure``) asks its cloud for the
offerings the bundled catalog knows and returns a :class:`Snapshot` of plain values. The broker
stores it (dated) and overlays it on the catalog; nothing here decides whether a value is used
(the plausibility check against the list price lives with the overlay, in
:mod:`providers.catalog`). Errors are the typed :mod:`providers.base` errors, scoped to the cloud
or region whose API failed, so one broken region never hides another's data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

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


@dataclass
class Snapshot:
    """Everything one refresh of one provider learnt; ``errors`` says what it could not learn."""

    provider: str
    fetched_at: float
    prices: list[LivePrice] = field(default_factory=list)
    zones: list[Zones] = field(default_factory=list)
    quotas: list[Quota] = field(default_factory=list)
    needs: list[QuotaNeed] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    spot: list[SpotSignal] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # (kind, region) parts that failed this time ("" = every region of that kind).
    failed: list[tuple[str, str]] = field(default_factory=list)

    KINDS = ("prices", "zones", "quotas", "needs", "reservations", "spot")

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        out: dict[str, Any] = {"provider": self.provider, "fetched_at": self.fetched_at,
                               "errors": list(self.errors), "failed": [list(f) for f in self.failed]}
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
                 "reservations": Reservation, "spot": SpotSignal}
        snap = cls(str(d["provider"]), float(d["fetched_at"]), errors=list(d.get("errors") or ()),
                   failed=[(str(k), str(r)) for k, r in d.get("failed") or ()])
        for kind, t in types.items():
            rows = []
            for r in d.get(kind) or ():
                if "zones" in r and isinstance(r["zones"], list):
                    r = {**r, "zones": tuple(r["zones"])}
                rows.append(t(**r))
            setattr(snap, kind, rows)
        return snap


    def fail(self, kind: str, region: str, err: BaseException) -> None:
        """Record that ``kind`` could not be learnt for ``region`` ("" = anywhere), and why."""
        self.failed.append((kind, region))
        self.errors.append(f"{kind}{' in ' + region if region else ''}: {err}")

    def merged_over(self, old: "Snapshot | None") -> "Snapshot":
        """This snapshot, with ``old``'s rows kept wherever this one failed: a failed refresh
        keeps the last good data of exactly the parts that failed."""
        if old is None or not self.failed:
            return self
        out = Snapshot(self.provider, self.fetched_at, errors=list(self.errors), failed=list(self.failed))
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


def fetch(provider: str, settings: Mapping[str, Any], catalog: Any, now: float) -> Snapshot:
    """Ask ``provider``'s APIs about every offering of ``catalog`` in its configured regions.

    A failing part (one API, one region) is recorded in :attr:`Snapshot.errors` and the rest is
    still returned; an error that leaves nothing to return raises :class:`ProviderError`.
    """
    if provider == "aws":
        from providers.market.aws import fetch as f
    elif provider == "gcp":
        from providers.market.gcp import fetch as f
    elif provider == "azure":
        from providers.market.azure import fetch as f
    else:
        raise ValueError(f"unknown provider {provider!r}")
    return f(settings, catalog, now)


def rfc3339(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def instance_types(catalog: Any, provider: str) -> dict[str, Any]:
    """The catalog's instance types of ``provider``, by name."""
    return {name: it for (p, name), it in catalog.instances.items() if p == provider}
