"""One interface for the schedulers the broker watches (Slurm, Kubernetes/Kueue, ...).

A scheduler is a **watcher**: an object that reads the scheduler's queue and nodes into a
:class:`policies.queue.QueueSnapshot`. Everything else a scheduler can do for the broker is an
optional **capability**, a small protocol the watcher implements or not; the core (the
autoscaler, the interruption notices) asks for a capability with :func:`capability` and acts
without it when the scheduler lacks it. The core never names a scheduler: it iterates the
watchers the registry (:mod:`broker.watchers.registry`) builds from the configuration.

=====================  =====================================================================
protocol               what the core does with it
=====================  =====================================================================
SchedulerWatcher       ``snapshot(now)`` each autoscaler tick; ``source`` names the snapshots
                       and decisions (e.g. ``slurm:prod``). Required.
BurstHandoff           ``allow_burst(job_ids)``: the scheduler places the chosen jobs on cloud
                       capacity itself (Slurm: the burst partition; its power saving launches
                       the nodes). Without it the autoscaler launches one lease per chosen job.
OffloadJobs            ``offload(job_ids)`` moves the tuning/eval/inference jobs that block
                       training to ``offload_queue`` (a partition, a queue) before anything
                       bursts. Without it, or with ``offload_queue == ""``, the diagnosis only
                       names them.
DrainNodes             ``drain_and_requeue(nodes, reason)`` when a cloud warns it will take
                       an instance: no new work on the nodes, their jobs requeued. Raises
                       :class:`UnknownNodes` when the nodes are not this scheduler's (the
                       notice then goes to the next scheduler).
JoinNodes              ``join_spec(job)``: how a lease the autoscaler launches for ``job``
                       joins the cluster (its boot template, e.g. ``kubernetes``).
Stoppable              ``stop()``: the watcher runs threads or holds connections of its own
                       (a watch stream); the service stops it when it stops.
=====================  =====================================================================

Errors are typed: an action that fails raises :class:`SchedulerError` (or a subclass) whose
message is one sentence naming every job or node it could not handle; :class:`HandoffError` for
a burst or offload that failed for some jobs (the others are done), :class:`UnknownNodes` for
nodes a scheduler does not know. A watcher whose queue cannot be read raises anything; the
autoscaler logs it and reads the other sources.

Adding a scheduler (e.g. ``broker/kubernetes/``)
------------------------------------------------
1. Its settings: a :class:`providers.settings.Table` with ``enabled: bool = False`` and its own
   keys, checked in ``__post_init__`` (``raise bad("key", "sentence")``). It becomes the
   top-level ``[<name>]`` table of the configuration; document every key in
   ``deploy/broker.example.toml`` (tests/test_config.py checks).
2. Its watcher: a class with ``source`` and ``snapshot(now) -> QueueSnapshot``, plus the
   capability methods it supports (above). Keep the client library's import inside the watcher
   module, not in the kind module, so the CLI and ``broker serve`` start without it.
3. Its kind: in ``broker/<name>/kind.py`` (``check``, optional, is for what spans tables:
   it gets the kind's settings and the whole configuration of an enabled kind, and raises
   ``ValueError("key sentence")`` with ``key`` in its own table)::

       from broker.watchers.registry import SchedulerKind
       from broker.<name>.settings import FooSettings

       def build(settings: FooSettings) -> SchedulerWatcher:
           from broker.<name>.watcher import FooWatcher   # imported only when enabled
           return FooWatcher.from_settings(settings)

       KIND = SchedulerKind(name="<name>", settings=FooSettings, build=build,
                            summary="one line for the docs", check=None)

4. One line in :data:`broker.watchers.registry.KIND_MODULES`: ``"broker.<name>.kind"``.

``[<name>] enabled = true`` then makes the service build the watcher, and the autoscaler read
it every ``[autoscaler] interval_s``; tests/test_watchers.py checks every registered kind (a
table with ``enabled``, a name that is no core table, a build that returns a watcher).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from policies.queue import PendingJob, QueueSnapshot

__all__ = ["SchedulerWatcher", "BurstHandoff", "OffloadJobs", "DrainNodes", "JoinNodes", "JoinSpec", "Stoppable",
           "SchedulerError", "HandoffError", "UnknownNodes", "Unsupported", "capability"]


# ---------------------------------------------------------------------------------------------
# errors
class SchedulerError(RuntimeError):
    """A scheduler action failed; the message is one sentence naming what and why."""


class HandoffError(SchedulerError):
    """A burst hand-off or an offload failed for some jobs (the others were done). ``failures``
    holds (job id, why) for each; the message names them all."""

    def __init__(self, message: str, failures: Sequence[tuple[str, str]] = ()) -> None:
        self.failures = tuple(failures)
        super().__init__(message)

    @classmethod
    def of(cls, failures: Sequence[tuple[str, str]]) -> "HandoffError":
        return cls("; ".join(f"job {job}: {why}" for job, why in failures), failures)


class UnknownNodes(SchedulerError):
    """None of the nodes asked about is this scheduler's."""


class Unsupported(SchedulerError):
    """The scheduler does not offer the capability asked for."""


# ---------------------------------------------------------------------------------------------
# the watcher and its capabilities
@runtime_checkable
class SchedulerWatcher(Protocol):
    """Reads a scheduler's queue. ``source`` names its snapshots and the decisions on them."""

    source: str

    def snapshot(self, now: float) -> QueueSnapshot: ...


@runtime_checkable
class BurstHandoff(Protocol):
    """The scheduler itself puts the chosen pending jobs on cloud capacity."""

    def allow_burst(self, job_ids: list[str]) -> None:
        """Hand each job over; idempotent; raises :class:`HandoffError` naming the jobs it could
        not hand over (a job no longer pending is skipped, not an error)."""
        ...


@runtime_checkable
class OffloadJobs(Protocol):
    """The scheduler moves jobs to another partition or queue (``""``: none configured)."""

    offload_queue: str

    def offload(self, job_ids: list[str]) -> list[str]:
        """Move each still-pending job to ``offload_queue``; returns the ids moved. Raises
        :class:`HandoffError` naming every job that could not be moved (the others are)."""
        ...


@runtime_checkable
class DrainNodes(Protocol):
    """The scheduler takes nodes out of service ahead of a cloud interruption."""

    def drain_and_requeue(self, nodes: Sequence[str], reason: str) -> list[str]:
        """Drain ``nodes`` and requeue the jobs running on them; returns the requeued job ids.
        Raises :class:`UnknownNodes` when none of ``nodes`` is this scheduler's."""
        ...


@dataclass(frozen=True)
class JoinSpec:
    """How a cloud node launched for a job joins the scheduler's cluster."""

    bootstrap: str = ""  # boot template (providers.bootstrap), "" = none
    env: Mapping[str, str] = field(default_factory=dict)  # added to the job's environment


@runtime_checkable
class JoinNodes(Protocol):
    """Leases the autoscaler launches for this scheduler's jobs boot into its cluster."""

    def join_spec(self, job: PendingJob) -> JoinSpec: ...


@runtime_checkable
class Stoppable(Protocol):
    """The watcher runs threads or holds connections; ``stop()`` ends them (idempotent)."""

    def stop(self) -> None: ...


C = TypeVar("C")


def capability(watcher: object, kind: type[C], *, required: bool = False) -> C | None:
    """``watcher`` as the capability ``kind`` (a protocol above), or None when it lacks it
    (:class:`Unsupported` when ``required``)."""
    if isinstance(watcher, kind):
        return watcher
    if required:
        raise Unsupported(f"{getattr(watcher, 'source', type(watcher).__name__)} cannot "
                          f"{kind.__name__} (the scheduler does not offer it)")
    return None
