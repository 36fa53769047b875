"""Issue #4: spot interruptions in each cloud, seen by the reconciler, announced on WatchLeases
(a real gRPC stream), answered with a requeue of the job from its checkpoint, a block on the
offering, and a replacement lease launched elsewhere."""
from __future__ import annotations


import pytest

from broker.convert import demand_to_pb
from providers.base import offering_key
from broker.v1 import broker_pb2 as pb
from policies.demand import Demand
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.lease_kit import (
    Watch, existing_by_lease, instances_of, live_by_lease, offering, service, serving,
)

pytestmark = pytest.mark.timeout(120)

FAKE_REGIONS = ("us-east-1", "us-west-2", "us-central1", "europe-west4", "eastus", "westeurope")
GPU = {"aws": "A10G", "gcp": "A100", "azure": "A100"}


def _interrupt(clouds, lease, how: str) -> None:  # noqa: F811
    inst = instances_of(lease)[0]
    if lease.provider == "aws":
        clouds.aws.interrupt(inst.instance_id)
    elif lease.provider == "gcp":
        clouds.gcp.interrupt(inst.node_name, keep=how == "kept")
    else:
        clouds.azure.interrupt(inst.node_name)


@pytest.mark.parametrize("provider,how", [("aws", "terminated"), ("gcp", "deleted"), ("gcp", "kept"),
                                          ("azure", "evicted")])
def test_interrupted_spot_lease_requeues_blocks_and_is_replaced(clouds, tmp_path, provider, how):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        demand = Demand(gpus=1, hours=4, gpu_model=GPU[provider], interruptible=True, checkpoint_minutes=20,
                        regions=FAKE_REGIONS)
        quote = stub.Quote(pb.QuoteRequest(demand=demand_to_pb(demand)), timeout=30).quote
        rank = next(o.rank for o in quote.offers if o.provider == provider and o.market == pb.MARKET_SPOT)
        lease = stub.Launch(pb.LaunchRequest(idempotency_key=f"spot-{provider}", quote_offer=pb.QuoteOffer(
            quote_id=quote.quote_id, rank=rank)), timeout=60).lease
        assert lease.state == pb.LEASE_STATE_RUNNING and lease.provider == provider
        job = pb.Job(job_id="train-42", owner="ana", queue="gpu", checkpoint_uri="gs://ckpt/train-42/step-9000")
        stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=job), timeout=30)
        old = svc.store.get_lease(lease.lease_id)
        watch = Watch(stub).opened(svc.store)
        try:
            _interrupt(clouds, old, how)
            report = svc.reconciler.run_pass()
            assert report.interrupted == 1 and report.replaced == 1, report

            ev = watch.wait_for(lambda e: e.kind == pb.LEASE_EVENT_KIND_INTERRUPTED)
            assert ev.lease.lease_id == old.lease_id and "spot interruption" in ev.message
            rq = watch.wait_for(lambda e: e.kind == pb.LEASE_EVENT_KIND_REQUEUE)
            assert rq.lease.lease_id == old.lease_id
            assert (rq.job.job_id, rq.job.checkpoint_uri) == ("train-42", "gs://ckpt/train-42/step-9000")
            assert "gs://ckpt/train-42/step-9000" in rq.message
        finally:
            watch.close()

        key = offering_key(old.provider, old.region, old.instance_type, old.market)
        assert key in svc.store.active_blocks(svc.clock())
        (new,) = [l for l in svc.store.list_leases() if l.replaces == old.lease_id]
        assert new.lease_id in rq.message
        assert new.state == "running", new.state_reason
        assert offering_key(new.provider, new.region, new.instance_type, new.market) != key
        assert new.job.checkpoint_uri == "gs://ckpt/train-42/step-9000"
        assert svc.store.get_lease(old.lease_id).state == "released"
        live = live_by_lease(clouds)
        assert old.lease_id not in live and len(live[new.lease_id]) == new.nodes
        if how == "kept":  # the preempted VM was kept TERMINATED: it is deleted all the same
            assert clouds.gcp.instance(instances_of(old)[0].node_name) is None

        svc.reconciler.run_pass()  # nothing more happens on the next pass
        assert len([l for l in svc.store.list_leases() if l.replaces == old.lease_id]) == 1
        stub.Release(pb.ReleaseRequest(lease_id=new.lease_id), timeout=60)
        assert existing_by_lease(clouds) == {}


def test_interrupted_explicit_lease_without_job(clouds, tmp_path):  # noqa: F811
    """No job to requeue and no demand to re-quote: the lease is marked interrupted and released."""
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="x", offering=offering(
            "aws", "us-west-2", "g5.xlarge", market="spot", count=2)), timeout=60).lease
        clouds.aws.interrupt(lease.instances[1].instance_id)
        report = svc.reconciler.run_pass()
        assert (report.interrupted, report.replaced) == (1, 0)
        kinds = [e.kind for e in svc.store.events_of(lease.lease_id)]
        assert "interrupted" in kinds and "requeue" not in kinds
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.state == "released"
        assert "Server.SpotInstanceTermination" in rec.state_reason and "no replacement" in rec.state_reason
        assert existing_by_lease(clouds) == {}  # the surviving node went with it
