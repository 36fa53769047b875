"""Slurm as a scheduler kind: the ``[slurm]`` table and its watcher (broker.watchers.registry)."""
from __future__ import annotations

from broker.slurm.settings import SlurmSettings
from broker.watchers.base import SchedulerWatcher
from broker.watchers.registry import SchedulerKind


def build(settings: SlurmSettings) -> SchedulerWatcher:
    """The Slurm watcher with its capabilities (burst hand-off, offload, drain)."""
    from broker.slurm.watcher import SlurmScheduler

    return SlurmScheduler.from_settings(settings)


KIND = SchedulerKind(name="slurm", settings=SlurmSettings, build=build,
                     summary="Slurm through squeue/sinfo/scontrol; bursts through its power saving")
