"""Reading a job trace: a CSV with one row per job, from a cleaned file or a public cluster trace.

Columns are found by name through :data:`ALIASES` (the first alias present wins) or an explicit
``columns`` mapping (``--columns submit=creation_time,gpus=num_gpu``):

=============== ================================================================================
field           header names tried, in order
=============== ================================================================================
job_id          job_id, jobid, job_name, name, id, uid
submit          submit_time_s, submit_time, submit, submitted, creation_time, create_time
gpus            num_gpus, num_gpu, gpu_num, gpus, gpu_count, gpu_request
duration        duration_s, duration, run_time, runtime, elapsed
start           start_time, start, scheduled_time, started
end             end_time, end, finish_time, deletion_time, finished
gpu_milli       gpu_milli (thousandths of a GPU per GPU asked, for fractional GPU shares)
queue           vc, partition, queue
interruptible   interruptible
gpu_model       gpu_model, gpu, gpu_type, gpu_spec
data_gb         data_gb, data_in_gb, dataset_gb
kind            kind
checkpoint      checkpoint_minutes
job_class       class, job_class, qos, priority, job_type, queue, partition (the class label,
                matched with :func:`policies.classes.classify`)
runtime_known   runtime_known (false: the policy sees no runtime, only the job's class)
=============== ================================================================================

``job_id``, ``submit`` and ``gpus`` are required, and ``duration`` or ``start`` and ``end``.
Times are seconds (any origin) or ISO 8601 timestamps (UTC unless they say otherwise). A missing
duration is ``end - start``.

A column found by the name ``queue`` may be a time, not a name: in the Helios job traces
(``cluster_log.csv``) it is the seconds the job waited, the original scheduler's outcome. A
number there is neither a queue nor a class label (nor, through the label, a priority), so no
replay is handed how long the job waited; ``vc`` and ``partition`` are tried before it.

Real traces hold rows that are not GPU jobs. Unless ``strict``, these are skipped and counted by
reason (:data:`SKIP_REASONS`): ``no_gpus`` (CPU-only, 0 GPUs), ``never_ran`` (no start time),
``no_duration`` (neither a duration nor an end and not running at the trace's end) and, with
``fractional="skip"``, ``fractional`` (a share of a GPU; by default it rounds up to whole GPUs).
A job that started but has no end was still running when the trace ended: it is replayed up to
the trace's last timestamp and flagged ``censored``. ``strict`` refuses any such row instead,
naming its line. Rows that are malformed (text where a number belongs, negative times,
repeated ids) are refused in both modes.
"""
from __future__ import annotations

import csv
import hashlib
import math
import struct
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from broker.fields import TEN_YEARS_S, TS_MAX
from broker.simulate.table import KINDS, IdLog, JobTable, TraceJob
from providers.files import lines

FRACTIONAL = ("round-up", "skip")
SKIP_REASONS = ("no_gpus", "fractional", "never_ran", "no_duration")

ALIASES: dict[str, tuple[str, ...]] = {
    "job_id": ("job_id", "jobid", "job_name", "name", "id", "uid"),
    "submit": ("submit_time_s", "submit_time", "submit", "submitted", "creation_time", "create_time"),
    "gpus": ("num_gpus", "num_gpu", "gpu_num", "gpus", "gpu_count", "gpu_request"),
    "duration": ("duration_s", "duration", "run_time", "runtime", "elapsed"),
    "start": ("start_time", "start", "scheduled_time", "started"),
    "end": ("end_time", "end", "finish_time", "deletion_time", "finished"),
    "gpu_milli": ("gpu_milli",),
    "queue": ("vc", "partition", "queue"),
    "interruptible": ("interruptible",),
    "gpu_model": ("gpu_model", "gpu", "gpu_type", "gpu_spec"),
    "data_gb": ("data_gb", "data_in_gb", "dataset_gb"),
    "kind": ("kind",),
    "checkpoint": ("checkpoint_minutes",),
    "job_class": ("class", "job_class", "qos", "priority", "job_type", "queue", "partition"),
    "runtime_known": ("runtime_known",),
}
_REQUIRED = ("job_id", "submit", "gpus")
MAX_TIME_S = TS_MAX  # 9999-12-31T23:59:59Z, as a protobuf Timestamp
YEAR_S = 365 * 24 * 3600
MAX_SPAN_S = TEN_YEARS_S  # a job's duration, and the trace's first to last submission
MAX_JOB_GPUS = 1_000_000  # as `broker quote --gpu`
_EMPTY = {"", "none", "null", "nan", "na", "n/a", "unknown", "-"}


class TraceError(ValueError):
    """A trace or lifetimes file is unusable; the message names the file and line."""


def unreadable(p: Path, lines_read: int, e: Exception) -> TraceError:
    """The sentence for a CSV that cannot be read as text: not UTF-8 (a binary file), or a
    field past the csv module's limit (a 200 kB field is no trace). ``lines_read``: the csv
    reader's ``line_num`` when it failed."""
    if isinstance(e, UnicodeDecodeError):  # the line being decoded was not counted yet
        return TraceError(f"{p.name} is not UTF-8 text (near line {lines_read + 1}): give a CSV file")
    line = max(lines_read, 1)
    if "field larger than field limit" in str(e):
        return TraceError(f"{p.name} line {line}: a field is longer than {csv.field_size_limit():,} characters")
    return TraceError(f"{p.name} line {line} is not CSV: {str(e).rstrip('.')}")


@dataclass(frozen=True, slots=True)
class Trace:
    """The jobs to replay, sorted by submit time, and what was left out of the file."""

    path: str
    jobs: Sequence[TraceJob]  # a JobTable when read from a file
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows
    rounded_up: int = 0  # fractional GPU shares rounded up to whole GPUs
    censored: int = 0

    @property
    def span_s(self) -> float:
        if not self.jobs:
            return 0.0
        if isinstance(self.jobs, JobTable):
            return max(1.0, max(map(float.__add__, self.jobs.submit, self.jobs.duration)) - self.jobs.submit[0])
        return max(1.0, max(j.submit_s + j.duration_s for j in self.jobs) - self.jobs[0].submit_s)

    @property
    def gpu_hours(self) -> float:
        if isinstance(self.jobs, JobTable):
            return sum(map(float.__mul__, map(float, self.jobs.gpus), self.jobs.duration)) / 3600.0
        return sum(j.gpus * j.duration_s for j in self.jobs) / 3600.0

    def to_dict(self) -> dict:
        return {"path": self.path, "jobs": len(self.jobs), "skipped": dict(self.skipped),
                "skipped_rows": sum(self.skipped.values()), "fractional_rounded_up": self.rounded_up,
                "censored_jobs": self.censored, "span_s": round(self.span_s, 1),
                "gpu_hours": round(self.gpu_hours, 1)}

    def warning(self) -> str | None:
        """One line for the terminal when rows were skipped, rounded or cut, else None."""
        parts = [f"{n:,} {r.replace('_', ' ')}" for r, n in self.skipped.items() if n]
        extra = []
        if self.rounded_up:
            extra.append(f"{self.rounded_up:,} fractional GPU shares rounded up")
        if self.censored:
            extra.append(f"{self.censored:,} still running at the trace's end replayed up to it")
        if not parts and not extra:
            return None
        head = f"skipped {sum(self.skipped.values()):,} rows ({', '.join(parts)})" if parts else ""
        return "; ".join(x for x in [head, *extra] if x)


def hash_unit(seed: int, key: str) -> float:
    """A number in [0, 1) fixed by (seed, key): the same job draws the same in every policy."""
    h = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return struct.unpack("<Q", h)[0] / 2.0**64


def parse_columns(text: str) -> dict[str, str]:
    """``submit=creation_time,gpus=num_gpu`` -> {"submit": "creation_time", "gpus": "num_gpu"}."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        k, eq, v = item.partition("=")
        k, v = k.strip().lower(), v.strip().lower()
        if not eq or not v:
            raise TraceError(f"--columns takes field=header pairs separated by commas, got {item!r}")
        if k not in ALIASES:
            raise TraceError(f"--columns names an unknown field {k!r}; known: {', '.join(ALIASES)}")
        out[k] = v
    return out


_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}


class _Columns:
    """Where each field sits in a trace row, from the header, the aliases and ``columns``."""

    def __init__(self, header: list[str], name: str, columns: Mapping[str, str]):
        col = {h: i for i, h in enumerate(header)}
        self.at: dict[str, int | None] = {}
        for fld, aliases in ALIASES.items():
            if fld in columns:
                if columns[fld] not in col:
                    raise TraceError(f"{name} has no column {columns[fld]!r} (given for {fld} by --columns)")
                self.at[fld] = col[columns[fld]]
            else:
                self.at[fld] = next((col[a] for a in aliases if a in col), None)
        # found as "queue": a number there is the wait the trace recorded (Helios), not a name
        self.numeric_is_wait = {f for f in ("queue", "job_class") if f not in columns
                                and self.at[f] is not None and header[self.at[f]] == "queue"}
        missing = [f for f in _REQUIRED if self.at[f] is None]
        if self.at["duration"] is None and (self.at["start"] is None or self.at["end"] is None):
            missing.append("duration")
        if missing:
            raise TraceError(f"{name} line 1 lacks column(s) {', '.join(ALIASES[f][0] for f in missing)} "
                             f"(or an alias; map others with --columns)")
        self.width = len(header)


def _time(v: str) -> float | None:
    """Seconds from a number or an ISO 8601 timestamp; None when empty."""
    t = v.strip()
    if t.lower() in _EMPTY:
        return None
    try:
        return float(t)
    except ValueError:
        at = datetime.fromisoformat(t.replace("Z", "+00:00"))
        return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


@dataclass(slots=True)
class _Row:
    """One row's raw fields, read before the trace's end is known."""

    line: int
    job_id: str
    submit: float
    gpus: float
    duration: float | None
    start: float | None
    end: float | None
    has_start: bool
    extra: tuple  # queue, interruptible, gpu_model, data_gb, kind, checkpoint, job_class, runtime_known


def out_of_range(submit: float | None, start: float | None, end: float | None, gpus: float,
                 dur: float | None) -> tuple[str, str] | None:
    """(the field, the rule it breaks) for the first of a row's numbers outside any real
    range, or None."""
    if submit is None or not (math.isfinite(submit) and 0 <= submit <= MAX_TIME_S):
        return "submit", f"submit_time_s must be zero or positive, before the year 10000 ({MAX_TIME_S:,} s)"
    for fld, v in (("start", start), ("end", end)):
        if v is not None and not (math.isfinite(v) and abs(v) <= MAX_TIME_S):
            return fld, f"{fld}_time must be a time before the year 10000 ({MAX_TIME_S:,} s)"
    if not (math.isfinite(gpus) and 0 <= gpus <= MAX_JOB_GPUS):
        return "gpus", f"num_gpus must be zero or positive, at most {MAX_JOB_GPUS:,}"
    if dur is not None and not (math.isfinite(dur) and 0 <= dur <= MAX_SPAN_S):
        return "duration", f"duration_s must be zero or positive, at most ten years ({MAX_SPAN_S:,} s)"
    return None


class _Reader:
    def __init__(self, cols: _Columns, name: str, opts: dict):
        self.c = cols.at
        self.wait_cols = cols.numeric_is_wait
        self.width = cols.width
        self.name = name
        self.o = opts
        self.ids = IdLog()  # every row's id, to refuse a repeated one (first_repeat)
        self.rounded = 0  # fractional shares rounded up, among the jobs kept

    def refuse_repeat(self) -> None:
        """Raise for the earliest row so far whose job id an earlier row had (as the row is
        read: before any later line's error or any strict refusal)."""
        rep = self.ids.first_repeat()
        if rep is not None:
            raise self.fail(rep[0], f"job_id {rep[1]} appears twice")

    def fail(self, line: int, what: str) -> TraceError:
        return TraceError(f"{self.name} line {line}: {what}")

    def get(self, row: list[str], fld: str) -> str:
        k = self.c[fld]
        return row[k].strip() if k is not None else ""

    def raw(self, line: int, row: list[str]) -> _Row:
        if len(row) != self.width:
            raise self.fail(line, f"{len(row)} fields, the header has {self.width}")
        jid = self.get(row, "job_id")
        if not jid:
            raise self.fail(line, "job_id is empty")
        self.ids.add(jid, line)
        try:
            submit, start, end = (_time(self.get(row, f)) for f in ("submit", "start", "end"))
            g = self.get(row, "gpus")
            gpus = 0.0 if g.lower() in _EMPTY else float(g)
            d = self.get(row, "duration")
            dur = None if d.lower() in _EMPTY else float(d)
            milli = self.get(row, "gpu_milli")
            if milli and milli.lower() not in _EMPTY and float(milli) < 1000:
                gpus *= float(milli) / 1000.0
        except ValueError:
            raise self.fail(line, "submit_time_s, num_gpus and duration_s must be numbers (times may be timestamps), got "
                            + ", ".join(repr(self.get(row, f)) for f in ("submit", "gpus", "duration"))) from None
        what = out_of_range(submit, start, end, gpus, dur)
        if what:
            fld, said = what
            raise self.fail(line, f"{said}, got {self.get(row, fld)!r}")
        extra = tuple(sys.intern(x) if type(x) is str else x  # queues and models repeat: one copy
                      for x in self.extra(line, row, jid))
        return _Row(line, jid, submit, gpus, dur, start, end, self.c["start"] is not None, extra)

    def extra(self, line: int, row: list[str], jid: str) -> tuple:
        return (self.name_of(row, "queue"), self.interruptible(line, row, jid),
                self.get(row, "gpu_model").upper() or self.o["model"], self.data_gb(line, row),
                self.kind(line, row), self.checkpoint(line, row), self.name_of(row, "job_class")[:64],
                self.runtime_known(line, row))

    def name_of(self, row: list[str], fld: str) -> str:
        v = self.get(row, fld)
        if v and fld in self.wait_cols:
            try:
                float(v)
                return ""
            except ValueError:
                pass
        return v

    def runtime_known(self, line: int, row: list[str]) -> bool:
        v = self.get(row, "runtime_known").lower()
        if v in _TRUE or not v:
            return True
        if v in _FALSE:
            return False
        raise self.fail(line, f"runtime_known must be true or false, got {v!r}")

    def interruptible(self, line: int, row: list[str], jid: str) -> bool:
        if self.c["interruptible"] is None:
            return hash_unit(self.o["seed"], jid) < self.o["share"]
        v = self.get(row, "interruptible").lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise self.fail(line, f"interruptible must be true or false, got {v!r}")

    def data_gb(self, line: int, row: list[str]) -> float:
        v = self.get(row, "data_gb")
        if not v:
            return 0.0
        try:
            data = float(v)
        except ValueError:
            data = -1.0
        if not (math.isfinite(data) and data >= 0):
            raise self.fail(line, f"data_gb must be zero or positive, got {v!r}")
        return data

    def kind(self, line: int, row: list[str]) -> str:
        v = self.get(row, "kind").lower()
        if not v:
            return "training"
        if v not in KINDS:
            raise self.fail(line, f"kind must be one of {', '.join(KINDS)}, got {v!r}")
        return v

    def checkpoint(self, line: int, row: list[str]) -> int:
        v = self.get(row, "checkpoint")
        if not v:
            return 0
        try:
            ckpt = int(v)
        except ValueError:
            ckpt = -1
        if ckpt < 0:
            raise self.fail(line, f"checkpoint_minutes must be a whole number >= 0, got {v!r}")
        return ckpt

    def job(self, r: _Row, trace_end: float) -> TraceJob | str:
        """The job to replay, or the reason the row is skipped (refused when strict)."""
        strict = self.o["strict"]
        if r.gpus <= 0:
            if strict:
                raise self.fail(r.line, "num_gpus must be a whole number of at least 1, got 0")
            return "no_gpus"
        gpus = r.gpus
        if gpus != int(gpus):
            if strict:
                raise self.fail(r.line, f"num_gpus must be a whole number of at least 1, got {gpus:g}")
            if self.o["fractional"] == "skip":
                return "fractional"
            gpus = math.ceil(gpus)
        if r.has_start and r.start is None:
            if strict:
                raise self.fail(r.line, "the job never started (no start time)")
            return "never_ran"
        rounded, dur, censored = gpus != r.gpus, r.duration, False
        if dur is None and r.start is not None:
            if r.end is not None:
                dur = max(0.0, r.end - r.start)
            else:
                dur, censored = max(0.0, trace_end - r.start), True
        if dur is None:
            if strict:
                raise self.fail(r.line, "duration_s is empty and there is no start and end to compute it")
            return "no_duration"
        if dur > MAX_SPAN_S:  # from start and end
            raise self.fail(r.line, f"the job ran {dur / YEAR_S:,.0f} years (start to end), more than ten")
        if censored and strict:
            raise self.fail(r.line, "the job was still running when the trace ended (no end time)")
        self.rounded += rounded
        return TraceJob(r.job_id, r.submit, int(gpus), dur, *r.extra, censored=censored)


def read_trace(
    path: Path | str,
    interruptible_share: float = 0.5,
    seed: int = 0,
    default_gpu_model: str = "",
    *,
    strict: bool = False,
    fractional: str = "round-up",
    columns: Mapping[str, str] | None = None,
) -> Trace:
    """Read a trace CSV (see the module docstring). Without an ``interruptible`` column,
    ``interruptible_share`` of the jobs are marked interruptible by a seeded hash of the job id."""
    p = Path(path)
    if not 0.0 <= interruptible_share <= 1.0:
        raise TraceError(f"interruptible share must be between 0 and 1, got {interruptible_share}")
    if fractional not in FRACTIONAL:
        raise TraceError(f"fractional GPUs must be one of {', '.join(FRACTIONAL)}, got {fractional!r}")
    try:
        f = p.open(newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror or e}") from None
    rd: _Reader | None = None
    with f:
        reader = csv.reader(lines(f))
        try:
            header = [h.strip().lower() for h in next(reader)]
            rd = _Reader(_Columns(header, p.name, columns or {}), p.name,
                         {"share": interruptible_share, "seed": seed, "model": default_gpu_model.upper(),
                          "strict": strict, "fractional": fractional})
            jobs, skipped, later, failed, rows, trace_end = JobTable(), dict.fromkeys(SKIP_REASONS, 0), [], None, 0, 0.0
            for line, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                r = rd.raw(line, row)
                rows += 1
                trace_end = max(trace_end, _last_time(r))
                if r.duration is None and r.start is not None and r.end is None:
                    later.append(r)  # still running at the end: its duration waits for the trace's end
                elif failed is None:
                    failed = _keep(rd, r, 0.0, jobs, skipped)
        except StopIteration:
            raise TraceError(f"{p.name} is empty") from None
        except (UnicodeDecodeError, csv.Error) as e:
            if rd is not None:
                rd.refuse_repeat()
            raise unreadable(p, reader.line_num, e) from None
        except OSError as e:  # a line past providers.files.LINE_CHARS, or the disk
            raise TraceError(f"{p.name}: {e.strerror or e}") from None
        except TraceError:
            if rd is not None:
                rd.refuse_repeat()  # a repeated id on an earlier line (or this one) is refused first
            raise
    assert rd is not None
    rd.refuse_repeat()
    # one pass: a row is a job as soon as it is read, except those waiting for the trace's end;
    # a strict refusal is raised after every row was read, the earliest line first, as before
    for r in later:
        if failed is not None and failed.line < r.line:
            break
        failed = _keep(rd, r, trace_end, jobs, skipped) or failed
    if failed is not None:
        raise failed.error
    if not jobs:
        raise TraceError(f"{p.name} holds no jobs" + (f" (skipped {sum(skipped.values())} rows)" if rows else ""))
    jobs.sort_by_submit()
    span = jobs.submit[-1] - jobs.submit[0]
    if span > MAX_SPAN_S:  # a replay samples its whole span: the years between would never end
        raise TraceError(f"{p.name} spans {span / YEAR_S:,.0f} years from its first submission to its last, "
                         f"more than ten (a trace gives its times in seconds or as timestamps)")
    return Trace(str(p), jobs, {k: v for k, v in skipped.items() if v}, rd.rounded, sum(jobs.censored))


@dataclass(frozen=True, slots=True)
class _Refusal:
    line: int
    error: TraceError


def _keep(rd: _Reader, r: _Row, trace_end: float, jobs: JobTable, skipped: dict) -> _Refusal | None:
    """Add row ``r``'s job to ``jobs`` (or count why it is skipped); a strict refusal is returned."""
    try:
        j = rd.job(r, trace_end)
    except TraceError as e:
        return _Refusal(r.line, e)
    if isinstance(j, str):
        skipped[j] += 1
    else:
        jobs.add_job(j)
    return None


def _last_time(r: _Row) -> float:
    """The latest moment a row shows the trace was still being recorded."""
    ts = [r.submit, r.start, r.end]
    if r.start is not None and r.duration is not None:
        ts.append(r.start + r.duration)
    return max(t for t in ts if t is not None)


def load_trace(
    path: Path | str,
    interruptible_share: float = 0.5,
    seed: int = 0,
    default_gpu_model: str = "",
    **kw,
) -> list[TraceJob]:
    """The jobs of :func:`read_trace`, sorted by submit time."""
    return read_trace(path, interruptible_share, seed, default_gpu_model, **kw).jobs
