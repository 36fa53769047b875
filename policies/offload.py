"""Move the offloadable work before bursting training.

When the diagnosis finds tuning, eval or inference jobs waiting for capacity in the training
queue (``offloadable-work``) while training jobs wait too, the first fix is to move those jobs
to where they belong (a partition of their own, MIG slices, cheap inference GPUs), not to buy
cloud GPUs for training. :func:`plan` says which jobs move; the autoscaler moves them (on Slurm:
``scontrol update jobid=... partition=<[slurm] offload_partition>``; a pushed scheduler gets an
``offload`` decision with the job ids) before the burst trigger runs, and the trigger no longer
counts them.

Pure: plain values in, plain values out.
"""
from __future__ import annotations

from dataclasses import dataclass

from policies.causes import CauseKind, Verdict
from policies.diagnose import Diagnosis
from policies.queue import QueueSnapshot

OFFLOADABLE_KINDS = ("tuning", "eval", "inference")
# pending reasons of jobs that are not waiting in the queue at all
NOT_WAITING = ("Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin")


@dataclass(frozen=True, slots=True)
class Offload:
    job_ids: tuple[str, ...]
    gpus: int
    training_jobs: int  # the training jobs they block
    reason: str


def plan(snap: QueueSnapshot, diag: Diagnosis, partition: str = "", already: frozenset[str] = frozenset()
         ) -> Offload | None:
    """The tuning/eval/inference jobs to move off the training queue now, or None.

    Only when the diagnosis names offloadable work or more capacity is wanted (resource-bound,
    mixed), and training jobs wait (for capacity, or behind the
    jobs ahead of them: Slurm's "Priority"); jobs held or waiting on a dependency or a begin
    time stay, as do jobs already in ``partition`` or already moved (``already``).
    """
    if diag.cause(CauseKind.OFFLOADABLE_WORK) is None and diag.verdict not in (Verdict.RESOURCE_BOUND,
                                                                                Verdict.MIXED):
        return None  # a healthy queue, or one whose scheduling is what to fix
    waiting = [j for j in snap.pending if j.pending_reason.split(",")[0] not in NOT_WAITING]
    training = [j for j in waiting if j.kind == "training"]
    if not training:
        return None
    light = [j for j in waiting if j.kind in OFFLOADABLE_KINDS and j.job_id not in already
             and not (partition and partition in j.queue.split(","))]
    if not light:
        return None
    gpus = sum(j.gpus for j in light)
    where = f"partition {partition}" if partition else "a queue of their own"
    n, t = len(light), len(training)
    reason = (f"offload {n} tuning/eval/inference job{'s' if n != 1 else ''} ({gpus} GPU{'s' if gpus != 1 else ''}) "
              f"to {where} before bursting training: {'it waits' if n == 1 else 'they wait'} for capacity in the "
              f"training queue, where {t} training job{'s' if t != 1 else ''} wait{'s' if t == 1 else ''} too")
    return Offload(tuple(j.job_id for j in light), gpus, t, reason)
