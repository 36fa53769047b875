"""ReportQueue and Diagnose: snapshots pushed by any scheduler, parsed and validated here, then
handed to the service (which diagnoses them, and lets the autoscaler decide)."""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

from google.protobuf.json_format import MessageToDict

from broker import convert
from broker.errors import InvalidArgument
from broker.v1 import broker_pb2 as pb
from policies.diagnose import Diagnosis
from policies.queue import QueueSnapshot


INT64_FIELDS = ("time_limit_s", "est_runtime_s", "waited_s", "runtime_s", "priority")
# fields whose proto3 default ("") means "not sent": each record needs them
_NAMED = {"pending": "job_id", "running": "job_id", "nodes": "name", "gpu_samples": "node"}


def snapshot_from_pb(m: pb.QueueSnapshot, now: float) -> QueueSnapshot:
    """Validate a pushed snapshot; raises ValueError naming the field (``pending[2].gpus ...``).

    A valid snapshot is read in one pass over the message (:mod:`broker.queue_pb`); one that
    is not goes through :func:`checked_snapshot`, which names the first bad field.
    """
    from broker.queue_pb import fast_snapshot

    snap = fast_snapshot(m, now)
    return snap if snap is not None else checked_snapshot(m, now)


def checked_snapshot(m: pb.QueueSnapshot, now: float) -> QueueSnapshot:
    """Validate a pushed snapshot field by field through its JSON mapping (the reference).

    proto3 does not send a field at its default, and 0, "" and false are values here: a GPU
    sample of GPU 0 at 0 %, a CPU-only node, a running job with no GPUs. So every field is read
    with its default; only ``GpuSample.utilization_pct`` is ``optional`` (a sample without a
    reading is refused, not taken as an idle GPU), and the names a record needs must not be
    empty. The document then goes through the one snapshot validator
    (:func:`broker.watchers.snapshot_json.snapshot_from_dict`).
    """
    from broker.watchers.snapshot_json import snapshot_from_dict

    doc = MessageToDict(m, preserving_proto_field_name=True,
                        always_print_fields_with_no_presence=True)
    doc.setdefault("taken_at", now)
    for key, name in _NAMED.items():
        for i, item in enumerate(doc.get(key, [])):
            if not item.get(name):
                raise ValueError(f"{key}[{i}].{name} is required (it is empty)")
            for f in INT64_FIELDS:  # the JSON mapping writes int64 as strings
                if f in item:
                    item[f] = int(item[f])
    for i, j in enumerate(doc.get("pending", [])):
        if j["gpus"] <= 0:
            raise ValueError(f"pending[{i}].gpus must be at least 1")
        if not j["kind"]:
            del j["kind"]  # empty = training
    for i, n in enumerate(doc.get("nodes", [])):
        if not n["state"]:
            raise ValueError(f"nodes[{i}].state is required (it is empty)")
    return snapshot_from_dict(doc)


_pause_lock = threading.Lock()
_pauses = [0, False]  # calls inside, and whether the collector ran before the first


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a pushed snapshot is read, diagnosed and decided.

    A push of 100,000 pending jobs makes some 200,000 long-lived objects in a few hundred
    milliseconds, and each full collection they set off walks every object of the process (a
    third of the call's CPU at 100,000 jobs). The call makes no reference cycles: what it built
    is freed by reference counting when it returns, and the collector resumes as it was once
    the last call inside has left (calls overlap on the server's threads)."""
    with _pause_lock:
        if _pauses[0] == 0:
            _pauses[1] = gc.isenabled()
            gc.disable()
        _pauses[0] += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()


def diagnosis_to_pb(d: Diagnosis) -> pb.Diagnosis:
    out = pb.Diagnosis(verdict=convert.VERDICT_TO_PB[d.verdict], allocation_rate=d.allocation_rate,
                       utilization=-1.0 if d.utilization is None else d.utilization / 100.0,
                       pending_gpus=d.pending_gpus, actions=list(d.actions))
    for c in d.causes:
        out.causes.add(kind=c.kind, summary=c.summary, jobs=list(c.jobs), nodes=list(c.nodes), action=c.action)
    return out


def _snapshot(svc, m: pb.QueueSnapshot) -> QueueSnapshot:
    try:
        return snapshot_from_pb(m, svc.clock())
    except ValueError as e:
        raise InvalidArgument(f"snapshot.{e}", field="snapshot") from None


def report_queue(svc, request: pb.ReportQueueRequest) -> pb.ReportQueueResponse:
    if not request.HasField("snapshot"):
        raise InvalidArgument("snapshot is required.", field="snapshot")
    with collector_paused():
        diag, decision = svc.report_queue(_snapshot(svc, request.snapshot))
    out = pb.ReportQueueResponse()
    if decision is not None:
        d = out.decisions.add(action=decision.action, reason=decision.reason, job_ids=list(decision.job_ids))
        d.at.CopyFrom(convert.ts(svc.clock()))
    out.diagnosis.CopyFrom(diagnosis_to_pb(diag))
    return out


def diagnose(svc, request: pb.DiagnoseRequest) -> pb.DiagnoseResponse:
    with collector_paused():
        snap = _snapshot(svc, request.snapshot) if request.HasField("snapshot") else None
        diag = svc.diagnose(snap)
    return pb.DiagnoseResponse(diagnosis=diagnosis_to_pb(diag))
