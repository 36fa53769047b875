"""Managed jobs: the job a lease carries, what its nodes report about it, and what a loss
leaves of it.

A job attached to a lease (at launch or by ``Handoff``) is the broker's to keep alive. Its
nodes report on it (``ReportJob`` over gRPC, or the HTTP callback of :mod:`broker.callback`)
with the lease's own callback credential: ``brl_`` and 256 random bits, minted for every boot
script rendered, kept in the store only as its SHA-256 digest (``lease_credentials``), good for
that lease's job reports and nothing else, revoked in the very write that ends the lease.

The job's record (:class:`broker.records.Job`) lives in the lease's ``job`` column with its state mirrored in the lease's
``job_state`` column, so a reconciler pass tells a lease whose job ended (released within that
pass) or still runs (never killed by the lease's lifetime or a budget without a requeue) from
the row alone. What the record holds beyond the hand-off's fields:

- ``state``, ``exit_code``, ``progress`` (0..1), ``reported_at``: the latest report;
- ``checkpoint_uri``, ``checkpoint_at``, ``work_done_s``: the latest checkpoint and the work it
  saved (``progress`` × the demand's hours when the report gives progress, else the time the job
  ran on its leases up to the checkpoint);
- ``restarts``, ``max_restarts``: how often it was requeued, and the most it may be;
- ``base_done_s``: the work saved when it came to this lease (a replacement's starting point);
- ``total_hours``: the whole job's hours (a replacement's demand asks only for what is left).

On a loss the job is requeued from its last checkpoint on a replacement quoted for the work left
(``hours`` minus ``work_done_s``); past ``max_restarts`` it is failed. Slurm leases (the job
names the scheduler's cloud nodes) keep Slurm's own path: reports are recorded, Slurm requeues.
"""
from __future__ import annotations

import enum
import hashlib
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from sqlalchemy import insert, select

from broker.errors import FailedPrecondition, InvalidArgument
from broker.lease import LIVE, EventKind, Lease
from broker.records import Job
from broker.store import LeaseCredentialRecord, StaleLease, Store

CREDENTIAL_PREFIX = "brl_"
MAX_JOB_ID = 256
MAX_URI = 2048
#: The least a replacement is quoted for, however much of the job its checkpoints saved.
MIN_HOURS_LEFT = 0.05


class JobState(enum.StrEnum):
    """A job's state as its nodes report it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: A job in one of these has ended: its lease is released within one reconciler pass.
ENDED_JOB = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Action(enum.StrEnum):
    """What a report's answer tells the node to do next."""

    CONTINUE = "continue"
    CHECKPOINT = "checkpoint"  # the lease's end is near (lifetime, budget, notice): save now
    STOP = "stop"  # the job has ended, or the lease is going away


def managed(job: Job) -> bool:
    """Is this a job the broker keeps alive (not a Slurm hand-off, which Slurm requeues)?"""
    return bool(job.job_id) and not job.node_names


def job_state_of(job: Job) -> str:
    """The ``job_state`` column for a lease carrying ``job``."""
    if not managed(job):
        return ""
    return str(job.state or JobState.RUNNING)


def running(lease: Any) -> bool:
    """Does ``lease`` (a Lease or a pass row) carry a managed job that has not ended?"""
    return getattr(lease, "job_state", "") == JobState.RUNNING


# -- credentials ---------------------------------------------------------------------------------

def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class LeaseCredentials:
    """Per-lease callback credentials in the store (only digests)."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock

    def mint(self, lease_id: str) -> str:
        """A new credential for ``lease_id``'s nodes; the only time it exists outside them."""
        token = CREDENTIAL_PREFIX + secrets.token_urlsafe(32)
        with self.store.engine.begin() as conn:
            conn.execute(insert(LeaseCredentialRecord.__table__).values(
                digest=_digest(token), lease_id=lease_id, created_at=self.clock(), revoked_at=None))
        return token

    def lease_of(self, token: str) -> str | None:
        """The lease a presented credential is for, or None (unknown, revoked, or not one)."""
        if not token.startswith(CREDENTIAL_PREFIX) or len(token) > 128:
            return None
        t = LeaseCredentialRecord.__table__
        with self.store.engine.connect() as conn:
            row = conn.execute(select(t.c.lease_id, t.c.revoked_at).where(t.c.digest == _digest(token))).first()
        if row is None or row.revoked_at is not None:
            return None
        return row.lease_id


# -- reports -------------------------------------------------------------------------------------

def _text(value: Any, name: str, limit: int, required: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string.", field=name)
    if required and not value.strip():
        raise InvalidArgument(f"{name} is required.", field=name)
    if len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"{name} must be one line of at most {limit} characters.", field=name)
    return value


@dataclass(frozen=True)
class JobReport:
    """One report about a lease's job, checked (:meth:`checked`) before anything is looked up."""

    lease_id: str
    job_id: str
    state: str
    exit_code: int | None = None
    checkpoint_uri: str = ""
    progress: float | None = None

    def checked(self) -> "JobReport":
        """This report, or InvalidArgument naming the first bad field."""
        _text(self.lease_id, "lease_id", 128, required=True)
        _text(self.job_id, "job_id", MAX_JOB_ID, required=True)
        _text(self.checkpoint_uri, "checkpoint_uri", MAX_URI)
        if not isinstance(self.state, str) or self.state not in set(JobState):
            raise InvalidArgument(f"state must be running, succeeded, failed or cancelled, got {str(self.state)[:32]!r}.",
                                  field="state")
        if self.exit_code is not None and (isinstance(self.exit_code, bool) or not isinstance(self.exit_code, int)
                                           or not -2**31 <= self.exit_code < 2**31):
            raise InvalidArgument("exit_code must be a whole number (a process exit status).", field="exit_code")
        if self.progress is not None and (isinstance(self.progress, bool) or not isinstance(self.progress, (int, float))
                                          or not math.isfinite(self.progress) or not 0 <= self.progress <= 1):
            raise InvalidArgument("progress must be a fraction from 0 to 1.", field="progress")
        return self


def _sentence(job_id: str, state: str, exit_code: int | None) -> str:
    code = "" if exit_code is None else f" (exit code {exit_code})"
    return f"job {job_id} {state}{code}"


def apply_report(store: Store, lease: Lease, r: JobReport, now: float) -> tuple[Lease, Action]:
    """Record ``r`` on ``lease`` (read by the caller, who checked who may report on it): the
    job's state, and a checkpoint when it names one. A repeated report changes nothing."""
    for _ in range(5):
        if lease.state not in LIVE:
            raise FailedPrecondition(f"lease {lease.lease_id} is {lease.state.value}: it takes no job reports.")
        job = lease.job
        if job.job_id and job.job_id != r.job_id:
            raise FailedPrecondition(f"lease {lease.lease_id} runs job {job.job_id[:64]}, not {r.job_id[:64]}.",
                                     field="job_id")
        was = job.state or (JobState.RUNNING if job.job_id else "")
        if was in ENDED_JOB:
            if was == r.state:
                return lease, Action.STOP
            raise FailedPrecondition(f"job {r.job_id[:64]} already {was}: it cannot become {r.state}.", field="state")
        fields = _reported(lease, job, r, now)
        try:
            lease = store.update_lease(
                lease, now=now, message=_sentence(r.job_id, r.state, r.exit_code), event_kind=EventKind.JOB,
                event_data={"job_id": r.job_id, "state": r.state, "exit_code": r.exit_code,
                            "checkpoint_uri": r.checkpoint_uri, "progress": r.progress}, **fields)
        except StaleLease:
            fresh = store.get_lease(lease.lease_id)
            if fresh is None:
                raise
            lease = fresh
            continue
        return lease, action_for(lease)
    raise StaleLease(f"lease {lease.lease_id} keeps changing; report again.")


def _reported(lease: Lease, job: Job, r: JobReport, now: float) -> dict[str, Any]:
    """The lease's new columns after report ``r`` on ``job``."""
    if not job.job_id:  # reported before any hand-off: the report attaches it
        job = job.with_(job_id=r.job_id, attached_at=now)
    job = job.with_(state=str(r.state), reported_at=now)
    if r.exit_code is not None:
        job = job.with_(exit_code=r.exit_code)
    if r.progress is not None:
        job = job.with_(progress=r.progress)
    if r.checkpoint_uri:
        job = job.with_(checkpoint_uri=r.checkpoint_uri, checkpoint_at=now,
                        work_done_s=work_done_at(lease, job, now, r.progress))
    fields: dict[str, Any] = {"job": job, "job_state": job_state_of(job)}
    if r.state in ENDED_JOB:
        fields["idle_since"] = now
    elif lease.idle_since:
        fields["idle_since"] = 0.0
    return fields


def action_for(lease: Lease) -> Action:
    """What the node is told after a report: stop once the job ended or the lease is going;
    checkpoint once the lease's end was announced (lifetime warning, interruption notice)."""
    if lease.state not in LIVE or lease.job.state in ENDED_JOB:
        return Action.STOP
    if lease.job.checkpoint_requested:
        return Action.CHECKPOINT
    return Action.CONTINUE


# -- work left and requeues ----------------------------------------------------------------------

def run_start(lease: Lease, job: Job) -> float:
    """When the job began running on this lease."""
    return max(lease.started_at or lease.created_at, job.attached_at)


def work_done_at(lease: Lease, job: Job, now: float, progress: float | None = None) -> float:
    """Seconds of the job's work done at ``now`` (on every lease it ran on)."""
    hours = total_hours(lease)
    if progress is not None and hours > 0:
        return progress * hours * 3600.0
    return job.base_done_s + max(0.0, now - run_start(lease, job))


def total_hours(lease: Lease) -> float:
    """The whole job's hours: its first demand's (a replacement's demand is only what was left)."""
    return float(lease.job.total_hours or (lease.demand.hours if lease.demand is not None else 0.0))


def hours_left(lease: Lease) -> float | None:
    """The work left to quote a replacement for: the demand's hours minus what the last
    checkpoint saved (all of it without one). None when the lease had no demand."""
    hours = total_hours(lease)
    if hours <= 0:
        return None
    saved = lease.job.work_done_s / 3600.0
    return max(MIN_HOURS_LEFT, hours - saved)


@dataclass(frozen=True)
class Requeue:
    """What a loss does to a lease's job: requeued onto ``job`` (for the replacement), quoted for
    ``hours`` (None: the lease's own offering), or failed (``failed`` says why)."""

    job: Job
    hours: float | None
    failed: str = ""

    @property
    def sentence_hours(self) -> str:
        return "" if self.hours is None else f"; work left {self.hours:.2f} h"


def plan_requeue(lease: Lease, cause: str, default_max_restarts: int) -> Requeue | None:
    """The requeue of ``lease``'s job after ``cause``, or None when it has no running managed job."""
    job = lease.job
    if not managed(job) or job.state in ENDED_JOB:
        return None
    restarts = job.restarts
    limit = job.max_restarts if job.max_restarts is not None else default_max_restarts
    if restarts >= limit:
        return Requeue(job, None, failed=f"job {job.job_id} failed: {cause} after {restarts} "
                                         f"restart(s), max_restarts {limit}")
    nxt = job.with_(attached_at=0.0, exit_code=None, reported_at=0.0, checkpoint_requested=False,
                    lifetime_warned=False, state=str(JobState.RUNNING), restarts=restarts + 1,
                    max_restarts=limit, base_done_s=job.work_done_s)
    if total_hours(lease) > 0:
        nxt = nxt.with_(total_hours=total_hours(lease))
    return Requeue(nxt, hours_left(lease))
