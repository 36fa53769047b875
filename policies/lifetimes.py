"""Observed spot lifetimes, per cloud: how long a spot node lives before it is preempted.

Rows shaped like ``spot_instance_lifetimes_aws_gcp_2020.csv`` (``cloud``, ``observed_lifetime_s``,
``ended_by``; ``still_running...`` marks a censored row: the instance outlived the log). Pure:
rows in (the caller opens the file), :class:`Lifetimes` out. The simulator draws preemptions from
them; the quote and the simulator price and choose spot by them (:mod:`policies.spot_choice`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from policies.spot import LifetimeDist

#: The columns a lifetimes file must have.
COLUMNS = ("cloud", "observed_lifetime_s")


class LifetimesError(ValueError):
    """A lifetimes row is unusable; the message names the line."""


@dataclass(frozen=True, slots=True)
class Lifetimes:
    """Observed spot lifetimes per cloud, seconds; ``censored`` ones were still running."""

    by_cloud: dict[str, tuple[tuple[float, bool], ...]]

    def draw(self, cloud: str, u: float, u2: float) -> float | None:
        """A lifetime for one node from ``cloud``'s observations, or None if none were seen.
        A censored draw (the instance outlived the log) survives at least that long and then
        draws again, memorylessly."""
        obs = self.by_cloud.get(cloud)
        if not obs:
            return None
        total = 0.0
        for _ in range(8):
            life, censored = obs[int(u * len(obs)) % len(obs)]
            total += life
            if not censored:
                return total
            u = (u * 7919.0 + u2) % 1.0
        return total

    def with_observations(self, extra: Mapping[str, Iterable[tuple[float, bool]]]) -> "Lifetimes":
        """These lifetimes and ``extra`` ones (cloud -> (seconds, censored)), sorted per cloud."""
        out = {k: list(v) for k, v in self.by_cloud.items()}
        for cloud, obs in extra.items():
            out.setdefault(cloud, []).extend((float(s), bool(c)) for s, c in obs if s > 0 and math.isfinite(s))
        return Lifetimes({k: tuple(sorted(v)) for k, v in out.items() if v})

    def distributions(self) -> dict[str, LifetimeDist]:
        """Per cloud, the distribution the cost model and the spot rule read (a cloud whose every
        observation is censored has no distribution: nothing was ever seen preempted there)."""
        return {k: LifetimeDist.from_observations(v) for k, v in sorted(self.by_cloud.items())
                if any(not c for _, c in v)}


def lifetimes_from_rows(rows: Iterable[Mapping[str, str]], fieldnames: Iterable[str] | None,
                        name: str = "lifetimes") -> Lifetimes:
    """:class:`Lifetimes` from CSV rows (``csv.DictReader``'s, the header in ``fieldnames``);
    :class:`LifetimesError` naming the line of a bad one."""
    need = [c for c in COLUMNS if c not in (fieldnames or [])]
    if need:
        raise LifetimesError(f"{name} line 1 lacks column(s) {', '.join(need)}")
    out: dict[str, list[tuple[float, bool]]] = {}
    for line, row in enumerate(rows, start=2):
        cloud = (row.get("cloud") or "").strip().lower()
        try:
            life = float(row["observed_lifetime_s"])
        except (TypeError, ValueError):
            raise LifetimesError(f"{name} line {line}: observed_lifetime_s must be a number, "
                                 f"got {row.get('observed_lifetime_s')!r}") from None
        if not cloud or not (math.isfinite(life) and life > 0):
            raise LifetimesError(f"{name} line {line}: needs a cloud and a positive lifetime")
        censored = (row.get("ended_by") or "").strip().lower().startswith("still_running")
        out.setdefault(cloud, []).append((life, censored))
    if not out:
        raise LifetimesError(f"{name} holds no lifetimes")
    return Lifetimes({k: tuple(sorted(v)) for k, v in out.items()})
