"""Issue #4, leases that never leak: the lease state machine against the three mocked clouds.

An in-process Service with the real providers and a real SQLite store; gRPC where the API is
what is tested (idempotent Launch, Handoff, Release, WatchLeases)."""
from __future__ import annotations

import threading

import grpc
import pytest

from broker.lifecycle import LeaseError, Target
from broker.v1 import broker_pb2 as pb
from policies.demand import Demand
from tests.clouds.three import clouds, clouds_server  # noqa: F401
from tests.lease_kit import (
    Clock, Watch, Watched, events, existing_by_lease, instances_of, live_by_lease, offering, service, serving,
    states, target,
)

pytestmark = pytest.mark.timeout(120)

A100 = Demand(gpus=1, hours=2, gpu_model="A100")


def test_transitions_are_recorded_in_order_with_reasons(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc:
        lease = svc.lifecycle.launch(idempotency_key="k1",
                                     target=target(svc, "azure", "eastus", "Standard_NC24ads_A100_v4"))
        assert lease.state == "running"
        svc.lifecycle.release(lease.lease_id, "done with it")
        evs = svc.store.events_of(lease.lease_id)
        assert states(svc.store, lease.lease_id) == ["requested", "provisioning", "running", "draining", "released"]
        changes = [e for e in evs if e.kind == "state_changed"]
        assert [e.from_state for e in changes] == ["", "requested", "provisioning", "running", "draining"]
        assert all(e.message for e in changes)
        assert "launching 1 x Standard_NC24ads_A100_v4 (on_demand) in azure" in changes[1].message
        assert changes[3].message == changes[4].message == "done with it"
        assert [e.at for e in evs] == sorted(e.at for e in evs)
        assert existing_by_lease(clouds) == {}


@pytest.mark.parametrize("provider,region,itype", [
    ("aws", "us-east-1", "g5.xlarge"),
    ("gcp", "us-central1", "a2-highgpu-1g"),
    ("azure", "eastus", "Standard_NC24ads_A100_v4"),
])
def test_every_transition_is_written_before_its_cloud_call(clouds, tmp_path, provider, region, itype):  # noqa: F811
    """At each launch the lease is already `provisioning` with that attempt's client token in the
    store; at each terminate it is already `draining`. A capacity error on the first attempt makes
    the second one use a fresh token."""
    seen: list[tuple[str, str, str, str]] = []
    box: dict = {}

    def before(op, arg):
        if op == "launch":
            l = box["svc"].store.get_lease(arg.lease_id)
            seen.append(("launch", l.state, l.client_token, arg.client_token))
        elif op == "terminate" and arg:
            l = box["svc"].store.get_lease(arg[0].lease_id)
            seen.append(("terminate", l.state, "", ""))

    watched = {}

    def wrap(name, p):
        watched[name] = Watched(p, before)
        return watched[name]

    fault = {"aws": lambda: clouds.aws.inject("capacity", match="RunInstances"),
             "gcp": lambda: clouds.gcp.inject("capacity"),
             "azure": lambda: clouds.azure.inject("capacity", match="virtualMachines/")}[provider]
    with service(tmp_path, clouds, wrap=wrap) as svc:
        box["svc"] = svc
        t = target(svc, provider, region, itype)
        # the same offer again, in the other configured zone: the failover target
        zones = svc.engine.catalog.region(provider, region).zones
        alt = Target(t.provider, t.region, zones[1], t.instance_type, t.market, 1, t.hourly_micros)
        lease, _ = svc.lifecycle.create(idempotency_key="k", target=t, demand=A100, alternatives=[alt])
        fault()
        lease = svc.lifecycle.provision(lease)
        assert lease.state == "running", lease.state_reason
        launches = [s for s in seen if s[0] == "launch"]
        assert launches[0] == ("launch", "provisioning", f"{lease.lease_id}-1", f"{lease.lease_id}-1")
        assert launches[-1] == ("launch", "provisioning", f"{lease.lease_id}-2", f"{lease.lease_id}-2")
        attempts = lease.attempts
        assert len(attempts) == 1 and attempts[0]["provider"] == provider
        assert attempts[0]["code"] and attempts[0]["scope"].startswith(f"{provider}/{region}")
        seen.clear()
        svc.lifecycle.release(lease.lease_id)
        assert seen and all(s == ("terminate", "draining", "", "") for s in seen)
        assert existing_by_lease(clouds) == {}


def test_idempotent_launch_same_key_over_grpc(clouds, tmp_path):  # noqa: F811
    """Three concurrent Launch calls and a later one with the same key: one lease, one RunInstances."""
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        req = pb.LaunchRequest(idempotency_key="same-key", offering=offering("aws", "us-east-1", "g5.xlarge",
                                                                             count=2))
        out: list = []

        def go():
            out.append(stub.Launch(req, timeout=60).lease)

        threads = [threading.Thread(target=go) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        again = stub.Launch(req, timeout=60).lease
        assert {l.lease_id for l in out} == {again.lease_id}
        assert {l.state for l in out} == {pb.LEASE_STATE_RUNNING}
        assert clouds.aws.count("RunInstances") == 1
        assert len(live_by_lease(clouds)[again.lease_id]) == 2
        stub.Release(pb.ReleaseRequest(lease_id=again.lease_id), timeout=60)
        assert existing_by_lease(clouds) == {}


def _gang(svc, first: Target, alt: Target, key: str = "gang"):
    demand = Demand(gpus=2, hours=1, gpu_model="A100", nodes=2)
    lease, _ = svc.lifecycle.create(idempotency_key=key, target=first, demand=demand, alternatives=[alt])
    return lease


def test_gang_second_node_fails_then_the_whole_gang_fails_over(clouds, tmp_path):  # noqa: F811
    """GCP refuses the 2nd node of a 2-node lease: node 1 is deleted and the lease fails over, as a
    whole, to the region's next zone — even when GCP's own rollback of node 1 fails."""
    with service(tmp_path, clouds) as svc:
        lease = _gang(svc, target(svc, "gcp", "us-central1", "a2-highgpu-1g", count=2),
                      target(svc, "azure", "eastus", "Standard_NC24ads_A100_v4", count=2))
        clouds.gcp.inject("capacity", match=f"{lease.lease_id}-1-1")  # attempt 1, node 1
        clouds.gcp.inject("5xx", match="DELETE")  # the provider's own rollback fails once
        lease = svc.lifecycle.provision(lease)
        assert lease.state == "running" and lease.provider == "gcp" and lease.zone != "us-central1-a"
        assert len(instances_of(lease)) == 2
        live = live_by_lease(clouds)
        assert sorted(p for p, _ in live[lease.lease_id]) == ["gcp", "gcp"]
        assert [i for i in clouds.gcp.instances() if i["status"] != "TERMINATED"
                and i["zone"].endswith("us-central1-a")] == []
        (a,) = lease.attempts
        assert (a["provider"], a["scope"]) == ("gcp", "gcp/us-central1/us-central1-a")
        assert "blocked" not in a["code"] and a["code"]
        svc.lifecycle.release(lease.lease_id)
        assert existing_by_lease(clouds) == {}


def test_gang_cloud_gives_fewer_nodes(clouds, tmp_path):  # noqa: F811
    """A cloud that answers a 2-node launch with one node: what came up (and what it did not
    report) is terminated, the zone is blocked, and the gang is launched elsewhere."""
    class OneShort:
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def launch(self, spec):
            return self.inner.launch(spec)[:1]

        def __getattr__(self, item):
            return getattr(self.inner, item)

    with service(tmp_path, clouds, wrap=lambda n, p: OneShort(p) if n == "azure" else p) as svc:
        lease = _gang(svc, target(svc, "azure", "eastus", "Standard_NC24ads_A100_v4", count=2),
                      target(svc, "gcp", "us-central1", "a2-highgpu-1g", count=2))
        lease = svc.lifecycle.provision(lease)
        assert lease.state == "running" and lease.provider == "gcp"
        assert clouds.azure.instances() == []
        zones = [a["zone"] for a in lease.attempts if a["code"] == "PartialLaunch"]
        assert len(zones) == len(set(zones)) > 1, lease.attempts  # each zone of eastus, then GCP
        assert all(a["code"] == "PartialLaunch" and a["scope"].startswith("azure/eastus") for a in lease.attempts)
        assert any(k.startswith("azure/eastus") for k in svc.store.active_blocks(svc.clock()))
        svc.lifecycle.release(lease.lease_id)
        assert existing_by_lease(clouds) == {}


def test_every_offer_failing_reports_each_attempt(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        clouds.aws.inject("quota", times=0, match="RunInstances")
        with pytest.raises(grpc.RpcError) as e:
            stub.Launch(pb.LaunchRequest(idempotency_key="q", offering=offering("aws", "us-west-2", "g5.xlarge")),
                        timeout=60)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # failed for good: not worth a retry
        assert "VcpuLimitExceeded" in e.value.details() and "aws/us-west-2" in e.value.details()
        # a retry with the same key gets the same failure, not OK with a failed lease
        with pytest.raises(grpc.RpcError) as again:
            stub.Launch(pb.LaunchRequest(idempotency_key="q", offering=offering("aws", "us-west-2", "g5.xlarge")),
                        timeout=60)
        assert (again.value.code(), again.value.details()) == (e.value.code(), e.value.details())
        (lease,) = svc.store.list_leases()
        assert lease.state == "failed"
        assert states(svc.store, lease.lease_id) == ["requested", "provisioning", "failed"]
        # A quota error re-reads the region's quota (broker.market) and blocks only the offering.
        blocks = svc.store.active_blocks(svc.clock())
        assert "aws/us-west-2/g5.xlarge/on_demand" in blocks and "aws/us-west-2" not in blocks


def test_handoff_attaches_a_job(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        lease = stub.Launch(pb.LaunchRequest(idempotency_key="h", offering=offering(
            "azure", "eastus", "Standard_NC24ads_A100_v4")), timeout=60).lease
        job = pb.Job(job_id="train-7", owner="ana", queue="gpu", checkpoint_uri="s3://ckpt/train-7/step-400")
        out = stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=job), timeout=30).lease
        assert out.job.job_id == "train-7" and out.job.checkpoint_uri.endswith("step-400")
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.job["job_id"] == "train-7" and rec.idle_since == 0.0
        assert ("handoff", "running", "running", "job train-7 handed off") in events(svc.store, lease.lease_id)
        with pytest.raises(grpc.RpcError) as e:
            stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=pb.Job()), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "job_id" in e.value.details()
        stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=60)
        with pytest.raises(grpc.RpcError) as e:
            stub.Handoff(pb.HandoffRequest(lease_id=lease.lease_id, job=job), timeout=30)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "released" in e.value.details()


def test_release_at_max_lifetime_idle_timeout_and_on_request(clouds, tmp_path):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock, lifecycle={"idle_timeout_s": 600}) as svc, \
            serving(svc) as stub:
        def launch(key, **kw):
            return stub.Launch(pb.LaunchRequest(idempotency_key=key, offering=offering(
                "aws", "us-east-1", "g5.xlarge"), **kw), timeout=60).lease.lease_id

        short, idle, busy, asked = launch("short", max_lifetime_s=300), launch("idle"), launch("busy"), launch("rel")
        stub.Handoff(pb.HandoffRequest(lease_id=busy, job=pb.Job(job_id="j1")), timeout=30)
        stub.Release(pb.ReleaseRequest(lease_id=asked, reason="job finished"), timeout=60)
        assert svc.store.get_lease(asked).state == "released"
        assert svc.store.get_lease(asked).state_reason == "job finished"

        clock.advance(301)
        svc.reconciler.run_pass()
        assert svc.store.get_lease(short).state == "released"
        assert svc.store.get_lease(short).state_reason == "maximum lifetime of 300 s reached"
        assert svc.store.get_lease(idle).state == "running"

        clock.advance(300)
        svc.reconciler.run_pass()
        assert svc.store.get_lease(idle).state == "released"
        assert svc.store.get_lease(idle).state_reason == "idle for 600 s with no job"
        assert svc.store.get_lease(busy).state == "running"
        assert set(live_by_lease(clouds)) == {busy}
        # cost accrues on the lease's clock: 1 node for 601 s
        rec = svc.store.get_lease(idle)
        assert abs(rec.accrued_micros - rec.hourly_micros * 601 / 3600) <= 1


def test_watch_leases_streams_state_changes(clouds, tmp_path):  # noqa: F811
    with service(tmp_path, clouds) as svc, serving(svc) as stub:
        watch = Watch(stub).opened(svc.store)
        try:
            lease = stub.Launch(pb.LaunchRequest(idempotency_key="w", offering=offering(
                "gcp", "us-central1", "a2-highgpu-1g", market="on_demand")), timeout=60).lease
            stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), timeout=60)
            watch.wait_for(lambda e: e.lease.state == pb.LEASE_STATE_RELEASED)
            changes = [e for e in watch.events if e.kind == pb.LEASE_EVENT_KIND_STATE_CHANGED]
            assert all(e.lease.lease_id == lease.lease_id for e in changes)
            assert [e.lease.state for e in changes] == [
                pb.LEASE_STATE_REQUESTED, pb.LEASE_STATE_PROVISIONING, pb.LEASE_STATE_RUNNING,
                pb.LEASE_STATE_DRAINING, pb.LEASE_STATE_RELEASED]
            assert [e.message.split(" ")[0] for e in changes] == ["lease", "launching", "1", "released", "released"]
            assert changes[2].lease.instances and changes[2].lease.provider == "gcp"
            assert [e.at.ToSeconds() for e in changes] == sorted(e.at.ToSeconds() for e in changes)
        finally:
            watch.close()


# -- the reconciler after a crash ---------------------------------------------------------------

class Crash(BaseException):
    """The broker process dying at this point (not a cloud error: nothing catches it)."""


def _crashing(when: str):
    """Wrap providers so that launch dies before or after reaching the cloud."""
    class Dies(Watched):
        def launch(self, spec):
            if when == "before":
                raise Crash("killed before the cloud call")
            self.inner.launch(spec)
            raise Crash("killed before the result was written")
    return lambda name, p: Dies(p)


@pytest.mark.parametrize("provider,region,itype,market", [
    ("aws", "us-west-2", "g5.xlarge", "spot"),
    ("gcp", "europe-west4", "a2-highgpu-1g", "on_demand"),
    ("azure", "westeurope", "Standard_NC24ads_A100_v4", "on_demand"),
])
def test_crash_after_the_cloud_call_is_adopted_not_relaunched(clouds, tmp_path, provider, region, itype,
                                                              market):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock, wrap=_crashing("after")) as svc:
        lease, _ = svc.lifecycle.create(idempotency_key="c", target=target(svc, provider, region, itype, market, 2))
        with pytest.raises(Crash):
            svc.lifecycle.provision(lease)
        assert svc.store.get_lease(lease.lease_id).state == "provisioning"
    launched = live_by_lease(clouds)[lease.lease_id]
    with service(tmp_path, clouds, clock=clock) as svc:  # the restarted broker
        report = svc.reconciler.run_pass()
        assert report.adopted == 1
        rec = svc.store.get_lease(lease.lease_id)
        assert rec.state == "running" and rec.attempt == 1
        assert sorted(live_by_lease(clouds)[lease.lease_id]) == sorted(launched)
        assert {i["node_name"] for i in instances_of(rec)} == {f"{lease.lease_id}-1-0", f"{lease.lease_id}-1-1"}
        svc.lifecycle.release(lease.lease_id)
    assert existing_by_lease(clouds) == {}


def test_crash_before_the_cloud_call_resumes_with_the_same_token(clouds, tmp_path):  # noqa: F811
    clock = Clock()
    with service(tmp_path, clouds, clock=clock, wrap=_crashing("before")) as svc:
        stuck, _ = svc.lifecycle.create(idempotency_key="p", target=target(svc, "aws", "us-east-1", "g5.xlarge"))
        with pytest.raises(Crash):
            svc.lifecycle.provision(stuck)
        never, _ = svc.lifecycle.create(idempotency_key="r", target=target(svc, "aws", "us-east-1", "g5.xlarge"))
    watched = {}
    with service(tmp_path, clouds, clock=clock, lifecycle={"resume_after_s": 30},
                 wrap=lambda n, p: watched.setdefault(n, Watched(p))) as svc:
        svc.reconciler.run_pass()  # too early: a launch may still be under way elsewhere
        assert svc.store.get_lease(stuck.lease_id).state == "provisioning"
        assert svc.store.get_lease(never.lease_id).state == "requested"
        assert not watched["aws"].ops("launch")
        clock.advance(31)
        report = svc.reconciler.run_pass()
        assert report.resumed == 2
        assert sorted(s.client_token for s in watched["aws"].ops("launch")) == sorted(
            [f"{never.lease_id}-1", f"{stuck.lease_id}-1"])
        for l in (stuck, never):
            assert svc.store.get_lease(l.lease_id).state == "running"
            assert len(live_by_lease(clouds)[l.lease_id]) == 1
        assert "resuming launch after restart" in [m for _, _, _, m in events(svc.store, stuck.lease_id)]


def test_orphans_and_leftovers_are_terminated(clouds, tmp_path):  # noqa: F811
    """Instances tagged for a failed lease, for no lease at all, and a running lease's extra node
    are terminated once seen for the grace period; the lease's own node is kept."""
    clock = Clock()
    with service(tmp_path, clouds, clock=clock, reconciler={"orphan_grace_s": 60}) as svc:
        lc = svc.lifecycle
        ok = lc.launch(idempotency_key="ok", target=target(svc, "aws", "us-east-1", "g5.xlarge"))
        clouds.aws.inject("quota", match="RunInstances")
        failed, _ = lc.create(idempotency_key="f", target=target(svc, "aws", "us-west-2", "g5.xlarge"))
        with pytest.raises(LeaseError):
            lc.provision(failed)

        def run(lease_id, region="us-east-1"):  # what a crashed or foreign launch leaves behind
            ec2 = clouds.aws.client(region)
            ec2.run_instances(ImageId=svc.config.providers.aws.image_for(region), InstanceType="g5.xlarge",
                              MinCount=1, MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                  {"Key": "broker:lease", "Value": lease_id},
                                  {"Key": "broker:owner", "Value": "broker-test"}]}])

        run("l-ghost")
        run(ok.lease_id)
        run(failed.lease_id, "us-west-2")
        assert len(live_by_lease(clouds)[ok.lease_id]) == 2
        svc.reconciler.run_pass()
        assert len(live_by_lease(clouds)[ok.lease_id]) == 2  # still within the grace period
        clock.advance(61)
        report = svc.reconciler.run_pass()
        assert report.orphans_terminated == 3
        assert live_by_lease(clouds) == {ok.lease_id: [("aws", instances_of(ok)[0]["instance_id"])]}
        assert svc.store.get_lease(ok.lease_id).state == "running"


def test_a_lagging_listing_concludes_nothing(clouds, tmp_path):  # noqa: F811
    """A listing that misses a running lease's node (EC2 lags) does not drain the lease."""
    class Lagging(Watched):
        def list_managed(self, regions=None):
            return []

    with service(tmp_path, clouds, wrap=lambda n, p: Lagging(p) if n == "aws" else p) as svc:
        lease = svc.lifecycle.launch(idempotency_key="lag", target=target(svc, "aws", "us-east-1", "g5.xlarge",
                                                                           "spot"))
        svc.reconciler.run_pass()
        assert svc.store.get_lease(lease.lease_id).state == "running"
