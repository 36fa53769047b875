"""Reading a job trace and observed spot lifetimes.

A trace is a CSV with one row per job: ``job_id, submit_time_s, num_gpus, duration_s`` plus
optional ``queue``/``vc``, ``interruptible``, ``gpu_model``/``gpu``, ``data_gb``, ``kind`` and
``checkpoint_minutes``. Spot lifetimes are ``spot_instance_lifetimes_aws_gcp_2020.csv``-shaped
(``cloud``, ``observed_lifetime_s``, ``ended_by``).
"""
from __future__ import annotations

import csv
import hashlib
import math
import struct
from dataclasses import dataclass
from pathlib import Path

KINDS = ("training", "tuning", "eval", "inference")


class TraceError(ValueError):
    """A trace or lifetimes file is unusable; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    queue: str = ""
    interruptible: bool = False
    gpu_model: str = ""
    data_gb: float = 0.0
    kind: str = "training"
    checkpoint_minutes: int = 0


def hash_unit(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): the same job draws the same in every policy."""
    h = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return struct.unpack("<Q", h)[0] / 2.0**64


_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}
_ALIASES = {
    "queue": ("queue", "vc", "partition"),
    "gpu_model": ("gpu_model", "gpu", "gpu_type"),
    "data_gb": ("data_gb", "data_in_gb", "dataset_gb"),
}
_REQUIRED = ("job_id", "submit_time_s", "num_gpus", "duration_s")


class _Columns:
    """Where each field sits in a trace row, from the header."""

    def __init__(self, header: list[str], name: str):
        col = {h: i for i, h in enumerate(header)}
        missing = [c for c in _REQUIRED if c not in col]
        if missing:
            raise TraceError(f"{name} line 1 lacks column(s) {', '.join(missing)}")

        def opt(field: str) -> int | None:
            for a in _ALIASES.get(field, (field,)):
                if a in col:
                    return col[a]
            return None

        self.width = len(header)
        self.job_id, self.submit, self.gpus, self.duration = (col[c] for c in _REQUIRED)
        self.queue, self.interruptible = opt("queue"), opt("interruptible")
        self.gpu_model, self.data_gb = opt("gpu_model"), opt("data_gb")
        self.kind, self.checkpoint = opt("kind"), opt("checkpoint_minutes")


class _RowReader:
    """Turns one row into a TraceJob or raises TraceError naming the line."""

    def __init__(self, cols: _Columns, name: str, interruptible_share: float, seed: int, default_gpu_model: str):
        self.c = cols
        self.name = name
        self.share = interruptible_share
        self.seed = seed
        self.model = default_gpu_model.upper()
        self.seen: set[str] = set()

    def fail(self, line: int, what: str) -> TraceError:
        return TraceError(f"{self.name} line {line}: {what}")

    def job(self, line: int, row: list[str]) -> TraceJob:
        c = self.c
        if len(row) != c.width:
            raise self.fail(line, f"{len(row)} fields, the header has {c.width}")
        jid = row[c.job_id].strip()
        if not jid:
            raise self.fail(line, "job_id is empty")
        if jid in self.seen:
            raise self.fail(line, f"job_id {jid} appears twice")
        self.seen.add(jid)
        try:
            submit, gpus_f, dur = float(row[c.submit]), float(row[c.gpus]), float(row[c.duration])
        except ValueError:
            raise self.fail(line, f"submit_time_s, num_gpus and duration_s must be numbers, got "
                            f"{row[c.submit]!r}, {row[c.gpus]!r}, {row[c.duration]!r}") from None
        if not (math.isfinite(submit) and submit >= 0):
            raise self.fail(line, f"submit_time_s must be zero or positive, got {row[c.submit]}")
        if not (gpus_f >= 1 and gpus_f == int(gpus_f)):
            raise self.fail(line, f"num_gpus must be a whole number of at least 1, got {row[c.gpus]}")
        if not (math.isfinite(dur) and dur >= 0):
            raise self.fail(line, f"duration_s must be zero or positive, got {row[c.duration]}")
        model = (row[c.gpu_model].strip().upper() if c.gpu_model is not None else "") or self.model
        queue = row[c.queue].strip() if c.queue is not None else ""
        return TraceJob(jid, submit, int(gpus_f), dur, queue, self.interruptible(line, row, jid), model,
                        self.data_gb(line, row), self.kind(line, row), self.checkpoint(line, row))

    def interruptible(self, line: int, row: list[str], jid: str) -> bool:
        if self.c.interruptible is None:
            return hash_unit(self.seed, jid) < self.share
        v = row[self.c.interruptible].strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise self.fail(line, f"interruptible must be true or false, got {row[self.c.interruptible]!r}")

    def data_gb(self, line: int, row: list[str]) -> float:
        k = self.c.data_gb
        if k is None or not row[k].strip():
            return 0.0
        try:
            data = float(row[k])
        except ValueError:
            data = -1.0
        if not (math.isfinite(data) and data >= 0):
            raise self.fail(line, f"data_gb must be zero or positive, got {row[k]!r}")
        return data

    def kind(self, line: int, row: list[str]) -> str:
        k = self.c.kind
        if k is None or not row[k].strip():
            return "training"
        kind = row[k].strip().lower()
        if kind not in KINDS:
            raise self.fail(line, f"kind must be one of {', '.join(KINDS)}, got {row[k]!r}")
        return kind

    def checkpoint(self, line: int, row: list[str]) -> int:
        k = self.c.checkpoint
        if k is None or not row[k].strip():
            return 0
        try:
            ckpt = int(row[k])
        except ValueError:
            ckpt = -1
        if ckpt < 0:
            raise self.fail(line, f"checkpoint_minutes must be a whole number >= 0, got {row[k]!r}")
        return ckpt


def load_trace(
    path: Path | str,
    interruptible_share: float = 0.5,
    seed: int = 0,
    default_gpu_model: str = "",
) -> list[TraceJob]:
    """Read a trace CSV (see the module docstring). Without an ``interruptible`` column,
    ``interruptible_share`` of the jobs are marked interruptible by a seeded hash of the job id.
    Rows come back sorted by submit time; any bad row raises :class:`TraceError` naming its line."""
    p = Path(path)
    if not 0.0 <= interruptible_share <= 1.0:
        raise TraceError(f"interruptible share must be between 0 and 1, got {interruptible_share}")
    try:
        f = p.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    jobs: list[TraceJob] = []
    with f:
        reader = csv.reader(f)
        try:
            header = [h.strip().lower() for h in next(reader)]
        except StopIteration:
            raise TraceError(f"{p.name} is empty") from None
        rows = _RowReader(_Columns(header, p.name), p.name, interruptible_share, seed, default_gpu_model)
        for line, row in enumerate(reader, start=2):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            jobs.append(rows.job(line, row))
    if not jobs:
        raise TraceError(f"{p.name} holds no jobs")
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


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
    if not out:
        raise TraceError(f"{p.name} holds no lifetimes")
    return Lifetimes({k: tuple(sorted(v)) for k, v in out.items()})
