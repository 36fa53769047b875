"""Slurm: the broker decides WHICH jobs burst, Slurm's power saving runs the nodes.

Two halves, one configuration section (``[slurm]``, :mod:`broker.slurm.settings`):

* **In `broker serve`** (the autoscaler, :func:`broker.slurm.watcher.slurm_source`): a
  :class:`~broker.slurm.watcher.SlurmSourceWatcher` reads the queue (``squeue``/``sinfo``); when
  the autoscaler decides to burst job X, the :class:`~broker.slurm.watcher.SlurmBurstTarget` runs
  ``scontrol update jobid=X partition=<its partitions>,<burst>``. Slurm may now place X on a
  CLOUD node of the burst partition, and powers that node up. A job the autoscaler holds (a
  scheduling-bound queue) is never given the burst partition.
* **In Slurm's power-saving programs** (``broker slurm resume|suspend|resume-fail HOSTLIST``,
  :mod:`broker.slurm.programs`): launch and release the leases of the CLOUD nodes Slurm powers up
  and down.

The modules, in the order the data flows:

- :mod:`~broker.slurm.records` — the job record, small value parsers, the job hints;
- :mod:`~broker.slurm.parse` — ``squeue``/``sinfo``/``scontrol show job`` output → records;
- :mod:`~broker.slurm.commands` — the ONE command runner and ``scontrol``'s calls;
- :mod:`~broker.slurm.watcher` — the watcher and the burst target (the in-server half);
- :mod:`~broker.slurm.groups` — resume file, grouping by job, shapes, demand, idempotency keys;
- :mod:`~broker.slurm.programs` — resume, suspend, resume-fail and their file log.

Submodules are imported where they are used, so the CLI starts without loading them.
"""
