"""The one-pass decoder of a pushed snapshot (broker.queue_pb) against the field-by-field
validator it stands in for (broker.queue_api.checked_snapshot): on any message, valid or not,
ReportQueue/Diagnose get the same snapshot, or the same error naming the same field."""
from __future__ import annotations

import dataclasses
import math

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import queue_pb
from broker.queue_api import checked_snapshot, snapshot_from_pb
from broker.v1 import broker_pb2 as pb

NOW = 1_767_225_600.0

texts = st.one_of(st.sampled_from(["", "gpu", "A100", "Resources", "Priority", "training", "eval",
                                   "idle", "mix", "alloc", "drain", "down", "cloud", "x\x00y"]),
                  st.text(max_size=8))
floats = st.one_of(st.sampled_from([0.0, -0.0, 1.5, 100.0, 100.5, -1.0, math.nan, math.inf]),
                   st.floats(allow_nan=True, allow_infinity=True))
INT32 = st.one_of(st.sampled_from([0, 1, 8, -1]), st.integers(-2**31, 2**31 - 1))
INT64 = st.one_of(st.sampled_from([0, 1, 3600, -1]), st.integers(-2**63, 2**63 - 1))


def record(msg_cls):
    """Any message of ``msg_cls``: every field (those a later change adds too) drawn or left
    out, so proto3 defaults and optional fields without a value are exercised."""
    parts = {}
    for f in msg_cls.DESCRIPTOR.fields:
        if f.type == FD.TYPE_STRING:
            s = texts
        elif f.type == FD.TYPE_BOOL:
            s = st.booleans()
        elif f.type == FD.TYPE_DOUBLE:
            s = floats
        elif f.type in (FD.TYPE_INT64, FD.TYPE_SINT64):
            s = INT64
        elif f.type in (FD.TYPE_INT32, FD.TYPE_SINT32):
            s = INT32
        else:
            continue
        if f.is_repeated:
            s = st.lists(s, max_size=3)
        parts[f.name] = st.one_of(st.none(), s)
    return st.fixed_dictionaries(parts).map(
        lambda d: msg_cls(**{k: v for k, v in d.items() if v is not None}))


def good(msg_cls, **fixed):
    return record(msg_cls).map(lambda m: (m.MergeFrom(msg_cls(**fixed)), m)[1])


snapshots = st.builds(
    lambda p, r, n, g, t: pb.QueueSnapshot(source="s", pending=p, running=r, nodes=n,
                                           gpu_samples=g, **({"taken_at": {"seconds": t}} if t else {})),
    st.lists(st.one_of(record(pb.PendingJob), good(pb.PendingJob, job_id="j", gpus=2, kind="eval")),
             max_size=4),
    st.lists(record(pb.RunningJob), max_size=3),
    st.lists(st.one_of(record(pb.ClusterNode), good(pb.ClusterNode, name="n", state="mix")), max_size=3),
    st.lists(st.one_of(record(pb.GpuSample), good(pb.GpuSample, node="n", utilization_pct=50.0)),
             max_size=3),
    st.one_of(st.none(), st.integers(1, 2**33)))


def outcome(fn, m):
    try:
        return "ok", fn(m, NOW)
    except ValueError as e:
        return "error", str(e)


def test_the_fast_decoder_knows_every_field_of_every_record():
    """A field added to a record or its message turns the fast path off (the validator still
    answers, slowly): update queue_pb.FIELDS and its decoders."""
    assert queue_pb.fields_match()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots)
def test_same_snapshot_or_same_error_as_the_validator(m):
    assert outcome(snapshot_from_pb, m) == outcome(checked_snapshot, m)
    fast = queue_pb.fast_snapshot(m, NOW)
    if fast is not None:
        assert fast == checked_snapshot(m, NOW)


N32, N64 = st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)
valid_jobs = st.builds(
    pb.PendingJob, job_id=st.text(min_size=1, max_size=8), gpus=st.integers(1, 2**31 - 1),
    user=texts, queue=texts, gpu_model=texts, min_gpu_memory_gb=N32, nodes=N32, time_limit_s=N64,
    est_runtime_s=N64, waited_s=N64, pending_reason=texts, interruptible=st.booleans(),
    checkpoint_minutes=N32, data_gb=st.floats(0, allow_nan=False, allow_infinity=False),
    kind=st.sampled_from(["", "training", "tuning", "eval", "inference"]), exclusive=st.booleans())


@settings(max_examples=100, deadline=None)
@given(st.lists(valid_jobs, min_size=1, max_size=5))
def test_valid_jobs_take_the_fast_path(jobs):
    m = pb.QueueSnapshot(source="s", pending=jobs)
    fast = queue_pb.fast_snapshot(m, NOW)
    assert fast is not None, "a valid snapshot must not fall back to the slow validator"
    assert fast == checked_snapshot(m, NOW)
    assert [j.kind for j in fast.pending] == [j.kind or "training" for j in jobs]


@pytest.mark.parametrize("mutate, field", [
    (lambda m: m.pending.add(job_id="a", gpus=0), "pending[0].gpus"),
    (lambda m: m.pending.add(job_id="", gpus=1), "pending[0].job_id"),
    (lambda m: m.pending.add(job_id="a", gpus=1, data_gb=math.nan), "pending[0].data_gb"),
    (lambda m: m.nodes.add(name="n", state="broken"), "nodes[0].state"),
    (lambda m: m.gpu_samples.add(node="n", index=0), "gpu_samples[0]"),
    (lambda m: m.running.add(job_id="r", gpus=-1), "running[0].gpus"),
])
def test_a_bad_record_is_named_as_before(mutate, field):
    m = pb.QueueSnapshot(source="s")
    mutate(m)
    assert queue_pb.fast_snapshot(m, NOW) is None
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        snapshot_from_pb(m, NOW)


@settings(max_examples=100, deadline=None)
@given(st.lists(valid_jobs, min_size=1, max_size=5))
def test_decoded_records_are_the_records_their_constructor_makes(jobs):
    """The decoder fills the records' slots itself: each is its dataclass, equal to and hashing
    as one built by the constructor from the same fields, and as frozen."""
    m = pb.QueueSnapshot(source="s", pending=jobs,
                         gpu_samples=[pb.GpuSample(node="n", index=1, utilization_pct=50.0)])
    fast = queue_pb.fast_snapshot(m, NOW)
    assert fast is not None
    for rec in (*fast.pending, *fast.gpu_samples):
        twin = type(rec)(*(getattr(rec, f.name) for f in dataclasses.fields(rec)))
        assert type(rec) is type(twin) and rec == twin and hash(rec) == hash(twin)
        assert repr(rec) == repr(twin)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rec, dataclasses.fields(rec)[0].name, "x")


def test_a_record_class_the_fast_constructor_does_not_know_gets_its_own_init():
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("a")

    assert queue_pb._maker(NoSlots, ("a",)) is NoSlots
    assert queue_pb._maker(Checked, ("a",)) is Checked
    assert queue_pb._maker(queue_pb.GpuSample, ("node", "index")) is queue_pb.GpuSample
    assert queue_pb._maker(queue_pb.PendingJob, queue_pb.FIELDS[queue_pb.PendingJob, pb.PendingJob]) \
        is not queue_pb.PendingJob
