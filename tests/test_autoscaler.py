"""The autoscaler through ReportQueue: diagnose, decide, launch, hand off; and "did not burst"."""
from __future__ import annotations

import contextlib
import time

import grpc
import pytest

from broker.v1 import broker_pb2 as pb
from broker.v1 import broker_pb2_grpc as pb_grpc
from providers.registry import build_enabled
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.grpc_server import running_server

pytestmark = pytest.mark.timeout(180)

AUTOSCALER = {"enabled": True, "default_gpu_model": "L4",
              "trigger": {"stabilization_s": 0, "cooldown_s": 0, "pending_gpus_threshold": 4}}


@contextlib.contextmanager
def serving(clouds, tmp_path, autoscaler=AUTOSCALER):  # noqa: F811
    tables = clouds.provider_tables()
    providers = build_enabled(tables, "broker-test")
    cfg = {"autoscaler": autoscaler, "providers": tables}
    with running_server(tmp_path, providers=providers, config=cfg) as (addr, svc):
        assert svc.autoscaler is not None  # built by the service from [autoscaler]
        with grpc.insecure_channel(addr) as ch:
            yield pb_grpc.BrokerStub(ch), svc, clouds


@pytest.fixture
def broker(clouds, tmp_path):  # noqa: F811
    with serving(clouds, tmp_path) as b:
        yield b


def node(name, state, total, alloc):
    return pb.ClusterNode(name=name, state=state, gpus_total=total, gpus_allocated=alloc, gpu_model="A100")


def snapshot(pending, nodes, source="kueue:prod"):
    s = pb.QueueSnapshot(source=source, pending=pending, nodes=nodes)
    s.taken_at.FromSeconds(int(time.time()))
    return s


def job(i, gpus=1, runtime_h=2.0, waited_s=60, reason="Resources", **kw):
    kw.setdefault("gpu_model", "L4")
    return pb.PendingJob(job_id=str(i), gpus=gpus, est_runtime_s=int(runtime_h * 3600),
                         waited_s=waited_s, pending_reason=reason, queue="gpu", user="ana", **kw)


def test_resource_bound_queue_bursts_and_hands_off(broker):
    stub, svc, clouds = broker
    full = [node(f"gpu-{i}", "alloc", 8, 8) for i in range(4)]
    pend = [job(i, gpus=1, interruptible=(i % 2 == 0), checkpoint_minutes=30) for i in range(8)]
    r = stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, full)))
    assert r.diagnosis.verdict == pb.VERDICT_RESOURCE_BOUND
    assert r.decisions[0].action == "burst", r.decisions[0].reason
    leases = stub.ListLeases(pb.ListLeasesRequest()).leases
    assert leases, "a burst launches leases"
    running = [l for l in leases if l.state == pb.LEASE_STATE_RUNNING]
    assert running and all(l.job.job_id for l in running)
    assert {l.job.job_id for l in running} <= {str(i) for i in range(8)}
    alive = sum(len(v) for v in clouds.alive_instances().values())
    assert alive == sum(l.nodes for l in running)
    decisions = stub.ListDecisions(pb.ListDecisionsRequest()).decisions
    assert any(d.action == "burst" and d.lease_id for d in decisions)
    # the same jobs reported again are not burst twice
    stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, full)))
    assert len(stub.ListLeases(pb.ListLeasesRequest()).leases) == len(leases)


def test_scheduling_bound_queue_is_not_burst(broker):
    stub, svc, clouds = broker
    # half the GPUs free but scattered; whole-node jobs wait: scheduling-bound
    nodes = [node(f"gpu-{i}", "mix", 8, 4) for i in range(4)] + [node("gpu-9", "drain", 8, 0)]
    pend = [job(i, gpus=8, exclusive=True, runtime_h=10, waited_s=600) for i in range(3)]
    r = stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, nodes)))
    assert r.diagnosis.verdict in (pb.VERDICT_SCHEDULING_BOUND, pb.VERDICT_MIXED)
    assert r.decisions[0].action == "hold"
    assert "did not burst, because" in r.decisions[0].reason
    assert not stub.ListLeases(pb.ListLeasesRequest()).leases
    kinds = {c.kind for c in r.diagnosis.causes}
    assert kinds, "the diagnosis names its causes"
    held = stub.ListDecisions(pb.ListDecisionsRequest()).decisions
    assert held[0].action == "hold" and "did not burst" in held[0].reason


def test_schedule_first_a_scheduling_bound_queue_bursts_nothing_even_overdue(broker):
    """44 % allocated, 36 GPUs free but scattered, six whole-node jobs waiting longer than half
    their runtime: the wait trigger used to burst all six (48 GPUs)."""
    stub, svc, clouds = broker
    nodes = [node(f"gpu-{i}", "mix", 8, 4 if i < 4 else 3) for i in range(8)]  # 28 of 64
    pend = [job(i, gpus=8, exclusive=True, runtime_h=2.0, waited_s=2 * 3600, gpu_model="A100")
            for i in range(6)]
    r = stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, nodes)))
    assert r.diagnosis.verdict == pb.VERDICT_SCHEDULING_BOUND
    assert round(r.diagnosis.allocation_rate, 2) == 0.44
    d = r.decisions[0]
    assert d.action == "hold" and not d.job_ids, d.reason
    assert d.reason.startswith("did not burst, because scheduling-bound: allocation 44% under 70%")
    assert "6 whole-node (--exclusive) requests (48 GPUs) wait while 36 GPUs are free" in d.reason
    assert "Fix: Right-size requests" in d.reason
    assert not stub.ListLeases(pb.ListLeasesRequest()).leases
    assert not any(clouds.alive_instances().values())
    held = stub.ListDecisions(pb.ListDecisionsRequest()).decisions
    assert [h.action for h in held] == ["hold"] and held[0].reason == d.reason


def test_bursting_overdue_jobs_of_a_scheduling_bound_queue_is_an_opt_in(clouds, tmp_path):  # noqa: F811
    opt_in = {**AUTOSCALER, "trigger": {**AUTOSCALER["trigger"],
                                        "burst_overdue_when_scheduling_bound": True}}
    with serving(clouds, tmp_path, opt_in) as (stub, svc, _):
        nodes = [node(f"gpu-{i}", "mix", 8, 4) for i in range(4)]
        overdue = job(77, gpus=1, runtime_h=1.0, waited_s=2 * 3600)  # waited 2 h for a 1 h job
        r = stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot([overdue], nodes)))
        assert r.diagnosis.verdict == pb.VERDICT_SCHEDULING_BOUND
        assert r.decisions[0].action == "burst", r.decisions[0].reason
        assert "77" in r.decisions[0].job_ids
        leases = stub.ListLeases(pb.ListLeasesRequest()).leases
        assert [l.job.job_id for l in leases] == ["77"]


@pytest.mark.parametrize("bad, field", [
    (pb.QueueSnapshot(pending=[pb.PendingJob(job_id="1", gpus=0)]), "snapshot.pending[0].gpus"),
    (pb.QueueSnapshot(nodes=[pb.ClusterNode(name="n", state="sleeping", gpus_total=8)]), "snapshot.nodes[0].state"),
    (pb.QueueSnapshot(pending=[pb.PendingJob(job_id="1", gpus=1, kind="party")]), "snapshot.pending[0].kind"),
])
def test_malformed_snapshot_is_invalid_argument(broker, bad, field):
    stub, _, _ = broker
    with pytest.raises(grpc.RpcError) as e:
        stub.ReportQueue(pb.ReportQueueRequest(snapshot=bad))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field), e.value.details()


def test_diagnose_rpc_on_the_latest_snapshot(broker):
    stub, _, _ = broker
    with pytest.raises(grpc.RpcError) as e:
        stub.Diagnose(pb.DiagnoseRequest())
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    full = [node(f"gpu-{i}", "alloc", 8, 8) for i in range(2)]
    stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot([job(1, gpus=8)], full)))
    d = stub.Diagnose(pb.DiagnoseRequest()).diagnosis
    assert d.verdict == pb.VERDICT_RESOURCE_BOUND and d.allocation_rate == 1.0


def test_a_pushed_queue_gets_an_offload_decision_before_training_bursts_and_classes_count(broker):
    """The gRPC scheduler is told to move its eval/inference jobs (an ``offload`` decision with
    their ids); the burst that follows is for training only, and a pushed job's class sets its
    wait target (a production job waiting past 30 min goes although its runtime is a week)."""
    stub, svc, clouds = broker
    full = [node(f"gpu-{i}", "alloc", 8, 8) for i in range(2)]
    pend = [job("e1", kind="eval"), job("i1", kind="inference", reason="Priority"),
            job("t1", runtime_h=168, waited_s=2400, job_class="prod", priority=100, qos="high"),
            *[job(f"t{i}", runtime_h=1) for i in range(2, 7)]]
    r = stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, full)))
    decisions = stub.ListDecisions(pb.ListDecisionsRequest()).decisions
    off = [d for d in decisions if d.action == "offload"]
    assert len(off) == 1 and sorted(off[0].job_ids) == ["e1", "i1"], [(d.action, d.reason) for d in decisions]
    assert off[0].reason.startswith("offload 2 tuning/eval/inference jobs (2 GPUs) to a queue of their own "
                                    "before bursting training")
    bursts = [d for d in decisions if d.action == "burst"]
    burst_ids = {j for d in bursts for j in d.job_ids}
    assert "t1" in burst_ids and not burst_ids & {"e1", "i1"}, [(d.action, d.reason) for d in decisions]
    assert any("class production 30 min" in d.reason for d in bursts if "t1" in d.job_ids)
    assert r.decisions  # the report answers with what was decided
    # reported again: the moved jobs are not offloaded twice
    stub.ReportQueue(pb.ReportQueueRequest(snapshot=snapshot(pend, full)))
    again = [d for d in stub.ListDecisions(pb.ListDecisionsRequest()).decisions if d.action == "offload"]
    assert len(again) == 1
