"""Observed spot lifetimes, per cloud: how long a spot node lives before it is preempted.

Read from ``spot_instance_lifetimes_aws_gcp_2020.csv``-shaped data (``cloud``,
``observed_lifetime_s``, ``ended_by``; ``still_running...`` marks a censored row: the instance
outlived the log).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from broker.simulate.trace import TraceError, unreadable


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


def load_lifetimes(path: Path | str) -> Lifetimes:
    """Read ``spot_instance_lifetimes_aws_gcp_2020.csv``-shaped data: ``cloud``,
    ``observed_lifetime_s`` and ``ended_by`` (``still_running...`` marks censored rows)."""
    p = Path(path)
    try:
        f = p.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read spot lifetimes {p}: {e.strerror or e}") from None
    out: dict[str, list[tuple[float, bool]]] = {}
    with f:
        r = csv.DictReader(f)
        try:
            _rows(p, r, out)
        except (UnicodeDecodeError, csv.Error) as e:
            raise unreadable(p, r.line_num, e) from None
    if not out:
        raise TraceError(f"{p.name} holds no lifetimes")
    return Lifetimes({k: tuple(sorted(v)) for k, v in out.items()})


def _rows(p: Path, r: csv.DictReader, out: dict[str, list[tuple[float, bool]]]) -> None:
    """The rows into ``out`` (cloud -> (lifetime, censored)), or a TraceError naming the line."""
    need = [c for c in ("cloud", "observed_lifetime_s") if c not in (r.fieldnames or [])]
    if need:
        raise TraceError(f"{p.name} line 1 lacks column(s) {', '.join(need)}")
    for line, row in enumerate(r, start=2):
        cloud = (row.get("cloud") or "").strip().lower()
        try:
            life = float(row["observed_lifetime_s"])
        except (TypeError, ValueError):
            raise TraceError(f"{p.name} line {line}: observed_lifetime_s must be a number, "
                             f"got {row.get('observed_lifetime_s')!r}") from None
        if not cloud or not (math.isfinite(life) and life > 0):
            raise TraceError(f"{p.name} line {line}: needs a cloud and a positive lifetime")
        censored = (row.get("ended_by") or "").strip().lower().startswith("still_running")
        out.setdefault(cloud, []).append((life, censored))
