"""Slurm as a scheduler kind: the broker decides WHICH jobs burst, Slurm's power saving runs the nodes.

Two halves, one configuration section (``[slurm]``, :mod:`broker.slurm.settings`):

* **In `broker serve`** (this package, registered as a scheduler kind by
  :mod:`broker.slurm.kind`): a :class:`~broker.slurm.watcher.SlurmScheduler` reads the queue
  (``squeue``/``sinfo``) and offers the capabilities of :mod:`broker.watchers.base`. When the
  autoscaler decides to burst job X, its burst hand-off runs ``scontrol update jobid=X
  partition=<its partitions>,<burst>``. Slurm may now place X on a CLOUD node of the burst
  partition, and powers that node up. A job the autoscaler holds (a scheduling-bound queue) is
  never given the burst partition. It also moves light jobs to ``offload_partition`` and, on an
  interruption notice, drains a cloud node and requeues its jobs.
* **On the Slurm controller** (``broker slurm resume|suspend|resume-fail HOSTLIST``, the
  node-side programs in :mod:`broker.slurm_node`): launch and release the leases of the CLOUD
  nodes Slurm powers up and down. They use this package's settings, records and commands; this
  package never imports them.

The modules, in the order the data flows:

- :mod:`~broker.slurm.records` — the job record, small value parsers, the job hints;
- :mod:`~broker.slurm.parse` — ``squeue``/``sinfo``/``scontrol show job`` output → records;
- :mod:`~broker.slurm.commands` — the ONE command runner and ``scontrol``'s calls, the errors;
- :mod:`~broker.slurm.watcher` — the watcher, its capabilities and the burst target;
- :mod:`~broker.slurm.kind` — the registration (the ``[slurm]`` table, the watcher's build).

Submodules are imported where they are used, so the CLI starts without loading them.
"""
