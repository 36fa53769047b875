"""How a reconciler pass tells lost nodes apart, and what it counts: a steady lease costs no extra
cloud call, a spot node that vanished is an interruption, a spot node stopped by its owner is not,
and every loss in a pass is counted. Against the in-memory clouds (tests/fake_provider.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from broker.lease import LeaseState
from broker.lifecycle import Lifecycle, Settings
from broker.quote import QuoteEngine
from broker.reconciler import Reconciler
from broker.records import Job
from policies.demand import Demand
from providers.base import InstanceState, Market, StopReason
from tests.fake_provider import FakeProvider
from tests.lease_kit import Clock

S = LeaseState
SPOT_JOB = Demand(gpus=8, hours=1, gpu_model="H100", interruptible=True)


@pytest.fixture
def kit(tmp_path, mini_catalog):
    from broker.store import Store

    clock = Clock(1_800_000_000.0)
    clouds = {name: FakeProvider(name, clock=clock) for name in ("aws", "gcp", "azure")}
    store = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    lc = Lifecycle(store, clouds, QuoteEngine(mini_catalog), owner="test", clock=clock,
                   settings=Settings(backoff_s=0.0), sleep=lambda s: None)
    yield lc, Reconciler(lc, orphan_grace_s=60.0, clock=clock), clouds
    store.close()


def _spot(lc, key: str, job_id: str):
    """A spot lease on AWS running a checkpointing job, with a GCP spot offer to fail over to."""
    first = lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge", "spot", 1)
    alt = lc.target_explicit("gcp", "us-central1", "", "a3-highgpu-8g", "spot", 1)
    return lc.launch(idempotency_key=key, target=first, demand=SPOT_JOB, alternatives=[alt],
                     job=Job(job_id=job_id, checkpoint_uri=f"s3://ck/{job_id}"))


def test_a_steady_lease_costs_a_pass_no_describe_call(kit):
    """A listing that shows every node of the lease settles it: the cloud is not asked again."""
    lc, rec, clouds = kit
    lease = lc.launch(idempotency_key="k", target=lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge",
                                                                      "on_demand", 2))
    rec.run_pass()
    assert [m for m, _ in clouds["aws"].calls if m == "describe"] == []
    assert lc.get(lease.lease_id).state is S.RUNNING


def test_every_interruption_and_replacement_of_a_pass_is_counted(kit):
    lc, rec, clouds = kit
    leases = [_spot(lc, f"k{n}", f"train-{n}") for n in range(2)]
    for lease in leases:
        clouds["aws"].interrupt(next(iter(lease.instance_ids)))
    report = rec.run_pass()
    assert (report.interrupted, report.replaced) == (2, 2)


def test_a_spot_node_that_vanished_is_an_interruption(kit):
    """A reclaimed spot VM whose action is delete leaves no trace: the lease counts it as an
    interruption, says so, and its job is requeued on a replacement."""
    lc, rec, clouds = kit
    lease = _spot(lc, "k", "train-1")
    clouds["aws"].vanish(next(iter(lease.instance_ids)))
    report = rec.run_pass()
    assert (report.interrupted, report.lost, report.replaced) == (1, 0, 1)
    (lost,) = [e.message for e in lc.store.events_of(lease.lease_id) if e.kind == "interrupted"]
    assert lost.startswith("spot interruption: spot instance vanished; replacement lease ")
    assert "aws/us-east-1/p5.48xlarge/spot" in lc.store.active_blocks(lc.clock())  # not tried again soon
    (new,) = [x for x in lc.store.list_leases() if x.replaces == lease.lease_id]
    assert new.state is S.RUNNING and new.job.checkpoint_uri == "s3://ck/train-1"


def test_a_spot_node_stopped_by_its_owner_is_a_loss_not_an_interruption(kit):
    lc, rec, clouds = kit
    lease = _spot(lc, "k", "train-1")
    (iid,) = lease.instance_ids
    aws = clouds["aws"]
    aws.instances[iid] = replace(aws.instances[iid], state=InstanceState.TERMINATED, stop_reason=StopReason.USER,
                                 stop_detail="terminated from the console")
    report = rec.run_pass()
    assert (report.interrupted, report.lost) == (0, 1)
    (lost,) = [e.message for e in lc.store.events_of(lease.lease_id) if e.kind == "interrupted"]
    assert lost.startswith("outside termination: ")
    assert lc.store.active_blocks(lc.clock()) == {}  # the market is not to blame


def test_a_running_lease_extra_node_is_an_orphan_and_a_launching_lease_nodes_are_its_own(kit):
    """Listed in that order, a running lease's own node, its extra node (a launch attempt it moved on
    from), and the node of a lease still launching: the extra node is terminated after the grace
    period, the other two are kept."""
    lc, rec, clouds = kit
    aws = clouds["aws"]
    running = lc.launch(idempotency_key="r", target=lc.target_explicit("aws", "us-east-1", "", "p5.48xlarge",
                                                                        "on_demand", 1))
    extra = aws.plant(running.lease_id, "us-east-1", "p5.48xlarge", Market.ON_DEMAND)
    launching, _ = lc.create(idempotency_key="l", target=lc.target_explicit("aws", "eu-west-1", "", "p5.48xlarge",
                                                                             "on_demand", 1))
    launching = lc._begin_attempt(launching, lc.target_explicit("aws", "eu-west-1", "", "p5.48xlarge",
                                                                "on_demand", 1), [])
    theirs = aws.plant(launching.lease_id, "eu-west-1", "p5.48xlarge", Market.ON_DEMAND)
    assert rec.run_pass().orphans_terminated == 0
    rec.clock.advance(60)
    assert rec.run_pass().orphans_terminated == 1
    assert extra.instance_id not in aws.instances
    assert running.instance_ids | {theirs.instance_id} <= set(aws.instances)
