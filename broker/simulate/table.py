"""A trace's jobs: one as an object (:class:`TraceJob`), many as columns (:class:`JobTable`).

:class:`JobTable` holds each field of :class:`TraceJob` in a typed array
(``array.array``: a double is 8 bytes, not a 24-byte float object and an 8-byte pointer), the
job ids in one byte string, and queue, GPU model and class labels as codes into one list of the
distinct strings. It is a ``Sequence[TraceJob]``: ``table[i]`` builds the job on demand, so
code that reads a few jobs reads them as before, while the replay reads the columns.
"""
from __future__ import annotations

import copy
from array import array
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence, overload

import numpy as np

KINDS = ("training", "tuning", "eval", "inference")


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
    job_class: str = ""  # the class label (policies.classes), "" = none
    runtime_known: bool = True  # False: the policy sees no runtime (the replay still runs it)
    censored: bool = False  # still running when the trace ended: replayed up to its end


_KIND_CODE = {k: n for n, k in enumerate(KINDS)}


class JobTable(Sequence[TraceJob]):
    """Jobs, one index per job, one typed array per field (see the module docstring)."""

    def __init__(self) -> None:
        self.submit = array("d")
        self.duration = array("d")
        self.gpus = array("q")
        self.data_gb = array("d")
        self.checkpoint = array("q")
        self.interruptible = array("b")
        self.runtime_known = array("b")
        self.censored = array("b")
        self.kind = array("b")
        self.queue = array("i")  # codes into strings
        self.model = array("i")
        self.job_class = array("i")
        self.strings: list[str] = []
        self._code: dict[str, int] = {}
        self._ids = bytearray()  # the job ids, UTF-8, end to end
        self._id_end = array("q")  # where each id ends in _ids, in the order added
        self._id_at: array | None = None  # job -> its id's position, once reordered

    # -- building -------------------------------------------------------------------------

    def code(self, s: str) -> int:
        c = self._code.get(s)
        if c is None:
            c = self._code[s] = len(self.strings)
            self.strings.append(s)
        return c

    def add(self, job_id: str, submit_s: float, gpus: int, duration_s: float, queue: str = "",
            interruptible: bool = False, gpu_model: str = "", data_gb: float = 0.0, kind: str = "training",
            checkpoint_minutes: int = 0, job_class: str = "", runtime_known: bool = True,
            censored: bool = False) -> None:
        """Append one job (the fields of :class:`TraceJob`, in its order)."""
        self._ids += job_id.encode()
        self._id_end.append(len(self._ids))
        self.submit.append(submit_s)
        self.gpus.append(gpus)
        self.duration.append(duration_s)
        self.queue.append(self.code(queue))
        self.interruptible.append(interruptible)
        self.model.append(self.code(gpu_model))
        self.data_gb.append(data_gb)
        self.kind.append(_KIND_CODE[kind])
        self.checkpoint.append(checkpoint_minutes)
        self.job_class.append(self.code(job_class))
        self.runtime_known.append(runtime_known)
        self.censored.append(censored)

    def add_job(self, j: TraceJob) -> None:
        self.add(j.job_id, j.submit_s, j.gpus, j.duration_s, j.queue, j.interruptible, j.gpu_model, j.data_gb,
                 j.kind, j.checkpoint_minutes, j.job_class, j.runtime_known, j.censored)

    @classmethod
    def of(cls, jobs: Iterable[TraceJob]) -> JobTable:
        """``jobs`` as a table (a table is returned as it is)."""
        if isinstance(jobs, JobTable):
            return jobs
        t = cls()
        for j in jobs:
            t.add_job(j)
        return t

    _COLUMNS = ("submit", "duration", "gpus", "data_gb", "checkpoint", "interruptible", "runtime_known",
                "censored", "kind", "queue", "model", "job_class")

    def sort_by_submit(self) -> None:
        """Reorder the jobs by submit time, stably (as ``list.sort`` by submit time)."""
        order = np.argsort(np.frombuffer(self.submit, dtype=np.float64), kind="stable")
        if np.all(order[1:] > order[:-1]):
            return
        for name in self._COLUMNS:
            col = getattr(self, name)
            a = np.frombuffer(col, dtype=np.dtype(col.typecode))[order]
            setattr(self, name, array(col.typecode, a.tobytes()))
        at = order if self._id_at is None else np.frombuffer(self._id_at, dtype=np.int64)[order]
        self._id_at = array("q", at.astype(np.int64).tobytes())

    def with_interruptible(self, col: array) -> JobTable:
        """The same jobs (columns shared) with the interruptible column ``col`` instead."""
        t = copy.copy(self)
        t.interruptible = col
        return t

    # -- reading --------------------------------------------------------------------------

    def job_id(self, i: int) -> str:
        k = i if self._id_at is None else self._id_at[i]
        return self._ids[self._id_end[k - 1] if k else 0:self._id_end[k]].decode()

    def __len__(self) -> int:
        return len(self.submit)

    @overload
    def __getitem__(self, i: int) -> TraceJob: ...

    @overload
    def __getitem__(self, i: slice) -> list[TraceJob]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self.submit)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("job index out of range")
        s = self.strings
        return TraceJob(self.job_id(i), self.submit[i], self.gpus[i], self.duration[i], s[self.queue[i]],
                        bool(self.interruptible[i]), s[self.model[i]], self.data_gb[i], KINDS[self.kind[i]],
                        self.checkpoint[i], s[self.job_class[i]], bool(self.runtime_known[i]),
                        bool(self.censored[i]))

    def __iter__(self) -> Iterator[TraceJob]:
        return (self[i] for i in range(len(self.submit)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JobTable({len(self):,} jobs)"


class IdLog:
    """Every row's job id and line, compactly, to find a repeated id without a set of strings:
    a 64-bit hash per row, the ids end to end in one byte string for the hashes that collide."""

    def __init__(self) -> None:
        self.hashes = array("q")
        self.lines = array("q")
        self._ids = bytearray()
        self._end = array("q")

    def add(self, job_id: str, line: int) -> None:
        self.hashes.append(hash(job_id))
        self.lines.append(line)
        self._ids += job_id.encode()
        self._end.append(len(self._ids))

    def _id(self, k: int) -> str:
        return self._ids[self._end[k - 1] if k else 0:self._end[k]].decode()

    def first_repeat(self) -> tuple[int, str] | None:
        """(line, id) of the earliest row whose id an earlier row had, or None."""
        h = np.frombuffer(self.hashes, dtype=np.int64)
        if len(h) < 2:
            return None
        order = np.argsort(h, kind="stable")
        hs = h[order]
        same = np.flatnonzero(hs[1:] == hs[:-1])
        if not len(same):
            return None
        best: tuple[int, str] | None = None
        for v in np.unique(hs[same]):  # the rows of each colliding hash, by string
            seen: set[str] = set()
            for k in sorted(order[np.searchsorted(hs, v, "left"):np.searchsorted(hs, v, "right")].tolist()):
                jid = self._id(k)
                if jid in seen:
                    if best is None or self.lines[k] < best[0]:
                        best = (self.lines[k], jid)
                    break
                seen.add(jid)
        return best
