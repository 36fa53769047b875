"""Slurm's power-saving programs, run by slurmctld on the controller (``broker slurm resume |
suspend | resume-fail HOSTLIST`` through deploy/slurm/*.sh): the node side of the Slurm
hand-off, apart from the in-server watcher (:mod:`broker.slurm`).

- :mod:`~broker.slurm_node.groups` — resume file, grouping by job, shapes, demand, idempotency keys;
- :mod:`~broker.slurm_node.programs` — resume, suspend, resume-fail and their file log.

They talk to the broker server over gRPC (:mod:`broker.client`) and to Slurm through
:mod:`broker.slurm.commands`, with the ``[slurm]`` settings (:mod:`broker.slurm.settings`).
"""
