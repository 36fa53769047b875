"""A pushed ``QueueSnapshot`` message straight into the domain's records, in one pass.

A big cluster pushes 100,000 pending jobs (a 3 MB message) every tick, so the snapshot is read
without the JSON mapping: each record's fields come off the message in one ``attrgetter`` call
and fill the slots of its frozen dataclass (:func:`_maker`); the strings many jobs share (user, queue, model,
reason, kind) are interned so 100,000 jobs hold one copy of each.

The rules are those of the one validator (:func:`broker.queue_api.checked_snapshot`, through
:mod:`broker.watchers.snapshot_json`); this pass only asks whether a record is valid. At the
first doubt it returns None and the caller runs the validator, which names the field exactly as
before. So the fast pass accepts only what the validator accepts, with the same values. It
knows each record's fields by name; when a record or its message gains a field (``FIELDS``
no longer matches both), the fast pass steps aside and every snapshot takes the validator's
path until ``FIELDS`` is brought up to date (tests/test_queue_decode.py says so).
"""
from __future__ import annotations

import dataclasses
import math
import operator
import sys

from broker.v1 import broker_pb2 as pb
from policies.queue import (JOB_KINDS, NODE_STATES, ClusterNode, GpuSample, PendingJob,
                            QueueSnapshot, RunningJob)

_KINDS = frozenset(JOB_KINDS)
_STATES = frozenset(NODE_STATES)
_MAX = sys.float_info.max  # 0 <= x <= _MAX: finite and not negative (NaN fails)

#: the fields each decoder below unpacks, in the record's order
FIELDS = {
    (PendingJob, pb.PendingJob): (
        "job_id", "gpus", "user", "queue", "gpu_model", "min_gpu_memory_gb", "nodes",
        "time_limit_s", "est_runtime_s", "waited_s", "pending_reason", "interruptible",
        "checkpoint_minutes", "data_gb", "kind", "exclusive", "job_class", "qos", "priority"),
    (RunningJob, pb.RunningJob): ("job_id", "gpus", "user", "queue", "nodes", "runtime_s",
                                  "time_limit_s", "est_runtime_s"),
    (ClusterNode, pb.ClusterNode): ("name", "state", "gpus_total", "gpus_allocated", "gpu_model",
                                    "partitions", "reason"),
    (GpuSample, pb.GpuSample): ("node", "index", "utilization_pct", "memory_used_mb"),
}


def fields_match() -> bool:
    """Whether ``FIELDS`` is every field of each record and of its message, in order."""
    return all(tuple(f.name for f in dataclasses.fields(cls)) == names
               and {f.name for f in msg.DESCRIPTOR.fields} == set(names)
               for (cls, msg), names in FIELDS.items())


def _maker(cls: type, names: tuple[str, ...]):
    """A constructor of ``cls`` (a frozen dataclass with slots) taking ``names`` in order.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; this one
    fills the slots directly through their descriptors: the same object, equal and hashing
    alike, at half the cost (100,000 pending jobs per push). Only for a class whose slots are
    exactly ``names`` and that has no ``__post_init__``; any other gets its own ``__init__``."""
    if tuple(getattr(cls, "__slots__", ())) != names or hasattr(cls, "__post_init__"):
        return cls
    ns: dict = {"new": object.__new__, "cls": cls}
    ns.update({f"set_{n}": cls.__dict__[n].__set__ for n in names})
    args = ", ".join(names)
    body = "".join(f"    set_{n}(self, {n})\n" for n in names)
    exec(f"def make({args}):\n    self = new(cls)\n{body}    return self\n", ns)
    return ns["make"]


_ACTIVE = fields_match()
_get = {cls: operator.attrgetter(*names) for (cls, _), names in FIELDS.items()}
_new = {cls: _maker(cls, names) for (cls, _), names in FIELDS.items()}


def _pending(items) -> list | None:
    out, get, intern, new = [], _get[PendingJob], sys.intern, _new[PendingJob]
    append = out.append
    for r in items:
        (job_id, gpus, user, queue, model, mem, nodes, limit, est, waited, reason, interruptible,
         ckpt, data_gb, kind, exclusive, job_class, qos, priority) = get(r)
        if (not job_id or gpus <= 0 or mem < 0 or nodes < 0 or limit < 0 or est < 0
                or waited < 0 or ckpt < 0 or not 0 <= data_gb <= _MAX
                or (kind and kind not in _KINDS) or priority < 0):
            return None
        append(new(job_id, gpus, intern(user), intern(queue), intern(model), mem, nodes, limit,
                   est, waited, intern(reason), interruptible, ckpt, data_gb,
                   intern(kind) if kind else "training", exclusive, intern(job_class), intern(qos),
                   priority))
    return out


def _running(items) -> list | None:
    out, get, intern = [], _get[RunningJob], sys.intern
    for r in items:
        job_id, gpus, user, queue, nodes, runtime_s, limit, est = get(r)
        if not job_id or gpus < 0 or runtime_s < 0 or limit < 0 or est < 0:
            return None
        out.append(RunningJob(job_id, gpus, intern(user), intern(queue), tuple(nodes), runtime_s,
                              limit, est))
    return out


def _nodes(items) -> list | None:
    out, get, intern = [], _get[ClusterNode], sys.intern
    for r in items:
        name, state, total, allocated, model, partitions, reason = get(r)
        if not name or state not in _STATES or total < 0 or allocated < 0:
            return None
        out.append(ClusterNode(name, intern(state), total, allocated, intern(model),
                               tuple(partitions), reason))
    return out


def _samples(items) -> list | None:
    out, get, new = [], _get[GpuSample], _new[GpuSample]
    for r in items:
        node, index, util, mem = get(r)
        if (not node or index < 0 or not 0 <= util <= 100 or not 0 <= mem <= _MAX
                or not r.HasField("utilization_pct")):  # a sample without a reading is refused
            return None
        out.append(new(node, index, util, mem))
    return out


def fast_snapshot(m: pb.QueueSnapshot, now: float) -> QueueSnapshot | None:
    """``m`` as a :class:`QueueSnapshot` when every record is valid, else None."""
    from broker.watchers.snapshot_json import taken_at_value

    if not _ACTIVE:
        return None
    if m.HasField("taken_at"):
        try:
            taken_at = taken_at_value(m.taken_at.ToJsonString())
        except ValueError:
            return None
    elif isinstance(now, (int, float)) and math.isfinite(now):
        taken_at = float(now)
    else:
        return None
    pending, running = _pending(m.pending), _running(m.running)
    nodes, samples = _nodes(m.nodes), _samples(m.gpu_samples)
    if pending is None or running is None or nodes is None or samples is None:
        return None
    return QueueSnapshot(source=m.source, taken_at=taken_at, pending=tuple(pending),
                         nodes=tuple(nodes), gpu_samples=tuple(samples), running=tuple(running),
                         extra={})
