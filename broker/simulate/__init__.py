"""Trace replay: the same trigger, selection, cost and spot code as the live broker, on a trace.

One event-driven replay per policy over one job trace, in five parts:

- :mod:`~broker.simulate.trace`: reading a job trace, cleaned or a public cluster's;
- :mod:`~broker.simulate.lifetimes`: observed spot lifetimes;
- :mod:`~broker.simulate.chooser`: where a burst job goes, by policy, priced with
  :func:`policies.cost.price`;
- :mod:`~broker.simulate.onprem`: the on-prem cluster, FIFO with EASY backfill on whole GPUs;
- :mod:`~broker.simulate.cloud`: burst jobs' nodes, billing, spot preemptions and rework;
- :mod:`~broker.simulate.replay`: the event loop and the autoscaler's trigger
  (:func:`policies.triggers.evaluate`).

Per-job randomness (interruptible flag, lifetimes) is a seeded hash of the job id, so every
policy meets the same luck.
"""
from broker.simulate.model import POLICY_NAMES, Policy, PolicyResult, SimConfig, builtin_policies
from broker.simulate.replay import Replay, run_policies, simulate
from broker.simulate.lifetimes import Lifetimes, load_lifetimes
from broker.simulate.trace import Trace, TraceError, TraceJob, hash_unit, load_trace, parse_columns, read_trace

__all__ = [
    "POLICY_NAMES", "Lifetimes", "Policy", "PolicyResult", "Replay", "SimConfig", "Trace", "TraceError", "TraceJob",
    "builtin_policies", "hash_unit", "load_lifetimes", "load_trace", "parse_columns", "read_trace",
    "run_policies", "simulate",
]
