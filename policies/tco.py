"""Build vs rent: what owning GPUs costs against renting them, and at what utilisation it pays.

Owning N GPUs costs a fixed amount a year — the servers amortised over their life, staff,
facility — plus power, which grows with use (an idle GPU server still draws ``idle_power_share``
of its peak). Renting costs the GPU-hours actually used at the cloud's price: on-demand, or a
1-year commitment sized to the sustained load (you pay for the committed GPUs every hour, so
commit only what runs all the time). Both sides are linear in utilisation ``u``, so the
break-even utilisation is one division:

    fixed + idle_power + (full_power - idle_power) * u  =  u * N * 8760 * price

The recommendation follows the figures: the cheapest per year of owning, renting (the cheapest
rental) and the hybrid (own the servers the base load fills at ``build_at``, rent the rest on
demand), with the break-even utilisation. The usual rule of thumb — build at or above ~60 %
sustained utilisation, rent at or below ~40 %, hybrid between — is reported beside it, and the
reason says when the two disagree.

Pure: numbers in, numbers out; the catalog lookup takes offerings as a value.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from providers.base import MICROS, Market, Offering

HOURS_PER_YEAR = 8760.0


class TcoError(ValueError):
    """An input is out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class OnPrem:
    """What owning the GPUs costs. Defaults: an 8-GPU H100-class server.

    - ``server_capex_usd`` (250,000): list price of an 8x H100 SXM server with networking share.
    - ``amortisation_years`` (4): typical depreciation of GPU servers.
    - ``kw_per_server`` (10.2): DGX H100 maximum system power.
    - ``pue`` (1.4): cooling and distribution overhead of an average enterprise data centre.
    - ``usd_per_kwh`` (0.12): industrial electricity.
    - ``staff_usd_per_year`` (150,000) and ``facility_usd_per_year`` (60,000): for the whole
      fleet (operators, racks/colocation, network, support contracts).
    - ``idle_power_share`` (0.35): share of peak power an idle server still draws.
    """

    gpus: int
    gpus_per_server: int = 8
    server_capex_usd: float = 250_000.0
    amortisation_years: float = 4.0
    kw_per_server: float = 10.2
    pue: float = 1.4
    usd_per_kwh: float = 0.12
    staff_usd_per_year: float = 150_000.0
    facility_usd_per_year: float = 60_000.0
    idle_power_share: float = 0.35

    def validate(self) -> "OnPrem":
        if self.gpus <= 0:
            raise TcoError(f"gpus must be positive, got {self.gpus}")
        if self.gpus_per_server <= 0:
            raise TcoError(f"gpus per server must be positive, got {self.gpus_per_server}")
        for name in ("server_capex_usd", "kw_per_server", "usd_per_kwh", "staff_usd_per_year",
                     "facility_usd_per_year"):
            if getattr(self, name) < 0:
                raise TcoError(f"{name.replace('_', ' ')} must be zero or positive, got {getattr(self, name)}")
        if self.amortisation_years <= 0:
            raise TcoError(f"amortisation years must be positive, got {self.amortisation_years}")
        if self.pue < 1:
            raise TcoError(f"PUE is at least 1, got {self.pue}")
        if not 0 <= self.idle_power_share <= 1:
            raise TcoError(f"idle power share must be between 0 and 1, got {self.idle_power_share}")
        return self

    @property
    def servers(self) -> int:
        return -(-self.gpus // self.gpus_per_server)

    @property
    def capex_per_year(self) -> float:
        return self.servers * self.server_capex_usd / self.amortisation_years

    @property
    def full_power_per_year(self) -> float:
        return self.servers * self.kw_per_server * self.pue * HOURS_PER_YEAR * self.usd_per_kwh

    @property
    def fixed_per_year(self) -> float:
        """Costs that do not move with utilisation (idle power included)."""
        return (self.capex_per_year + self.staff_usd_per_year + self.facility_usd_per_year
                + self.idle_power_share * self.full_power_per_year)

    def cost_per_year(self, u: float) -> float:
        return self.fixed_per_year + (1 - self.idle_power_share) * self.full_power_per_year * u


@dataclass(frozen=True, slots=True)
class CloudPrice:
    """The cheapest matching cloud price per GPU-hour, and where it comes from."""

    kind: str  # "on_demand" or "committed_1y"
    usd_per_gpu_hour: float
    provider: str
    region: str
    instance_type: str

    @property
    def label(self) -> str:
        return f"{self.provider} {self.instance_type} {self.region}"


def cheapest_prices(
    offerings: Iterable[Offering],
    committed_micros: Mapping[tuple[str, str, str], int],
    gpu_model: str,
) -> dict[str, CloudPrice]:
    """Cheapest on-demand and 1-year committed price per GPU-hour of ``gpu_model``."""
    model = gpu_model.upper()
    best: dict[str, CloudPrice] = {}
    for o in offerings:
        it = o.instance
        if it.gpu.upper() != model or o.market is not Market.ON_DEMAND or it.gpus <= 0:
            continue
        cands = [("on_demand", o.hourly_micros)]
        c = committed_micros.get((it.provider, o.region, it.name))
        if c:
            cands.append(("committed_1y", c))
        for kind, micros in cands:
            per_gpu = micros / MICROS / it.gpus
            cur = best.get(kind)
            if cur is None or per_gpu < cur.usd_per_gpu_hour:
                best[kind] = CloudPrice(kind, per_gpu, it.provider, o.region, it.name)
    return best


def rent_cost_per_year(gpus: int, u: float, price: CloudPrice) -> float:
    """Renting the GPU-hours ``gpus`` GPUs at utilisation ``u`` use, at ``price``."""
    return gpus * HOURS_PER_YEAR * u * price.usd_per_gpu_hour


def break_even(onprem: OnPrem, price: CloudPrice) -> float | None:
    """The utilisation above which owning is cheaper than renting at ``price``; None if never."""
    rent_slope = onprem.gpus * HOURS_PER_YEAR * price.usd_per_gpu_hour
    own_slope = (1 - onprem.idle_power_share) * onprem.full_power_per_year
    if rent_slope <= own_slope:
        return None
    u = onprem.fixed_per_year / (rent_slope - own_slope)
    return u if u <= 1.0 else None


@dataclass(frozen=True, slots=True)
class Advice:
    utilization: float
    recommendation: str  # "build", "rent" or "hybrid"
    reason: str
    onprem_per_year: float
    onprem_lines: dict[str, float]
    prices: dict[str, CloudPrice]
    rent_per_year: dict[str, float]
    break_even: dict[str, float | None]
    costs: dict[str, dict[str, float]] = field(default_factory=dict)  # choice -> {"1y", "3y"}
    rule_of_thumb: str = ""  # what the utilisation bands alone would say

    def to_dict(self) -> dict[str, Any]:
        return {
            "utilization": round(self.utilization, 4),
            "recommendation": self.recommendation,
            "rule_of_thumb": self.rule_of_thumb,
            "reason": self.reason,
            "onprem_per_year_usd": round(self.onprem_per_year, 2),
            "onprem_lines_per_year_usd": {k: round(v, 2) for k, v in self.onprem_lines.items()},
            "cloud": {k: {"usd_per_gpu_hour": round(p.usd_per_gpu_hour, 4), "provider": p.provider,
                          "region": p.region, "instance_type": p.instance_type,
                          "rent_per_year_usd": round(self.rent_per_year[k], 2),
                          "break_even_utilization": _round_or_none(self.break_even[k], 4)}
                      for k, p in self.prices.items()},
            "cost_usd": {k: {h: round(v, 2) for h, v in c.items()} for k, c in self.costs.items()},
        }


def advise(
    onprem: OnPrem,
    utilization: float,
    prices: Mapping[str, CloudPrice],
    build_at: float = 0.60,
    rent_at: float = 0.40,
) -> Advice:
    """Compare owning ``onprem`` at ``utilization`` with renting at ``prices``."""
    onprem.validate()
    if not 0 <= utilization <= 1:
        raise TcoError(f"utilisation must be between 0 and 1 (or 0-100 %), got {utilization}")
    if not prices:
        raise TcoError("no cloud price to compare with")
    if not 0 <= rent_at <= build_at <= 1:
        raise TcoError("the rent band must lie under the build band, both within 0..1")
    u = utilization
    own = onprem.cost_per_year(u)
    rent = {k: rent_cost_per_year(onprem.gpus, u, p) for k, p in prices.items()}
    be = {k: break_even(onprem, p) for k, p in prices.items()}
    cheapest_kind = min(rent, key=rent.__getitem__)
    cheapest = rent[cheapest_kind]
    lines = {
        "capex_amortised": onprem.capex_per_year,
        "power": onprem.fixed_per_year - onprem.capex_per_year - onprem.staff_usd_per_year
        - onprem.facility_usd_per_year + (1 - onprem.idle_power_share) * onprem.full_power_per_year * u,
        "staff": onprem.staff_usd_per_year,
        "facility": onprem.facility_usd_per_year,
    }
    # Hybrid: own the servers the base load fills, rent the rest on demand.
    base_gpus = int(onprem.gpus * min(1.0, u / build_at) // onprem.gpus_per_server * onprem.gpus_per_server)
    costs: dict[str, dict[str, float]] = {}
    for years in (1, 3):
        key = f"{years}y"
        costs.setdefault("build", {})[key] = own * years
        for k, v in rent.items():
            costs.setdefault(f"rent_{k}", {})[key] = v * years
    od = prices.get("on_demand") or prices[cheapest_kind]
    if base_gpus > 0:
        base = OnPrem(**{**_fields(onprem), "gpus": base_gpus})
        base_u = min(1.0, u * onprem.gpus / base_gpus)
        peak_gpu_h = max(0.0, u * onprem.gpus - base_u * base_gpus) * HOURS_PER_YEAR
        hyb = base.cost_per_year(base_u) + peak_gpu_h * od.usd_per_gpu_hour
    else:
        hyb = rent_cost_per_year(onprem.gpus, u, od)
    for years in (1, 3):
        costs.setdefault("hybrid", {})[f"{years}y"] = hyb * years

    rec, reason, thumb = _verdict(u, own, cheapest_kind, cheapest, prices, be, hyb, base_gpus, build_at, rent_at)
    return Advice(u, rec, reason, own, lines, dict(prices), rent, be, costs, thumb)


def rule_of_thumb(u: float, build_at: float = 0.60, rent_at: float = 0.40) -> str:
    """The usual bands: build at or above ``build_at`` sustained utilisation, rent at or under
    ``rent_at``, hybrid between. Shown beside the verdict, never instead of it."""
    return "build" if u >= build_at else "rent" if u <= rent_at else "hybrid"


def _verdict(u: float, own: float, rent_kind: str, rent: float, prices: Mapping[str, CloudPrice],
             be: Mapping[str, float | None], hyb: float, base_gpus: int, build_at: float,
             rent_at: float) -> tuple[str, str, str]:
    """The cheapest of owning, renting and the hybrid at ``u``, with the figures behind it."""
    options = {"build": own, "rent": rent, "hybrid": hyb}
    rec = min(options, key=lambda k: (options[k], k != "build"))
    thumb = rule_of_thumb(u, build_at, rent_at)
    kinds = {k: k.replace("_", " ") for k in be}
    be_txt = ", ".join(f"{kinds[k]} {'never' if v is None else f'{v * 100:.0f} %'}" for k, v in be.items())
    p = prices[rent_kind]
    figures = (f"at {u * 100:.0f} % utilisation owning costs ${own:,.0f}/yr, renting {kinds[rent_kind]} "
               f"({p.label}, ${p.usd_per_gpu_hour:.2f}/GPU-h) ${rent:,.0f}/yr, hybrid (own {base_gpus} GPUs, "
               f"burst the rest on demand) ${hyb:,.0f}/yr")
    be_rent = be.get(rent_kind)
    pays = ("owning never pays against renting" if be_rent is None
            else f"owning pays above {be_rent * 100:.0f} % utilisation")
    agree = "agrees" if thumb == rec else "disagrees; the figures decide"
    reason = (f"{rec}: {figures}; {pays} (break-even: {be_txt}). Rule of thumb (>= {build_at * 100:.0f} % build, "
              f"<= {rent_at * 100:.0f} % rent): {thumb}, which {agree}.")
    return rec, reason, thumb


def _round_or_none(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def _fields(o: OnPrem) -> dict[str, Any]:
    return {k: getattr(o, k) for k in OnPrem.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------
# Measured utilisation from Slurm accounting (sacct --parsable2 with AllocTRES and Elapsed).


def parse_elapsed(text: str) -> int:
    """Slurm's ``[DD-]HH:MM:SS`` / ``MM:SS`` (optionally with fractional seconds) in seconds."""
    t = text.strip()
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
    parts = t.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.replace(".", "", 1).isdigit() for p in parts):
        raise ValueError(f"not a Slurm elapsed time: {text!r}")
    nums = [float(p) for p in parts]
    while len(nums) < 3:
        nums.insert(0, 0.0)
    h, m, s = nums
    return int(days * 86400 + h * 3600 + m * 60 + s)


def gpus_in_tres(tres: str) -> int:
    """GPUs in an AllocTRES string: ``gres/gpu=4`` or typed ``gres/gpu:a100=4`` (not both)."""
    plain, typed = 0, 0
    for item in tres.split(","):
        k, _, v = item.strip().partition("=")
        if k == "gres/gpu":
            plain += int(v)
        elif k.startswith("gres/gpu:"):
            typed += int(v)
    return plain or typed


@dataclass(frozen=True, slots=True)
class SacctUsage:
    gpu_seconds: float
    jobs: int
    window_s: float

    def utilization(self, gpus: int) -> float:
        if gpus <= 0 or self.window_s <= 0:
            return 0.0
        return min(1.0, self.gpu_seconds / (gpus * self.window_s))


def sacct_usage(text: str, source: str = "sacct") -> SacctUsage:
    """GPU-seconds used by the jobs in a ``sacct --parsable2`` export (job steps skipped) and
    the window they cover (first Start to last End, when those columns are there; else the
    longest job). Raises ValueError naming the line for a bad row."""
    import datetime as _dt

    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{source} is empty")
    header = [h.strip() for h in lines[0].split("|")]
    col = {h: i for i, h in enumerate(header)}
    missing = [c for c in ("JobID", "AllocTRES", "Elapsed") if c not in col]
    if missing:
        raise ValueError(f"{source} line 1 lacks column(s) {', '.join(missing)} "
                         "(export with sacct --parsable2 --format=JobID,AllocTRES,Elapsed,Start,End)")
    gpu_s = 0.0
    jobs = 0
    first, last = None, None
    longest = 0

    def ts(v: str) -> float | None:
        v = v.strip()
        if not v or v in ("Unknown", "None"):
            return None
        return _dt.datetime.fromisoformat(v).timestamp()

    for n, ln in enumerate(lines[1:], start=2):
        f = ln.split("|")
        if len(f) < len(header):
            raise ValueError(f"{source} line {n}: {len(f)} fields, the header has {len(header)}")
        jid = f[col["JobID"]].strip()
        if "." in jid:
            continue  # a step (.batch, .extern, .0): its job line already counts it
        try:
            g = gpus_in_tres(f[col["AllocTRES"]])
            el = parse_elapsed(f[col["Elapsed"]])
            st = ts(f[col["Start"]]) if "Start" in col else None
            en = ts(f[col["End"]]) if "End" in col else None
        except ValueError as e:
            raise ValueError(f"{source} line {n}: {e}") from None
        jobs += 1
        longest = max(longest, el)
        if g:
            gpu_s += g * el
        if st is not None:
            first = st if first is None else min(first, st)
            end = en if en is not None else st + el
            last = end if last is None else max(last, end)
    if jobs == 0:
        raise ValueError(f"{source} holds no jobs")
    window = (last - first) if first is not None and last is not None else float(longest)
    return SacctUsage(gpu_s, jobs, max(window, 0.0))


# ---------------------------------------------------------------------------------------------
# Build vs rent per pool size, from simulated replays (broker simulate --onprem-gpus A,B,C).


@dataclass(frozen=True, slots=True)
class SizeCost:
    """One simulated pool size: owning it plus bursting what it cannot hold, per year."""

    gpus: int
    utilization: float
    wait_p95_s: float
    own_per_year: float
    cloud_per_year: float
    break_even: float | None  # utilisation at which owning this pool pays against renting it

    @property
    def total_per_year(self) -> float:
        return self.own_per_year + self.cloud_per_year


def size_costs(
    spec: OnPrem,
    runs: Iterable[tuple[int, float, float, float]],
    price: CloudPrice,
) -> list[SizeCost]:
    """``runs``: (pool GPUs, simulated on-prem utilisation, cloud USD per year, p95 wait s) per
    size; owning is priced with ``spec``'s inputs at each size (a size of 0 owns nothing)."""
    out = []
    for gpus, u, cloud, p95 in runs:
        if gpus < 0 or not 0 <= u <= 1 or cloud < 0:
            raise TcoError(f"a simulated size needs gpus >= 0, utilisation in 0..1 and cloud cost >= 0, "
                           f"got {gpus}, {u}, {cloud}")
        if gpus == 0:
            out.append(SizeCost(0, 0.0, p95, 0.0, cloud, None))
            continue
        own = OnPrem(**{**_fields(spec), "gpus": gpus}).validate()
        out.append(SizeCost(gpus, u, p95, own.cost_per_year(u), cloud, break_even(own, price)))
    return sorted(out, key=lambda r: r.gpus)


def best_size(rows: list[SizeCost], rent_all_per_year: float) -> tuple[str, str]:
    """The cheapest size (or renting everything), as a verdict and one sentence with the figures."""
    if not rows:
        raise TcoError("no simulated pool size to compare")
    best = min(rows, key=lambda r: (r.total_per_year, r.gpus))
    if best.gpus == 0 or rent_all_per_year <= best.total_per_year:
        return "rent", (f"rent: renting everything on demand costs ${rent_all_per_year:,.0f}/yr; the cheapest pool "
                        f"({best.gpus} GPUs) costs ${best.total_per_year:,.0f}/yr with its bursts")
    be = "never pays" if best.break_even is None else f"pays above {best.break_even * 100:.0f} % utilisation"
    return "build", (f"build {best.gpus} GPUs and burst the rest: ${best.total_per_year:,.0f}/yr (owning "
                     f"${best.own_per_year:,.0f} at {best.utilization * 100:.0f} % utilisation + cloud "
                     f"${best.cloud_per_year:,.0f}), p95 wait {best.wait_p95_s:,.0f} s, against "
                     f"${rent_all_per_year:,.0f}/yr renting everything on demand; owning {best.gpus} GPUs {be}")
