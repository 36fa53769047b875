"""ReportQueue and Diagnose read proto3 defaults as values: GPU 0, 0 % utilisation, a CPU-only
node, a running job without GPUs. Every field of every queue record is sent at its zero/empty
value: a field a record needs is refused with INVALID_ARGUMENT naming it, the others are values."""
from __future__ import annotations

import grpc
import pytest

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("queue-api")) as (addr, _svc):
        with grpc.insecure_channel(addr) as ch:
            yield pb_grpc.BrokerStub(ch)


def base() -> dict[str, object]:
    """One valid record of each kind, every field set to something other than its default."""
    return {
        "pending": pb.PendingJob(job_id="p1", user="ana", queue="gpu", gpus=2, gpu_model="A100",
                                 min_gpu_memory_gb=40, nodes=1, time_limit_s=7200, est_runtime_s=3600,
                                 waited_s=600, pending_reason="Resources", interruptible=True,
                                 checkpoint_minutes=30, data_gb=10.0, kind="eval", exclusive=True),
        "running": pb.RunningJob(job_id="r1", user="bo", queue="gpu", gpus=4, nodes=["gpu-1"],
                                 runtime_s=60),
        "nodes": pb.ClusterNode(name="gpu-1", state="mix", gpus_total=8, gpus_allocated=4,
                                gpu_model="A100", partitions=["gpu"], reason="testing"),
        "gpu_samples": pb.GpuSample(node="gpu-1", index=3, utilization_pct=55.0, memory_used_mb=900.0),
    }


def snapshot(records: dict[str, object]) -> pb.QueueSnapshot:
    s = pb.QueueSnapshot(source="test")
    for key, rec in records.items():
        getattr(s, key).append(rec)
    return s


# the fields a record cannot do without (sent empty, they are refused naming the field)
REQUIRED = {("pending", "job_id"), ("pending", "gpus"), ("running", "job_id"), ("nodes", "name"),
            ("nodes", "state"), ("gpu_samples", "node"), ("gpu_samples", "utilization_pct")}
CASES = [(key, f.name) for key, rec in base().items() for f in rec.DESCRIPTOR.fields]


@pytest.mark.parametrize("rpc", ["ReportQueue", "Diagnose"])
@pytest.mark.parametrize("key, field", CASES, ids=[f"{k}.{f}" for k, f in CASES])
def test_every_field_at_its_zero_or_empty_value(stub, rpc, key, field):
    records = base()
    records[key].ClearField(field)  # proto3: the field is not on the wire at all
    s = snapshot(records)
    call = (lambda: stub.ReportQueue(pb.ReportQueueRequest(snapshot=s))) if rpc == "ReportQueue" \
        else (lambda: stub.Diagnose(pb.DiagnoseRequest(snapshot=s)))
    if (key, field) in REQUIRED:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(f"snapshot.{key}[0]"), e.value.details()
        assert field in e.value.details()
    else:
        assert call().diagnosis.verdict != pb.VERDICT_UNSPECIFIED


def test_gpu_zero_at_zero_percent_a_cpu_only_node_and_a_gpu_less_job_are_read_as_values(stub):
    s = pb.QueueSnapshot(
        source="zeros",
        nodes=[pb.ClusterNode(name="gpu-1", state="alloc", gpus_total=2, gpus_allocated=2),
               pb.ClusterNode(name="cpu-1", state="idle")],  # gpus_total 0
        running=[pb.RunningJob(job_id="r1", gpus=2, nodes=["gpu-1"]),
                 pb.RunningJob(job_id="cpu-job", nodes=["cpu-1"])],  # gpus 0
        gpu_samples=[pb.GpuSample(node="gpu-1", index=0, utilization_pct=0.0),
                     pb.GpuSample(node="gpu-1", index=1, utilization_pct=0.0)],
        pending=[pb.PendingJob(job_id="p1", gpus=1, waited_s=3600)])
    for d in (stub.ReportQueue(pb.ReportQueueRequest(snapshot=s)).diagnosis,
              stub.Diagnose(pb.DiagnoseRequest(snapshot=s)).diagnosis):
        assert d.allocation_rate == 1.0 and d.utilization == 0.0  # the 0 % samples count
        idle = [c for c in d.causes if c.kind == "idle-allocated"]
        assert idle and list(idle[0].nodes) == ["gpu-1"] and list(idle[0].jobs) == ["r1"]


def test_a_pushed_drain_reason_reaches_the_diagnosis(stub):
    s = pb.QueueSnapshot(source="drain", nodes=[
        pb.ClusterNode(name="gpu-1", state="alloc", gpus_total=4, gpus_allocated=4),
        pb.ClusterNode(name="gpu-2", state="drain", gpus_total=4, reason="ECC errors")],
        pending=[pb.PendingJob(job_id="p1", gpus=4, waited_s=3600)])
    d = stub.Diagnose(pb.DiagnoseRequest(snapshot=s)).diagnosis
    drained = [c for c in d.causes if c.kind == "drained-nodes"]
    assert drained and "gpu-2: ECC errors" in drained[0].summary


def test_an_empty_snapshot_is_a_healthy_empty_queue(stub):
    d = stub.Diagnose(pb.DiagnoseRequest(snapshot=pb.QueueSnapshot())).diagnosis
    assert d.verdict == pb.VERDICT_HEALTHY and d.pending_gpus == 0
